package workers_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/workers"
)

// A command that kills its own shim takes only itself along (it dies with the
// shim); what it started in a session of its own would run on with parent 1. The
// worker finds those processes by the run's marker and stops them: the task is
// lost, and nothing of it runs.
func TestWhatADeadShimsCommandLeftIsStopped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startWorker(t, workers.Config{})
	dir := t.TempDir()
	id := b.arm(t, engine.Spec{
		Command: `setsid sleep 600 & echo $! > orphan; (trap "" TERM; exec setsid sleep 600) & echo $! > stubborn; ` +
			`while [ ! -s orphan ] || [ ! -s stubborn ]; do sleep 0.01; done; kill -9 $PPID; sleep 600`,
		Cwd: dir,
	})
	orphan, stubborn := readPID(t, filepath.Join(dir, "orphan")), readPID(t, filepath.Join(dir, "stubborn"))
	st := b.waitFor(t, id, 30*time.Second, "ended", ended)
	if st.Status != engine.StatusLost {
		t.Errorf("status %q, want lost", st.Status)
	}
	waitPIDsGone(t, 10*time.Second, orphan, stubborn)
}
