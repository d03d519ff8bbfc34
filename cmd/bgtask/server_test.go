package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// startExternalNATS runs a one-node NATS JetStream server of the test's own, as a
// deployment would: no anonymous access, an engine user that may do everything.
func startExternalNATS(t *testing.T) string {
	t.Helper()
	ns, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: t.TempDir(), NoSigs: true,
		Users: []*server.User{{Username: "engine", Password: "engine-pw"}},
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

// TestServerWithNATSMakesItsHome: against a cluster, a home that does not exist yet
// is made; one that cannot be made is named in one error, unless nothing needs it.
func TestServerWithNATSMakesItsHome(t *testing.T) {
	t.Parallel()
	url := startExternalNATS(t)
	external := func(home string, args ...string) []string {
		return append([]string{"--home", home, "--nats", url, "--user", "engine", "--password", "engine-pw", "server"}, args...)
	}

	home := filepath.Join(t.TempDir(), "not", "yet")
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() { done <- Run(ctx, external(home, "--tick", "200ms"), out, out) }()
	awaitText(t, out, "bgtask server ready", done)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("server: %v\n%s", err, out.String())
	}
	if _, err := os.Stat(filepath.Join(home, webhookSecretFile)); err != nil {
		t.Fatalf("the home was not made with its webhook secret: %v", err)
	}

	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	unmakeable := filepath.Join(file, "home")
	var stderr syncBuffer
	err := Run(context.Background(), external(unmakeable), &syncBuffer{}, &stderr)
	if err == nil || !strings.Contains(err.Error(), "the home "+unmakeable+" cannot be created") ||
		!strings.Contains(err.Error(), "--webhook-secret-file") {
		t.Fatalf("server with a home that cannot be made: %v, want one error that names the home and the way out", err)
	}

	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	out = &syncBuffer{}
	go func() { done <- Run(ctx, external(unmakeable, "--no-worker", "--webhook-secret-file", secret), out, out) }()
	awaitText(t, out, "bgtask server ready", done)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("engine-only server: %v\n%s", err, out.String())
	}
}

// TestServerWebhookDenyPrivate: with --webhook-deny-private, a wake-up for a webhook
// on loopback fails for good with the reason, and the receiver gets nothing.
func TestServerWebhookDenyPrivate(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	receiver := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	t.Cleanup(receiver.Close)
	home := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, []string{"server", "--home", home, "--listen", "127.0.0.1:0", "--tick", "200ms", "--webhook-deny-private"}, out, out)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server: %v\n%s", err, out.String())
		}
	})
	awaitText(t, out, "bgtask server ready", done)

	id := addTask(t, home, "--webhook", receiver.URL+"/hook", "--", "true")
	deadline := time.Now().Add(30 * time.Second)
	for {
		view := decode[struct {
			Deliveries []struct {
				Failed    bool   `json:"failed"`
				LastError string `json:"last_error"`
			} `json:"deliveries"`
		}](t, bgtask(t, home, "show", "--json", id).must(t, 0, "show").stdout)
		if len(view.Deliveries) == 1 && view.Deliveries[0].Failed {
			if e := view.Deliveries[0].LastError; !strings.Contains(e, "loopback") {
				t.Fatalf("the push failed with %q, want the loopback rule", e)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the push did not fail in 30s: %+v", view)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the receiver on loopback got %d requests", n)
	}
}
