package engine_test

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/projections"
)

func TestAnArchivedTaskReplaysToItsSummaryWithOrWithoutItsHistory(t *testing.T) {
	t.Parallel()
	f := build(t, engine.PhaseFired)
	fired := f.state
	f.do(engineWriter, engine.Archive{Seq: 12})
	want := engine.State{
		ID: taskID, Phase: engine.PhaseArchived, ArchivedFrom: engine.PhaseFired, Status: engine.StatusSucceeded,
		Spec:    engine.Spec{Command: fired.Spec.CommandLine(), Kind: fired.Spec.Kind, Target: fired.Spec.Target},
		ArmedAt: fired.ArmedAt, EndedAt: fired.EndedAt, FiredAt: fired.FiredAt, ArchiveSeq: 12,
		Seq: f.seq, LastType: events.TypeArchived, Events: fired.Events + 1,
	}
	if !reflect.DeepEqual(f.state, want) {
		t.Fatalf("archived state:\n got %+v\nwant %+v", f.state, want)
	}
	// Compacted, the stream holds the archived event alone: the same state.
	compacted, problems := engine.Replay(f.history[len(f.history)-1:])
	if len(problems) > 0 || !reflect.DeepEqual(compacted, f.state) {
		t.Fatalf("replay of the compacted history: %+v %v", compacted, problems)
	}
	if !f.state.Phase.Terminal() {
		t.Fatal("archived is not terminal")
	}
}

func TestOnlyAFinishedTaskIsArchived(t *testing.T) {
	t.Parallel()
	for _, at := range []engine.Phase{engine.PhaseArmed, engine.PhaseRunning, engine.PhaseEnded, engine.PhasePersisted} {
		f := build(t, at)
		if _, err := engine.Decide(f.state, engine.Archive{Seq: 1}, engine.Meta{Writer: engineWriter, Now: f.now}); !errors.Is(err, engine.ErrWrongPhase) {
			t.Errorf("archive in phase %s: %v", at, err)
		}
		if err := f.record(f.event(engineWriter, 0, &events.Archived{ArchiveSeq: 1})); err == nil {
			t.Errorf("an archived event in phase %s was applied", at)
		}
	}
	// A fired task whose push is still retrying is not finished.
	pushing := fired(t, "pushing", hookSpec)
	if _, err := engine.Decide(pushing.state, engine.Archive{Seq: 1}, engine.Meta{Writer: engineWriter, Now: pushing.now}); !errors.Is(err, engine.ErrWrongPhase) {
		t.Errorf("archive with a push sink not done: %v", err)
	}
	cancelled := build(t, engine.PhaseCancelled)
	cancelled.do(engineWriter, engine.Archive{Seq: 2})
	if cancelled.state.ArchivedFrom != engine.PhaseCancelled {
		t.Fatalf("archived from cancelled: %+v", cancelled.state)
	}
}

// The archiver moves finished tasks out of the event stream: each keeps one event
// (one subject) there, its whole history is in the archive, a restart's replay gives
// the same states, and an idempotency key still names the same task.
func TestTheArchiverCompactsFinishedTasksOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	archive, err := events.OpenArchive(ctx, b.srv.JS, 1)
	if err != nil {
		t.Fatal(err)
	}
	keyed := `{"command":"make","idempotency_key":"build-42"}`
	done := b.ended(t, keyed).ID
	b.advance(t, done, engineWriter, engine.PersistCompletion{})
	b.advance(t, done, engineWriter, engine.Fire{InboxSeq: 1})
	running := b.register(t, `{"command":"sleep 600"}`)
	b.advance(t, running, workerA, engine.Spawn{Host: "h"})
	cancelled := b.register(t, `{"command":"sleep 600"}`)
	b.advance(t, cancelled, engineWriter, engine.Cancel{Reason: "no"})
	fullDone, err := b.store.History(ctx, done)
	if err != nil {
		t.Fatal(err)
	}
	subjectsBefore := b.subjects(t)

	proj := projections.New(b.store, nil, engine.Base{})
	if err := proj.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer proj.Stop()
	if err := proj.WaitFor(ctx, b.lastSeq(t)); err != nil {
		t.Fatal(err)
	}
	archiver := engine.NewArchiver(b.store, b.store, archive, proj, engineWriter, time.Hour, engine.Base{})
	if n, err := archiver.Sweep(ctx); err != nil || n != 0 {
		t.Fatalf("a sweep before the tasks are an hour old archived %d: %v", n, err)
	}
	archiver = engine.NewArchiver(b.store, b.store, archive, proj, engineWriter, time.Hour,
		engine.Base{Now: func() time.Time { return time.Now().Add(2 * time.Hour) }})
	if n, err := archiver.Sweep(ctx); err != nil || n != 2 {
		t.Fatalf("sweep archived %d tasks, want 2 (the fired and the cancelled): %v", n, err)
	}

	for _, id := range []string{done, cancelled} {
		if types := b.types(t, id); !reflect.DeepEqual(types, []events.Type{events.TypeArchived}) {
			t.Fatalf("task %s keeps %v in the stream", id, types)
		}
	}
	if got := b.types(t, running); len(got) != 2 {
		t.Fatalf("the running task was touched: %v", got)
	}
	if after := b.subjects(t); after != subjectsBefore {
		// Each task keeps its one stored subject: its archived event.
		t.Fatalf("subjects in the stream: %d before, %d after", subjectsBefore, after)
	}
	last, err := b.store.Last(ctx, done)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := last.Decode()
	h, err := archive.Get(ctx, p.(*events.Archived).ArchiveSeq)
	if err != nil || h.TaskID != done || !reflect.DeepEqual(h.Events, fullDone) {
		t.Fatalf("archived history of %s: %+v, %v", done, h, err)
	}

	// A second sweep finds nothing to do; a restart's replay equals the live state.
	if n, err := archiver.Sweep(ctx); err != nil || n != 0 {
		t.Fatalf("second sweep: %d, %v", n, err)
	}
	if err := proj.WaitFor(ctx, b.lastSeq(t)); err != nil {
		t.Fatal(err)
	}
	again := projections.New(b.store, nil, engine.Base{})
	if err := again.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer again.Stop()
	for _, id := range []string{done, running, cancelled} {
		live, _ := proj.Task(id)
		replayed, _ := again.Task(id)
		if !reflect.DeepEqual(live, replayed) {
			t.Fatalf("task %s: live %+v, replayed %+v", id, live, replayed)
		}
	}
	if s, _ := again.Task(done); s.Phase != engine.PhaseArchived || s.Status != engine.StatusSucceeded {
		t.Fatalf("archived task: %+v", s)
	}

	svc := engine.NewService(b.store, engineWriter, engine.Base{})
	if id, created, err := svc.Register(ctx, []byte(keyed)); err != nil || created || id != done {
		t.Fatalf("the key of an archived task registered again: %s %v %v", id, created, err)
	}
}

// subjects is how many subjects the event stream keeps state for.
func (b *bundle) subjects(t *testing.T) int {
	t.Helper()
	ctx := context.Background()
	s, err := b.srv.JS.Stream(ctx, events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return int(info.State.NumSubjects)
}

// A sweep archives many tasks at once, and two engines sweeping the same stream
// side by side archive each task once between them.
func TestSweepsSideBySideArchiveEachTaskOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	archive, err := events.OpenArchive(ctx, b.srv.JS, 1)
	if err != nil {
		t.Fatal(err)
	}
	const tasks = 30
	var ids []string
	for range tasks {
		id := b.register(t, `{"command":"true"}`)
		b.advance(t, id, engineWriter, engine.Cancel{Reason: "done with"})
		ids = append(ids, id)
	}
	proj := projections.New(b.store, nil, engine.Base{})
	if err := proj.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer proj.Stop()
	if err := proj.WaitFor(ctx, b.lastSeq(t)); err != nil {
		t.Fatal(err)
	}
	later := engine.Base{Now: func() time.Time { return time.Now().Add(2 * time.Hour) }}
	counts := make([]int, 2)
	var wg sync.WaitGroup
	for i := range counts {
		archiver := engine.NewArchiver(b.store, b.store, archive, proj, engineWriter, time.Hour, later)
		wg.Go(func() {
			n, err := archiver.Sweep(ctx)
			if err != nil {
				t.Error(err)
			}
			counts[i] = n
		})
	}
	wg.Wait()
	if counts[0]+counts[1] != tasks {
		t.Errorf("the sweeps archived %v tasks, want %d between them", counts, tasks)
	}
	for _, id := range ids {
		if types := b.types(t, id); !reflect.DeepEqual(types, []events.Type{events.TypeArchived}) {
			t.Errorf("task %s keeps %v in the stream, want one archived event", id, types)
		}
	}
}
