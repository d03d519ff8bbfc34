package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bgtask/bgtask/events"
)

// DefaultArchiveAfter is how long a finished task stays whole in the event stream
// before it is archived: as long as its output stays in the log stream.
const DefaultArchiveAfter = 7 * 24 * time.Hour

// archivable reports whether nothing can happen to the task any more: it fired and
// its push sinks are done, or it was cancelled.
func (s State) archivable() bool {
	return (s.Phase == PhaseFired && s.Acknowledged()) || s.Phase == PhaseCancelled
}

// finishedAt is when the task's last step happened.
func (s State) finishedAt() time.Time {
	switch {
	case s.FiredAt != nil:
		return *s.FiredAt
	case s.EndedAt != nil:
		return *s.EndedAt
	}
	return s.ArmedAt
}

// Summary is what an archived task keeps of its state.
func (s State) Summary() events.TaskSummary {
	sum := events.TaskSummary{
		Phase: string(s.Phase), Status: s.Status, Command: s.Spec.CommandLine(), Kind: s.Spec.Kind,
		Target: s.Spec.Target, ArmedAt: s.ArmedAt, EndedAt: s.EndedAt, FiredAt: s.FiredAt, Events: s.Events,
	}
	if s.Wakeup != nil {
		sum.ExitCode = s.Wakeup.ExitCode
	}
	return sum
}

func archivedState(id string, p *events.Archived) State {
	sum := p.Summary
	return State{
		ID: id, Phase: PhaseArchived, ArchivedFrom: Phase(sum.Phase), Status: sum.Status,
		Spec:    Spec{Command: sum.Command, Kind: sum.Kind, Target: sum.Target},
		ArmedAt: sum.ArmedAt, EndedAt: sum.EndedAt, FiredAt: sum.FiredAt, ArchiveSeq: p.ArchiveSeq,
		// Apply counts the archived event itself.
		Events: sum.Events,
	}
}

// Archive records that a finished task's history is in the archive at Seq.
type Archive struct{ Seq uint64 }

func (c Archive) decide(s State, _ Meta) (events.Payload, uint64, error) {
	if !s.archivable() {
		return nil, 0, fmt.Errorf("%w: task %s is %s, not finished", ErrWrongPhase, s.ID, s.Phase)
	}
	return &events.Archived{ArchiveSeq: c.Seq, Summary: s.Summary()}, s.Epoch, nil
}

// HistoryStore is the event store as the archiver reads it.
type HistoryStore interface {
	events.Store
	// HistoryOf is History for a task known to have n events.
	HistoryOf(ctx context.Context, taskID string, n int) ([]events.Record, error)
}

// ArchiveStore keeps whole histories.
type ArchiveStore interface {
	Put(ctx context.Context, taskID string, history []events.Record) (uint64, error)
}

// Compactor drops every event of a task but its last.
type Compactor interface {
	Compact(ctx context.Context, taskID string) error
}

// SettledLister lists the settled tasks that finished by cutoff: fired with every
// push sink done, or cancelled, and not archived yet. It need not build the state
// of any other task.
type SettledLister interface {
	Settled(cutoff time.Time) []State
}

// Archiver moves tasks finished longer than a while ago out of the event stream,
// whose per-task index is the server's memory: the history goes into the archive,
// an archived event that points at it is appended, and the task's other events are
// removed. A crash between the steps leaves a task archived twice (the archive
// drops the copy by its id) or archived but not compacted (it costs memory only).
type Archiver struct {
	base    Base
	store   HistoryStore
	compact Compactor
	archive ArchiveStore
	tasks   SettledLister
	writer  string
	after   time.Duration

	run lifecycle
}

// NewArchiver returns an archiver of tasks finished longer than after ago.
func NewArchiver(store HistoryStore, compact Compactor, archive ArchiveStore, tasks SettledLister, writer string, after time.Duration, base Base) *Archiver {
	return &Archiver{base: base.WithDefaults(), store: store, compact: compact, archive: archive, tasks: tasks, writer: writer, after: after}
}

// sweepEvery is how often the archiver looks for tasks due: a tenth of the time
// they stay, between a second and ten minutes.
func (a *Archiver) sweepEvery() time.Duration {
	return min(max(a.after/10, time.Second), 10*time.Minute)
}

// Start sweeps at once and then every sweepEvery until Stop. An archiver of
// tasks finished 0 ago archives nothing: its Start starts nothing.
func (a *Archiver) Start(ctx context.Context) error {
	ctx, err := a.run.begin(ctx)
	if err != nil || a.after <= 0 {
		return err
	}
	a.run.goroutine(func() {
		ticker := time.NewTicker(a.sweepEvery())
		defer ticker.Stop()
		for {
			if n, err := a.Sweep(ctx); err != nil && ctx.Err() == nil {
				a.base.Logger.Warn("archive sweep stopped", "archived", n, "err", err)
			} else if n > 0 {
				a.base.Logger.Info("archived finished tasks", "tasks", n)
			}
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
		}
	})
	return nil
}

// Stop ends the sweeps.
func (a *Archiver) Stop() { a.run.end() }

// archiveParallel is how many tasks a sweep archives at once: each is a history
// read and three JetStream writes, which wait on the network and the store's
// fsync rather than on the CPU. One at a time, a sweep archived ~126 tasks/s.
const archiveParallel = 8

// Sweep archives every task due and returns how many it archived.
func (a *Archiver) Sweep(ctx context.Context) (int, error) {
	cutoff := a.base.Now().Add(-a.after)
	all := a.tasks.Settled(cutoff)
	var archived atomic.Int64
	slots := make(chan struct{}, archiveParallel)
	var wg sync.WaitGroup
	for _, s := range all {
		if !s.archivable() || s.finishedAt().After(cutoff) {
			continue
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-slots }()
			switch err := a.archiveTask(ctx, s); {
			case err == nil:
				archived.Add(1)
			case errors.Is(err, events.ErrConflict) || errors.Is(err, ErrWrongPhase) || ctx.Err() != nil:
				// It changed (another engine archived it): the next sweep sees.
			default:
				a.base.Logger.Warn("task not archived", "task", s.ID, "err", err)
			}
		})
	}
	wg.Wait()
	return int(archived.Load()), ctx.Err()
}

func (a *Archiver) archiveTask(ctx context.Context, listed State) error {
	id := listed.ID
	history, err := a.store.HistoryOf(ctx, id, listed.Events)
	if err != nil {
		return err
	}
	s, _ := Replay(history)
	if !s.archivable() {
		return ErrWrongPhase
	}
	seq, err := a.archive.Put(ctx, id, history)
	if err != nil {
		return err
	}
	ev, err := Decide(s, Archive{Seq: seq}, Meta{Writer: a.writer, Now: a.base.Now()})
	if err != nil {
		return err
	}
	if _, err := a.store.Append(ctx, ev, s.Seq); err != nil {
		return err
	}
	return a.compact.Compact(ctx, id)
}
