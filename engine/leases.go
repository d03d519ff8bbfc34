package engine

import (
	"context"
	"errors"
	"time"

	"github.com/bgtask/bgtask/events"
)

// Liveness tells whether a worker's lease is current.
type Liveness interface {
	Alive(ctx context.Context, workerID string) (bool, error)
	TTL() time.Duration
}

// TaskLister lists tasks as far as the reader has seen.
type TaskLister interface {
	TaskReader
	List(q ListQuery) ([]State, int)
}

// Leases appends lost for the running tasks of workers whose heartbeat is gone
// past the lease TTL. A worker that comes back later is fenced: its next append
// fails, it re-reads the task, and it stops its run.
type Leases struct {
	base     Base
	store    events.Store
	tasks    TaskLister
	liveness Liveness
	writer   string
	run      lifecycle
}

// NewLeases returns the lease checker of an engine.
func NewLeases(store events.Store, tasks TaskLister, liveness Liveness, writer string, base Base) *Leases {
	return &Leases{base: base.WithDefaults(), store: store, tasks: tasks, liveness: liveness, writer: writer}
}

// Start checks the leases every quarter TTL until Stop. The first check waits one
// TTL: after a restart of the engine, workers need that long to beat again.
func (l *Leases) Start(ctx context.Context) error {
	ctx, err := l.run.begin(ctx)
	if err != nil {
		return err
	}
	ttl := l.liveness.TTL()
	l.run.goroutine(func() {
		wait := ttl
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = max(ttl/4, 100*time.Millisecond)
			if err := l.Check(ctx); err != nil && ctx.Err() == nil {
				l.base.Logger.Warn("lease check failed", "err", err)
			}
		}
	})
	return nil
}

// Stop ends the checks.
func (l *Leases) Stop() { l.run.end() }

// Check appends lost for each running task whose worker's lease is gone.
func (l *Leases) Check(ctx context.Context) error {
	running, _ := l.tasks.List(ListQuery{Phase: PhaseRunning})
	alive := map[string]bool{}
	for _, s := range running {
		ok, checked := alive[s.Worker]
		if !checked {
			var err error
			if ok, err = l.liveness.Alive(ctx, s.Worker); err != nil {
				return err
			}
			alive[s.Worker] = ok
		}
		if ok {
			continue
		}
		if err := l.lose(ctx, s); err != nil {
			return err
		}
	}
	l.base.Logger.Debug("leases checked", "running", len(running), "workers", len(alive))
	return nil
}

// lose appends lost for running task s, once: after a conflict the task moved (its
// worker wrote after all), and the next check sees it as it is.
func (l *Leases) lose(ctx context.Context, s State) error {
	decide := func(s State) (events.Event, error) {
		ev, err := Decide(s, Lose{}, Meta{Writer: l.writer, Now: l.base.Now()})
		if err != nil {
			return ev, ErrNothingToAppend // not running as listed: not this check's to lose
		}
		return ev, nil
	}
	switch _, err := Update(ctx, l.store, s, nil, decide, ReloadOnConflict{Max: 0}); {
	case err == nil:
		l.base.Logger.Warn("worker gone past its lease: task lost", "task", s.ID, "worker", s.Worker, "on_lost", s.Spec.OnLost)
	case errors.Is(err, events.ErrConflict), errors.Is(err, ErrNothingToAppend):
	default:
		return err
	}
	return nil
}
