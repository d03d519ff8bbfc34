package workers_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/workers"
)

// A command that kills its own shim runs on, and what it started in sessions of
// its own (setsid) would outlive it, with no shim to stop them. Where the worker
// adopts the command (a subreaper), it records the command's exit and then stops
// them; where it cannot, the run is lost and they are stopped too. The worker
// finds them by the run's marker, one that ignores TERM too.
func TestWhatADeadShimsCommandLeftIsStopped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	state := t.TempDir()
	b.startWorker(t, workers.Config{StateDir: state})
	dir := t.TempDir()
	id := b.arm(t, engine.Spec{
		Command: `setsid sleep 600 & echo $! > orphan; (trap "" TERM; exec setsid sleep 600) & echo $! > stubborn; ` +
			`while [ ! -s orphan ] || [ ! -s stubborn ] || [ ! -e ` + state + `/runs/$BGTASK_RUN/pid.json ]; do sleep 0.01; done; ` +
			`kill -9 $PPID; exit 3`,
		Cwd: dir,
	})
	orphan, stubborn := readPID(t, filepath.Join(dir, "orphan")), readPID(t, filepath.Join(dir, "stubborn"))
	st := b.waitFor(t, id, 30*time.Second, "ended", ended)
	switch {
	case !workers.CanAdopt && st.Status != engine.StatusLost:
		t.Errorf("status %q, want lost: no worker here learns a dead shim's command's exit", st.Status)
	case workers.CanAdopt && (st.Status != engine.StatusFailed || st.Run == nil || st.Run.ExitCode != 3):
		t.Errorf("status %q, run %+v; want failed with the command's exit code 3", st.Status, st.Run)
	}
	waitPIDsGone(t, 10*time.Second, orphan, stubborn)
}
