// Package clienttest runs a bgtask server in the test process, for the tests of
// programs built on package client: an embedded JetStream server and an engine
// (no worker: a timer fires, a command stays armed), in a home as `bgtask
// server` keeps one, so that client.Connect finds it there.
package clienttest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/bgtask/bgtask/engine/node"
	"github.com/bgtask/bgtask/engine/sinks"
	"github.com/bgtask/bgtask/internal/serverhome"
)

// Server is a bgtask server of a home, running in the test process.
type Server struct {
	Home  string
	stops []func()
	once  sync.Once
}

// Start starts a server in dir (made if need be) as `bgtask server` starts one:
// the home's client identity (made at its first start), its lock, the server,
// and its discovery file last. What it stores stays in the home for the next
// Start there.
func Start(dir string) (*Server, error) {
	s := &Server{Home: dir}
	if err := s.start(); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

func (s *Server) start() error {
	dir := s.Home
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ids, err := serverhome.LoadOrCreateIdentities(dir)
	if err != nil {
		return err
	}
	pub, err := ids.Client.PublicKey()
	if err != nil {
		return err
	}
	lock, err := serverhome.Lock(dir)
	if err != nil {
		return err
	}
	s.stops = append(s.stops, func() { lock.Close() })
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: filepath.Join(dir, serverhome.StoreDir),
		NoLog: true, NoSigs: true, Nkeys: []*server.NkeyUser{{Nkey: pub}},
		// The engine's connection comes in without credentials, as a user of its own.
		Users: []*server.User{{Username: "engine", Password: "not used"}}, NoAuthUser: "engine"})
	if err != nil {
		return err
	}
	ns.Start()
	s.stops = append(s.stops, func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		return errors.New("nats-server not ready")
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		return err
	}
	s.stops = append(s.stops, nc.Close)
	n, err := node.New(node.Config{Conn: nc, Writer: "engine", LeaseTTL: time.Minute, Replicas: 1,
		Sinks: sinks.New([]byte("a test secret of enough bytes")), Version: "0.0.0-test"})
	if err != nil {
		return err
	}
	if err := n.Start(context.Background()); err != nil {
		return err
	}
	s.stops = append(s.stops, n.Stop)
	if err := serverhome.WriteDiscovery(dir, serverhome.Discovery{URL: ns.ClientURL(), PID: os.Getpid()}); err != nil {
		return err
	}
	s.stops = append(s.stops, func() { _ = os.Remove(filepath.Join(dir, serverhome.DiscoveryFile)) })
	return nil
}

// Stop stops the server as `bgtask server` stops: its discovery file removed,
// its lock let go. Its clients then find it gone. Stop again does nothing.
func (s *Server) Stop() {
	s.once.Do(func() {
		for i := len(s.stops) - 1; i >= 0; i-- {
			s.stops[i]()
		}
	})
}

// Supervise makes the server one that a supervisor restarts: once it stops,
// its clients wait for it to come back instead of finding it gone.
func (s *Server) Supervise() error {
	return serverhome.WriteFileAtomic(filepath.Join(s.Home, serverhome.SupervisorFile), []byte("clienttest"))
}

// Run starts a server in dir for a test, stopped when the test ends.
func Run(t testing.TB, dir string) *Server {
	t.Helper()
	s, err := Start(dir)
	if err != nil {
		t.Fatalf("start a bgtask server in %s: %v", dir, err)
	}
	t.Cleanup(s.Stop)
	return s
}
