package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/internal/testkit"
)

// An external task waits for bgtask complete; a running command completed from
// outside is stopped, and its outcome is the completion's; an outcome --wake-on
// does not name ends quietly, with nothing in the inbox.
func TestCompleteFromOutsideAndWakeOn(t *testing.T) {
	home := t.TempDir()
	startServer(t, home)
	type woken struct {
		Status string `json:"status"`
		Result string `json:"result"`
	}
	ext := addTask(t, home, "--external", "--deadline", "1m", "--target", "ci")
	bgtask(t, home, "complete", ext, "--result", "ci green").must(t, 0, "complete")
	if w := decode[woken](t, bgtask(t, home, "wait", ext, "--json", "--timeout", "30s").must(t, 0, "wait").stdout); w.Status != engine.StatusSucceeded || w.Result != "ci green" {
		t.Fatalf("external task: %+v", w)
	}
	if r := bgtask(t, home, "complete", ext); r.code != client.ExitConflict {
		t.Fatalf("a second complete: exit %d, want %d", r.code, client.ExitConflict)
	}

	dir := t.TempDir()
	running := addTask(t, home, "--cwd", dir, "--", "echo $$ > pid; exec sleep 600")
	var pid int
	testkit.Eventually(t, 20*time.Second, "the command started", func() bool {
		data, err := os.ReadFile(filepath.Join(dir, "pid"))
		pid, _ = strconv.Atoi(strings.TrimSpace(string(data)))
		return err == nil && pid > 0
	})
	bgtask(t, home, "complete", running, "--status", "failed", "--result", "stopped from outside").must(t, 0, "complete a running task")
	if w := decode[woken](t, bgtask(t, home, "wait", running, "--json", "--timeout", "30s").must(t, client.ExitTaskFailed, "wait").stdout); w.Status != engine.StatusFailed || w.Result != "stopped from outside" {
		t.Fatalf("completed running task: %+v", w)
	}
	testkit.Eventually(t, 20*time.Second, "the command stopped", func() bool {
		return syscall.Kill(pid, 0) != nil
	})

	quiet := addTask(t, home, "--wake-on", "failed", "--target", "quiet", "--", "true")
	bgtask(t, home, "wait", quiet, "--timeout", "30s").must(t, 0, "wait of a quiet task")
	if inbox := strings.TrimSpace(bgtask(t, home, "inbox", "--target", "quiet", "--json").stdout); inbox != "" {
		t.Fatalf("the inbox of a task that succeeded with --wake-on failed: %s", inbox)
	}
}
