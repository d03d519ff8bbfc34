package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

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
	}](t, bgtask(t, home, "wait", skipped, "--json", "--timeout", "30s").must(t, exitTaskFailed, "wait").stdout)
	if w.Status != engine.StatusSkipped || !strings.Contains(w.Reason, failed) {
		t.Fatalf("the task after a failed one: %+v", w)
	}
	if _, err := os.Stat(filepath.Join(dir, "must-not-run")); err == nil {
		t.Fatal("the skipped task's command ran")
	}
	if r := bgtask(t, home, "add", "--after", "01a00000-0000-7000-8000-000000000000", "--", "true"); r.code != exitUsage || !strings.Contains(r.stderr, "after") {
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
