package integration

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/internal/testkit"
)

// timedWakeup is the part of a wake-up that timers and retries add.
type timedWakeup struct {
	Status   string `json:"status"`
	Kind     string `json:"kind"`
	Prompt   string `json:"prompt"`
	LateBy   string `json:"late_by"`
	Attempts []struct {
		Epoch    uint64 `json:"epoch"`
		Status   string `json:"status"`
		ExitCode *int   `json:"exit_code"`
	} `json:"attempts"`
}

// A timer that comes due while the server is killed fires once, as soon as the
// server is back, and says how late.
func TestATimerDueWhileTheServerIsDownFiresOnceLate(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	srv := startServer(t, home)
	id := add(t, home, "--target", "reminders", "--delay", "2s", "--prompt", "stand-up, {{late_by}} late")
	due := time.Now().Add(2 * time.Second)
	srv.stop(syscall.SIGKILL)
	// The timer's time passes while nothing runs: on the wall clock, which no
	// test moves for another process.
	time.Sleep(time.Until(due.Add(1500 * time.Millisecond)))
	startServer(t, home)
	w := decodeJSON[timedWakeup](t, ok(t, home, "wait", id, "--json", "--timeout", "45s"))
	late, err := time.ParseDuration(w.LateBy)
	if w.Status != "succeeded" || w.Kind != "timer" || err != nil || late < time.Second || !strings.HasPrefix(w.Prompt, "stand-up, ") {
		t.Fatalf("wake-up of a timer due while the server was down: %+v", w)
	}
	if n := countTypes(history(t, home, id)); n["due"] != 1 || n["fired"] != 1 || n["spawned"] != 0 {
		t.Fatalf("history of the timer: %v", n)
	}
	if got := inboxLines(t, home, "reminders"); len(got) != 1 {
		t.Fatalf("the inbox holds %d wake-ups of the timer, want 1", len(got))
	}
	auditClean(t, home)
}

// A command with retries whose server is killed while a retry waits runs every
// attempt once, and wakes the caller once, after the last, with the attempts.
func TestRetriesGoOnAcrossAKillOfTheServer(t *testing.T) {
	t.Parallel()
	home, dir := t.TempDir(), t.TempDir()
	srv := startServer(t, home)
	runs := filepath.Join(dir, "runs")
	id := add(t, home, "--cwd", dir, "--target", "retries", "--retry", "2", "--retry-backoff", "3s",
		"--", "echo run >> runs; exit 3")
	testkit.Eventually(t, 30*time.Second, "the first attempt ended and a retry waits", func() bool {
		return countTypes(history(t, home, id))["retry-scheduled"] == 1
	})
	srv.stop(syscall.SIGKILL)
	startServer(t, home)
	w := decodeJSON[timedWakeup](t, run(t, home, "wait", id, "--json", "--timeout", "45s").stdout)
	if w.Status != "failed" || len(w.Attempts) != 2 || w.Attempts[0].Epoch != 1 || w.Attempts[1].Epoch != 2 {
		t.Fatalf("wake-up after the retries: %+v", w)
	}
	data, err := os.ReadFile(runs)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(data), "run\n"); n != 3 {
		t.Fatalf("the command ran %d times, want 3", n)
	}
	if n := countTypes(history(t, home, id)); n["spawned"] != 3 || n["retry-scheduled"] != 2 || n["fired"] != 1 {
		t.Fatalf("history: %v", n)
	}
	if got := inboxLines(t, home, "retries"); len(got) != 1 {
		t.Fatalf("the inbox holds %d wake-ups, want 1", len(got))
	}
	auditClean(t, home)
}
