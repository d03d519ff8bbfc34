// Package eventstest runs real embedded JetStream servers for tests: random port,
// temporary store, shut down when the test ends.
package eventstest

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Server is a running embedded JetStream server with one client connection.
type Server struct {
	NATS *server.Server
	Conn *nats.Conn
	JS   jetstream.JetStream
}

// Run starts a JetStream server on a random loopback port with its store in a
// temporary directory. configure, if given, changes the options before the start.
func Run(t testing.TB, configure ...func(*server.Options)) *Server {
	t.Helper()
	opts := &server.Options{
		Host:      "127.0.0.1",
		Port:      -1,
		JetStream: true,
		StoreDir:  t.TempDir(),
		NoLog:     true,
		NoSigs:    true,
	}
	for _, c := range configure {
		c(opts)
	}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("start nats-server: %v", err)
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	return &Server{NATS: s, Conn: nc, JS: js}
}

// Connect opens another client connection to the server, closed when the test ends.
func (s *Server) Connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(s.NATS.ClientURL())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	return nc, js
}
