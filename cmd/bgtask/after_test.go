package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine"
)

// A task added --after another starts once it has ended; one after a task that
// failed is skipped, naming it, and its command never runs; one after a task that
// does not exist is refused.
func TestAfterWaitsForItsDependencyOrIsSkipped(t *testing.T) {
	home, dir := t.TempDir(), t.TempDir()
	startServer(t, home)
	first := addTask(t, home, "--cwd", dir, "--", "sleep 1; date +%s%N > first")
	second := addTask(t, home, "--cwd", dir, "--after", first, "--", "date +%s%N > second")
	bgtask(t, home, "wait", second, "--timeout", "30s").must(t, 0, "wait")
	ended, started := readNanos(t, filepath.Join(dir, "first")), readNanos(t, filepath.Join(dir, "second"))
	if started <= ended {
		t.Fatalf("the dependent started at %d, before its dependency ended at %d", started, ended)
	}

	failed := addTask(t, home, "--cwd", dir, "--", "exit 4")
	skipped := addTask(t, home, "--cwd", dir, "--after", failed, "--", "touch must-not-run")
	w := decode[struct {
		Status string `json:"status"`
		Reason string `json:"reason"`
	}](t, bgtask(t, home, "wait", skipped, "--json", "--timeout", "30s").must(t, client.ExitTaskFailed, "wait").stdout)
	if w.Status != engine.StatusSkipped || !strings.Contains(w.Reason, failed) {
		t.Fatalf("the task after a failed one: %+v", w)
	}
	if _, err := os.Stat(filepath.Join(dir, "must-not-run")); err == nil {
		t.Fatal("the skipped task's command ran")
	}
	if r := bgtask(t, home, "add", "--after", "01a00000-0000-7000-8000-000000000000", "--", "true"); r.code != client.ExitUsage || !strings.Contains(r.stderr, "after") {
		t.Fatalf("add after no task: exit %d, %s", r.code, r.stderr)
	}
}

func readNanos(t *testing.T, path string) int64 {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Members that wake nobody, and a join of them that wakes its target once,
// listing both. A member failed, so the join failed: a wait on it exits as a
// failure, and a join that wakes only on success ends quietly.
func TestAJoinWakesItsTargetOnceForItsMembers(t *testing.T) {
	home := t.TempDir()
	startServer(t, home)
	a := addTask(t, home, "--target", "group", "--wake-on", "none", "--", "true")
	b := addTask(t, home, "--target", "group", "--wake-on", "none", "--", "exit 5")
	j := decode[struct{ ID string }](t, bgtask(t, home, "join", "--all", a, b, "--target", "group", "--json").must(t, 0, "join").stdout).ID
	out := bgtask(t, home, "wait", j, "--json", "--timeout", "30s").must(t, client.ExitTaskFailed, "wait").stdout
	if !strings.Contains(out, a) || !strings.Contains(out, b) || !strings.Contains(out, `"exit_code": 5`) ||
		!strings.Contains(out, `"status": "failed"`) || !strings.Contains(out, "1 of 2 members did not succeed: "+b+" failed (exit code 5)") {
		t.Fatalf("the join's wake-up: %s", out)
	}
	quiet := decode[struct{ ID string }](t, bgtask(t, home, "join", "--all", a, b, "--target", "group", "--wake-on", "succeeded", "--json").must(t, 0, "join --wake-on").stdout).ID
	bgtask(t, home, "wait", quiet, "--timeout", "30s").must(t, client.ExitTaskFailed, "wait on the quiet join")
	inbox := strings.TrimSpace(bgtask(t, home, "inbox", "--target", "group", "--json").stdout)
	if n := strings.Count(inbox, "\n") + 1; inbox == "" || n != 1 || !strings.Contains(inbox, j) {
		t.Fatalf("the group's inbox: %s; want the first join's wake-up alone", inbox)
	}
	if r := bgtask(t, home, "join", a); r.code != client.ExitUsage {
		t.Fatalf("join with neither --all nor --any: exit %d", r.code)
	}
}
