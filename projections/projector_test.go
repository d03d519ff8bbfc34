package projections_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/events/eventstest"
	"github.com/bgtask/bgtask/projections"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// writer appends through the engine's decisions, as the real writers do.
type writer struct {
	t     *testing.T
	store *events.JetStreamStore
}

func (w writer) do(s engine.State, c engine.Command, who string) engine.State {
	w.t.Helper()
	ev, err := engine.Decide(s, c, engine.Meta{Writer: who, Now: time.Now()})
	if err != nil {
		w.t.Fatal(err)
	}
	seq, err := w.store.Append(context.Background(), ev, s.Seq)
	if err != nil {
		w.t.Fatal(err)
	}
	next, err := engine.Apply(s, events.Record{Seq: seq, Event: ev})
	if err != nil {
		w.t.Fatal(err)
	}
	return next
}

func (w writer) arm(command string) engine.State {
	spec := engine.Spec{Command: command, Target: engine.DefaultTarget}
	id, err := engine.TaskID(spec)
	if err != nil {
		w.t.Fatal(err)
	}
	return w.do(engine.State{ID: id}, engine.Arm{Spec: spec}, "engine")
}

func (w writer) run(s engine.State, exit int) engine.State {
	s = w.do(s, engine.Spawn{Host: "h"}, "w1")
	s = w.do(s, engine.Tick{PID: 42}, "w1")
	return w.do(s, engine.Exit{Run: events.Exited{ExitCode: exit, Tail: []string{"out"}, StartedAt: time.Now(), EndedAt: time.Now()}}, "w1")
}

func TestReplayedStateEqualsLiveState(t *testing.T) {
	t.Parallel()
	srv := eventstest.Run(t)
	ctx := context.Background()
	store, err := events.OpenStore(ctx, srv.JS, events.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var notified []engine.Phase
	live := projections.New(store, func(s engine.State, _ events.Record) {
		mu.Lock()
		notified = append(notified, s.Phase)
		mu.Unlock()
	}, engine.Base{})
	if err := live.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer live.Stop()

	w := writer{t: t, store: store}
	fired := w.run(w.arm("echo a"), 0)
	fired = w.do(fired, engine.PersistCompletion{}, "engine")
	fired = w.do(fired, engine.Fire{InboxSeq: 1}, "engine")
	w.run(w.arm("exit 1"), 1)
	w.do(w.arm("sleep 1"), engine.Cancel{Reason: "test"}, "engine")
	w.arm("still armed")
	// A corrupt message and an event that does not fit its task are skipped, not fatal.
	if _, err := srv.JS.Publish(ctx, events.TaskSubject(fired.ID, events.TypeTick), []byte("{broken")); err != nil {
		t.Fatal(err)
	}
	stray, err := events.New(fired.ID, "intruder", 9, time.Now(), &events.Tick{})
	if err != nil {
		t.Fatal(err)
	}
	strayJSON, err := json.Marshal(stray)
	if err != nil {
		t.Fatal(err)
	}
	// Published around the store, as a hostile or buggy client could.
	if _, err := srv.JS.Publish(ctx, events.TaskSubject(fired.ID, events.TypeTick), strayJSON); err != nil {
		t.Fatal(err)
	}
	last, err := store.LastSeq(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := live.WaitFor(ctx, last); err != nil {
		t.Fatal(err)
	}

	replayed := projections.New(store, nil, engine.Base{})
	if err := replayed.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer replayed.Stop()

	liveTasks, liveTotal := live.List(engine.ListQuery{})
	replayTasks, replayTotal := replayed.List(engine.ListQuery{})
	if liveTotal != 4 || replayTotal != 4 {
		t.Fatalf("tasks: live %d, replayed %d, want 4", liveTotal, replayTotal)
	}
	if !reflect.DeepEqual(liveTasks, replayTasks) {
		t.Fatalf("replayed state differs from live state:\nlive:     %+v\nreplayed: %+v", liveTasks, replayTasks)
	}
	for _, p := range []*projections.Projector{live, replayed} {
		if _, n := p.Problems(); n != 2 {
			t.Fatalf("problems = %d, want the corrupt event and the stray tick", n)
		}
	}
	if s, _ := replayed.Task(fired.ID); s.Phase != engine.PhaseFired || s.Status != engine.StatusSucceeded || s.PID != 42 {
		t.Fatalf("fired task replayed as %+v", s)
	}
	counts := map[engine.Phase]int{}
	for _, s := range replayTasks {
		counts[s.Phase]++
	}
	if want := map[engine.Phase]int{engine.PhaseFired: 1, engine.PhaseEnded: 1, engine.PhaseCancelled: 1, engine.PhaseArmed: 1}; !reflect.DeepEqual(counts, want) {
		t.Fatalf("phases = %v, want %v", counts, want)
	}
	if armed, total := replayed.List(engine.ListQuery{Phase: engine.PhaseArmed, Limit: 10}); total != 1 || len(armed) != 1 {
		t.Fatalf("list of armed tasks: %d of %d", len(armed), total)
	}
	// Each phase lists its own tasks, whether its tasks are indexed (unfinished) or
	// not, live as after a replay.
	for _, p := range []*projections.Projector{live, replayed} {
		for _, phase := range []engine.Phase{engine.PhaseArmed, engine.PhaseRunning, engine.PhaseEnded, engine.PhaseFired, engine.PhaseCancelled} {
			tasks, total := p.List(engine.ListQuery{Phase: phase})
			if total != counts[phase] || len(tasks) != total {
				t.Errorf("list of %s tasks: %d of %d, want %d", phase, len(tasks), total, counts[phase])
			}
			for _, s := range tasks {
				if s.Phase != phase {
					t.Errorf("list of %s tasks holds %s in %s", phase, s.ID, s.Phase)
				}
			}
		}
	}
	if page, total := replayed.List(engine.ListQuery{Limit: 2}); len(page) != 2 || total != 4 {
		t.Fatalf("limit 2: got %d of %d", len(page), total)
	}
	mu.Lock()
	defer mu.Unlock()
	// The live projector notified every event it applied, and no skipped one.
	if len(notified) != int(last)-2 {
		t.Fatalf("notified %d times, want %d (every valid event)", len(notified), last-2)
	}
}

func TestStartReturnsOnlyWhenTheWholeStreamIsApplied(t *testing.T) {
	t.Parallel()
	srv := eventstest.Run(t)
	ctx := context.Background()
	store, err := events.OpenStore(ctx, srv.JS, events.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	w := writer{t: t, store: store}
	for range 500 {
		w.arm("true")
	}
	notifications := 0
	p := projections.New(store, func(engine.State, events.Record) { notifications++ }, engine.Base{})
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	if _, total := p.List(engine.ListQuery{}); total != 500 {
		t.Fatalf("after Start: %d tasks, want 500", total)
	}
	if notifications != 0 {
		t.Fatalf("replay notified %d times; only live events notify", notifications)
	}
	if got := p.Applied(); got != 500 {
		t.Fatalf("applied = %d, want 500", got)
	}
}

func TestWaitForReturnsWhenItsEventIsApplied(t *testing.T) {
	t.Parallel()
	srv := eventstest.Run(t)
	ctx := context.Background()
	store, err := events.OpenStore(ctx, srv.JS, events.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	p := projections.New(store, nil, engine.Base{})
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 2)
	for _, seq := range []uint64{3, 2} {
		go func() {
			err := p.WaitFor(ctx, seq)
			if err == nil && p.Applied() < seq {
				err = fmt.Errorf("WaitFor(%d) returned at %d", seq, p.Applied())
			}
			waited <- err
		}()
	}
	w := writer{t: t, store: store}
	for range 3 {
		w.arm("true")
	}
	for range 2 {
		if err := <-waited; err != nil {
			t.Fatal(err)
		}
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := p.WaitFor(cancelled, 100); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitFor with a cancelled context: %v", err)
	}
	p.Stop()
	if err := p.WaitFor(ctx, 100); err == nil {
		t.Fatal("WaitFor on a stopped projector returned nil")
	}
}

// historyCounter counts the history reads of a settled task's whole state.
type historyCounter struct {
	*events.JetStreamStore
	reads atomic.Int32
}

func (h *historyCounter) ReadHistory(ctx context.Context, id string, n int, fn func(events.Record, error)) error {
	h.reads.Add(1)
	return h.JetStreamStore.ReadHistory(ctx, id, n, fn)
}

// A settled task's outcome (what a task waiting for it reads) comes from its
// summary, with no read of its history; its whole state takes one.
func TestASettledTasksOutcomeReadsNoHistory(t *testing.T) {
	t.Parallel()
	srv := eventstest.Run(t)
	ctx := context.Background()
	store, err := events.OpenStore(ctx, srv.JS, events.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	log := &historyCounter{JetStreamStore: store}
	p := projections.New(log, nil, engine.Base{})
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	w := writer{t: t, store: store}
	fired := w.run(w.arm("exit 3"), 3)
	fired = w.do(fired, engine.PersistCompletion{}, "engine")
	fired = w.do(fired, engine.Fire{InboxSeq: 1}, "engine")
	if err := p.WaitFor(ctx, fired.Seq); err != nil {
		t.Fatal(err)
	}
	got, ok := p.Outcome(fired.ID)
	if !ok || got.Phase != engine.PhaseFired || got.Status != fired.Status || got.Run == nil || got.Run.ExitCode != 3 {
		t.Fatalf("outcome %+v, want fired %s with exit code 3", got, fired.Status)
	}
	if n := log.reads.Load(); n != 0 {
		t.Fatalf("the outcome read the history %d times", n)
	}
	if _, ok := p.Task(fired.ID); !ok || log.reads.Load() != 1 {
		t.Fatalf("the whole state read the history %d times, want 1", log.reads.Load())
	}
}

// A settled task is kept as its summary; asked for by id, it comes whole, folded
// from its history in the stream, as the writer folded it.
func TestASettledTaskIsReadWholeByID(t *testing.T) {
	t.Parallel()
	srv := eventstest.Run(t)
	ctx := context.Background()
	store, err := events.OpenStore(ctx, srv.JS, events.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	p := projections.New(store, nil, engine.Base{})
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	w := writer{t: t, store: store}
	fired := w.run(w.arm("echo whole"), 3)
	fired = w.do(fired, engine.PersistCompletion{}, "engine")
	fired = w.do(fired, engine.Fire{InboxSeq: 1}, "engine")
	if err := p.WaitFor(ctx, fired.Seq); err != nil {
		t.Fatal(err)
	}
	got, ok := p.Task(fired.ID)
	if !ok || !reflect.DeepEqual(got, fired) {
		t.Fatalf("task by id:\n%+v\nwant\n%+v", got, fired)
	}
	listed, _ := p.List(engine.ListQuery{})
	if len(listed) != 1 || listed[0].Wakeup != nil || listed[0].Run == nil || listed[0].Run.ExitCode != 3 || listed[0].Seq != fired.Seq {
		t.Fatalf("listed as %+v, want its summary", listed)
	}
}

// MatchIDs finds tasks whatever they are kept as: whole, settled or archived.
func TestMatchIDsFindsEveryTask(t *testing.T) {
	t.Parallel()
	srv := eventstest.Run(t)
	ctx := context.Background()
	store, err := events.OpenStore(ctx, srv.JS, events.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	p := projections.New(store, nil, engine.Base{})
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	w := writer{t: t, store: store}
	armed := w.arm("sleep 1")
	cancelled := w.do(w.arm("sleep 2"), engine.Cancel{Reason: "test"}, "engine")
	archived := w.do(w.do(w.arm("sleep 3"), engine.Cancel{Reason: "test"}, "engine"), engine.Archive{Seq: 7}, "engine")
	if err := p.WaitFor(ctx, archived.Seq); err != nil {
		t.Fatal(err)
	}
	want := []string{armed.ID, cancelled.ID, archived.ID}
	slices.Sort(want)
	all := func(string) bool { return true }
	if ids, n := p.MatchIDs(all, 10); !slices.Equal(ids, want) || n != 3 {
		t.Errorf("every id: %v (%d), want %v", ids, n, want)
	}
	if ids, n := p.MatchIDs(all, 2); !slices.Equal(ids, want[:2]) || n != 3 {
		t.Errorf("the first 2 ids: %v (%d), want %v of 3", ids, n, want[:2])
	}
	for _, id := range want {
		if ids, n := p.MatchIDs(func(got string) bool { return got == id }, 10); n != 1 || ids[0] != id {
			t.Errorf("%s: found %v (%d)", id, ids, n)
		}
	}
}
