// Package projections rebuilds bgtask's current state from the event stream and
// answers queries from it. The projector reads the whole stream when it starts, so
// after any restart the state it serves is the state the stream implies; it then
// follows new events live.
package projections

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// Log is the part of the event store the projector reads.
type Log interface {
	Follow(ctx context.Context, taskID string, after uint64, fn func(events.Record, error) bool) error
	LastSeq(ctx context.Context) (uint64, error)
}

// Problem is an event the projector could not apply: corrupt, unknown, or out of
// place. It is reported and skipped; it never stops the projector.
type Problem struct {
	Seq    uint64 `json:"seq"`
	TaskID string `json:"task_id,omitempty"`
	Err    string `json:"error"`
}

// maxProblems bounds the problems kept in memory; the count is kept in full.
const maxProblems = 1000

// Projector holds every task's current state.
type Projector struct {
	base   engine.Base
	log    Log
	notify func(engine.State)

	mu sync.RWMutex
	// tasks are updated in place: a state leaves the lock only as a copy. A map of
	// pointers, so that growing it and listing it move pointers, not states.
	tasks map[string]*engine.State
	// unfinished holds the ids of the tasks in each phase that is not terminal:
	// the scheduler, the lease checks and the dispatcher list those phases all the
	// time, and they hold few of the tasks a long stream has seen.
	unfinished   map[engine.Phase]map[string]struct{}
	applied      uint64
	live         bool
	problems     []Problem
	problemCount int
	// waiters are the WaitFor calls waiting, each for its sequence; wake is the
	// lowest of those (0: no one waits), so that an event wakes no one early.
	waiters map[chan struct{}]uint64
	wake    uint64

	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// New returns a projector over log. notify, if set, is called with a task's new state
// for every event applied after the initial replay; it must not block.
func New(log Log, notify func(engine.State), base engine.Base) *Projector {
	return &Projector{
		base: base.WithDefaults(), log: log, notify: notify,
		tasks: map[string]*engine.State{}, unfinished: map[engine.Phase]map[string]struct{}{},
		waiters: map[chan struct{}]uint64{},
	}
}

// Start replays the stream up to its current end and returns once the state is
// complete; it keeps following new events until Stop.
func (p *Projector) Start(ctx context.Context) error {
	target, err := p.log.LastSeq(ctx)
	if err != nil {
		return fmt.Errorf("projector: %w", err)
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p.cancel, p.done = cancel, make(chan struct{})
	go func() {
		defer close(p.done)
		err := p.log.Follow(runCtx, "", 0, p.apply)
		if err != nil && runCtx.Err() == nil {
			p.base.Logger.Error("projector stopped following the stream", "err", err)
			p.mu.Lock()
			p.err = err
			p.mu.Unlock()
		}
	}()
	if err := p.WaitFor(ctx, target); err != nil {
		p.Stop()
		return fmt.Errorf("projector: replay: %w", err)
	}
	p.mu.Lock()
	p.live = true
	n := len(p.tasks)
	p.mu.Unlock()
	p.base.Logger.Info("projector ready", "tasks", n, "seq", target)
	return nil
}

// Stop ends following.
func (p *Projector) Stop() {
	if p.cancel != nil {
		p.cancel()
		<-p.done
	}
}

func (p *Projector) apply(rec events.Record, decodeErr error) bool {
	p.mu.Lock()
	var changed *engine.State
	if decodeErr != nil {
		p.report(Problem{Seq: rec.Seq, Err: decodeErr.Error()})
	} else {
		task := p.tasks[rec.TaskID]
		var prev engine.State
		if task != nil {
			prev = *task
		}
		next, err := engine.Apply(prev, rec)
		if err != nil {
			p.report(Problem{Seq: rec.Seq, TaskID: rec.TaskID, Err: err.Error()})
		}
		if next.ID != "" {
			if task == nil {
				task = new(engine.State)
				p.tasks[rec.TaskID] = task
			}
			*task = next
			if next.Phase != prev.Phase {
				p.index(rec.TaskID, prev.Phase, next.Phase)
			}
			if err == nil && p.live {
				changed = &next
			}
		}
	}
	p.applied = rec.Seq
	if p.wake != 0 && p.applied >= p.wake {
		p.wakeWaiters()
	}
	p.mu.Unlock()
	if changed != nil && p.notify != nil {
		p.notify(*changed)
	}
	return true
}

// index moves a task from one phase's index to another's.
func (p *Projector) index(id string, from, to engine.Phase) {
	if ids := p.unfinished[from]; ids != nil {
		delete(ids, id)
	}
	if to == "" || to.Terminal() {
		return
	}
	ids := p.unfinished[to]
	if ids == nil {
		ids = map[string]struct{}{}
		p.unfinished[to] = ids
	}
	ids[id] = struct{}{}
}

func (p *Projector) report(pr Problem) {
	p.problemCount++
	if len(p.problems) < maxProblems {
		p.problems = append(p.problems, pr)
	}
	p.base.Logger.Warn("event skipped", "seq", pr.Seq, "task", pr.TaskID, "err", pr.Err)
}

// WaitFor blocks until every event up to seq has been applied.
func (p *Projector) WaitFor(ctx context.Context, seq uint64) error {
	p.mu.Lock()
	if p.applied >= seq {
		p.mu.Unlock()
		return nil
	}
	if err := p.err; err != nil {
		p.mu.Unlock()
		return err
	}
	woken := make(chan struct{})
	p.waiters[woken] = seq
	if p.wake == 0 || seq < p.wake {
		p.wake = seq
	}
	p.mu.Unlock()
	select {
	case <-woken:
		return nil
	case <-ctx.Done():
		p.mu.Lock()
		delete(p.waiters, woken)
		p.mu.Unlock()
		return ctx.Err()
	case <-p.done:
		p.mu.Lock()
		delete(p.waiters, woken)
		applied, err := p.applied, p.err
		p.mu.Unlock()
		switch {
		case applied >= seq:
			return nil
		case err == nil:
			err = errors.New("projector stopped")
		}
		return err
	}
}

// wakeWaiters wakes the waiters whose sequence is applied.
func (p *Projector) wakeWaiters() {
	p.wake = 0
	for woken, seq := range p.waiters {
		if p.applied >= seq {
			close(woken)
			delete(p.waiters, woken)
		} else if p.wake == 0 || seq < p.wake {
			p.wake = seq
		}
	}
}

// Task implements engine.TaskReader.
func (p *Projector) Task(id string) (engine.State, bool) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	s, ok := p.tasks[id]
	if !ok {
		return engine.State{}, false
	}
	return *s, true
}

// List returns the tasks that match q, newest first, and how many matched in all.
func (p *Projector) List(q engine.ListQuery) ([]engine.State, int) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	var matched []*engine.State
	if q.Phase != "" && !q.Phase.Terminal() {
		ids := p.unfinished[q.Phase]
		matched = make([]*engine.State, 0, len(ids))
		for id := range ids {
			matched = append(matched, p.tasks[id])
		}
	} else {
		matched = make([]*engine.State, 0, len(p.tasks))
		for _, s := range p.tasks {
			if q.Phase == "" || s.Phase == q.Phase {
				matched = append(matched, s)
			}
		}
	}
	slices.SortFunc(matched, func(a, b *engine.State) int {
		if c := b.ArmedAt.Compare(a.ArmedAt); c != 0 {
			return c
		}
		return cmp.Compare(b.ID, a.ID)
	})
	total := len(matched)
	if q.Limit > 0 && len(matched) > q.Limit {
		matched = matched[:q.Limit]
	}
	out := make([]engine.State, len(matched))
	for i, s := range matched {
		out[i] = *s
	}
	return out, total
}

// Problems returns the events that could not be applied (at most the first 1000)
// and how many there were.
func (p *Projector) Problems() ([]Problem, int) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return slices.Clone(p.problems), p.problemCount
}

// Applied is the sequence of the last event applied.
func (p *Projector) Applied() uint64 {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.applied
}
