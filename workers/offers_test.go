package workers_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/workers"
)

// An exclusive worker is kept for the tasks placed on its labels: a task with no
// placement, or placed on its host only, waits for another worker; one placed on
// its pool runs there.
func TestAnExclusiveWorkerTakesOnlyTasksPlacedOnItsLabels(t *testing.T) {
	t.Parallel()
	b := setup(t)
	host, err := os.Hostname()
	if err != nil {
		t.Skip("no hostname:", err)
	}
	b.startWorker(t, workers.Config{ID: "gpu", Labels: map[string]string{"pool": "gpu"}, Exclusive: true})

	unplaced := b.arm(t, engine.Spec{Command: "true", Cwd: "/"})
	onHost := b.arm(t, engine.Spec{Command: "true", Cwd: "/", Placement: placed(map[string]string{"host": host})})
	gpu := b.arm(t, engine.Spec{Command: "true", Cwd: "/", Placement: placed(map[string]string{"pool": "gpu"})})
	b.waitFor(t, gpu, 20*time.Second, "ended", ended)
	if got := b.spawner(t, gpu); got != "gpu" {
		t.Errorf("task placed on pool=gpu spawned by %q, want the gpu worker", got)
	}
	// The gpu task was armed last and has been placed, so the scheduler has looked
	// at the others too: the exclusive worker took neither.
	for _, id := range []string{unplaced, onHost} {
		st, err := engine.Load(context.Background(), b.store, id)
		if err != nil {
			t.Fatal(err)
		}
		if st.Phase != engine.PhaseArmed {
			t.Fatalf("task %s is %s with only an exclusive pool=gpu worker, want armed", id, st.Phase)
		}
	}

	// Its heartbeat says so, and the scheduler offers it no other task.
	liveness, err := events.ConnectLiveness(context.Background(), b.srv.JS)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	current, _, err := liveness.Watch(ctx)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	if len(current) != 1 || !current[0].Info.Exclusive {
		t.Fatalf("heartbeats %+v, want the gpu worker's, exclusive", current)
	}

	b.startWorker(t, workers.Config{ID: "shared", Labels: map[string]string{"pool": "gpu"}})
	for _, id := range []string{unplaced, onHost} {
		b.waitFor(t, id, 20*time.Second, "ended", ended)
		if got := b.spawner(t, id); got != "shared" {
			t.Errorf("task %s spawned by %q, want the shared worker", id, got)
		}
	}
}

// An exclusive worker with no label but host would be kept for nothing: it does
// not start.
func TestAnExclusiveWorkerNeedsALabel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := workers.New(b.srv.Conn, b.srv.JS, b.store, workers.Config{
		ID: "bare", StateDir: t.TempDir(), Labels: map[string]string{"host": "h"}, Exclusive: true,
	})
	err := w.Start(context.Background())
	if err == nil {
		w.Stop()
		t.Fatal("an exclusive worker with only the host label started")
	}
	if want := "--exclusive"; !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not name %s", err, want)
	}
}
