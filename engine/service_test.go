package engine_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/events/eventstest"
)

func TestTaskID(t *testing.T) {
	t.Parallel()
	id := func(key string) string {
		t.Helper()
		s, err := engine.TaskID(engine.Spec{Command: "true", IdempotencyKey: key})
		if err != nil {
			t.Fatal(err)
		}
		if !events.ValidToken(s) {
			t.Fatalf("task id %q is not a subject token", s)
		}
		return s
	}
	t.Run("same key same id", func(t *testing.T) {
		t.Parallel()
		if a, b := id("deploy-42"), id("deploy-42"); a != b {
			t.Fatalf("ids %q and %q, want the same", a, b)
		}
	})
	t.Run("different keys different ids", func(t *testing.T) {
		t.Parallel()
		if a, b := id("deploy-42"), id("deploy-43"); a == b {
			t.Fatalf("keys deploy-42 and deploy-43 both gave %q", a)
		}
	})
	t.Run("no key gives distinct v7 ids", func(t *testing.T) {
		t.Parallel()
		seen := map[string]bool{}
		for range 100 {
			s := id("")
			u, err := uuid.Parse(s)
			if err != nil {
				t.Fatalf("id %q: %v", s, err)
			}
			if got, want := u.Version(), uuid.Version(7); got != want {
				t.Fatalf("id %q is version %d, want %d", s, got, want)
			}
			if seen[s] {
				t.Fatalf("id %q given twice", s)
			}
			seen[s] = true
		}
	})
}

// bundle is one embedded JetStream server with the engine's streams on it.
type bundle struct {
	srv   *eventstest.Server
	store *events.JetStreamStore
	inbox *events.JetStreamInbox
}

func setup(t *testing.T) *bundle {
	t.Helper()
	srv := eventstest.Run(t)
	ctx := context.Background()
	store, err := events.OpenStore(ctx, srv.JS, events.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	inbox, err := events.OpenInbox(ctx, srv.JS, events.InboxConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{srv: srv, store: store, inbox: inbox}
}

// msgs is how many messages a stream holds.
func (b *bundle) msgs(t *testing.T, stream string) uint64 {
	t.Helper()
	ctx := context.Background()
	s, err := b.srv.JS.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func (b *bundle) lastSeq(t *testing.T) uint64 {
	t.Helper()
	seq, err := b.store.LastSeq(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return seq
}

// register arms spec through a service and returns the task id.
func (b *bundle) register(t *testing.T, spec string) string {
	t.Helper()
	svc := engine.NewService(b.store, engineWriter, engine.Base{})
	id, created, err := svc.Register(context.Background(), []byte(spec))
	if err != nil || !created {
		t.Fatalf("Register(%s) = %q, %v, %v", spec, id, created, err)
	}
	return id
}

// advance decides c as writer on the task's stored state and appends it, as a worker
// or another engine would.
func (b *bundle) advance(t *testing.T, id, writer string, c engine.Command) engine.State {
	t.Helper()
	ctx := context.Background()
	s, err := engine.Load(ctx, b.store, id)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := engine.Decide(s, c, engine.Meta{Writer: writer, Now: time.Now()})
	if err != nil {
		t.Fatalf("Decide(%T) in phase %q: %v", c, s.Phase, err)
	}
	seq, err := b.store.Append(ctx, ev, s.Seq)
	if err != nil {
		t.Fatalf("Append(%s): %v", ev.Type, err)
	}
	s, err = engine.Apply(s, events.Record{Seq: seq, Event: ev})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// ended registers a task and runs it to its exit through the store.
func (b *bundle) ended(t *testing.T, spec string) engine.State {
	t.Helper()
	id := b.register(t, spec)
	b.advance(t, id, workerA, engine.Spawn{Host: "host-a"})
	b.advance(t, id, workerA, engine.Tick{PID: 100})
	now := time.Now()
	return b.advance(t, id, workerA, engine.Exit{Run: events.Exited{
		ExitCode: 0, Tail: []string{"done"}, StartedAt: now.Add(-time.Second), EndedAt: now,
	}})
}

// types lists the types of a task's stored events.
func (b *bundle) types(t *testing.T, id string) []events.Type {
	t.Helper()
	hist, err := b.store.History(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]events.Type, len(hist))
	for i, rec := range hist {
		out[i] = rec.Type
	}
	return out
}

func count(types []events.Type, want events.Type) int {
	n := 0
	for _, ty := range types {
		if ty == want {
			n++
		}
	}
	return n
}

func TestRegisterArmsOneEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	at := time.Date(2025, 6, 1, 8, 0, 0, 0, time.UTC)
	svc := engine.NewService(b.store, engineWriter, engine.Base{Now: func() time.Time { return at }})
	id, created, err := svc.Register(context.Background(), []byte(`{"command":"make test","kind":"build","origin":{"k":"v"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if !created {
		t.Fatal("created = false for a new task")
	}
	hist, err := b.store.History(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != 1 || hist[0].Type != events.TypeArmed || hist[0].Writer != engineWriter || !hist[0].Time.Equal(at) {
		t.Fatalf("history = %+v, want one armed event by %s at %v", hist, engineWriter, at)
	}
	s, err := engine.Load(context.Background(), b.store, id)
	if err != nil {
		t.Fatal(err)
	}
	if s.ID != id || s.Phase != engine.PhaseArmed || s.Spec.Command != "make test" || s.Spec.Target != engine.DefaultTarget || string(s.Spec.Origin) != `{"k":"v"}` {
		t.Fatalf("loaded state = %+v", s)
	}
}

func TestRegisterWithTheSameIdempotencyKeyArmsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	svc := engine.NewService(b.store, engineWriter, engine.Base{})
	ctx := context.Background()
	spec := []byte(`{"command":"deploy","idempotency_key":"deploy-42"}`)
	first, created, err := svc.Register(ctx, spec)
	if err != nil || !created {
		t.Fatalf("first Register = %q, %v, %v; want created", first, created, err)
	}
	again, created, err := svc.Register(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if created {
		t.Fatal("second Register with the same key reported created = true")
	}
	if again != first {
		t.Fatalf("second Register id = %q, want %q", again, first)
	}
	if got, want := b.msgs(t, events.StreamName), uint64(1); got != want {
		t.Fatalf("event stream holds %d messages, want %d", got, want)
	}
	// A different key is a different task.
	other, created, err := svc.Register(ctx, []byte(`{"command":"deploy","idempotency_key":"deploy-43"}`))
	if err != nil || !created || other == first {
		t.Fatalf("Register with another key = %q, %v, %v; want a new task", other, created, err)
	}
}

func TestRegisterConcurrentlyWithTheSameKeyArmsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const callers = 8
	type result struct {
		id      string
		created bool
		err     error
	}
	results := make(chan result, callers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range callers {
		_, js := b.srv.Connect(t)
		store, err := events.ConnectStore(ctx, js)
		if err != nil {
			t.Fatal(err)
		}
		svc := engine.NewService(store, fmt.Sprintf("engine-%d", i), engine.Base{})
		wg.Go(func() {
			<-start
			id, created, err := svc.Register(ctx, []byte(`{"command":"deploy","idempotency_key":"once"}`))
			results <- result{id, created, err}
		})
	}
	close(start)
	wg.Wait()
	close(results)
	ids := map[string]bool{}
	createdCount := 0
	for r := range results {
		if r.err != nil {
			t.Fatalf("Register: %v", r.err)
		}
		ids[r.id] = true
		if r.created {
			createdCount++
		}
	}
	if len(ids) != 1 || createdCount != 1 {
		t.Fatalf("%d ids, %d created; want 1 and 1", len(ids), createdCount)
	}
	if got, want := b.msgs(t, events.StreamName), uint64(1); got != want {
		t.Fatalf("event stream holds %d messages, want %d", got, want)
	}
}

func TestRegisterOfABadSpecAppendsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.register(t, `{"command":"true"}`)
	svc := engine.NewService(b.store, engineWriter, engine.Base{})
	for _, tc := range []struct {
		name, spec, field string
	}{
		{"unknown field", `{"command":"true","shell":"zsh"}`, "shell"},
		{"no command", `{"kind":"x"}`, "command"},
		{"relative cwd", `{"command":"true","cwd":"tmp"}`, "cwd"},
		{"bad target", `{"command":"true","target":"a.>"}`, "target"},
		{"bad prompt", `{"command":"true","prompt":"{{nope}}"}`, "prompt"},
		{"not JSON", `command=true`, "spec"},
		{"bad idempotency key", `{"command":"true","idempotency_key":` + `"` + strings.Repeat("k", 300) + `"` + `}`, "idempotency_key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := b.lastSeq(t)
			id, created, err := svc.Register(context.Background(), []byte(tc.spec))
			var fe *engine.FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field {
				t.Fatalf("Register = %q, %v, %v; want a FieldError on %s", id, created, err, tc.field)
			}
			if id != "" || created {
				t.Fatalf("rejected Register returned id %q created %v", id, created)
			}
			if got := b.lastSeq(t); got != before {
				t.Fatalf("stream LastSeq moved from %d to %d", before, got)
			}
		})
	}
	if got, want := b.msgs(t, events.StreamName), uint64(1); got != want {
		t.Fatalf("event stream holds %d messages, want %d", got, want)
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	svc := engine.NewService(b.store, engineWriter, engine.Base{})
	ctx := context.Background()

	t.Run("armed task is cancelled", func(t *testing.T) {
		id := b.register(t, `{"command":"sleep 100"}`)
		s, err := svc.Cancel(ctx, id, "not needed")
		if err != nil {
			t.Fatal(err)
		}
		if s.Phase != engine.PhaseCancelled || s.Status != engine.StatusCancelled || s.Reason != "not needed" {
			t.Fatalf("state = %q %q %q, want cancelled", s.Phase, s.Status, s.Reason)
		}
		last, err := b.store.Last(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if last.Type != events.TypeCancelled || last.Writer != engineWriter || last.Seq != s.Seq {
			t.Fatalf("last event = %s by %s at %d, want cancelled by %s at %d", last.Type, last.Writer, last.Seq, engineWriter, s.Seq)
		}
	})

	t.Run("running task is cancelled", func(t *testing.T) {
		id := b.register(t, `{"command":"sleep 100"}`)
		b.advance(t, id, workerA, engine.Spawn{})
		s, err := svc.Cancel(ctx, id, "")
		if err != nil {
			t.Fatal(err)
		}
		if got, want := s.Phase, engine.PhaseCancelled; got != want {
			t.Fatalf("phase = %q, want %q", got, want)
		}
		if got, want := b.types(t, id), []events.Type{events.TypeArmed, events.TypeSpawned, events.TypeCancelled}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("history = %v, want %v", got, want)
		}
	})

	for _, id := range []string{uuid.NewString(), "a.b", "*", ">", ""} {
		t.Run(fmt.Sprintf("unknown id %q is not found", id), func(t *testing.T) {
			before := b.lastSeq(t)
			if _, err := svc.Cancel(ctx, id, ""); !errors.Is(err, engine.ErrNotFound) {
				t.Fatalf("Cancel(%q) = %v, want ErrNotFound", id, err)
			}
			if got := b.lastSeq(t); got != before {
				t.Fatalf("stream LastSeq moved from %d to %d", before, got)
			}
		})
	}

	for _, tc := range []struct {
		name  string
		setup func(t *testing.T) string
	}{
		{"cancelled task", func(t *testing.T) string {
			id := b.register(t, `{"command":"true"}`)
			b.advance(t, id, engineWriter, engine.Cancel{})
			return id
		}},
		{"exited task", func(t *testing.T) string {
			return b.ended(t, `{"command":"true"}`).ID
		}},
		{"task that failed to start", func(t *testing.T) string {
			id := b.register(t, `{"command":"true"}`)
			b.advance(t, id, workerA, engine.Fail{Reason: "no shell"})
			return id
		}},
		{"persisted task", func(t *testing.T) string {
			s := b.ended(t, `{"command":"true"}`)
			b.advance(t, s.ID, engineWriter, engine.PersistCompletion{})
			return s.ID
		}},
		{"fired task", func(t *testing.T) string {
			s := b.ended(t, `{"command":"true"}`)
			b.advance(t, s.ID, engineWriter, engine.PersistCompletion{})
			b.advance(t, s.ID, engineWriter, engine.Fire{InboxSeq: 1})
			return s.ID
		}},
	} {
		t.Run(tc.name+" is finished", func(t *testing.T) {
			id := tc.setup(t)
			before := b.lastSeq(t)
			if _, err := svc.Cancel(ctx, id, ""); !errors.Is(err, engine.ErrFinished) {
				t.Fatalf("Cancel = %v, want ErrFinished", err)
			}
			if got := b.lastSeq(t); got != before {
				t.Fatalf("stream LastSeq moved from %d to %d", before, got)
			}
		})
	}
}

// TestCancelRacingAWorkerEndsOneWay: a cancel that loses the race to the worker's
// exit decides again on the new state and is refused, never appended after it.
func TestCancelRacingAWorkerEndsOneWay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	svc := engine.NewService(b.store, engineWriter, engine.Base{})
	const tasks = 10
	for range tasks {
		id := b.register(t, `{"command":"true"}`)
		b.advance(t, id, workerA, engine.Spawn{})
		_, js := b.srv.Connect(t)
		workerStore, err := events.ConnectStore(ctx, js)
		if err != nil {
			t.Fatal(err)
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		var cancelErr, exitErr error
		wg.Go(func() {
			<-start
			_, cancelErr = svc.Cancel(ctx, id, "race")
		})
		wg.Go(func() {
			<-start
			s, err := engine.Load(ctx, workerStore, id)
			if err != nil {
				exitErr = err
				return
			}
			ev, err := engine.Decide(s, engine.Exit{Run: events.Exited{ExitCode: 0}}, engine.Meta{Writer: workerA, Now: time.Now()})
			if err != nil {
				exitErr = err
				return
			}
			_, exitErr = workerStore.Append(ctx, ev, s.Seq)
		})
		close(start)
		wg.Wait()
		types := b.types(t, id)
		cancelled, exited := count(types, events.TypeCancelled), count(types, events.TypeExited)
		if cancelled+exited != 1 {
			t.Fatalf("history %v has %d cancelled and %d exited, want exactly one of them", types, cancelled, exited)
		}
		if exited == 1 && !errors.Is(cancelErr, engine.ErrFinished) {
			t.Fatalf("the exit won but Cancel returned %v, want ErrFinished", cancelErr)
		}
		// The worker either lost the append or saw the cancel before deciding.
		if cancelled == 1 && (cancelErr != nil || !errors.Is(exitErr, events.ErrConflict) && !errors.Is(exitErr, engine.ErrWrongPhase)) {
			t.Fatalf("the cancel won with %v and the exit returned %v, want nil and ErrConflict or ErrWrongPhase", cancelErr, exitErr)
		}
	}
}

// TestLoadEqualsTheLiveFold: the state rebuilt from the stream equals the state
// built live by the writers that appended it.
func TestLoadEqualsTheLiveFold(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	id := b.register(t, `{"command":"make test","env":{"CI":"1"},"origin":{"chat":{"id":5}},"prompt":"{{status}} {{origin.chat.id}}"}`)
	live, err := engine.Load(ctx, b.store, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		writer string
		cmd    engine.Command
	}{
		{workerA, engine.Spawn{Host: "h"}},
		{workerA, engine.Tick{PID: 7, OutputBytes: 10}},
		{workerA, engine.Exit{Run: events.Exited{ExitCode: 1, Tail: []string{"boom"}, StartedAt: time.Now().Add(-time.Minute), EndedAt: time.Now()}}},
		{engineWriter, engine.PersistCompletion{}},
		{engineWriter, engine.Fire{InboxSeq: 3}},
	} {
		ev, err := engine.Decide(live, step.cmd, engine.Meta{Writer: step.writer, Now: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		seq, err := b.store.Append(ctx, ev, live.Seq)
		if err != nil {
			t.Fatal(err)
		}
		if live, err = engine.Apply(live, events.Record{Seq: seq, Event: ev}); err != nil {
			t.Fatal(err)
		}
		loaded, err := engine.Load(ctx, b.store, id)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(loaded, live) {
			t.Fatalf("after %s the loaded state differs from the live one:\nloaded %+v\n  live %+v", ev.Type, loaded, live)
		}
	}
}

// countingStore counts the history reads of the store it wraps.
type countingStore struct {
	events.Store
	histories atomic.Int64
}

func (c *countingStore) History(ctx context.Context, id string) ([]events.Record, error) {
	c.histories.Add(1)
	return c.Store.History(ctx, id)
}

func TestLoadOfAnArmedTaskReadsOnlyItsLastEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	store := &countingStore{Store: b.store}
	id := b.register(t, `{"command":"make test","env":{"CI":"1"},"origin":{"chat":{"id":5}}}`)
	hist, err := b.store.History(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := engine.Replay(hist)
	got, err := engine.Load(ctx, store, id)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("loaded %+v\nwant the replay of its history %+v", got, want)
	}
	if n := store.histories.Load(); n != 0 {
		t.Fatalf("Load of an armed task read its history %d times, want its last event only", n)
	}
	// A task with more events than armed is still read whole.
	b.advance(t, id, workerA, engine.Spawn{Host: "h"})
	b.advance(t, id, workerA, engine.Tick{PID: 7})
	if hist, err = b.store.History(ctx, id); err != nil {
		t.Fatal(err)
	}
	want, _ = engine.Replay(hist)
	if got, err = engine.Load(ctx, store, id); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) || got.Phase != engine.PhaseRunning {
		t.Fatalf("loaded %+v\nwant the replay of its history %+v", got, want)
	}
	if _, err := engine.Load(ctx, store, "no-such-task"); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("Load of an unknown task: %v, want ErrNotFound", err)
	}
}

// TestCancelRefusesAnOversizedReason: the reason is kept in every view of the task,
// so one over its limit is refused and nothing is appended.
func TestCancelRefusesAnOversizedReason(t *testing.T) {
	t.Parallel()
	b := setup(t)
	svc := engine.NewService(b.store, engineWriter, engine.Base{})
	id := b.register(t, `{"command":"sleep 100"}`)
	before := b.lastSeq(t)
	_, err := svc.Cancel(context.Background(), id, strings.Repeat("r", engine.MaxCancelReasonBytes+1))
	var fe *engine.FieldError
	if !errors.As(err, &fe) || fe.Field != "reason" {
		t.Fatalf("Cancel = %v, want a *FieldError on reason", err)
	}
	if got := b.lastSeq(t); got != before {
		t.Fatalf("stream LastSeq moved from %d to %d", before, got)
	}
	s, err := svc.Cancel(context.Background(), id, strings.Repeat("r", engine.MaxCancelReasonBytes))
	if err != nil || s.Phase != engine.PhaseCancelled {
		t.Fatalf("Cancel with a reason at the limit = %q, %v; want cancelled", s.Phase, err)
	}
}
