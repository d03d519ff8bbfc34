package integration

import (
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/internal/testkit"
)

// keyReceiver is a webhook receiver on a given address that answers 200 and
// keeps the Idempotency-Key of every POST.
type keyReceiver struct {
	mu   sync.Mutex
	keys []string
}

// listenKeys starts a keyReceiver on addr until the test ends.
func listenKeys(t *testing.T, addr string) *keyReceiver {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	r := &keyReceiver{}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.keys = append(r.keys, req.Header.Get("Idempotency-Key"))
		r.mu.Unlock()
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return r
}

func (r *keyReceiver) received() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.keys)
}

// A webhook whose receiver is down when the task fires is retried past the 8
// attempts a push once had, through a restart of the server, and reaches the
// receiver once it listens again: exactly one POST, with the task id as its
// Idempotency-Key. Its retry window is in the task's history, not in the
// server's memory.
func TestAPushOutlivesAReceiversOutageAndAServerRestart(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	addr := fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	// 10ms doubled: the 9th attempt comes about 2.5 s after the first.
	server := startServer(t, home, "--retry-base", "10ms")
	id := add(t, home, "--webhook", "http://"+addr+"/hook", "--", "echo outage")
	waitFor(t, home, id)
	testkit.Eventually(t, 60*time.Second, "nine failed attempts", func() bool {
		n := countTypes(history(t, home, id))
		if n["delivery-failed"] > 0 {
			t.Fatalf("the push gave up after %d attempts while its receiver was down", n["delivery-attempt"])
		}
		return n["delivery-result"] >= 9
	})
	server.stop(syscall.SIGTERM)

	receiver := listenKeys(t, addr)
	startServer(t, home, "--retry-base", "10ms")
	testkit.Eventually(t, 60*time.Second, "the push delivered", func() bool {
		v := decodeJSON[struct {
			Deliveries []struct{ Delivered, Failed bool }
		}](t, ok(t, home, "show", id, "--json"))
		if v.Deliveries[0].Failed {
			t.Fatal("the push gave up")
		}
		return v.Deliveries[0].Delivered
	})
	if keys := receiver.received(); len(keys) != 1 || keys[0] != id {
		t.Fatalf("the receiver got %q, want one POST with Idempotency-Key %s", keys, id)
	}
	auditClean(t, home)
}
