package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/internal/testkit"
)

// hookReceiver is a webhook endpoint that answers 503 until it is up, and keeps
// the Idempotency-Key of each request it accepted.
type hookReceiver struct {
	URL  string
	mu   sync.Mutex
	up   bool
	keys []string
}

func newHookReceiver(t *testing.T) *hookReceiver {
	r := &hookReceiver{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if !r.up {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		r.keys = append(r.keys, req.Header.Get("Idempotency-Key"))
	}))
	t.Cleanup(srv.Close)
	r.URL = srv.URL
	return r
}

func (r *hookReceiver) setUp() {
	r.mu.Lock()
	r.up = true
	r.mu.Unlock()
}

func (r *hookReceiver) accepted() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.keys...)
}

// oneAttemptSpec is a spec file whose one push, to url, makes one attempt.
func oneAttemptSpec(t *testing.T, url string) string {
	path := filepath.Join(t.TempDir(), "spec.json")
	if err := os.WriteFile(path, []byte(`{"deliver":[{"type":"webhook","url":"`+url+`","max_attempts":1}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// waitShows waits until show prints text for the task.
func waitShows(t *testing.T, home, id, text string) {
	t.Helper()
	testkit.Eventually(t, 30*time.Second, "show "+id+" says "+text, func() bool {
		return strings.Contains(bgtask(t, home, "show", id).must(t, 0, "show").stdout, text)
	})
}

// A push that gave up is listed by list --delivery failed and marked by list
// and show; redeliver sends it again, once, and says so; what cannot be
// redelivered is an error with its exit status that names the field.
func TestRedeliverSendsAPushThatGaveUp(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	startServer(t, home)
	rcv := newHookReceiver(t)
	id := addTask(t, home, "--spec", oneAttemptSpec(t, rcv.URL), "--delay", "100ms")
	waitShows(t, home, id, "gave up: 503")
	listed := bgtask(t, home, "list", "--delivery", "failed").must(t, 0, "list --delivery failed").stdout
	if !strings.Contains(listed, id+" a push gave up: bgtask redeliver "+id) {
		t.Fatalf("list --delivery failed:\n%s", listed)
	}

	rcv.setUp()
	out := bgtask(t, home, "redeliver", id[:8]).must(t, 0, "redeliver").stdout
	if want := "redelivering " + id + ": push 0, webhook " + rcv.URL + "\n"; out != want {
		t.Fatalf("redeliver printed %q, want %q", out, want)
	}
	waitShows(t, home, id, ": delivered (2 attempts)")
	if got := rcv.accepted(); len(got) != 1 || got[0] != id {
		t.Fatalf("the receiver got %q, want one request with key %s", got, id)
	}

	plain := addTask(t, home, "--delay", "100ms")
	bgtask(t, home, "wait", plain).must(t, 0, "wait")
	for _, tc := range []struct {
		args       []string
		code       int
		field, say string
	}{
		{[]string{id, "--sink", "1"}, client.ExitUsage, "sink", "has push sinks 0 to 0"},
		{[]string{plain}, client.ExitConflict, "id", "has no push sink"},
	} {
		r := bgtask(t, home, append([]string{"redeliver", "--json"}, tc.args...)...).must(t, tc.code, "redeliver "+strings.Join(tc.args, " "))
		e := decode[errorObject](t, r.stdout).Error
		if e == nil || e.Field != tc.field || !strings.Contains(e.Message, tc.say) {
			t.Errorf("redeliver %s: %s, want an error naming %s that says %q", strings.Join(tc.args, " "), r.stdout, tc.field, tc.say)
		}
	}
}

// MCP's list selects the tasks whose push gave up, and its redeliver tool sends
// the push again, once.
func TestMCPRedeliversAPushThatGaveUp(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("CLAUDE_CODE_SESSION_ID", "")
	t.Setenv("CODEX_THREAD_ID", "")
	startServer(t, home)
	rcv := newHookReceiver(t)
	id := addTask(t, home, "--spec", oneAttemptSpec(t, rcv.URL), "--delay", "100ms")
	waitShows(t, home, id, "gave up: 503")
	p := startMCP(t, home, t.TempDir())

	listed := ok[struct {
		Tasks []struct{ ID, Delivery string }
	}](t, "list", p.call(t, "list", map[string]any{"delivery": "failed"}))
	if len(listed.Tasks) != 1 || listed.Tasks[0].ID != id || listed.Tasks[0].Delivery != engine.DeliveryFailed {
		t.Fatalf("list delivery failed: %+v", listed.Tasks)
	}
	rcv.setUp()
	res := p.call(t, "redeliver", map[string]any{"id": id[:8]})
	if task := ok[mcpTask](t, "redeliver", res); task.ID != id || text(res) != "redelivering "+id+": push 0 (webhook)" {
		t.Fatalf("redeliver: %s, %q", task.ID, text(res))
	}
	waitShows(t, home, id, ": delivered (2 attempts)")
	if got := rcv.accepted(); len(got) != 1 || got[0] != id {
		t.Fatalf("the receiver got %q, want one request with key %s", got, id)
	}
	if res := p.call(t, "redeliver", map[string]any{"id": id, "sink": 3}); !res.IsError || !strings.HasPrefix(text(res), "sink: 3: task") {
		t.Fatalf("redeliver of a sink out of range: %s", text(res))
	}
}
