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

	"github.com/bgtask/bgtask/internal/serverhome"
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
	if _, err := os.Stat(filepath.Join(home, serverhome.WebhookSecretFile)); err != nil {
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
	go func() {
		done <- Run(ctx, external(unmakeable, "--no-worker", "--webhook-secret-file", secret), out, out)
	}()
	awaitText(t, out, "bgtask server ready", done)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("engine-only server: %v\n%s", err, out.String())
	}
}

// runServerFor runs `bgtask server` on home with args until stop, and returns once it
// serves.
func runServerFor(t *testing.T, home string, args ...string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, append([]string{"server", "--home", home, "--listen", "127.0.0.1:0", "--tick", "200ms"}, args...), out, out)
	}()
	awaitText(t, out, "bgtask server ready", done)
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server: %v\n%s", err, out.String())
		}
	}
}

// TestServerWebhookDenyPrivate: with --webhook-deny-private, a webhook on loopback
// is refused at registration, and one registered before the rule was turned on
// fails for good at its push, with the reason; the receiver gets nothing.
func TestServerWebhookDenyPrivate(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	receiver := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	t.Cleanup(receiver.Close)
	home := t.TempDir()

	stop := runServerFor(t, home)
	bgtask(t, home, "target", "busy", "agent").must(t, 0, "target busy")
	id := addTask(t, home, "--target", "agent", "--webhook", receiver.URL+"/hook", "--", "true")
	bgtask(t, home, "wait", id, "--timeout", "30s").must(t, 0, "wait")
	stop()

	stop = runServerFor(t, home, "--webhook-deny-private")
	defer stop()
	r := bgtask(t, home, "add", "--json", "--webhook", receiver.URL+"/hook", "--", "true")
	if e := decode[errorObject](t, r.stdout).Error; r.code == 0 || e == nil || e.Field != "deliver[0].url" || !strings.Contains(e.Message, "loopback") {
		t.Fatalf("add of a webhook on loopback: exit %d, %s%s; want it refused on deliver[0].url", r.code, r.stdout, r.stderr)
	}
	bgtask(t, home, "target", "idle", "agent").must(t, 0, "target idle")
	deadline := time.Now().Add(30 * time.Second)
	for {
		view := decode[struct {
			Deliveries []struct {
				Failed    bool   `json:"failed"`
				Delivered bool   `json:"delivered"`
				LastError string `json:"last_error"`
			} `json:"deliveries"`
		}](t, bgtask(t, home, "show", "--json", id).must(t, 0, "show").stdout)
		if len(view.Deliveries) != 1 {
			t.Fatalf("deliveries = %+v, want one", view.Deliveries)
		}
		if k := view.Deliveries[0]; k.Failed || k.Delivered {
			if !k.Failed || !strings.Contains(k.LastError, "loopback") {
				t.Fatalf("the push came to %+v, want it failed by the loopback rule", k)
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

func TestAServerRefusesNATSWhoseMessagesCannotCarryAnEvent(t *testing.T) {
	if err := checkMaxPayload(1 << 20); err != nil {
		t.Fatalf("the default max payload: %v", err)
	}
	err := checkMaxPayload(128 << 10)
	if err == nil || !strings.Contains(err.Error(), "max_payload") {
		t.Fatalf("a 128 KiB max payload: %v, want a refusal naming max_payload", err)
	}
}
