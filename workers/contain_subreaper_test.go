//go:build linux && !bgtask_portable

package workers_test

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
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
