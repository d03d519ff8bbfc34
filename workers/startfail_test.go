package workers_test

import (
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/testkit"
	"github.com/bgtask/bgtask/workers"
)

// A command that cannot start is recorded failed before its run's directory goes:
// a worker that stops while the failure is not in the log yet finds the run again
// at its next start and records it then, rather than leave the task running with
// no PID and nothing on disk to settle it.
func TestAStartFailureNotRecordedBeforeTheWorkerStopsIsRecordedAfterItsRestart(t *testing.T) {
	testkit.FullOnly(t)
	t.Parallel()
	b := setup(t)
	state := t.TempDir()
	faulty := &faultyStore{Store: b.store}
	refused := make([]fault, 1000)
	faulty.inject(events.TypeFailed, refused...)
	first := startWorker(t, b.srv.Conn, b.srv.JS, faulty, workers.Config{ID: "stable", StateDir: state})
	id := b.arm(t, engine.Spec{Argv: []string{"/no/such/program"}, Cwd: t.TempDir()})
	testkit.Eventually(t, 20*time.Second, "the worker trying to record the failure", func() bool {
		faulty.mu.Lock()
		defer faulty.mu.Unlock()
		return len(faulty.faults[events.TypeFailed]) < len(refused)
	})
	first.Stop()
	if st := b.waitFor(t, id, time.Second, "running", func(s engine.State) bool { return s.Phase == engine.PhaseRunning }); st.PID != 0 {
		t.Fatalf("the task has PID %d, want none: its command never started", st.PID)
	}

	b.startWorker(t, workers.Config{ID: "stable", StateDir: state})
	st := b.waitFor(t, id, 20*time.Second, "ended", ended)
	if st.Status != engine.StatusFailed || st.Reason == "" {
		t.Fatalf("ended %s (%q), want failed with the start error", st.Status, st.Reason)
	}
}
