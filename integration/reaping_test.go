package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// In the all-in-one server the engine's exec sinks are children of the process
// that also runs the worker and reaps its shims. Each sink program runs once per
// wake-up: a reap of the shims that took a sink's child made os/exec's wait fail
// for a program that had done its work, and the push was tried again.
func TestEachExecSinkRunsOnceBesideTheWorkersShims(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home)
	nc, _ := connect(t, home)
	log := openLog(t, home)
	runs := filepath.Join(t.TempDir(), "runs")
	const tasks = 60
	var ids []string
	for range tasks {
		ids = append(ids, register(t, nc, map[string]any{
			"command": "true",
			"policy":  "immediate",
			"deliver": []map[string]any{{"type": "exec", "argv": []string{"/bin/sh", "-c", `echo "$BGTASK_TASK_ID" >> "$0"`, runs}}},
		}))
	}
	for _, id := range ids {
		log.waitSinksDone(t, id, 1)
	}
	data, err := os.ReadFile(runs)
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, id := range strings.Fields(string(data)) {
		count[id]++
	}
	var doubled []string
	for _, id := range ids {
		if count[id] != 1 {
			doubled = append(doubled, id)
		}
	}
	if len(doubled) > 0 {
		t.Fatalf("%d of %d tasks had their sink program run other than once (%d runs in all): %v", len(doubled), tasks, len(strings.Fields(string(data))), doubled)
	}
}
