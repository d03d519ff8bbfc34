package engine

import (
	"context"
	"sync"
	"time"

	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/testsignal"
)

// Timers ends a task whose deadline passes while it still waits for a worker (the
// worker enforces the deadline of a run, the engine that of a task no one runs),
// and fires a timer when its time comes.
type Timers struct {
	base   Base
	store  events.Store
	tasks  TaskReader
	writer string

	mu      sync.Mutex
	pending map[string]*time.Timer
	// ctx is what expiries run under, from Start until Stop.
	ctx     context.Context
	run     lifecycle
	running sync.WaitGroup

	// TestSignals are for tests alone: Expired carries the id of each task whose
	// timer ran, once it has done what it found to do.
	TestSignals struct{ Expired testsignal.Signal[string] }
}

// NewTimers returns the deadline timers of an engine.
func NewTimers(store events.Store, tasks TaskReader, writer string, base Base) *Timers {
	return &Timers{
		base: base.WithDefaults(), store: store, tasks: tasks, writer: writer,
		pending: map[string]*time.Timer{},
	}
}

// Start lets Notify and Recover set timers, until Stop: start the timers before
// the reader that notifies them, for what they hear of before is dropped.
func (t *Timers) Start(ctx context.Context) error {
	ctx, err := t.run.begin(ctx)
	if err != nil {
		return err
	}
	t.mu.Lock()
	t.ctx = ctx
	t.mu.Unlock()
	return nil
}

// off reports whether the timers are not started or stopped. Call it with t.mu held.
func (t *Timers) off() bool { return t.ctx == nil || t.ctx.Err() != nil }

// Notify is called with every task state the projector applies live.
func (t *Timers) Notify(s State) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.off() {
		return
	}
	at, _ := timerOf(s)
	if at.IsZero() {
		if timer := t.pending[s.ID]; timer != nil {
			timer.Stop()
			delete(t.pending, s.ID)
		}
		return
	}
	if t.pending[s.ID] != nil {
		return
	}
	id := s.ID
	t.pending[id] = time.AfterFunc(max(time.Until(at), 0), func() { t.expire(id) })
}

// Recover sets the timers of the tasks a restart found armed.
func (t *Timers) Recover(states []State) {
	for _, s := range states {
		t.Notify(s)
	}
}

// Stop cancels every timer and waits for an expiry in progress.
func (t *Timers) Stop() {
	t.run.end()
	t.mu.Lock()
	for id, timer := range t.pending {
		timer.Stop()
		delete(t.pending, id)
	}
	t.mu.Unlock()
	t.running.Wait()
}

func (t *Timers) expire(id string) {
	t.mu.Lock()
	if t.off() {
		t.mu.Unlock()
		return
	}
	delete(t.pending, id)
	t.running.Add(1)
	t.mu.Unlock()
	defer t.running.Done()
	defer t.TestSignals.Expired.Signal(id)

	ctx, cancel := context.WithTimeout(t.ctx, 30*time.Second)
	defer cancel()
	// The timer's state is the reader's, which may lag the log: after a conflict,
	// look again shortly.
	armed := func(context.Context) (State, error) {
		s, ok := t.tasks.Task(id)
		if at, _ := timerOf(s); !ok || at.IsZero() {
			return s, ErrNothingToAppend // taken, cancelled or gone
		}
		return s, nil
	}
	s, err := armed(ctx)
	if err != nil {
		return
	}
	var c Command
	decide := func(s State) (events.Event, error) {
		var at time.Time
		at, c = timerOf(s)
		now := t.base.Now()
		if now.Before(at) {
			now = at // the timer ran on the monotonic clock; the wall clock lags it
		}
		return Decide(s, c, Meta{Writer: t.writer, Now: now})
	}
	retrying := func(_ events.Event, err error) {
		t.base.Logger.Warn("timer not recorded, retrying", "task", id, "err", err)
	}
	if _, err := Update(ctx, t.store, s, armed, decide, ReloadOnError{Max: 9, Wait: 200 * time.Millisecond, Retrying: retrying}); err == nil {
		t.base.Logger.Info(timerDone(c), "task", id)
	}
}

// timerOf is the engine's timer of an armed task: when a timer fires, or when its
// deadline ends a task no worker took; zero for none.
func timerOf(s State) (time.Time, Command) {
	switch {
	case s.Phase != PhaseArmed:
		return time.Time{}, nil
	case s.Spec.IsTimer() && s.Paused:
		return time.Time{}, nil
	case s.Spec.IsTimer():
		return s.Spec.StartTime(), ComeDue{}
	}
	return s.Spec.DeadlineTime(), Expire{}
}

func timerDone(c Command) string {
	if _, ok := c.(ComeDue); ok {
		return "timer fired"
	}
	return "deadline passed before a worker took the task"
}
