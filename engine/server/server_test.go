package server

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/internal/serverhome"
	"github.com/bgtask/bgtask/internal/testkit"
)

func TestACleanRestartKeepsThePort(t *testing.T) {
	home := t.TempDir()
	first := startServer(t, home)
	before, err := serverhome.ReadDiscovery(home)
	if err != nil {
		t.Fatal(err)
	}
	// A client connection leaves the server's side of it in TIME_WAIT at the stop.
	c := newClient(t, home)
	if _, err := c.List(context.Background(), client.ListQuery{}); err != nil {
		t.Fatal(err)
	}
	c.Close()
	first.stop()
	second := startServer(t, home)
	if after, err := serverhome.ReadDiscovery(home); err != nil || after.URL != before.URL {
		t.Fatalf("the server listened on %s, then on %+v (%v) after a clean stop", before.URL, after, err)
	}
	second.stop()

	// Taken by another program, the port is tried, and given up for a new one.
	taken, err := net.Listen("tcp", strings.TrimPrefix(before.URL, "nats://"))
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	third := startServer(t, home)
	if after, err := serverhome.ReadDiscovery(home); err != nil || after.URL == before.URL || !strings.Contains(third.log.String(), "the port of the last run is taken") {
		t.Fatalf("with its port %s taken, the server listened on %+v (%v)\n%s", before.URL, after, err, third.log.String())
	}
}

// A server whose store cannot start does not take that for a port taken: it
// does not try again on another port, and says so at once.
func TestAStoreThatCannotStartIsNotTakenForATakenPort(t *testing.T) {
	home := t.TempDir()
	if err := serverhome.RememberPort(home, serverhome.PortFile, testkit.FreePort(t)); err != nil {
		t.Fatal(err)
	}
	// A file where the store's directory goes.
	if err := os.WriteFile(filepath.Join(home, serverhome.StoreDir), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	log := &syncBuffer{}
	err := Run(context.Background(), testOptions(home, log))
	if err == nil || strings.Contains(log.String(), "the port of the last run is taken") {
		t.Fatalf("server with no store: %v\n%s", err, log.String())
	}
}

// A server refuses, naming the option, what the command line got wrong, before
// it serves: each error is a *BadOption.
func TestABadOptionIsRefusedAsSuch(t *testing.T) {
	for what, c := range map[string]struct {
		change func(*Options)
		says   string
	}{
		"a listen address not on loopback":  {func(o *Options) { o.Listen = "0.0.0.0:0" }, "--listen"},
		"a sync of no kind":                 {func(o *Options) { o.Sync = "sometimes" }, "--sync"},
		"an exclusive worker with no label": {func(o *Options) { o.Worker.Exclusive = true }, "--exclusive"},
	} {
		o := testOptions(t.TempDir(), &syncBuffer{})
		c.change(&o)
		err := Run(context.Background(), o)
		if bad := new(BadOption); !errors.As(err, &bad) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want a *BadOption naming %s", what, err, c.says)
		}
	}
}

func TestAServerRefusesNATSWhoseMessagesCannotCarryAnEvent(t *testing.T) {
	if err := checkMaxPayload(1 << 20); err != nil {
		t.Fatalf("the default max payload: %v", err)
	}
	err := checkMaxPayload(128 << 10)
	if err == nil || !strings.Contains(err.Error(), "max_payload") {
		t.Fatalf("a 128 KiB max payload: %v, want a refusal naming max_payload", err)
	}
}

// With DenyPrivate, a webhook on loopback is refused at registration, and one
// registered before the rule was turned on fails for good at its push, with the
// reason; the receiver gets nothing.
func TestServerWebhookDenyPrivate(t *testing.T) {
	t.Setenv("HOME", t.TempDir()) // no profile of this machine's in the worker's login shell
	var hits atomic.Int32
	receiver := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	t.Cleanup(receiver.Close)
	home := t.TempDir()
	ctx := context.Background()
	spec := client.Spec{Command: "true", Target: "agent", Deliver: []engine.Sink{{Type: "webhook", URL: receiver.URL + "/hook"}}}

	srv := startServer(t, home)
	c := newClient(t, home)
	if _, err := c.SetTarget(ctx, "agent", client.TargetBusy, 0); err != nil {
		t.Fatal(err)
	}
	id := register(t, c, spec)
	if code := exitCodeOf(t, c, id, 30*time.Second); code != 0 {
		t.Fatalf("the task exited %d", code)
	}
	c.Close()
	srv.stop()

	startServer(t, home, func(o *Options) { o.DenyPrivate = true })
	c = newClient(t, home)
	var refusal *client.Error
	if _, err := c.Register(ctx, spec); !errors.As(err, &refusal) || refusal.Field != "deliver[0].url" || !strings.Contains(refusal.Message, "loopback") {
		t.Fatalf("register of a webhook on loopback: %v; want it refused on deliver[0].url", err)
	}
	if _, err := c.SetTarget(ctx, "agent", client.TargetIdle, 0); err != nil {
		t.Fatal(err)
	}
	var push engine.SinkState
	testkit.Eventually(t, 30*time.Second, "the push done", func() bool {
		task, err := c.Get(ctx, id)
		if err != nil || len(task.Deliveries) != 1 {
			t.Fatalf("get: %+v, %v; want one delivery", task.Deliveries, err)
		}
		push = task.Deliveries[0]
		return push.Done()
	})
	if !push.Failed || !strings.Contains(push.LastError, "loopback") {
		t.Fatalf("the push came to %+v, want it failed by the loopback rule", push)
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the receiver on loopback got %d requests", n)
	}
}

// startExternalNATS runs a one-node NATS JetStream server of the test's own, as a
// deployment would: no anonymous access, an engine user that may do everything.
func startExternalNATS(t *testing.T) string {
	t.Helper()
	ns, err := natsserver.NewServer(&natsserver.Options{
		Host: "127.0.0.1", Port: natsserver.RANDOM_PORT, JetStream: true, StoreDir: t.TempDir(), NoSigs: true,
		Users: []*natsserver.User{{Username: "engine", Password: "engine-pw"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	return ns.ClientURL()
}

// externalOptions are the options of a server on the deployment of url, as its
// engine user, with home.
func externalOptions(url, home string, log *syncBuffer) Options {
	o := testOptions(home, log)
	o.URL, o.Auth = url, []nats.Option{nats.UserInfo("engine", "engine-pw")}
	return o
}

// runExternal runs RunExternal(o) until stop, and returns once it serves.
func runExternal(t *testing.T, o Options, log *syncBuffer) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- RunExternal(ctx, o) }()
	awaitLog(t, log, "bgtask server ready", done)
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("server: %v\n%s", err, log.String())
		}
	}
}

// Against a cluster, a home that does not exist yet is made; one that cannot be
// made is named in one error, unless nothing needs it.
func TestServerWithNATSMakesItsHome(t *testing.T) {
	t.Parallel()
	url := startExternalNATS(t)

	home := filepath.Join(t.TempDir(), "not", "yet")
	log := &syncBuffer{}
	runExternal(t, externalOptions(url, home, log), log)()
	if _, err := os.Stat(filepath.Join(home, serverhome.WebhookSecretFile)); err != nil {
		t.Fatalf("the home was not made with its webhook secret: %v", err)
	}

	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	unmakeable := filepath.Join(file, "home")
	err := RunExternal(context.Background(), externalOptions(url, unmakeable, &syncBuffer{}))
	if err == nil || !strings.Contains(err.Error(), "the home "+unmakeable+" cannot be created") ||
		!strings.Contains(err.Error(), "--webhook-secret-file") {
		t.Fatalf("server with a home that cannot be made: %v, want one error that names the home and the way out", err)
	}

	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	log = &syncBuffer{}
	o := externalOptions(url, unmakeable, log)
	o.NoWorker, o.Delivery.SecretFile = true, secret
	runExternal(t, o, log)()
}
