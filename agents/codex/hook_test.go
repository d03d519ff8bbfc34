package codex

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/internal/testkit"
)

func TestHooksFollowTheThreadsTurns(t *testing.T) {
	w := newWorld(t)
	c := w.connect(t)
	// The deliver a hook starts: here a shell that says how it was run.
	hook := Hook{Config: client.Config{Home: w.home}, Home: w.home, Bgtask: []string{"/bin/sh", "-c", `echo "ran: $*"`, "bgtask"}}
	run := func(input string) string {
		t.Helper()
		if err := hook.Run(context.Background(), strings.NewReader(input)); err != nil {
			t.Fatalf("hook %s: %v", input, err)
		}
		states, err := c.Targets(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		st, ok := states["codex-019a-77"]
		if !ok {
			return "none"
		}
		return st.State
	}
	log := filepath.Join(w.home, StateDir, "019a-77.log")
	// A new session's start writes nothing, and hands nothing over: it has no wake-up yet.
	if got := run(`{"session_id":"019a-77","hook_event_name":"SessionStart","source":"startup"}`); got != "none" || fileExists(log) {
		t.Errorf("after SessionStart: %s; a deliver started: %v", got, fileExists(log))
	}
	if got := run(`{"session_id":"019a-77","hook_event_name":"UserPromptSubmit","prompt":"x"}`); got != client.TargetBusy {
		t.Errorf("after UserPromptSubmit: %s", got)
	}
	if st, _ := c.Targets(context.Background()); st["codex-019a-77"].Until == nil || time.Until(*st["codex-019a-77"].Until) > BusyTTL {
		t.Errorf("busy %+v, want for %v at most", st["codex-019a-77"], BusyTTL)
	}
	// A resume of a thread the daemon holds runs no SessionStart: the user's
	// prompt hands over what is pending, in a deliver of its own.
	testkit.Eventually(t, 30*time.Second, "the deliver started by the prompt, in the thread's log", func() bool {
		data, _ := os.ReadFile(log)
		return strings.Contains(string(data), "UserPromptSubmit: deliver --thread 019a-77\n") &&
			strings.Contains(string(data), "ran: setup codex deliver --thread 019a-77\n")
	})
	if got := run(`{"session_id":"019a-77","hook_event_name":"Stop"}`); got != client.TargetIdle {
		t.Errorf("after Stop: %s", got)
	}
	if got := run(`{"session_id":"019a-77","hook_event_name":"SessionStart","source":"resume"}`); got != client.TargetIdle {
		t.Errorf("after SessionStart of a resume: %s", got)
	}
	testkit.Eventually(t, 30*time.Second, "the deliver started by the resume", func() bool {
		data, _ := os.ReadFile(log)
		return strings.Contains(string(data), "SessionStart: deliver --thread 019a-77\n")
	})
	if st, _ := os.Stat(log); st.Mode().Perm() != 0o600 {
		t.Errorf("the log's mode is %v", st.Mode().Perm())
	}
	for _, input := range []string{`{"session_id":"no good","hook_event_name":"Stop"}`, `not JSON`} {
		if err := hook.Run(context.Background(), strings.NewReader(input)); err == nil {
			t.Errorf("hook %s: no error", input)
		}
	}
}
