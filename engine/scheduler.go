package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/bgtask/bgtask/events"
)

// WorkerFeed is the fleet's heartbeats: every worker's current one, then changes.
type WorkerFeed interface {
	// Watch returns the current heartbeats, then sends changes until ctx ends.
	Watch(ctx context.Context) ([]events.WorkerUpdate, <-chan events.WorkerUpdate, error)
	TTL() time.Duration
}

// OfferFunc offers a task to a worker and returns its answer.
type OfferFunc func(ctx context.Context, workerID string, o events.Offer) (events.OfferReply, error)

// WorkerStatus is a worker as `bgtask workers` shows it: its heartbeat, and the
// tasks the log says it runs.
type WorkerStatus struct {
	events.WorkerInfo
	// LastSeen is when the server stored its last heartbeat.
	LastSeen time.Time `json:"last_seen"`
	Tasks    []string  `json:"tasks"`
}

// ScheduledTasks are what the scheduler places: the armed tasks, and the tasks
// they wait for, read as outcomes (a settled one from its summary, with no read
// of its history: a pass looks at every waiting task's dependencies).
type ScheduledTasks interface {
	TaskLister
	OutcomeReader
	// EachUnfinished calls f with each task in phase, one not terminal, read in
	// place: f must not keep t, change it, or call the reader.
	EachUnfinished(phase Phase, f func(t *State))
}

// Scheduler places armed tasks on workers. It keeps the fleet's heartbeats, and on
// every change that can let a task start (a task armed, a run ended, a worker
// joined or became ready) it offers waiting tasks, in FairOrder, to the worker
// Choose picks. Whether a task starts is decided by the worker's conditional spawn,
// never by the offer: offers may be lost, repeated, or made by several engines at
// once, and a task still starts once. A task no worker can take stays armed, with
// the reason kept for `show` and `list`, until a worker that can take it appears.
type Scheduler struct {
	base  Base
	tasks ScheduledTasks
	feed  WorkerFeed
	offer OfferFunc

	mu      sync.Mutex
	workers map[string]*fleetEntry
	// inflight: tasks offered, answer pending. taken: tasks a worker took whose
	// spawn the reader has not applied yet; both count in the worker's load.
	inflight map[string]string
	taken    map[string]string
	// fleet is the workers as the last pass left them, their loads counting the
	// offers it made: Waiting tells from it why a task waits.
	fleet []Candidate
	turns *Turns
	// due makes a pass when the next delayed start or retry comes due.
	due *time.Timer

	kick chan struct{}
	run  lifecycle
}

type fleetEntry struct {
	info events.WorkerInfo
	at   time.Time
	// unreachable: nothing answered its last offer; it gets none until it beats again.
	unreachable bool
}

// offerTimeout bounds one offer: the worker reads the task and appends its spawn.
const offerTimeout = 10 * time.Second

// schedulePeriod is how often waiting tasks are looked at without any change: it
// retries offers whose answers were lost and ages out workers whose heartbeats expired.
const schedulePeriod = time.Second

// NewScheduler returns the scheduler of an engine.
func NewScheduler(tasks ScheduledTasks, feed WorkerFeed, offer OfferFunc, base Base) *Scheduler {
	return &Scheduler{
		base: base.WithDefaults(), tasks: tasks, feed: feed, offer: offer,
		workers: map[string]*fleetEntry{}, inflight: map[string]string{}, taken: map[string]string{},
		turns: NewTurns(), kick: make(chan struct{}, 1),
	}
}

// Start reads the fleet's heartbeats, places what it can at once, and goes on
// following changes and placing tasks until Stop. Once it returns, every armed
// task the reader knew of has been offered or has a reason to wait.
func (s *Scheduler) Start(ctx context.Context) error {
	ctx, err := s.run.begin(ctx)
	if err != nil {
		return err
	}
	w, err := s.watch(ctx)
	if err != nil {
		s.run.end()
		return err
	}
	s.pass(ctx)
	s.run.goroutine(func() { s.loop(ctx, w) })
	return nil
}

// Stop ends placing tasks and waits for the offers in flight.
func (s *Scheduler) Stop() { s.run.end() }

// workerWatch is one watch of the heartbeats, stopped by its cancel.
type workerWatch struct {
	updates <-chan events.WorkerUpdate
	cancel  context.CancelFunc
}

// watch starts a watch whose current values replace what the scheduler knew.
func (s *Scheduler) watch(ctx context.Context) (workerWatch, error) {
	wctx, cancel := context.WithCancel(ctx)
	current, updates, err := s.feed.Watch(wctx)
	if err != nil {
		cancel()
		return workerWatch{}, err
	}
	fleet := map[string]*fleetEntry{}
	for _, u := range current {
		if !u.Gone {
			fleet[u.ID] = &fleetEntry{info: u.Info, at: u.At}
		}
	}
	s.mu.Lock()
	s.workers = fleet
	s.mu.Unlock()
	s.signal()
	return workerWatch{updates: updates, cancel: cancel}, nil
}

func (s *Scheduler) loop(ctx context.Context, w workerWatch) {
	ticker := time.NewTicker(schedulePeriod)
	defer ticker.Stop()
	// The watch is started again now and then: a watch that stalled while its
	// server went away would otherwise age every worker out of the scheduler's view.
	refresh := time.NewTicker(max(s.feed.TTL()/4, schedulePeriod))
	defer refresh.Stop()
	defer func() { w.cancel() }()
	for {
		select {
		case <-ctx.Done():
			return
		case u, ok := <-w.updates:
			if !ok {
				w = s.rewatch(ctx, w) // the watch ended under us
				continue
			}
			s.update(u)
		case <-refresh.C:
			w = s.rewatch(ctx, w)
		case <-s.kick:
			s.pass(ctx)
		case <-ticker.C:
			s.pass(ctx)
		}
	}
}

// rewatch replaces a watch, retrying until it can or ctx ends.
func (s *Scheduler) rewatch(ctx context.Context, old workerWatch) workerWatch {
	old.cancel()
	for {
		w, err := s.watch(ctx)
		if err == nil {
			return w
		}
		s.base.Logger.Warn("scheduler: watching workers failed, retrying", "err", err)
		select {
		case <-ctx.Done():
			return workerWatch{cancel: func() {}}
		case <-time.After(time.Second):
		}
	}
}

func (s *Scheduler) update(u events.WorkerUpdate) {
	s.mu.Lock()
	if u.Gone {
		delete(s.workers, u.ID)
	} else {
		s.workers[u.ID] = &fleetEntry{info: u.Info, at: u.At}
	}
	s.mu.Unlock()
	s.signal()
}

// Kick asks for a placement pass: a task held back (for its dependencies) may
// start now.
func (s *Scheduler) Kick() { s.signal() }

func (s *Scheduler) signal() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Notify is called with every task state the projector applies live.
func (s *Scheduler) Notify(st State) {
	if st.Phase != PhaseArmed {
		s.mu.Lock()
		delete(s.taken, st.ID)
		s.mu.Unlock()
	}
	switch {
	case st.Phase == PhaseArmed:
	case st.LastType == events.TypeSpawned: // the worker's load is now in the log
	case st.LastType == events.TypeExited, st.LastType == events.TypeFailed,
		st.LastType == events.TypeCancelled, st.LastType == events.TypeLost:
		// a slot may be free
	default:
		return
	}
	s.signal()
}

// pass offers every waiting task that a worker can take now. Every registration
// asks for a pass, so a pass that can place nothing (no worker, or every slot
// taken) stops before it reads the waiting tasks: placing them is the only work
// that grows with their number.
func (s *Scheduler) pass(ctx context.Context) {
	// The running tasks are read in place, not listed: a pass comes with each task
	// armed and each run that ends, and a list would copy every running task's
	// state, a kilobyte each, each time.
	load := map[string]int{} // running tasks, by worker
	s.tasks.EachUnfinished(PhaseRunning, func(t *State) { load[t.Worker]++ })
	now := s.base.Now()

	s.mu.Lock()
	cands, index, free := s.candidates(load, now)
	s.fleet = cands
	if free == 0 {
		// The turns of targets gone idle meanwhile are forgotten by the next pass
		// that places tasks, before it orders them.
		s.mu.Unlock()
		return
	}
	armed, _ := s.tasks.List(ListQuery{Phase: PhaseArmed})
	active := ActiveTurns{}
	for i := range armed {
		active.Add(&armed[i])
	}
	s.tasks.EachUnfinished(PhaseRunning, active.Add)
	s.turns.Keep(active)
	type offer struct {
		task   State
		worker string
	}
	var offers []offer
	var next time.Time // the earliest start of a task not yet due
	for _, t := range FairOrder(armed, s.turns) {
		if free == 0 {
			break
		}
		if s.inflight[t.ID] != "" || s.taken[t.ID] != "" || !t.Spec.HasCommand() || t.Paused {
			continue
		}
		if wait, skip := t.Dependencies(s.tasks.Outcome); wait || skip != nil {
			continue // waiting for its dependencies, or to be skipped
		}
		if at := t.NotBefore(); at.After(now) {
			if next.IsZero() || at.Before(next) {
				next = at
			}
			continue
		}
		w, _ := Choose(t, cands)
		if w == "" {
			continue
		}
		cands[index[w]].Load++
		free--
		s.inflight[t.ID] = w
		offers = append(offers, offer{t, w})
	}
	s.wakeAt(next)
	s.mu.Unlock()

	for _, o := range offers {
		s.run.goroutine(func() { s.send(ctx, o.task, o.worker) })
	}
}

// candidates are the live workers with their loads (their running tasks, given
// in load, the tasks taken whose spawn is not applied yet, the offers in
// flight), by id, and how many free slots they have in all. Workers whose
// heartbeat expired are forgotten. Its mutex is held.
func (s *Scheduler) candidates(load map[string]int, now time.Time) (cands []Candidate, index map[string]int, free int) {
	for id, w := range s.taken {
		if st, ok := s.tasks.Task(id); !ok || st.Phase != PhaseArmed {
			delete(s.taken, id) // its spawn was applied before the answer came
			continue
		}
		load[w]++
	}
	for _, w := range s.inflight {
		load[w]++
	}
	index = map[string]int{}
	ttl := s.feed.TTL()
	for _, id := range slices.Sorted(maps.Keys(s.workers)) {
		e := s.workers[id]
		if now.Sub(e.at) > ttl {
			delete(s.workers, id) // its heartbeat expired with its lease
			continue
		}
		index[id] = len(cands)
		c := Candidate{
			ID: id, Labels: e.info.Labels, MaxTasks: e.info.MaxTasks, Load: load[id],
			Accepting: e.info.State == events.WorkerReady && !e.unreachable, Exclusive: e.info.Exclusive,
		}
		if c.Accepting && c.Load < c.MaxTasks {
			free += c.MaxTasks - c.Load
		}
		cands = append(cands, c)
	}
	return cands, index, free
}

func (s *Scheduler) send(ctx context.Context, task State, workerID string) {
	taskID := task.ID
	offerCtx, cancel := context.WithTimeout(ctx, offerTimeout)
	reply, err := s.offer(offerCtx, workerID, events.Offer{TaskID: taskID})
	cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.inflight, taskID)
	switch {
	case errors.Is(err, events.ErrNoWorker):
		if e := s.workers[workerID]; e != nil {
			e.unreachable = true
		}
	case err != nil:
		if ctx.Err() == nil {
			s.base.Logger.Warn("scheduler: offer not answered", "task", taskID, "worker", workerID, "err", err)
		}
	case reply.Taken:
		// Its target's turn is used only when a task starts: an offer declined
		// (a worker still finishing its last run) costs no turn.
		s.turns.Served(task)
		if st, ok := s.tasks.Task(taskID); ok && st.Phase == PhaseArmed {
			s.taken[taskID] = workerID
		}
	default:
		s.base.Logger.Debug("scheduler: offer declined", "task", taskID, "worker", workerID, "reason", reply.Reason)
	}
	// A declined or lost offer is made again at the next periodic pass, not at once:
	// a worker whose own count disagrees with the log for a moment is not flooded.
}

// wakeAt has a pass made at the start of the next task not yet due (zero: none),
// not at the periodic pass after it. Its mutex is held.
func (s *Scheduler) wakeAt(at time.Time) {
	if s.due != nil {
		s.due.Stop()
		s.due = nil
	}
	if !at.IsZero() {
		s.due = time.AfterFunc(time.Until(at), s.signal)
	}
}

// Waiting says why an armed task has not started, as of the last placement pass:
// what Choose says of it on the fleet that pass left.
func (s *Scheduler) Waiting(st State) string {
	if st.Phase != PhaseArmed {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if w := s.inflight[st.ID]; w != "" {
		return "being offered to worker " + w
	}
	if s.taken[st.ID] != "" {
		return ""
	}
	switch at := st.NotBefore(); {
	case st.Paused:
		return "paused: 'bgtask resume " + st.ID + "' lets it go on"
	case st.Spec.IsTimer():
		return "a timer: fires at " + st.Spec.StartAt
	case st.Spec.External:
		return "waiting to be completed from outside: 'bgtask complete " + st.ID + "'"
	case st.Spec.Join != nil:
		return fmt.Sprintf("a group: waiting for %s of its %d members to end", st.Spec.Join.Mode, len(st.Spec.Join.Members))
	case len(st.Spec.After) > 0:
		if why := s.dependencyWait(st); why != "" {
			return why
		}
	case at.After(s.base.Now()):
		return "starts at " + at.UTC().Format(time.RFC3339)
	}
	_, why := Choose(st, s.fleet)
	return why
}

// dependencyWait says what of its dependencies an armed task waits for, if any.
func (s *Scheduler) dependencyWait(st State) string {
	wait, skip := st.Dependencies(s.tasks.Outcome)
	switch {
	case skip != nil:
		return "to be skipped: its dependency " + skip.Dependency + " ended " + skip.Status
	case !wait:
		return ""
	}
	for _, id := range st.Spec.After {
		if dep, ok := s.tasks.Task(id); !ok || !dep.Phase.Terminal() {
			return "waiting for task " + id + " to end"
		}
	}
	return ""
}

// Workers lists the live workers, by id.
func (s *Scheduler) Workers() []WorkerStatus {
	running, _ := s.tasks.List(ListQuery{Phase: PhaseRunning})
	tasks := map[string][]string{}
	for _, r := range running {
		tasks[r.Worker] = append(tasks[r.Worker], r.ID)
	}
	now, ttl := s.base.Now(), s.feed.TTL()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]WorkerStatus, 0, len(s.workers))
	for _, id := range slices.Sorted(maps.Keys(s.workers)) {
		e := s.workers[id]
		if now.Sub(e.at) > ttl {
			continue
		}
		ts := tasks[id]
		slices.Sort(ts)
		st := WorkerStatus{WorkerInfo: e.info, LastSeen: e.at, Tasks: append([]string{}, ts...)}
		st.Running = len(ts)
		out = append(out, st)
	}
	return out
}
