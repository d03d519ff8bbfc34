//go:build linux && !bgtask_portable

package workers_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/testkit"
	"github.com/bgtask/bgtask/workers"
)

// What a command leaves running when it exits (a background process in its group,
// one in a session of its own, one that ignores TERM) is stopped by its shim after
// the exit is recorded: TERM, then KILL after the grace.
func TestTheShimStopsWhatACommandLeftBehind(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startWorker(t, workers.Config{})
	dir := t.TempDir()
	id := b.arm(t, engine.Spec{
		Command: `sleep 600 & echo $! > group; setsid sleep 600 & echo $! > session; ` +
			`setsid bash -c 'trap "" TERM; exec sleep 600' & echo $! > stubborn; exit 3`,
		Cwd: dir,
	})
	var left []int
	for _, name := range []string{"group", "session", "stubborn"} {
		pid := readPID(t, filepath.Join(dir, name))
		t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
		left = append(left, pid)
	}
	if st := b.waitFor(t, id, 20*time.Second, "ended", ended); st.Run == nil || st.Run.ExitCode != 3 {
		t.Fatalf("ended %s (%q), want exit 3", st.Status, st.Reason)
	}
	waitPIDsGone(t, 10*time.Second, left...)
}

// A shim killed once it recorded the command's PID leaves the command running,
// the child of its worker now (a subreaper): the worker records the command's
// exit when it ends, as the shim would have, and then stops what it left running.
func TestACommandOutlivesItsKilledShimAndItsExitIsRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	state := t.TempDir()
	b.startWorker(t, workers.Config{StateDir: state})
	dir := t.TempDir()
	id := b.arm(t, engine.Spec{Command: `sleep 600 & echo $! > left; while [ ! -e go ]; do sleep 0.02; done; echo done; exit 7`, Cwd: dir})
	var pids runPIDs
	testkit.Eventually(t, 10*time.Second, "the run's pid.json", func() bool {
		runs, _ := filepath.Glob(filepath.Join(state, "runs", "*"))
		for _, run := range runs {
			if p, err := readRunPIDs(run); err == nil {
				pids = p
				return true
			}
		}
		return false
	})
	left := readPID(t, filepath.Join(dir, "left"))
	if err := syscall.Kill(pids.Shim.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitPIDsGone(t, 10*time.Second, pids.Shim.PID)
	if !alive(pids.Command.PID) {
		t.Fatalf("the command %d died with its shim", pids.Command.PID)
	}
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	st := b.waitFor(t, id, 20*time.Second, "ended", ended)
	if st.Status != engine.StatusFailed || st.Run == nil || st.Run.ExitCode != 7 {
		t.Fatalf("ended %s (%q), run %+v; want failed with the command's exit code 7", st.Status, st.Reason, st.Run)
	}
	if tail := st.Run.Tail; len(tail) == 0 || tail[len(tail)-1] != "done" {
		t.Fatalf("tail %q, want the command's output to its end", tail)
	}
	n := map[events.Type]int{}
	for _, rec := range b.history(t, id) {
		n[rec.Type]++
	}
	if n[events.TypeExited] != 1 || n[events.TypeLost] != 0 {
		t.Fatalf("history %v, want one exited and no lost", n)
	}
	waitPIDsGone(t, 10*time.Second, left)
}
