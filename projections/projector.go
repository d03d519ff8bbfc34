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
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/testsignal"
)

// Log is the part of the event store the projector reads.
type Log interface {
	Follow(ctx context.Context, taskID string, after uint64, fn func(events.Record, error) bool) error
	LastSeq(ctx context.Context) (uint64, error)
	// Identity names the stream: a stream created again under the same name
	// has another identity, and its sequences mean other events.
	Identity(ctx context.Context) (string, error)
	// EventID is the id of the event at seq, or events.ErrNotFound.
	EventID(ctx context.Context, seq uint64) (string, error)
	// ReadHistory calls fn with each event of a task known to have n events, in
	// order, an event that does not decode with its error, as Follow does: the
	// projector folds a settled task's whole state from it.
	ReadHistory(ctx context.Context, taskID string, n int, fn func(events.Record, error)) error
}

// Snapshots is where the projector keeps snapshots of its state, and how often it
// writes them.
type Snapshots struct {
	// Path is the snapshot file; its directory must exist.
	Path string
	// Every is how many events may be applied after the last snapshot before the
	// next one is written; never fewer than there are tasks, so that the writes
	// cost a bounded share of the work: a snapshot takes a small part of the time
	// a replay of the events it stands for does (bgtask bench --scenario restart
	// measures both).
	Every uint64
	// Build names the build of bgtask: a snapshot of another is not read, for its
	// fold of the events may differ.
	Build string
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
	notify func(engine.State, events.Record)

	mu sync.RWMutex
	// tasks are the tasks that are not settled, updated in place: a state leaves
	// the lock only as a copy. A map of pointers, so that growing it and listing it
	// move pointers, not states. summaries are the settled tasks' summaries, likewise;
	// a task is in one of the two.
	tasks     map[string]*engine.State
	summaries map[string]*summary
	// interned are the strings the summaries share.
	interned interner
	// unfinished holds the ids of the tasks in each phase that is not terminal:
	// the scheduler, the lease checks and the dispatcher list those phases all the
	// time, and they hold few of the tasks a long stream has seen.
	unfinished map[engine.Phase]map[string]struct{}
	// phases counts the tasks in each phase, terminal ones too.
	phases       map[engine.Phase]int
	applied      uint64
	live         bool
	problems     []Problem
	problemCount int
	// waiters are the WaitFor calls waiting, each for its sequence; wake is the
	// lowest of those (0: no one waits), so that an event wakes no one early.
	waiters map[chan struct{}]uint64
	wake    uint64

	snapshots Snapshots
	// stream is the identity of the stream, for the snapshots; snapshotSeq is the
	// sequence of the last snapshot read or written (or whose write failed).
	stream      string
	snapshotSeq uint64
	// checkSeq and checkID are the last event applied that decoded.
	checkSeq     uint64
	checkID      string
	snapshotDue  chan struct{}
	snapshotDone chan struct{}
	// replayed is how the state was rebuilt at the start.
	replayed Replayed
	// released is the return of the replay's garbage to the system; quietDone
	// closes when the loop that returns a burst's garbage has ended.
	released  sync.WaitGroup
	quietDone chan struct{}

	cancel context.CancelFunc
	done   chan struct{}
	err    error

	// TestSignals are for tests alone: Snapshotted carries the sequence of each
	// snapshot written; looked, the sequence applied at each look for a quiet
	// stream (releaseWhenQuiet), once the look is done.
	TestSignals struct {
		Snapshotted testsignal.Signal[uint64]
		looked      testsignal.Signal[uint64]
	}
}

// Replayed says how the projector rebuilt its state when it started: from which
// snapshot, if any, and how far it read the stream after it.
type Replayed struct {
	SnapshotSeq uint64
	// SnapshotSkipped is why a snapshot that was there was not used.
	SnapshotSkipped string
	// Seqs is the span of sequences read after the snapshot (compacted events
	// leave gaps in it).
	Seqs uint64
}

// New returns a projector over log. notify, if set, is called with a task's new state
// and the event that made it, for every event applied after the initial replay; it
// must not block.
func New(log Log, notify func(engine.State, events.Record), base engine.Base) *Projector {
	return &Projector{
		base: base.WithDefaults(), log: log, notify: notify,
		tasks: map[string]*engine.State{}, summaries: map[string]*summary{},
		unfinished: map[engine.Phase]map[string]struct{}{}, phases: map[engine.Phase]int{},
		waiters: map[chan struct{}]uint64{},
	}
}

// UseSnapshots makes the projector start from the snapshot at s.Path when there
// is a valid one, and write one whenever s.Every events have been applied since
// the last. Call it before Start.
func (p *Projector) UseSnapshots(s Snapshots) { p.snapshots = s }

// Start replays the stream up to its current end and returns once the state is
// complete; it keeps following new events until Stop (the engine.Component
// contract).
func (p *Projector) Start(ctx context.Context) error {
	if p.cancel != nil {
		return engine.ErrStarted
	}
	target, err := p.log.LastSeq(ctx)
	if err != nil {
		return fmt.Errorf("projector: %w", err)
	}
	p.restore(ctx, target)
	from := p.applied
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p.cancel, p.done = cancel, make(chan struct{})
	go func() {
		defer close(p.done)
		err := p.log.Follow(runCtx, "", from, p.apply)
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
	n := len(p.tasks) + len(p.summaries)
	p.replayed.Seqs = p.applied - from
	replayed := p.replayed
	if p.stream != "" && p.snapshots.Every > 0 {
		p.snapshotDue, p.snapshotDone = make(chan struct{}, 1), make(chan struct{})
		go p.snapshotLoop(runCtx, p.snapshotDue, p.snapshotDone)
		p.checkSnapshotDue()
	}
	mark := from // the events folded since memory was last given back start here
	if replayed.Seqs >= releaseAfter {
		p.released.Go(releaseMemory)
		mark = p.applied
	}
	p.quietDone = make(chan struct{})
	go p.releaseWhenQuiet(runCtx, mark, p.quietDone)
	p.mu.Unlock()
	p.base.Logger.Info("projector ready", "tasks", n, "seq", target,
		"from_snapshot", replayed.SnapshotSeq, "seqs_replayed", replayed.Seqs)
	return nil
}

// releaseAfter is how many events a replay folds before its garbage is handed
// back to the system once it is done: every event decoded, several times the
// state it leaves (gigabytes for a replay of a million events). The Go runtime
// would keep it for a heap twice the size of the live one, and give it back over
// minutes, or never if the server stays idle.
var releaseAfter uint64 = 100_000

// releaseMemory returns the memory the heap does not use to the system. What a
// sync.Pool holds survives one collection in its victim cache, and what a cleanup
// (runtime.AddCleanup) puts back in a pool is put back after the collection that
// found its owner unreachable: NATS's file store recycles its 4 and 8 MiB block
// buffers that way, so only the third collection frees them, and the third one
// here is FreeOSMemory's, which returns them to the system.
var releaseMemory = func() {
	runtime.GC()
	runtime.GC()
	debug.FreeOSMemory()
}

// releaseBurst, releaseQuiet, releaseTrickle and releaseShare are when the memory
// of work done live is given back: once the stream has had at most releaseTrickle
// events in releaseQuiet, or at most 1/releaseShare of the events of its busiest
// releaseQuiet since the last release, after at least releaseBurst events since
// that release. A burst of tasks leaves a heap the Go runtime keeps whole when the
// server goes idle: it collects an idle heap every 2 minutes only, and gives back
// only what exceeds its next goal, twice the heap live at the last collection, so
// the server would keep the burst's size for as long as it stays idle (a burst of
// 10,000 tasks: 157 MiB, against 33 MiB idle and 66 MiB once released; bgtask
// bench --scenario burst). releaseQuiet is longer than NATS's file store keeps a
// block's cache after its last use (10 s), so that its buffers are garbage by
// then. A running task ticks once in 10 s: the trickle is the ticks of a few,
// and the share those of any number that a burst outnumbers (120 running tasks
// make 180 events in releaseQuiet, a burst of 10,000 tasks about 52,000 in 40 s). A
// steady stream is never quiet by its share, and needs no release: its
// collections keep its heap to their goal.
var (
	releaseBurst   uint64 = 10_000
	releaseTrickle uint64 = 100
	releaseShare   uint64 = 10
)

const releaseQuiet = 15 * time.Second

// releaseLooks is how many times in releaseQuiet the stream is looked at.
const releaseLooks = 3

// releaseTicks times the looks: every releaseQuiet/releaseLooks. (A test looks
// when it chooses: how quiet the stream was must not depend on how fast a busy
// machine appended its events.)
var releaseTicks = func(every time.Duration) (<-chan time.Time, func()) {
	tick := time.NewTicker(every)
	return tick.C, tick.Stop
}

// releaseWhenQuiet gives the memory back each time the stream has gone quiet
// (releaseTrickle, releaseShare) after releaseBurst events or more since mark,
// until ctx ends.
func (p *Projector) releaseWhenQuiet(ctx context.Context, mark uint64, done chan<- struct{}) {
	defer close(done)
	ticks, stop := releaseTicks(releaseQuiet / releaseLooks)
	defer stop()
	// seen is the sequence applied at each of the last looks, the oldest first.
	var seen [releaseLooks + 1]uint64
	for i := range seen {
		seen[i] = mark
	}
	// busiest is the most events in releaseQuiet since mark.
	var busiest uint64
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-ticks:
		}
		copy(seen[:], seen[1:])
		seen[releaseLooks] = p.Applied()
		applied, recent := seen[releaseLooks], seen[releaseLooks]-seen[0]
		busiest = max(busiest, recent)
		quiet := recent <= releaseTrickle || recent <= busiest/releaseShare
		if n >= releaseLooks-1 && quiet && applied-mark >= releaseBurst {
			releaseMemory()
			mark, busiest = applied, 0
		}
		p.TestSignals.looked.Signal(applied)
	}
}

// Stop ends following. A snapshot being written is finished first. It is safe
// before Start and twice.
func (p *Projector) Stop() {
	p.released.Wait()
	if p.cancel != nil {
		p.cancel()
		<-p.done
		p.mu.RLock()
		quietDone := p.quietDone
		p.mu.RUnlock()
		if quietDone != nil {
			<-quietDone
		}
		p.mu.RLock()
		snapshotDone := p.snapshotDone
		p.mu.RUnlock()
		if snapshotDone != nil {
			<-snapshotDone
		}
	}
}

// Replayed says how the state was rebuilt at the start.
func (p *Projector) Replayed() Replayed {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.replayed
}

func (p *Projector) apply(rec events.Record, decodeErr error) bool {
	var reopened *engine.State
	if decodeErr == nil {
		reopened = p.reopen(rec)
	}
	p.mu.Lock()
	var changed *engine.State
	if decodeErr != nil {
		p.report(Problem{Seq: rec.Seq, Err: decodeErr.Error()})
	} else {
		task, sum := p.tasks[rec.TaskID], p.summaries[rec.TaskID]
		var prev engine.State
		switch {
		case task != nil:
			prev = *task
		case reopened != nil:
			prev = *reopened
		case sum != nil:
			// Of the other events, only an archived event fits a settled task,
			// and it needs the phase alone; any other is refused by the phase as
			// by the whole state.
			prev = sum.state()
		}
		next, err := engine.Apply(prev, rec)
		if err != nil {
			p.report(Problem{Seq: rec.Seq, TaskID: rec.TaskID, Err: err.Error()})
		}
		if next.ID != "" {
			p.store(rec.TaskID, &next, task, sum)
			if next.Phase != prev.Phase {
				p.index(rec.TaskID, prev.Phase, next.Phase)
			}
			if err == nil && p.live {
				changed = &next
			}
		}
	}
	p.applied = rec.Seq
	if decodeErr == nil {
		p.checkSeq, p.checkID = rec.Seq, rec.ID
	}
	if p.wake != 0 && p.applied >= p.wake {
		p.wakeWaiters()
	}
	if p.snapshotDue != nil {
		p.checkSnapshotDue()
	}
	p.mu.Unlock()
	if changed != nil && p.notify != nil {
		p.notify(*changed, rec)
	}
	return true
}

// reopen is the whole state, before rec, of the settled task that rec makes
// unsettled again: a redelivery of its pushes that gave up. It is nil for any
// other event, or if the history cannot be read (the summary then stands for
// it, and the event is refused as out of place). Only apply changes a summary,
// so the history is read outside the lock.
func (p *Projector) reopen(rec events.Record) *engine.State {
	if rec.Type != events.TypeRedeliveryRequested {
		return nil
	}
	p.mu.RLock()
	sum := p.summaries[rec.TaskID]
	var known engine.State
	if sum != nil {
		known = sum.state()
	}
	p.mu.RUnlock()
	if sum == nil || known.Phase == engine.PhaseArchived {
		return nil
	}
	whole, ok := p.fold(known, rec.Seq)
	if !ok {
		return nil
	}
	return &whole
}

// fold is the whole state of the settled task whose summary known is, from its
// history before the sequence before (0: all of it); ok is false if that cannot
// be read, or ends short of the summary.
func (p *Projector) fold(known engine.State, before uint64) (engine.State, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), historyTimeout)
	defer cancel()
	// Folded as apply folds it: an event that does not decode is skipped.
	var whole engine.State
	err := p.log.ReadHistory(ctx, known.ID, known.Events, func(rec events.Record, err error) {
		if err == nil && (before == 0 || rec.Seq < before) {
			whole, _ = engine.Apply(whole, rec)
		}
	})
	if err != nil {
		p.base.Logger.Warn("a settled task's history is unreadable: its summary stands for it", "task", known.ID, "err", err)
		return known, false
	}
	if whole.ID != known.ID || whole.Seq < known.Seq {
		p.base.Logger.Warn("a settled task's history ends before its summary: its summary stands for it",
			"task", known.ID, "history_seq", whole.Seq, "seq", known.Seq)
		return known, false
	}
	return whole, true
}

// store keeps a task's new state: whole, or as a summary once it is settled. task
// and sum are where it was kept (nil: not there). Called with the lock held.
func (p *Projector) store(id string, next *engine.State, task *engine.State, sum *summary) {
	if settled(next) {
		if task != nil {
			delete(p.tasks, id)
		}
		if sum == nil {
			sum = new(summary)
			p.summaries[id] = sum
		}
		*sum = summarize(next, &p.interned)
		// The map's key is the one copy of the id.
		sum.ID = id
		return
	}
	if sum != nil {
		delete(p.summaries, id)
	}
	if task == nil {
		task = new(engine.State)
		p.tasks[id] = task
	}
	*task = *next
}

// index moves a task from one phase's index and count to another's.
func (p *Projector) index(id string, from, to engine.Phase) {
	if from != "" {
		p.phases[from]--
	}
	if to != "" {
		p.phases[to]++
	}
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

// Unsettled is every task something may still happen to: all but the settled
// ones, whose summaries are all the projector keeps. What the engine recovers at
// its start is among them, so it need not build the state of every task.
func (p *Projector) Unsettled() []engine.State {
	p.mu.RLock()
	defer p.mu.RUnlock()
	states := make([]engine.State, 0, len(p.tasks))
	for _, s := range p.tasks {
		states = append(states, *s)
	}
	return states
}

// Settled implements engine.SettledLister: the settled tasks, not archived, that
// finished by cutoff, each built from its summary.
func (p *Projector) Settled(cutoff time.Time) []engine.State {
	p.mu.RLock()
	defer p.mu.RUnlock()
	var states []engine.State
	for _, sum := range p.summaries {
		if sum.Phase == engine.PhaseArchived || sum.finishedAt().After(cutoff) {
			continue
		}
		states = append(states, sum.state())
	}
	return states
}

// Task implements engine.TaskReader. A settled task's whole state is folded from
// its history, read from the stream; if that fails, its summary is what is known.
func (p *Projector) Task(id string) (engine.State, bool) {
	p.mu.RLock()
	if s, ok := p.tasks[id]; ok {
		defer p.mu.RUnlock()
		return *s, true
	}
	sum, ok := p.summaries[id]
	if !ok {
		p.mu.RUnlock()
		return engine.State{}, false
	}
	known := sum.state()
	p.mu.RUnlock()
	if known.Phase == engine.PhaseArchived {
		return known, true
	}
	whole, _ := p.fold(known, 0)
	return whole, true
}

// Outcome implements engine.OutcomeReader: a task not settled yet whole, a
// settled one as its summary keeps it (phase, status, exit code, times), with no
// read of its history.
func (p *Projector) Outcome(id string) (engine.State, bool) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if s, ok := p.tasks[id]; ok {
		return *s, true
	}
	if sum, ok := p.summaries[id]; ok {
		return sum.state(), true
	}
	return engine.State{}, false
}

// MatchIDs returns the ids that match, of every task the projector knows
// (settled and archived ones too): the first limit of them in order, and how
// many match. It looks at each id, outside any index: it is for an id a person
// shortened, not for a path that serves every request.
func (p *Projector) MatchIDs(match func(id string) bool, limit int) ([]string, int) {
	var ids []string
	p.mu.RLock()
	for id := range p.tasks {
		if match(id) {
			ids = append(ids, id)
		}
	}
	for id := range p.summaries {
		if match(id) {
			ids = append(ids, id)
		}
	}
	p.mu.RUnlock()
	slices.Sort(ids)
	return ids[:min(limit, len(ids))], len(ids)
}

// historyTimeout bounds the read of a settled task's history.
const historyTimeout = 10 * time.Second

// List returns the tasks that match q, newest first, and how many matched in all.
func (p *Projector) List(q engine.ListQuery) ([]engine.State, int) {
	return p.ListAfter(q, time.Time{}, "")
}

// EachUnfinished calls f with each task in phase, one not terminal, in no
// order, read in place with the projection locked for reading: f must not keep
// t, change it, or call the projector.
func (p *Projector) EachUnfinished(phase engine.Phase, f func(t *engine.State)) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	for id := range p.unfinished[phase] {
		f(p.tasks[id])
	}
}

// ListAfter is List continued after the task armed at armedAt with the id afterID
// (none: from the newest). Newest first is armed time, then id, both descending:
// a position in that order stays one while tasks are registered, since each new
// task is armed after every listed one, so paging by it neither skips nor repeats.
// The total counts every task that matches q, before the position and after.
// It sorts outside the lock: with many tasks the sort takes milliseconds, during
// which the projector could apply no event, and no wake-up would go out.
func (p *Projector) ListAfter(q engine.ListQuery, armedAt time.Time, afterID string) ([]engine.State, int) {
	type entry struct {
		armedAt time.Time
		id      string
		// One of the two, read under the lock only.
		state *engine.State
		sum   *summary
	}
	newerFirst := func(a, b entry) int {
		if c := b.armedAt.Compare(a.armedAt); c != 0 {
			return c
		}
		return cmp.Compare(b.id, a.id)
	}
	after := entry{armedAt: armedAt, id: afterID}
	total := 0
	var matched []entry
	add := func(e entry) {
		total++
		if afterID == "" || newerFirst(after, e) < 0 {
			matched = append(matched, e)
		}
	}
	p.mu.RLock()
	switch {
	case q.Phase != "" && !q.Phase.Terminal():
		ids := p.unfinished[q.Phase]
		matched = make([]entry, 0, len(ids))
		for id := range ids {
			if s := p.tasks[id]; q.Selects(s.Listed()) {
				add(entry{armedAt: s.ArmedAt, id: s.ID, state: s})
			}
		}
	default:
		if q.Phase == "" {
			matched = make([]entry, 0, len(p.tasks)+len(p.summaries))
		}
		for _, s := range p.tasks {
			if q.Selects(s.Listed()) {
				add(entry{armedAt: s.ArmedAt, id: s.ID, state: s})
			}
		}
		for _, s := range p.summaries {
			if q.Selects(s.listed()) {
				add(entry{armedAt: s.ArmedAt, id: s.ID, sum: s})
			}
		}
	}
	p.mu.RUnlock()
	slices.SortFunc(matched, newerFirst)
	if q.Limit > 0 && len(matched) > q.Limit {
		matched = matched[:q.Limit]
	}
	// A task's state or summary lives at the same address while it is kept so:
	// only what it holds changes, under the lock. One that no longer matches
	// (left the state asked for, got another status), or has been settled, since
	// it matched is left out (a settled task was listed by its summary's place
	// when it matched).
	out := make([]engine.State, 0, len(matched))
	p.mu.RLock()
	for _, e := range matched {
		switch {
		case e.state != nil && p.tasks[e.id] == e.state && q.Selects(e.state.Listed()):
			out = append(out, *e.state)
		case e.state != nil:
			if sum := p.summaries[e.id]; sum != nil && q.Selects(sum.listed()) {
				out = append(out, sum.state())
			}
		case e.sum != nil && q.Selects(e.sum.listed()):
			out = append(out, e.sum.state())
		}
	}
	p.mu.RUnlock()
	return out, total
}

// Problems returns the events that could not be applied (at most the first 1000)
// and how many there were.
func (p *Projector) Problems() ([]Problem, int) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return slices.Clone(p.problems), p.problemCount
}

// Phases counts the tasks in each phase; a phase no task is in is left out.
func (p *Projector) Phases() map[engine.Phase]int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	out := make(map[engine.Phase]int, len(p.phases))
	for phase, n := range p.phases {
		if n > 0 {
			out[phase] = n
		}
	}
	return out
}

// Applied is the sequence of the last event applied.
func (p *Projector) Applied() uint64 {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.applied
}
