package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/bgtask/bgtask/events"
)

// StatusSkipped is the outcome of a task that never ran: a dependency its
// after_policy needs to succeed did not.
const StatusSkipped = "skipped"

// After policies: what a task's dependencies must have done for it to run.
const (
	AfterSucceeded = "succeeded" // every dependency succeeded (the default)
	AfterEnded     = "ended"     // every dependency ended, whatever its outcome
)

// MaxAfter bounds how many tasks a task may wait for.
const MaxAfter = 100

// validateAfter checks after and after_policy.
func (s *Spec) validateAfter() error {
	if len(s.After) == 0 {
		if s.AfterPolicy != "" {
			return fieldErr("after_policy", "only with after")
		}
		return nil
	}
	if !s.HasCommand() {
		return fieldErr("after", "only with a command")
	}
	if len(s.After) > MaxAfter {
		return fieldErr("after", "%d tasks: at most %d", len(s.After), MaxAfter)
	}
	for _, id := range s.After {
		if !events.ValidToken(id) {
			return fieldErr("after", "%q is not a task id", id)
		}
	}
	switch s.AfterPolicy {
	case "":
		s.AfterPolicy = AfterSucceeded
	case AfterSucceeded, AfterEnded:
	default:
		return fieldErr("after_policy", "%q: want succeeded or ended", s.AfterPolicy)
	}
	return nil
}

// Dependencies says what an armed task's dependencies let it do: wait (one has
// not ended), run, or be skipped (skip names the one that did not succeed).
func (s State) Dependencies(task func(id string) (State, bool)) (wait bool, skip *Skip) {
	for _, id := range s.Spec.After {
		dep, ok := task(id)
		switch {
		case !ok || !dep.Phase.Terminal():
			wait = true
		case s.Spec.AfterPolicy == AfterSucceeded && dep.Status != StatusSucceeded && skip == nil:
			skip = &Skip{Dependency: id, Status: dep.Status}
		}
	}
	if wait {
		return true, nil
	}
	return false, skip
}

// Skip ends an armed task whose dependency did not succeed: it never runs.
type Skip struct{ Dependency, Status string }

func (c Skip) decide(s State, _ Meta) (events.Payload, uint64, error) {
	if s.Phase != PhaseArmed || !slices.Contains(s.Spec.After, c.Dependency) {
		return nil, 0, phaseError(s)
	}
	return &events.Skipped{Dependency: c.Dependency, Reason: fmt.Sprintf("its dependency %s ended %s, not succeeded", c.Dependency, c.Status)}, s.Epoch, nil
}

func (s State) skipped(rec events.Record, p *events.Skipped) (State, error) {
	at := rec.Time
	if s.Phase != PhaseArmed || !slices.Contains(s.Spec.After, p.Dependency) {
		return s, ErrWrongPhase
	}
	s.Phase, s.Status, s.Reason, s.EndedAt = PhaseEnded, StatusSkipped, p.Reason, &at
	return s, nil
}

// checkAfter refuses a spec that waits for a task that does not exist: a
// dependency, or a member of its group.
func (s *Service) checkAfter(ctx context.Context, spec Spec) error {
	field := "after"
	if spec.Join != nil {
		field = "join.members"
	}
	for _, id := range (State{Spec: spec}).waitsFor() {
		if _, err := s.store.Last(ctx, id); errors.Is(err, events.ErrNotFound) {
			return fieldErr(field, "%s: no such task", id)
		} else if err != nil {
			return err
		}
	}
	return nil
}

// Dependencies skips the armed tasks whose dependencies did not succeed: it keeps,
// for each task still waiting, the tasks it waits for, and looks at it again when
// one of them ends. (The scheduler holds a waiting task; one whose dependencies
// all ended as its policy needs is placed as any other.)
type Dependencies struct {
	base   Base
	store  events.Store
	tasks  OutcomeReader
	writer string
	// ready is told that a task waiting for others may start: the scheduler's kick.
	ready func()

	mu      sync.Mutex
	waiters map[string][]string // dependency → the armed tasks waiting for it
	ctx     context.Context
	run     lifecycle
}

// OutcomeReader reads tasks as far as a task waiting for them needs: a task not
// settled yet whole, a settled one as its summary keeps it (phase, status, exit
// code), never by a read of its history. The watch looks at a group's members on
// each member's end, in the projector's notification: a history read per member
// there would make a group's end cost its size squared in reads, and hold the
// projector meanwhile.
type OutcomeReader interface {
	Outcome(id string) (State, bool)
}

// NewDependencies returns the dependency watch of an engine; ready is called when
// a task it held may start.
func NewDependencies(store events.Store, tasks OutcomeReader, writer string, ready func(), base Base) *Dependencies {
	return &Dependencies{base: base.WithDefaults(), store: store, tasks: tasks, writer: writer, ready: ready, waiters: map[string][]string{}}
}

// Start lets Notify and Recover act, until Stop (the Component contract).
func (d *Dependencies) Start(ctx context.Context) error {
	ctx, err := d.run.begin(ctx)
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.ctx = ctx
	d.mu.Unlock()
	return nil
}

// Stop ends the skips in progress.
func (d *Dependencies) Stop() { d.run.end() }

// Recover looks at the tasks a restart found armed.
func (d *Dependencies) Recover(states []State) {
	for _, s := range states {
		d.Notify(s)
	}
}

// Notify is called with every task state the projector applies live: an armed
// task with dependencies is looked at, and so are the tasks waiting for one that
// has just ended.
func (d *Dependencies) Notify(s State) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ctx == nil || d.ctx.Err() != nil {
		return
	}
	if s.Phase.Terminal() && len(d.waiters[s.ID]) > 0 {
		for _, id := range d.waiters[s.ID] {
			d.look(id)
		}
		delete(d.waiters, s.ID)
		d.ready()
	}
	if s.Phase == PhaseArmed && len(s.waitsFor()) > 0 {
		d.lookAt(s)
	}
}

// look looks at task id again, as the reader has it. Its mutex is held.
func (d *Dependencies) look(id string) {
	if s, ok := d.tasks.Outcome(id); ok && s.Phase == PhaseArmed {
		d.lookAt(s)
	}
}

// lookAt keeps an armed task waiting for the tasks it waits for, or ends it: a
// group whose members ended, a task whose dependency failed. Its mutex is held;
// the end's append runs on a goroutine of its own.
func (d *Dependencies) lookAt(s State) {
	var end Command
	var wait bool
	if s.Spec.Join != nil {
		if j := s.JoinEnd(d.tasks.Outcome); j != nil {
			end = *j
		}
		wait = end == nil
	} else if w, skip := s.Dependencies(d.tasks.Outcome); skip != nil {
		end = *skip
	} else {
		wait = w
	}
	switch {
	case wait:
		for _, dep := range s.waitsFor() {
			if !slices.Contains(d.waiters[dep], s.ID) {
				d.waiters[dep] = append(d.waiters[dep], s.ID)
			}
		}
	case end != nil:
		ctx := d.ctx
		d.run.goroutine(func() { d.end(ctx, s, end) })
	}
}

func (d *Dependencies) end(ctx context.Context, s State, c Command) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	reload := func(ctx context.Context) (State, error) { return Load(ctx, d.store, s.ID) }
	decide := func(s State) (events.Event, error) {
		return Decide(s, c, Meta{Writer: d.writer, Now: d.base.Now()})
	}
	if s, err := Update(ctx, d.store, s, reload, decide, ReloadOnError{Max: 5, Wait: 200 * time.Millisecond}); err == nil {
		d.base.Logger.Info("ended by the tasks it waited for", "task", s.ID, "status", s.Status)
	}
}
