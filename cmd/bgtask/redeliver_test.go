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
)

// A push that gave up is listed by list --delivery failed and marked by list
// and show; redeliver sends it again, once, and says so; what cannot be
// redelivered is an error with its exit status that names the field.
func TestRedeliverSendsAPushThatGaveUp(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	startServer(t, home)
	var mu sync.Mutex
	up, keys := false, []string{}
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if !up {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		keys = append(keys, r.Header.Get("Idempotency-Key"))
	}))
	t.Cleanup(rcv.Close)
	spec := filepath.Join(home, "spec.json")
	if err := os.WriteFile(spec, []byte(`{"deliver":[{"type":"webhook","url":"`+rcv.URL+`","max_attempts":1}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	id := addTask(t, home, "--spec", spec, "--delay", "100ms")
	eventually(t, 30*time.Second, "the push given up", func() bool {
		return strings.Contains(bgtask(t, home, "show", id).must(t, 0, "show").stdout, "gave up: 503")
	})
	listed := bgtask(t, home, "list", "--delivery", "failed").must(t, 0, "list --delivery failed").stdout
	if !strings.Contains(listed, id+" a push gave up: bgtask redeliver "+id) {
		t.Fatalf("list --delivery failed:\n%s", listed)
	}

	mu.Lock()
	up = true
	mu.Unlock()
	out := bgtask(t, home, "redeliver", id[:8]).must(t, 0, "redeliver").stdout
	if want := "redelivering " + id + ": push 0, webhook " + rcv.URL + "\n"; out != want {
		t.Fatalf("redeliver printed %q, want %q", out, want)
	}
	eventually(t, 30*time.Second, "the push delivered", func() bool {
		return strings.Contains(bgtask(t, home, "show", id).must(t, 0, "show").stdout, ": delivered (2 attempts)")
	})
	mu.Lock()
	got := append([]string(nil), keys...)
	mu.Unlock()
	if len(got) != 1 || got[0] != id {
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
