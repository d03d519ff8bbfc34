package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/testsignal"
)

// ScheduleStore keeps the schedules (events.Schedules): every change is
// conditional on the revision read.
type ScheduleStore interface {
	Create(ctx context.Context, name string, value []byte) (uint64, error)
	Get(ctx context.Context, name string) (events.ScheduleEntry, error)
	List(ctx context.Context) ([]events.ScheduleEntry, error)
	Update(ctx context.Context, name string, value []byte, rev uint64) (uint64, error)
	Delete(ctx context.Context, name string) error
	// Watch calls changed after each change, until ctx ends.
	Watch(ctx context.Context, changed func()) error
}

// RegisterFunc registers a task spec (Service.Register): its id, and whether
// this call created it.
type RegisterFunc func(ctx context.Context, raw []byte) (id string, created bool, err error)

// CancelFunc cancels a task (Service.Cancel).
type CancelFunc func(ctx context.Context, id, reason string) (State, error)

// ScheduleRunner registers the occurrences of every schedule as their slots
// come due. Each occurrence's id derives from the schedule and the slot, and
// each advance of a schedule is conditional on the revision read, so several
// engines running the same schedules register every slot once.
type ScheduleRunner struct {
	store    ScheduleStore
	register RegisterFunc
	tasks    TaskReader
	cancel   CancelFunc
	base     Base
	kick     chan struct{}
	lc       lifecycle

	// TestSignals are for tests alone: Ran carries the time each pass over the
	// schedules began, once the pass is done.
	TestSignals struct{ Ran testsignal.Signal[time.Time] }
}

// ScheduleReread is how often the runner reads the bucket when it hears of no
// change: a watch that broke must not leave a new schedule unrun.
const ScheduleReread = 5 * time.Second

// NewScheduleRunner returns a runner of the schedules in store; Start starts it.
func NewScheduleRunner(store ScheduleStore, register RegisterFunc, tasks TaskReader, cancel CancelFunc, base Base) *ScheduleRunner {
	return &ScheduleRunner{
		store: store, register: register, tasks: tasks, cancel: cancel,
		base: base.WithDefaults(), kick: make(chan struct{}, 1),
	}
}

// Start reads the schedules once, registering what is due, and runs them until Stop.
func (r *ScheduleRunner) Start(ctx context.Context) error {
	if _, err := r.store.List(ctx); err != nil {
		return fmt.Errorf("read the schedules: %w", err)
	}
	ctx, err := r.lc.begin(ctx)
	if err != nil {
		return err
	}
	r.lc.goroutine(func() {
		for ctx.Err() == nil {
			if err := r.store.Watch(ctx, r.changed); err != nil {
				r.base.Logger.Warn("schedules not watched; read every few seconds", "err", err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(ScheduleReread):
			}
		}
	})
	r.lc.goroutine(func() { r.loop(ctx) })
	return nil
}

// Stop ends the runner and waits for it.
func (r *ScheduleRunner) Stop() { r.lc.end() }

func (r *ScheduleRunner) changed() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// loop runs every schedule, then sleeps until the next slot of any, a change,
// or the next re-read.
func (r *ScheduleRunner) loop(ctx context.Context) {
	for {
		wait := ScheduleReread
		began := r.base.Now()
		if next := r.runAll(ctx); !next.IsZero() {
			wait = min(wait, max(next.Sub(r.base.Now()), 0))
		}
		r.TestSignals.Ran.Signal(began)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-r.kick:
		case <-t.C:
		}
		t.Stop()
	}
}

// runAll handles every schedule and returns the earliest next slot.
func (r *ScheduleRunner) runAll(ctx context.Context) time.Time {
	entries, err := r.store.List(ctx)
	if err != nil {
		if ctx.Err() == nil {
			r.base.Logger.Warn("schedules unreadable", "err", err)
		}
		return time.Time{}
	}
	var earliest time.Time
	for _, e := range entries {
		next, err := r.run(ctx, e)
		if err != nil && ctx.Err() == nil {
			r.base.Logger.Warn("schedule not run", "schedule", e.Name, "err", err)
		}
		if !next.IsZero() && (earliest.IsZero() || next.Before(earliest)) {
			earliest = next
		}
	}
	return earliest
}

// run registers what is due of one schedule and advances it, reading it again
// if another engine changed it meanwhile. It returns the schedule's next slot.
func (r *ScheduleRunner) run(ctx context.Context, e events.ScheduleEntry) (time.Time, error) {
	for attempt := 0; ; attempt++ {
		s, err := DecodeSchedule(e.Value)
		if err != nil {
			return time.Time{}, err
		}
		now := r.base.Now()
		d := DecideSchedule(s, now, r.previous(s, now))
		if d.Changed(s) {
			next, err := r.carryOut(ctx, s, d)
			if err != nil {
				return time.Time{}, err
			}
			value, _ := json.Marshal(next)
			_, err = r.store.Update(ctx, s.Name, value, e.Revision)
			if errors.Is(err, events.ErrScheduleChanged) && attempt < 10 {
				if e, err = r.store.Get(ctx, s.Name); err != nil {
					return time.Time{}, err
				}
				continue
			}
			if err != nil {
				return time.Time{}, err
			}
			s = next
		}
		if s.Paused {
			return time.Time{}, nil
		}
		if s.Buffered != nil {
			// Its previous occurrence's end is not heard of: look again soon.
			return now.Add(time.Second), nil
		}
		if next := s.Next(s.After, 1); len(next) > 0 {
			return next[0], nil
		}
		return time.Time{}, nil
	}
}

// previous is the state of the schedule's latest occurrence. One registered a
// moment ago may not be known to the reader yet: it counts as active.
func (r *ScheduleRunner) previous(s Schedule, now time.Time) Previous {
	if s.LastID == "" {
		return Previous{}
	}
	st, ok := r.tasks.Task(s.LastID)
	if !ok {
		return Previous{ID: s.LastID, Active: now.Sub(s.LastSlot) < time.Minute}
	}
	return Previous{ID: s.LastID, Active: st.Phase.Runs()}
}

// carryOut cancels and registers as d says, and returns the schedule to store.
// A slot whose spec is refused is logged and skipped: it would be refused again.
func (r *ScheduleRunner) carryOut(ctx context.Context, s Schedule, d ScheduleDecision) (Schedule, error) {
	next := d.Next
	if d.Cancel != "" {
		reason := fmt.Sprintf("schedule %s: a newer occurrence replaces it (overlap cancel_previous)", s.Name)
		if _, err := r.cancel(ctx, d.Cancel, reason); err != nil && !errors.Is(err, ErrWrongPhase) && !errors.Is(err, ErrFinished) {
			return Schedule{}, fmt.Errorf("cancel the previous occurrence %s: %w", d.Cancel, err)
		}
	}
	for _, slot := range d.Register {
		id, created, err := registerOccurrence(ctx, r.register, s, slot)
		var fe *FieldError
		if errors.As(err, &fe) {
			r.base.Logger.Error("occurrence refused: slot skipped", "schedule", s.Name, "slot", slot, "err", err)
			continue
		}
		if err != nil {
			return Schedule{}, err
		}
		if created {
			r.base.Logger.Info("occurrence registered", "schedule", s.Name, "slot", slot, "task", id)
		}
		next.LastID, next.LastSlot = id, slot
	}
	return next, nil
}

// registerOccurrence registers the occurrence of s for slot. One registered
// before, by this engine or another, is that occurrence: a key conflict means
// it was registered with the template before a change.
func registerOccurrence(ctx context.Context, register RegisterFunc, s Schedule, slot time.Time) (string, bool, error) {
	raw, err := s.OccurrenceSpec(slot)
	if err != nil {
		return "", false, err
	}
	id, created, err := register(ctx, raw)
	var conflict *KeyConflictError
	if errors.As(err, &conflict) {
		return conflict.ID, false, nil
	}
	return id, created, err
}

// DecodeSchedule reads a stored schedule; it was validated when added.
func DecodeSchedule(value []byte) (Schedule, error) {
	var s Schedule
	if err := json.Unmarshal(value, &s); err != nil {
		return Schedule{}, fmt.Errorf("a stored schedule does not decode: %w", err)
	}
	return s, nil
}

// AddSchedule validates s and stores it, its slots counted from now.
func AddSchedule(ctx context.Context, store ScheduleStore, s Schedule, now time.Time) (Schedule, error) {
	s.CreatedAt, s.After, s.LastSlot, s.LastID, s.Buffered = now.UTC(), now.UTC(), time.Time{}, "", nil
	if err := s.Validate(); err != nil {
		return Schedule{}, err
	}
	value, err := json.Marshal(s)
	if err != nil {
		return Schedule{}, err
	}
	if _, err := store.Create(ctx, s.Name, value); err != nil {
		return Schedule{}, err
	}
	return s, nil
}

// ChangeSchedule applies change to the stored schedule, reading it again if
// another writer changed it meanwhile.
func ChangeSchedule(ctx context.Context, store ScheduleStore, name string, change func(*Schedule)) (Schedule, error) {
	for attempt := 0; ; attempt++ {
		e, err := store.Get(ctx, name)
		if err != nil {
			return Schedule{}, err
		}
		s, err := DecodeSchedule(e.Value)
		if err != nil {
			return Schedule{}, err
		}
		change(&s)
		value, _ := json.Marshal(s)
		_, err = store.Update(ctx, name, value, e.Revision)
		if errors.Is(err, events.ErrScheduleChanged) && attempt < 10 {
			continue
		}
		return s, err
	}
}

// PauseSchedule stops or restarts a schedule's slots. A resumed schedule counts
// its slots from now: those that passed while it was paused do not run.
func PauseSchedule(ctx context.Context, store ScheduleStore, name string, paused bool, now time.Time) (Schedule, error) {
	return ChangeSchedule(ctx, store, name, func(s *Schedule) {
		if s.Paused && !paused && now.After(s.After) {
			s.After, s.Buffered = now.UTC(), nil
		}
		s.Paused = paused
	})
}

// TriggerSchedule registers an occurrence of a schedule now, keyed by now, and
// makes it the latest occurrence, the one the overlap rule looks at.
func TriggerSchedule(ctx context.Context, store ScheduleStore, register RegisterFunc, name string, now time.Time) (string, error) {
	e, err := store.Get(ctx, name)
	if err != nil {
		return "", err
	}
	s, err := DecodeSchedule(e.Value)
	if err != nil {
		return "", err
	}
	slot := now.UTC()
	id, _, err := registerOccurrence(ctx, register, s, slot)
	if err != nil {
		return "", err
	}
	_, err = ChangeSchedule(ctx, store, name, func(s *Schedule) {
		if slot.After(s.LastSlot) {
			s.LastID, s.LastSlot = id, slot
		}
	})
	return id, err
}
