package engine

import (
	"cmp"
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/testsignal"
)

// SinkRunner makes one attempt of a push sink.
type SinkRunner interface {
	Push(ctx context.Context, sink Sink, w events.Wakeup, attempt int) SinkOutcome
}

// DefaultRetryBase is the wait after a push sink's first failed attempt; each later
// wait doubles, up to MaxRetryWait, with jitter.
const (
	DefaultRetryBase = time.Second
	MaxRetryWait     = 5 * time.Minute
)

// Pusher pushes fired wake-ups to their specs' sinks, as their policies and their
// targets' states allow. Every attempt is claimed with a conditional append before
// it is made and its result appended after, so engine replicas never push the same
// attempt twice, and what is held, in flight or failed is in the log, not in memory:
// a restart resumes where the last run stopped. A push is at least once: an engine
// that dies after pushing and before recording it pushes again, with the same
// Idempotency-Key (the task id).
type Pusher struct {
	base      Base
	store     events.Store
	tasks     TaskReader
	runner    SinkRunner
	me        Engine
	retryBase time.Duration

	mu      sync.Mutex
	pending map[string]bool // fired tasks with push sinks not done
	targets map[string]events.TargetState
	running map[Push]bool
	// appended is the sequence of this pusher's last append to a task: until the
	// reader has caught up with it, the task is not planned from a stale state.
	appended map[string]uint64
	wake     chan struct{}
	// ctx is what the work runs under, from Start until Stop.
	ctx context.Context
	run lifecycle

	// TestSignals are for tests alone: Planned carries each plan of a target,
	// as the pusher carries it out.
	TestSignals struct{ Planned testsignal.Signal[Plan] }
}

// NewPusher returns the pusher of engine me. retryBase 0 means DefaultRetryBase.
func NewPusher(store events.Store, tasks TaskReader, runner SinkRunner, me Engine, retryBase time.Duration, base Base) *Pusher {
	if retryBase <= 0 {
		retryBase = DefaultRetryBase
	}
	return &Pusher{
		base: base.WithDefaults(), store: store, tasks: tasks, runner: runner, me: me, retryBase: retryBase,
		pending: map[string]bool{}, targets: map[string]events.TargetState{}, running: map[Push]bool{},
		appended: map[string]uint64{}, wake: make(chan struct{}, 1),
	}
}

// Notify is called with every task state the projector applies live.
func (p *Pusher) Notify(s State) {
	if s.Phase != PhaseFired || len(s.Deliveries) == 0 {
		return
	}
	p.mu.Lock()
	p.pending[s.ID] = true
	p.mu.Unlock()
	p.signal()
}

// Recover queues the pushes a restart found unfinished.
func (p *Pusher) Recover(states []State) {
	for _, s := range states {
		p.Notify(s)
	}
}

// TargetChanged is called with a target's new state.
func (p *Pusher) TargetChanged(name string, st events.TargetState) {
	p.mu.Lock()
	p.targets[name] = st
	p.mu.Unlock()
	p.signal()
}

func (p *Pusher) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Start runs the pusher until Stop. Start it once the targets' states are known,
// or a wake-up held for a busy target could go out before its state is read.
func (p *Pusher) Start(ctx context.Context) error {
	ctx, err := p.run.begin(ctx)
	if err != nil {
		return err
	}
	p.ctx = ctx
	p.run.goroutine(func() {
		timer := time.NewTimer(time.Hour)
		defer timer.Stop()
		for {
			next := p.plan()
			timer.Stop()
			if !next.IsZero() {
				timer.Reset(max(next.Sub(p.base.Now()), time.Millisecond))
			}
			select {
			case <-ctx.Done():
				return
			case <-p.wake:
			case <-timer.C:
			}
		}
	})
	return nil
}

// Stop ends the pusher. Attempts in flight are abandoned unrecorded; the next
// start of this engine claims them again.
func (p *Pusher) Stop() { p.run.end() }

// plan starts what the policies allow now and returns when to look again.
func (p *Pusher) plan() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.base.Now()
	byTarget := map[string][]State{}
	for id := range p.pending {
		s, ok := p.tasks.Task(id)
		if !ok {
			continue
		}
		if s.Acknowledged() && s.Seq >= p.appended[id] && !p.runningTask(id) {
			delete(p.pending, id)
			delete(p.appended, id)
			continue
		}
		byTarget[s.Spec.Target] = append(byTarget[s.Spec.Target], s)
	}
	var next time.Time
	for target, tasks := range byTarget {
		slices.SortFunc(tasks, func(a, b State) int { return cmp.Compare(a.FiredSeq, b.FiredSeq) })
		st, ok := p.targets[target]
		if !ok {
			st = events.TargetState{State: events.TargetIdle}
		}
		plan := PlanTarget(tasks, st, p.me, now)
		p.TestSignals.Planned.Signal(plan)
		if !plan.Next.IsZero() && (next.IsZero() || plan.Next.Before(next)) {
			next = plan.Next
		}
		for _, push := range plan.GiveUp {
			p.launch([]Push{push}, true, tasks)
		}
		p.launch(plan.Start, false, tasks)
	}
	return next
}

func (p *Pusher) runningTask(id string) bool {
	for push := range p.running {
		if push.TaskID == id {
			return true
		}
	}
	return false
}

// launch starts pushes, leaving out those that run already or whose task the
// reader has not caught up with after this pusher's own appends. Their attempts
// are claimed one after another, in the order given (the order the tasks fired),
// and each is made as soon as it is claimed, without waiting for the others.
// p.mu is held.
func (p *Pusher) launch(pushes []Push, giveUp bool, tasks []State) {
	var states []State
	var starting []Push
	for _, push := range pushes {
		if p.running[push] {
			continue
		}
		s := tasks[slices.IndexFunc(tasks, func(s State) bool { return s.ID == push.TaskID })]
		if s.Seq < p.appended[push.TaskID] {
			continue // the projector's notification of our append is on its way
		}
		p.running[push] = true
		states, starting = append(states, s), append(starting, push)
	}
	if len(starting) == 0 {
		return
	}
	done := func(push Push) {
		p.mu.Lock()
		delete(p.running, push)
		p.mu.Unlock()
		p.signal()
	}
	p.run.goroutine(func() {
		for i, push := range starting {
			s := states[i]
			if p.ctx.Err() != nil {
				done(push) // stopping: the next start plans it again
				continue
			}
			if giveUp {
				p.giveUp(s, push)
				done(push)
				continue
			}
			s, ok := p.claim(s, push)
			if !ok {
				done(push)
				continue
			}
			p.run.goroutine(func() {
				p.attempt(s, push)
				done(push)
			})
		}
	})
}

// appendTo appends the event of command c to task s and returns the task's new state.
func (p *Pusher) appendTo(s State, c Command) (State, error) {
	ev, err := Decide(s, c, Meta{Writer: p.me.Writer, Now: p.base.Now()})
	if err != nil {
		return s, err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(p.ctx), 30*time.Second)
	defer cancel()
	seq, err := p.store.Append(ctx, ev, s.Seq)
	if err != nil {
		return s, err
	}
	p.mu.Lock()
	p.appended[s.ID] = max(p.appended[s.ID], seq)
	p.mu.Unlock()
	return Apply(s, events.Record{Seq: seq, Event: ev})
}

// conflicted notes that task s has events past what its state says: it is not
// planned again until the reader has them.
func (p *Pusher) conflicted(s State) {
	p.mu.Lock()
	p.appended[s.ID] = max(p.appended[s.ID], s.Seq+1)
	p.mu.Unlock()
}

func (p *Pusher) giveUp(s State, push Push) {
	if _, err := p.appendTo(s, GiveUpDelivery{Sink: push.Sink}); err != nil {
		if errors.Is(err, events.ErrConflict) {
			p.conflicted(s)
		} else {
			p.base.Logger.Warn("delivery-failed not recorded", "task", s.ID, "sink", push.Sink, "err", err)
		}
		return
	}
	p.base.Logger.Warn("push sink gave up", "task", s.ID, "sink", push.Sink, "attempts", s.Deliveries[push.Sink].Attempts)
}

// claim appends the claim of push's next attempt, and returns the task with it.
func (p *Pusher) claim(s State, push Push) (State, bool) {
	s, err := p.appendTo(s, ClaimDelivery{Sink: push.Sink, Engine: p.me})
	if err != nil {
		if errors.Is(err, events.ErrConflict) {
			p.conflicted(s) // another engine has it, or the reader is behind
		} else {
			p.base.Logger.Warn("delivery attempt not claimed", "task", s.ID, "sink", push.Sink, "err", err)
		}
		return s, false
	}
	return s, true
}

// attempt makes the attempt of push that s has claimed, and records its outcome.
func (p *Pusher) attempt(s State, push Push) {
	sink, claim := s.Spec.Deliver[push.Sink], s.Deliveries[push.Sink].Claim
	ctx, cancel := context.WithTimeout(p.ctx, sink.AttemptTimeout())
	outcome := p.runner.Push(ctx, sink, *s.Wakeup, claim.Attempt)
	cancel()
	if outcome.OK {
		CrashPoint(CrashAfterPush)
	}
	if p.ctx.Err() != nil {
		return // stopping: the next start claims this attempt again
	}
	// A redelivered push starts over: its waits grow again from the retry base.
	n := claim.Attempt - s.Deliveries[push.Sink].EarlierAttempts
	record := RecordDelivery{Sink: push.Sink, Outcome: outcome, Backoff: p.backoff(n, outcome.RetryAfter)}
	decide := func(s State) (events.Event, error) {
		return Decide(s, record, Meta{Writer: p.me.Writer, Now: p.base.Now()})
	}
	// After a failed append, the record is decided again from the log, while this
	// engine still holds the attempt's claim and is not stopping.
	reload := func(context.Context) (State, error) {
		if err := p.ctx.Err(); err != nil {
			return s, err
		}
		s, err := Load(p.ctx, p.store, s.ID)
		if err != nil {
			return s, err
		}
		if k := s.Deliveries[push.Sink]; k.Claim == nil || k.Claim.Attempt != claim.Attempt || k.ClaimedBy != p.me.Writer {
			return s, errors.New("the attempt's claim was taken over")
		}
		return s, nil
	}
	retrying := func(_ events.Event, err error) {
		if p.ctx.Err() == nil {
			p.base.Logger.Warn("delivery result not recorded, retrying", "task", s.ID, "sink", push.Sink, "err", err)
		}
	}
	ctx, cancel = context.WithTimeout(context.WithoutCancel(p.ctx), 30*time.Second)
	recorded, err := Update(ctx, p.store, s, reload, decide, ReloadOnError{Max: 5, Retrying: retrying})
	cancel()
	if err == nil {
		p.mu.Lock()
		p.appended[s.ID] = max(p.appended[s.ID], recorded.Seq)
		p.mu.Unlock()
	}
	level, msg := p.base.Logger.Info, "pushed"
	if !outcome.OK {
		level, msg = p.base.Logger.Warn, "push failed"
	}
	level(msg, "task", s.ID, "sink", sink.Type, "attempt", claim.Attempt, "error", outcome.Error, "recorded", err == nil)
}

// backoff is the wait before the attempt after the push's nth (counted from its
// start or its last redelivery): exponential from the retry base, with equal
// jitter so that many failed pushes do not retry in step, and never shorter than
// what the receiver asked for.
func (p *Pusher) backoff(n int, retryAfter time.Duration) time.Duration {
	d := p.retryBase << min(n-1, 20)
	d = min(d, MaxRetryWait)
	d = d/2 + rand.N(d/2+1)
	return max(d, min(retryAfter, MaxRetryWait))
}
