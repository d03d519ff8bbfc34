package engine_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// taskList is a fixed set of tasks, as the projector would list them.
type taskList struct {
	mu      sync.Mutex
	tasks   []engine.State
	armed   int // List calls for the armed tasks
	running int // and for the running ones
	reads   int // Task calls: a settled task's would read its history
}

func (l *taskList) Task(id string) (engine.State, bool) {
	l.mu.Lock()
	l.reads++
	l.mu.Unlock()
	return l.Outcome(id)
}

func (l *taskList) Outcome(id string) (engine.State, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.tasks {
		if s.ID == id {
			return s, true
		}
	}
	return engine.State{}, false
}

func (l *taskList) List(q engine.ListQuery) ([]engine.State, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch q.Phase {
	case engine.PhaseArmed:
		l.armed++
	case engine.PhaseRunning:
		l.running++
	}
	var out []engine.State
	for _, s := range l.tasks {
		if q.Phase == "" || s.Phase == q.Phase {
			out = append(out, s)
		}
	}
	return out, len(out)
}

func (l *taskList) EachUnfinished(phase engine.Phase, f func(*engine.State)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range l.tasks {
		if l.tasks[i].Phase == phase {
			f(&l.tasks[i])
		}
	}
}

func (l *taskList) armedLists() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.armed
}

// fleet is a worker feed with a fixed set of workers.
type fleet struct{ workers []events.WorkerInfo }

func (f fleet) Watch(ctx context.Context) ([]events.WorkerUpdate, <-chan events.WorkerUpdate, error) {
	var current []events.WorkerUpdate
	for _, w := range f.workers {
		current = append(current, events.WorkerUpdate{ID: w.ID, Info: w, At: time.Now()})
	}
	updates := make(chan events.WorkerUpdate)
	context.AfterFunc(ctx, func() { close(updates) })
	return current, updates, nil
}

func (fleet) TTL() time.Duration { return time.Hour }

func armedTask(id string, at time.Time, labels map[string]string) engine.State {
	s := engine.State{ID: id, Phase: engine.PhaseArmed, ArmedAt: at, Spec: engine.Spec{Command: "true", Target: engine.DefaultTarget}}
	if labels != nil {
		s.Spec.Placement = &engine.Placement{Labels: labels}
	}
	return s
}

// startScheduler starts a scheduler whose offers are sent on the returned channel
// and stay unanswered until the test ends.
func startScheduler(t *testing.T, tasks *taskList, f fleet) (*engine.Scheduler, <-chan events.Offer) {
	t.Helper()
	offers := make(chan events.Offer, 10)
	s := engine.NewScheduler(tasks, f, func(ctx context.Context, _ string, o events.Offer) (events.OfferReply, error) {
		offers <- o
		<-ctx.Done()
		return events.OfferReply{}, ctx.Err()
	}, engine.Base{})
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s, offers
}

func TestSchedulerWithoutWorkersSaysWhyAndDoesNotReadTheWaitingTasks(t *testing.T) {
	t.Parallel()
	tasks := &taskList{tasks: []engine.State{armedTask("a", t0, nil), armedTask("b", t0.Add(time.Second), map[string]string{"pool": "red"})}}
	s, _ := startScheduler(t, tasks, fleet{})
	if got := s.Waiting(tasks.tasks[0]); got != "waiting for a worker: no worker is connected" {
		t.Errorf("Waiting(a) = %q", got)
	}
	if got := s.Waiting(tasks.tasks[1]); got != "waiting for a worker with pool=red: no worker is connected" {
		t.Errorf("Waiting(b) = %q", got)
	}
	// Registrations ask for passes; with no slot anywhere, none lists the waiting tasks.
	for range 3 {
		s.Notify(tasks.tasks[0])
	}
	if n := tasks.armedLists(); n != 0 {
		t.Errorf("the armed tasks were listed %d times with no worker to take them", n)
	}
}

// A worker's running tasks fill its slots, and a pass counts them where they
// are: it lists (copies) none of them.
func TestSchedulerCountsTheRunningTasksInPlace(t *testing.T) {
	t.Parallel()
	running := armedTask("running", t0, nil)
	running.Phase, running.Worker = engine.PhaseRunning, "w1"
	tasks := &taskList{tasks: []engine.State{running, armedTask("older", t0, nil), armedTask("newer", t0.Add(time.Second), nil)}}
	w := events.WorkerInfo{ID: "w1", State: events.WorkerReady, MaxTasks: 2}
	s, offers := startScheduler(t, tasks, fleet{workers: []events.WorkerInfo{w}})
	if o := <-offers; o.TaskID != "older" {
		t.Fatalf("offered %s first, want the older task", o.TaskID)
	}
	if got, want := s.Waiting(tasks.tasks[2]), "waiting for a free slot: the 1 worker that can take it is at capacity"; got != want {
		t.Errorf("Waiting(newer) = %q, want %q", got, want)
	}
	tasks.mu.Lock()
	defer tasks.mu.Unlock()
	if tasks.running != 0 {
		t.Errorf("the running tasks were listed %d times", tasks.running)
	}
}

func TestSchedulerOffersTheOldestTaskAndSaysWhyTheOthersWait(t *testing.T) {
	t.Parallel()
	tasks := &taskList{tasks: []engine.State{
		armedTask("newer", t0.Add(time.Second), nil),
		armedTask("older", t0, nil),
		armedTask("red", t0, map[string]string{"pool": "red"}),
	}}
	w := events.WorkerInfo{ID: "w1", Labels: map[string]string{"host": "h1"}, State: events.WorkerReady, MaxTasks: 1}
	s, offers := startScheduler(t, tasks, fleet{workers: []events.WorkerInfo{w}})
	if o := <-offers; o.TaskID != "older" {
		t.Fatalf("offered %s first, want the older task", o.TaskID)
	}
	want := map[string]string{
		"older": "being offered to worker w1",
		"newer": "waiting for a free slot: the 1 worker that can take it is at capacity",
		"red":   "waiting for a worker with pool=red: no live worker has these labels",
	}
	for _, st := range tasks.tasks {
		if got := s.Waiting(st); got != want[st.ID] {
			t.Errorf("Waiting(%s) = %q, want %q", st.ID, got, want[st.ID])
		}
	}
	running := tasks.tasks[1]
	running.Phase = engine.PhaseRunning
	if got := s.Waiting(running); got != "" {
		t.Errorf("Waiting of a running task = %q, want none", got)
	}
}

// A delayed start is offered at its time, not before, and a timer never: a task
// offered early would only be declined, one at its time needs no periodic pass.
func TestSchedulerOffersADelayedStartAtItsTimeAndNeverATimer(t *testing.T) {
	t.Parallel()
	start := time.Now().Add(1500 * time.Millisecond)
	delayed := armedTask("delayed", t0, nil)
	delayed.Spec.StartAt = start.Format(time.RFC3339Nano)
	timer := engine.State{ID: "timer", Phase: engine.PhaseArmed, ArmedAt: t0,
		Spec: engine.Spec{StartAt: time.Now().Add(-time.Second).Format(time.RFC3339Nano), Target: engine.DefaultTarget}}
	tasks := &taskList{tasks: []engine.State{timer, delayed}}
	w := events.WorkerInfo{ID: "w1", State: events.WorkerReady, MaxTasks: 4}
	s, offers := startScheduler(t, tasks, fleet{workers: []events.WorkerInfo{w}})
	if got := s.Waiting(delayed); got != "starts at "+start.UTC().Format(time.RFC3339) {
		t.Errorf("Waiting(delayed) = %q", got)
	}
	o := <-offers
	if late := time.Since(start); o.TaskID != "delayed" || late < 0 {
		t.Fatalf("offered %s %v after its start, want the delayed task at its start", o.TaskID, late)
	}
	select {
	case o := <-offers:
		t.Fatalf("offered %s too", o.TaskID)
	default:
	}
}

// A task waiting for a dependency that ended is offered, its dependency read as
// an outcome: a pass reads no history of a settled task.
func TestSchedulerReadsDependenciesAsOutcomes(t *testing.T) {
	t.Parallel()
	dep := engine.State{ID: "dep", Phase: engine.PhaseFired, Status: engine.StatusSucceeded, ArmedAt: t0}
	waiting := armedTask("after", t0, nil)
	waiting.Spec.After = []string{"dep"}
	tasks := &taskList{tasks: []engine.State{dep, waiting}}
	w := events.WorkerInfo{ID: "w1", Labels: map[string]string{"host": "h1"}, State: events.WorkerReady, MaxTasks: 1}
	s, offers := startScheduler(t, tasks, fleet{workers: []events.WorkerInfo{w}})
	if o := <-offers; o.TaskID != "after" {
		t.Fatalf("offered %s, want the task whose dependency ended", o.TaskID)
	}
	_ = s.Waiting(waiting)
	tasks.mu.Lock()
	defer tasks.mu.Unlock()
	if tasks.reads != 0 {
		t.Fatalf("the scheduler read %d tasks whole for their dependents", tasks.reads)
	}
}
