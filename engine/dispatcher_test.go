package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// noReader has seen nothing, so the dispatcher loads every task from the store.
type noReader struct{}

func (noReader) Task(string) (engine.State, bool) { return engine.State{}, false }

// mapReader answers with the states it was given, however stale.
type mapReader map[string]engine.State

func (m mapReader) Task(id string) (engine.State, bool) { s, ok := m[id]; return s, ok }

var errInjected = errors.New("injected delivery failure")

// recordingInbox wraps the real inbox: it records the recheck time of every delivery
// and fails the first failFirst of them.
type recordingInbox struct {
	events.Inbox
	mu        sync.Mutex
	rechecks  []time.Time
	failFirst int
}

func (r *recordingInbox) Deliver(ctx context.Context, w events.Wakeup, recheckSince time.Time) (uint64, error) {
	r.mu.Lock()
	r.rechecks = append(r.rechecks, recheckSince)
	fail := r.failFirst > 0
	if fail {
		r.failFirst--
	}
	r.mu.Unlock()
	if fail {
		return 0, errInjected
	}
	return r.Inbox.Deliver(ctx, w, recheckSince)
}

func (r *recordingInbox) calls() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Time(nil), r.rechecks...)
}

// inboxMessages returns every message in the inbox stream, in order.
func (b *bundle) inboxMessages(t *testing.T) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx := context.Background()
	stream, err := b.srv.JS.Stream(ctx, events.InboxStreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
		msg, err := stream.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("read inbox message %d: %v", seq, err)
		}
		out = append(out, msg)
	}
	return out
}

// checkDeliveredOnce checks that a task has exactly one completion-persisted and one
// fired, that exactly one inbox message carries it, on its target's subject, at the
// sequence fired names, and that the message is the persisted wake-up.
func (b *bundle) checkDeliveredOnce(t *testing.T, id string) engine.State {
	t.Helper()
	types := b.types(t, id)
	if count(types, events.TypeCompletionPersisted) != 1 || count(types, events.TypeFired) != 1 {
		t.Fatalf("history %v, want one completion-persisted and one fired", types)
	}
	if got, want := types[len(types)-1], events.TypeFired; got != want {
		t.Fatalf("last event = %s, want %s", got, want)
	}
	s, err := engine.Load(context.Background(), b.store, id)
	if err != nil {
		t.Fatal(err)
	}
	var mine []*jetstream.RawStreamMsg
	for _, msg := range b.inboxMessages(t) {
		if msg.Header.Get(jetstream.MsgIDHeader) == id {
			mine = append(mine, msg)
		}
	}
	if len(mine) != 1 {
		t.Fatalf("the inbox holds %d messages for task %s, want 1", len(mine), id)
	}
	msg := mine[0]
	if got, want := msg.Sequence, s.InboxSeq; got != want {
		t.Fatalf("inbox message at seq %d, fired names %d", got, want)
	}
	if got, want := msg.Subject, events.InboxSubject(s.Spec.Target); got != want {
		t.Fatalf("inbox message on %q, want %q", got, want)
	}
	var w events.Wakeup
	if err := json.Unmarshal(msg.Data, &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(w, *s.Wakeup) {
		t.Fatalf("delivered wake-up differs from the persisted one:\ndelivered %+v\npersisted %+v", w, *s.Wakeup)
	}
	return s
}

func TestCompleteDeliversAnEndedTaskOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	s := b.ended(t, `{"command":"make test","target":"agent-1","origin":{"chat":"c1"}}`)
	inbox := &recordingInbox{Inbox: b.inbox}
	d := engine.NewDispatcher(b.store, inbox, noReader{}, engineWriter, 1, engine.Base{})

	if err := d.Complete(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	got := b.checkDeliveredOnce(t, s.ID)
	if got.Phase != engine.PhaseFired || got.Status != engine.StatusSucceeded {
		t.Fatalf("state = %q %q, want fired succeeded", got.Phase, got.Status)
	}
	if got, want := b.msgs(t, events.InboxStreamName), uint64(1); got != want {
		t.Fatalf("inbox holds %d messages, want %d", got, want)
	}
	// A completion this call persisted itself cannot have been delivered before.
	if calls := inbox.calls(); len(calls) != 1 || !calls[0].IsZero() {
		t.Fatalf("Deliver recheck times = %v, want one delivery without a recheck", calls)
	}

	// Again: nothing left to do.
	before := b.lastSeq(t)
	if err := d.Complete(ctx, s.ID); err != nil {
		t.Fatalf("second Complete: %v", err)
	}
	if got := b.lastSeq(t); got != before {
		t.Fatalf("second Complete moved LastSeq from %d to %d", before, got)
	}
	if got, want := b.msgs(t, events.InboxStreamName), uint64(1); got != want {
		t.Fatalf("inbox holds %d messages after a second Complete, want %d", got, want)
	}
	if got := len(inbox.calls()); got != 1 {
		t.Fatalf("second Complete delivered again (%d deliveries)", got)
	}
}

func TestCompleteWithAStaleReaderIsANoOp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ended := b.ended(t, `{"command":"true"}`)
	first := engine.NewDispatcher(b.store, b.inbox, noReader{}, engineWriter, 1, engine.Base{})
	if err := first.Complete(ctx, ended.ID); err != nil {
		t.Fatal(err)
	}
	before := b.lastSeq(t)
	// This reader still believes the task has just ended.
	stale := engine.NewDispatcher(b.store, b.inbox, mapReader{ended.ID: ended}, "engine-2", 1, engine.Base{})
	if err := stale.Complete(ctx, ended.ID); err != nil {
		t.Fatal(err)
	}
	if got := b.lastSeq(t); got != before {
		t.Fatalf("stale Complete moved LastSeq from %d to %d", before, got)
	}
	b.checkDeliveredOnce(t, ended.ID)
	if got, want := b.msgs(t, events.InboxStreamName), uint64(1); got != want {
		t.Fatalf("inbox holds %d messages, want %d", got, want)
	}
}

func TestCompleteLeavesUnfinishedTasksAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	d := engine.NewDispatcher(b.store, b.inbox, noReader{}, engineWriter, 1, engine.Base{})
	armed := b.register(t, `{"command":"true"}`)
	running := b.register(t, `{"command":"true"}`)
	b.advance(t, running, workerA, engine.Spawn{})
	cancelled := b.register(t, `{"command":"true"}`)
	b.advance(t, cancelled, engineWriter, engine.Cancel{})
	before := b.lastSeq(t)
	for _, id := range []string{armed, running, cancelled} {
		if err := d.Complete(ctx, id); err != nil {
			t.Fatalf("Complete(%s): %v", id, err)
		}
	}
	if got := b.lastSeq(t); got != before {
		t.Fatalf("Complete of unfinished tasks moved LastSeq from %d to %d", before, got)
	}
	if got := b.msgs(t, events.InboxStreamName); got != 0 {
		t.Fatalf("inbox holds %d messages, want none", got)
	}
	if err := d.Complete(ctx, "no-such-task"); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("Complete of an unknown task = %v, want ErrNotFound", err)
	}
}

// TestCompleteAfterACrashBeforeDelivery: a previous dispatcher persisted the
// completion and stopped before the inbox.
func TestCompleteAfterACrashBeforeDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ended := b.ended(t, `{"command":"true","target":"t1"}`)
	persisted := b.advance(t, ended.ID, engineWriter, engine.PersistCompletion{})
	inbox := &recordingInbox{Inbox: b.inbox}
	d := engine.NewDispatcher(b.store, inbox, noReader{}, engineWriter, 1, engine.Base{})

	if err := d.Complete(ctx, ended.ID); err != nil {
		t.Fatal(err)
	}
	b.checkDeliveredOnce(t, ended.ID)
	if got, want := b.msgs(t, events.InboxStreamName), uint64(1); got != want {
		t.Fatalf("inbox holds %d messages, want %d", got, want)
	}
	// A completion it did not persist may have been delivered: the inbox is checked
	// from the time it was persisted.
	calls := inbox.calls()
	if len(calls) != 1 || !calls[0].Equal(*persisted.PersistedAt) {
		t.Fatalf("Deliver recheck times = %v, want one recheck since %v", calls, *persisted.PersistedAt)
	}
}

// TestCompleteAfterACrashAfterDelivery: a previous dispatcher persisted the
// completion and delivered it, and stopped before appending fired.
func TestCompleteAfterACrashAfterDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ended := b.ended(t, `{"command":"true","target":"t1"}`)
	persisted := b.advance(t, ended.ID, engineWriter, engine.PersistCompletion{})
	delivered, err := b.inbox.Deliver(ctx, *persisted.Wakeup, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	d := engine.NewDispatcher(b.store, b.inbox, mapReader{ended.ID: persisted}, engineWriter, 1, engine.Base{})

	if err := d.Complete(ctx, ended.ID); err != nil {
		t.Fatal(err)
	}
	s := b.checkDeliveredOnce(t, ended.ID)
	if got, want := s.InboxSeq, delivered; got != want {
		t.Fatalf("fired names inbox seq %d, want the earlier delivery %d", got, want)
	}
	if got, want := b.msgs(t, events.InboxStreamName), uint64(1); got != want {
		t.Fatalf("inbox holds %d messages, want %d", got, want)
	}
}

// TestCompleteThatLosesThePersistRaceChecksTheInbox: a dispatcher whose
// completion-persisted lost to another's cannot know whether that one delivered, so it
// checks the inbox before publishing.
func TestCompleteThatLosesThePersistRaceChecksTheInbox(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ended := b.ended(t, `{"command":"true"}`)
	persisted := b.advance(t, ended.ID, "engine-2", engine.PersistCompletion{})
	inbox := &recordingInbox{Inbox: b.inbox}
	// The reader has not seen the other engine's completion yet.
	d := engine.NewDispatcher(b.store, inbox, mapReader{ended.ID: ended}, engineWriter, 1, engine.Base{})

	if err := d.Complete(ctx, ended.ID); err != nil {
		t.Fatal(err)
	}
	b.checkDeliveredOnce(t, ended.ID)
	calls := inbox.calls()
	if len(calls) != 1 || !calls[0].Equal(*persisted.PersistedAt) {
		t.Fatalf("Deliver recheck times = %v, want one recheck since %v", calls, *persisted.PersistedAt)
	}
}

func TestConcurrentDispatchersDeliverEachTaskOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const dispatchers, tasks = 2, 10
	ds := make([]*engine.Dispatcher, dispatchers)
	for i := range ds {
		_, js := b.srv.Connect(t)
		store, err := events.ConnectStore(ctx, js)
		if err != nil {
			t.Fatal(err)
		}
		inbox, err := events.OpenInbox(ctx, js, events.InboxConfig{})
		if err != nil {
			t.Fatal(err)
		}
		ds[i] = engine.NewDispatcher(store, inbox, noReader{}, fmt.Sprintf("engine-%d", i), 1, engine.Base{})
	}
	ids := make([]string, tasks)
	for i := range ids {
		ids[i] = b.ended(t, `{"command":"true"}`).ID
	}
	for _, id := range ids {
		start := make(chan struct{})
		errs := make(chan error, dispatchers)
		var wg sync.WaitGroup
		for _, d := range ds {
			wg.Go(func() {
				<-start
				errs <- d.Complete(ctx, id)
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("Complete(%s): %v", id, err)
			}
		}
		b.checkDeliveredOnce(t, id)
	}
	if got, want := b.msgs(t, events.InboxStreamName), uint64(tasks); got != want {
		t.Fatalf("inbox holds %d messages for %d tasks", got, want)
	}
}

// waitWorked waits until the dispatcher has done with every task of ids.
func waitWorked(t *testing.T, d *engine.Dispatcher, ids ...string) {
	t.Helper()
	left := map[string]bool{}
	for _, id := range ids {
		left[id] = true
	}
	d.TestSignals.Worked.WaitFor(10*time.Second, fmt.Sprintf("%d tasks delivered", len(ids)), func(id string) bool {
		delete(left, id)
		return len(left) == 0
	})
}

func TestDispatcherDeliversWhatItIsNotified(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := engine.NewDispatcher(b.store, b.inbox, noReader{}, engineWriter, 2, engine.Base{})
	d.TestSignals.Worked.Init(t)
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop) // also when the test fails before its own Stop
	var ids []string
	for range 5 {
		s := b.ended(t, `{"command":"true"}`)
		ids = append(ids, s.ID)
		d.Notify(s)
		d.Notify(s) // a duplicate notification is harmless
	}
	waitWorked(t, d, ids...)
	d.Stop()
	for _, id := range ids {
		b.checkDeliveredOnce(t, id)
	}
	if got, want := b.msgs(t, events.InboxStreamName), uint64(len(ids)); got != want {
		t.Fatalf("inbox holds %d messages for %d tasks", got, want)
	}
}

// gatedInbox holds every delivery until open of them wait at once.
type gatedInbox struct {
	events.Inbox
	open    int
	mu      sync.Mutex
	waiting int
	opened  chan struct{}
}

func (g *gatedInbox) Deliver(ctx context.Context, w events.Wakeup, recheckSince time.Time) (uint64, error) {
	g.mu.Lock()
	if g.waiting++; g.waiting == g.open {
		close(g.opened)
	}
	g.mu.Unlock()
	select {
	case <-g.opened:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return g.Inbox.Deliver(ctx, w, recheckSince)
}

// Tasks that end together are delivered together: a wake-up whose writes wait on
// the disk does not hold back the others. Each delivery here waits until 32 are
// waiting, as many as the registrations a server takes at once.
func TestADispatcherDeliversTheWakeupsOfABurstAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const burst = 32
	inbox := &gatedInbox{Inbox: b.inbox, open: burst, opened: make(chan struct{})}
	d := engine.NewDispatcher(b.store, inbox, noReader{}, engineWriter, engine.Deliveries, engine.Base{})
	d.TestSignals.Worked.Init(t)
	var ids []string
	for range burst {
		s := b.ended(t, `{"command":"true"}`)
		ids = append(ids, s.ID)
		d.Notify(s)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop) // also when the test fails before its own Stop
	waitWorked(t, d, ids...)
	d.Stop()
	for _, id := range ids {
		b.checkDeliveredOnce(t, id)
	}
}

func TestDispatcherRecoversUnfinishedDeliveries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ended := b.ended(t, `{"command":"true"}`)
	persisted := b.ended(t, `{"command":"true"}`)
	persisted = b.advance(t, persisted.ID, engineWriter, engine.PersistCompletion{})
	d := engine.NewDispatcher(b.store, b.inbox, noReader{}, engineWriter, 1, engine.Base{})
	d.TestSignals.Worked.Init(t)
	d.Recover([]engine.State{ended, persisted})
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop) // also when the test fails before its own Stop
	waitWorked(t, d, ended.ID, persisted.ID)
	d.Stop()
	b.checkDeliveredOnce(t, ended.ID)
	b.checkDeliveredOnce(t, persisted.ID)
}

func TestDispatcherRetriesAFailedDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	inbox := &recordingInbox{Inbox: b.inbox, failFirst: 2}
	d := engine.NewDispatcher(b.store, inbox, noReader{}, engineWriter, 1, engine.Base{})
	d.TestSignals.Worked.Init(t)
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop) // also when the test fails before its own Stop
	s := b.ended(t, `{"command":"true"}`)
	d.Notify(s)
	waitWorked(t, d, s.ID)
	d.Stop()
	b.checkDeliveredOnce(t, s.ID)
	calls := inbox.calls()
	if len(calls) != 3 {
		t.Fatalf("%d delivery attempts, want 3 (two failures, one success)", len(calls))
	}
	// The retries follow a persisted completion whose delivery outcome is unknown.
	if calls[1].IsZero() || calls[2].IsZero() {
		t.Fatalf("retries delivered without checking the inbox first: recheck times %v", calls)
	}
}

func TestDispatcherStopsWithoutWork(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := engine.NewDispatcher(b.store, b.inbox, noReader{}, engineWriter, 3, engine.Base{})
	d.Stop() // before Start: nothing to stop
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	d.Stop()
}
