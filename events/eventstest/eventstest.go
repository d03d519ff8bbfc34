// Package eventstest runs real embedded JetStream servers for tests: random port,
// temporary store, shut down when the test ends.
package eventstest

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
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

// Cluster is a JetStream cluster of embedded servers on loopback.
type Cluster struct {
	Servers []*server.Server
}

// RunCluster starts n clustered JetStream servers on loopback, every one routed to
// every other, and waits until the cluster has a JetStream meta leader. configure,
// if given, changes each server's options (i is its index) before the start.
func RunCluster(t testing.TB, n int, configure ...func(i int, o *server.Options)) *Cluster {
	t.Helper()
	ports := freePorts(t, n)
	routes := make([]*url.URL, n)
	for i, p := range ports {
		routes[i] = &url.URL{Scheme: "nats-route", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(p))}
	}
	c := &Cluster{}
	for i := range n {
		opts := &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1),
			Host:       "127.0.0.1",
			Port:       -1,
			JetStream:  true,
			StoreDir:   t.TempDir(),
			NoLog:      true,
			NoSigs:     true,
			Cluster:    server.ClusterOpts{Name: "bgtask-test", Host: "127.0.0.1", Port: ports[i]},
			Routes:     routes,
		}
		for _, conf := range configure {
			conf(i, opts)
		}
		s, err := server.NewServer(opts)
		if err != nil {
			t.Fatalf("start nats-server %d: %v", i+1, err)
		}
		s.Start()
		t.Cleanup(func() {
			s.Shutdown()
			s.WaitForShutdown()
		})
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatalf("nats-server %d not ready", i+1)
		}
		c.Servers = append(c.Servers, s)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ready := 0
		for _, s := range c.Servers {
			if s.JetStreamIsClustered() && s.JetStreamIsCurrent() {
				ready++
			}
		}
		if ready == n {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster of %d: JetStream not ready after 30s", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// URLs is every server's client URL, comma separated, as nats.Connect takes them.
func (c *Cluster) URLs() string {
	urls := make([]string, 0, len(c.Servers))
	for _, s := range c.Servers {
		if s.Running() {
			urls = append(urls, s.ClientURL())
		}
	}
	return strings.Join(urls, ",")
}

// StreamLeader returns the server that leads a stream's replicas now (nil if none).
func (c *Cluster) StreamLeader(account, stream string) *server.Server {
	for _, s := range c.Servers {
		if s.Running() && s.JetStreamIsStreamLeader(account, stream) {
			return s
		}
	}
	return nil
}

// freePorts finds n free loopback ports for the cluster routes, which must all be
// known before the first server starts.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	var ls []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}
