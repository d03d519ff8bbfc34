package workers_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/workers"
)

func placed(labels map[string]string) *engine.Placement { return &engine.Placement{Labels: labels} }

// spawner returns the worker that spawned a task.
func (b *bundle) spawner(t *testing.T, id string) string {
	t.Helper()
	for _, rec := range b.history(t, id) {
		if rec.Type == events.TypeSpawned {
			return rec.Writer
		}
	}
	return ""
}

// A task goes only to a worker whose labels match its placement; one that no worker
// matches stays armed, and is taken as soon as a worker that matches appears.
func TestWorkersTakeOnlyTasksTheirLabelsMatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startWorker(t, workers.Config{ID: "blue", Labels: map[string]string{"pool": "blue"}})
	b.startWorker(t, workers.Config{ID: "green", Labels: map[string]string{"pool": "green"}})

	red := b.arm(t, engine.Spec{Command: "true", Cwd: "/", Placement: placed(map[string]string{"pool": "red"})})
	var blues, greens []string
	for range 4 {
		blues = append(blues, b.arm(t, engine.Spec{Command: "true", Cwd: "/", Placement: placed(map[string]string{"pool": "blue"})}))
		greens = append(greens, b.arm(t, engine.Spec{Command: "true", Cwd: "/", Placement: placed(map[string]string{"pool": "green"})}))
	}
	for _, id := range blues {
		b.waitFor(t, id, 20*time.Second, "ended", ended)
		if got := b.spawner(t, id); got != "blue" {
			t.Errorf("task placed on pool=blue spawned by %q", got)
		}
	}
	for _, id := range greens {
		b.waitFor(t, id, 20*time.Second, "ended", ended)
		if got := b.spawner(t, id); got != "green" {
			t.Errorf("task placed on pool=green spawned by %q", got)
		}
	}
	// Every task armed after the red one has been placed, so the scheduler has
	// looked at the red one too: no worker may have taken it.
	st, err := engine.Load(context.Background(), b.store, red)
	if err != nil {
		t.Fatal(err)
	}
	if st.Phase != engine.PhaseArmed {
		t.Fatalf("task placed on pool=red is %s with no red worker, want armed", st.Phase)
	}

	b.startWorker(t, workers.Config{ID: "red", Labels: map[string]string{"pool": "red"}})
	b.waitFor(t, red, 20*time.Second, "ended", ended)
	if got := b.spawner(t, red); got != "red" {
		t.Errorf("task placed on pool=red spawned by %q", got)
	}
}

// Every worker has the host label, so a task placed on a host runs there.
func TestAWorkerHasItsHostLabel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	host, err := os.Hostname()
	if err != nil {
		t.Skip("no hostname:", err)
	}
	b.startWorker(t, workers.Config{ID: "other", Labels: map[string]string{"host": "elsewhere"}})
	b.startWorker(t, workers.Config{ID: "here"})
	id := b.arm(t, engine.Spec{Command: "true", Cwd: "/", Placement: placed(map[string]string{"host": host})})
	b.waitFor(t, id, 20*time.Second, "ended", ended)
	if got := b.spawner(t, id); got != "here" {
		t.Errorf("task placed on host=%s spawned by %q", host, got)
	}
}

// A draining worker takes no new task, watches its running one to the end, then is
// drained: its heartbeat is gone.
func TestADrainingWorkerFinishesItsRunsAndTakesNothingNew(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := b.startWorker(t, workers.Config{ID: "old", Labels: map[string]string{"pool": "p"}, TickInterval: 50 * time.Millisecond})
	dir := t.TempDir()
	gate := filepath.Join(dir, "go")
	first := b.arm(t, engine.Spec{
		Command: `while [ ! -e "$GATE" ]; do sleep 0.05; done; echo finished`,
		Env:     map[string]string{"GATE": gate}, Cwd: dir, Placement: placed(map[string]string{"pool": "p"}),
	})
	b.waitFor(t, first, 20*time.Second, "started", hasPID)

	w.Drain()
	second := b.arm(t, engine.Spec{Command: "true", Cwd: "/", Placement: placed(map[string]string{"pool": "p"})})
	// A new worker of the pool takes the new task: the draining one did not.
	b.startWorker(t, workers.Config{ID: "new", Labels: map[string]string{"pool": "p"}})
	b.waitFor(t, second, 20*time.Second, "ended", ended)
	if got := b.spawner(t, second); got != "new" {
		t.Errorf("task armed during the drain spawned by %q, want the new worker", got)
	}
	select {
	case <-w.Drained():
		t.Fatal("drained while a run was still going")
	default:
	}

	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	st := b.waitFor(t, first, 20*time.Second, "ended", ended)
	if st.Status != engine.StatusSucceeded {
		t.Errorf("run that drained: status %s (%s), want succeeded", st.Status, st.Reason)
	}
	select {
	case <-w.Drained():
	case <-time.After(20 * time.Second):
		t.Fatal("not drained after its last run ended")
	}
	liveness, err := events.ConnectLiveness(context.Background(), b.srv.JS)
	if err != nil {
		t.Fatal(err)
	}
	if alive, err := liveness.Alive(context.Background(), "old"); err != nil || alive {
		t.Errorf("drained worker's heartbeat: alive %v (%v), want removed", alive, err)
	}
}

// A worker started to drain watches the runs it left and takes nothing; with none
// it is drained at once.
func TestAWorkerStartedDrainingWithNoRunsIsDrainedAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := b.startWorker(t, workers.Config{ID: "idle", Drain: true})
	select {
	case <-w.Drained():
	case <-time.After(20 * time.Second):
		t.Fatal("an idle worker started with Drain is not drained")
	}
}

// With one slot, a target with a queue of tasks does not keep another target's task
// waiting behind its whole queue: targets take turns.
func TestABusyTargetDoesNotStarveAnother(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startWorker(t, workers.Config{ID: "single", MaxTasks: 1})
	dir := t.TempDir()
	gate := filepath.Join(dir, "go")
	first := b.arm(t, engine.Spec{
		Command: `while [ ! -e "$GATE" ]; do sleep 0.05; done`, Env: map[string]string{"GATE": gate},
		Cwd: dir, Target: "busy",
	})
	b.waitFor(t, first, 20*time.Second, "started", hasPID)
	var busy []string
	for range 4 {
		busy = append(busy, b.arm(t, engine.Spec{Command: "true", Cwd: "/", Target: "busy"}))
	}
	other := b.arm(t, engine.Spec{Command: "true", Cwd: "/", Target: "other"})
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	spawnSeq := func(id string) uint64 {
		b.waitFor(t, id, 30*time.Second, "ended", ended)
		for _, rec := range b.history(t, id) {
			if rec.Type == events.TypeSpawned {
				return rec.Seq
			}
		}
		t.Fatalf("task %s has no spawn", id)
		return 0
	}
	otherAt := spawnSeq(other)
	before := 0
	for _, id := range busy {
		if spawnSeq(id) < otherAt {
			before++
		}
	}
	if before > 0 {
		t.Errorf("%d of the busy target's queued tasks started before the other target's, want none: it was its turn", before)
	}
}
