package engine

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/testsignal"
)

// TaskReader gives the current state of a task, as far as the reader has seen.
type TaskReader interface {
	Task(id string) (State, bool)
}

// Dispatcher turns ended tasks into exactly one wake-up: it appends
// completion-persisted, then publishes the wake-up to the inbox with the task id as
// message id, then appends fired. Every append is conditional, so a second
// dispatcher (or a second attempt) loses the race instead of writing twice, and a
// task found between persisted and fired is delivered with a check of the inbox.
type Dispatcher struct {
	base    Base
	store   events.Store
	inbox   events.Inbox
	tasks   TaskReader
	writer  string
	workers int

	mu      sync.Mutex
	queue   []string
	queued  map[string]bool
	busy    map[string]bool // tasks a loop works on: no second loop takes them
	notices map[string]bool // tasks with a stall notice or notices to deliver
	sent    map[string]int  // notices known to be in the inbox, by task
	wake    chan struct{}
	run     lifecycle

	// TestSignals are for tests alone: Worked carries the id of each task a loop
	// has done with: delivered, found undeliverable, or left as the dispatcher stops.
	TestSignals struct{ Worked testsignal.Signal[string] }
}

// Deliveries is how many wake-ups an engine's dispatcher delivers at once. Each
// waits on three writes in turn, every one fsynced before it is acknowledged, so
// a few at a time fall behind tasks that end together: their wake-ups would wait
// for seconds behind each other's writes. A server takes as many registrations
// at once (api's maxRegistering).
const Deliveries = 32

// NewDispatcher returns a dispatcher with workers parallel deliveries.
func NewDispatcher(store events.Store, inbox events.Inbox, tasks TaskReader, writer string, workers int, base Base) *Dispatcher {
	if workers < 1 {
		workers = 1
	}
	return &Dispatcher{
		base: base.WithDefaults(), store: store, inbox: inbox, tasks: tasks, writer: writer,
		workers: workers, queued: map[string]bool{}, busy: map[string]bool{}, notices: map[string]bool{}, sent: map[string]int{}, wake: make(chan struct{}, 1),
	}
}

// Notify is called with every task state the projector applies live. A run that has
// just ended is queued, and so is a stall the caller is to be told of.
func (d *Dispatcher) Notify(s State) {
	switch {
	case s.Phase == PhaseEnded:
		d.enqueue(s.ID, false)
	case s.LastType == events.TypeStalled && s.Stall.Action == OnStallNotify, s.LastType == events.TypeNotice:
		d.enqueue(s.ID, true)
	case s.Notices > 0 && (s.Phase.Terminal() || s.Phase == PhaseCancelled):
		d.mu.Lock()
		delete(d.sent, s.ID)
		d.mu.Unlock()
	}
}

// Recover queues every task that ended or was persisted but not fired, and every
// task whose stall notice or notices may not have gone out: work a previous
// process left when it stopped or crashed.
func (d *Dispatcher) Recover(states []State) {
	for _, s := range states {
		notices := s.Notices > 0 || s.StallNotified
		switch {
		case s.Phase == PhaseEnded || s.Phase == PhasePersisted:
			d.enqueue(s.ID, notices)
		case s.Phase == PhaseRunning && notices:
			d.enqueue(s.ID, true)
		}
	}
}

func (d *Dispatcher) enqueue(id string, notice bool) {
	d.mu.Lock()
	if !d.queued[id] {
		d.queued[id] = true
		d.queue = append(d.queue, id)
	}
	if notice {
		d.notices[id] = true
	}
	d.mu.Unlock()
	d.signal()
}

// next takes the first queued task no other loop works on, so a task's notice and
// its final wake-up are never delivered at once, out of order.
func (d *Dispatcher) next() (id string, notice, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, id := range d.queue {
		if d.busy[id] {
			continue
		}
		// In place: a recovery queues every task that ended unfired at once.
		if i == 0 {
			d.queue[0] = ""
			d.queue = d.queue[1:]
		} else {
			d.queue = slices.Delete(d.queue, i, i+1)
		}
		notice = d.notices[id]
		delete(d.queued, id)
		delete(d.notices, id)
		d.busy[id] = true
		return id, notice, true
	}
	return "", false, false
}

func (d *Dispatcher) done(id string) {
	d.mu.Lock()
	delete(d.busy, id)
	requeued := d.queued[id]
	d.mu.Unlock()
	if requeued {
		d.signal()
	}
}

func (d *Dispatcher) signal() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// Start runs the delivery loops until Stop (the Component contract).
func (d *Dispatcher) Start(ctx context.Context) error {
	ctx, err := d.run.begin(ctx)
	if err != nil {
		return err
	}
	for range d.workers {
		d.run.goroutine(func() { d.loop(ctx) })
	}
	return nil
}

// Stop ends the loops; a delivery in progress is abandoned at its next step and
// finished by whoever recovers the task.
func (d *Dispatcher) Stop() { d.run.end() }

func (d *Dispatcher) loop(ctx context.Context) {
	for {
		id, notice, ok := d.next()
		if !ok {
			select {
			case <-ctx.Done():
				return
			case <-d.wake:
				continue
			}
		}
		// Another loop may be waiting on the same signal for the rest of the queue.
		d.signal()
		d.work(ctx, id, notice)
		if ctx.Err() != nil {
			return
		}
	}
}

// work delivers what a task is queued for, retrying until it is done or the
// dispatcher stops.
func (d *Dispatcher) work(ctx context.Context, id string, notice bool) {
	defer d.TestSignals.Worked.Signal(id)
	defer d.done(id)
	backoff := 50 * time.Millisecond
	for {
		err := d.deliver(ctx, id, notice)
		if err == nil || ctx.Err() != nil {
			return
		}
		if errors.Is(err, ErrNotFound) || errors.Is(err, ErrWrongPhase) {
			d.base.Logger.Error("task cannot be delivered", "task", id, "err", err)
			return
		}
		d.base.Logger.Warn("delivery failed, retrying", "task", id, "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

func (d *Dispatcher) deliver(ctx context.Context, id string, notice bool) error {
	if notice {
		if err := d.Notice(ctx, id); err != nil {
			return err
		}
	}
	return d.Complete(ctx, id)
}

// Notice delivers a task's stall notice, while the task still runs. It is sent
// once: the worker writes one notify stall per task, and a second attempt finds the
// first in the inbox.
func (d *Dispatcher) Notice(ctx context.Context, id string) error {
	s, ok := d.tasks.Task(id)
	if !ok {
		return nil
	}
	if err := d.deliverNotices(ctx, s); err != nil {
		return err
	}
	if !s.StallNotified || s.Phase != PhaseRunning || s.StalledAt == nil {
		return nil
	}
	_, err := d.inbox.Deliver(ctx, s.StallNotice(), *s.StalledAt)
	return err
}

// Complete drives one task from ended to fired. It is safe to call for any task, any
// number of times, from any number of processes.
func (d *Dispatcher) Complete(ctx context.Context, id string) error {
	s, ok := d.tasks.Task(id)
	if !ok {
		var err error
		if s, err = Load(ctx, d.store, id); err != nil {
			return err
		}
	}
	// A completion this call did not persist may have been delivered by an attempt
	// whose outcome is unknown: check the inbox before publishing.
	recheck := s.Phase == PhasePersisted
	conflicts := 0 // for the whole completion, not each of its steps
	reload := func(ctx context.Context) (State, error) {
		conflicts++
		recheck = true
		return Load(ctx, d.store, id)
	}
	decide := func(s State) (events.Event, error) {
		c, err := d.nextStep(ctx, s, recheck)
		if err != nil {
			return events.Event{}, err
		}
		return Decide(s, c, Meta{Writer: d.writer, Now: d.base.Now()})
	}
	for {
		var err error
		s, err = Update(ctx, d.store, s, reload, decide, ReloadOnConflict{Max: 10 - conflicts})
		if errors.Is(err, ErrNothingToAppend) {
			return nil // fired, cancelled, or not ended yet: nothing to deliver
		}
		if err != nil {
			return err
		}
		if s.Phase == PhasePersisted {
			CrashPoint(CrashAfterPersist)
		}
		if s.Phase == PhaseFired {
			d.base.Logger.Info("fired", "task", id, "status", s.Status, "inbox_seq", s.InboxSeq)
		}
		switch {
		case s.Phase != PhaseArmed || s.RetryAt == nil:
		case s.Spec.IsProbe():
			d.base.Logger.Debug("probe did not meet its rule, running it again", "task", id, "probes", s.Probes, "at", s.RetryAt)
		default:
			a := s.Attempts[len(s.Attempts)-1]
			d.base.Logger.Info("attempt ended, retrying", "task", id, "attempt", len(s.Attempts), "status", a.Status, "at", s.RetryAt)
		}
	}
}

// nextStep is the command that takes an ended task one step on to fired: from
// ended, persisting its completion (or its retry); from persisted, firing it, once
// its wake-up is delivered (recheck: found in the inbox if an earlier attempt
// delivered it).
func (d *Dispatcher) nextStep(ctx context.Context, s State, recheck bool) (Command, error) {
	switch s.Phase {
	case PhaseEnded:
		if s.Retryable() {
			return RetryLater{Jitter: rand.Float64()}, nil
		}
		if s.Probing() {
			return ProbeLater{}, nil
		}
		return PersistCompletion{}, nil
	case PhasePersisted:
		if !s.Wakes() {
			return Fire{Quiet: true}, nil // an outcome the caller is not woken on
		}
		var since time.Time
		if recheck && s.PersistedAt != nil {
			since = *s.PersistedAt
		}
		seq, err := d.inbox.Deliver(ctx, *s.Wakeup, since)
		if err != nil {
			return nil, err
		}
		CrashPoint(CrashAfterDeliver)
		return Fire{InboxSeq: seq}, nil
	default:
		return nil, ErrNothingToAppend
	}
}
