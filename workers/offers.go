package workers

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"slices"

	"github.com/nats-io/nats.go"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// onOffer answers the engine's offer of an armed task. The worker takes it only
// while it is ready and has a free slot; taking it is the conditional append of
// spawned, so an offer repeated or made to another worker too starts nothing twice.
func (w *Worker) onOffer(m *nats.Msg) {
	var o events.Offer
	if json.Unmarshal(m.Data, &o) != nil || !events.ValidToken(o.TaskID) {
		respond(m, events.OfferReply{Reason: events.DeclineError})
		return
	}
	w.mu.Lock()
	switch {
	case w.stopping || w.state != events.WorkerReady:
		w.mu.Unlock()
		respond(m, events.OfferReply{Reason: events.DeclineNotReady})
		return
	case w.runs[o.TaskID] != nil || w.taking[o.TaskID]:
		w.mu.Unlock()
		respond(m, events.OfferReply{Reason: events.DeclineTaken})
		return
	}
	select {
	case w.slots <- struct{}{}:
	default:
		w.mu.Unlock()
		respond(m, events.OfferReply{Reason: events.DeclineFull})
		return
	}
	w.taking[o.TaskID] = true
	w.wg.Add(1) // under mu, after the stopping check: Stop waits for this take
	w.mu.Unlock()
	go func() {
		defer w.wg.Done()
		reply, r, logAt := w.take(w.ctx, o.TaskID)
		respond(m, reply)
		if r == nil {
			<-w.slots
			w.release("")
			return
		}
		engine.CrashPoint(engine.CrashAfterSpawn)
		defer func() { <-w.slots }()
		r.execute(w.ctx, logAt, func(logAt *offsets) bool { return r.runOnce(w.ctx, logAt) })
	}()
}

func respond(m *nats.Msg, reply any) {
	data, _ := json.Marshal(reply)
	_ = m.Respond(data)
}

// take tries to become the owner of an armed task. It returns the run it now owns
// (nil if it does not) and where the task's log stands.
func (w *Worker) take(ctx context.Context, id string) (events.OfferReply, *run, offsets) {
	log := w.cfg.Base.Logger
	var logAt offsets
	defer func() {
		w.mu.Lock()
		delete(w.taking, id)
		w.mu.Unlock()
	}()
	armed, err := engine.Load(ctx, w.store, id)
	switch {
	case errors.Is(err, engine.ErrNotFound):
		return events.OfferReply{Reason: events.DeclineTaken}, nil, logAt
	case err != nil:
		log.Warn("worker: cannot read an offered task", "task", id, "err", err)
		return events.OfferReply{Reason: events.DeclineError}, nil, logAt
	case armed.Phase != engine.PhaseArmed:
		return events.OfferReply{Reason: events.DeclineTaken}, nil, logAt
	case !armed.Spec.Placement.Admits(w.cfg.Labels, w.cfg.Exclusive):
		return events.OfferReply{Reason: events.DeclineLabels}, nil, logAt
	}
	if armed.Epoch > 0 {
		// Armed again after its worker was lost: the log goes on after the earlier
		// runs' output.
		if logAt, err = w.logEnds(ctx, id); err != nil {
			return events.OfferReply{Reason: events.DeclineError}, nil, logAt
		}
	}
	// The run's directory is made before the spawn is appended: a worker that dies
	// between the two finds the task again when it restarts.
	dir := w.runDir(id, armed.Epoch+1)
	if err := writeIntent(dir); errors.Is(err, fs.ErrExist) {
		return events.OfferReply{Reason: events.DeclineTaken}, nil, logAt // taken before a restart, and held
	} else if err != nil {
		log.Error("worker: cannot write its state directory", "err", err)
		return events.OfferReply{Reason: events.DeclineError}, nil, logAt
	}
	r := &run{w: w, state: armed, cancelled: make(chan struct{})}
	// The run's directory is written while its spawn is appended; the shim is
	// handed the run after the spawn is in the log. A worker that stops in between
	// finds a run no shim took, as it would had it stopped after the spawn, and
	// settles it from the log.
	ready := make(chan preparedRun, 1)
	if armed.Spec.Process == nil {
		epoch := armed.Epoch + 1
		run := r.shimRun(dir, epoch, logAt)
		go func() { ready <- w.prepareFirst(dir, epoch, run, armed.Spec) }()
	} else {
		close(ready) // a watch of a process: nothing to start
	}
	held, err := r.claim(ctx)
	if p, ok := <-ready; ok {
		r.prepared = &p
	}
	switch {
	case held:
		w.hold(r)
		return events.OfferReply{Taken: true}, r, logAt
	case err == nil:
		_ = os.RemoveAll(dir)
		return events.OfferReply{Reason: events.DeclineTaken}, nil, logAt // another worker took it, or it was cancelled first
	default:
		// Stopping with the spawn's outcome unknown: the run's directory stays, and
		// the next start of this worker learns from the log whether it holds the task.
		log.Warn("worker: stopping before its take of a task was settled", "task", id, "err", err)
		return events.OfferReply{Reason: events.DeclineError}, nil, logAt
	}
}

// prepareFirst readies the first run of a task being taken: its program found
// and its directory written.
func (w *Worker) prepareFirst(dir string, epoch uint64, run shimRun, spec engine.Spec) (p preparedRun) {
	p.epoch = epoch
	p.run, p.err = prepareRun(dir, run, spec)
	return p
}

// hold counts a run as the worker's own until release.
func (w *Worker) hold(r *run) {
	w.mu.Lock()
	w.runs[r.state.ID] = r
	w.mu.Unlock()
}

// release forgets a run that ended (id "" after a take that took nothing) and ends a
// drain when it was the last.
func (w *Worker) release(id string) {
	w.mu.Lock()
	if id != "" {
		delete(w.runs, id)
	}
	// A stopping worker lets go of its runs, which go on: that ends no drain.
	done := !w.stopping && w.state == events.WorkerDraining && len(w.runs) == 0 && len(w.taking) == 0
	w.mu.Unlock()
	if done {
		w.finishDrain()
	}
}

// Drain makes the worker take no new task; when the runs it has end, Drained is
// closed and its heartbeat removed: it holds nothing, and is gone.
func (w *Worker) Drain() {
	// One check of both states: the start may make the worker ready meanwhile.
	if !w.setState(w.ctx, events.WorkerDraining, events.WorkerReady, events.WorkerStarting) {
		return // draining already, or stopping
	}
	w.cfg.Base.Logger.Info("worker draining: no new task; exits when its runs have ended", "running", len(w.Running()))
	w.release("")
}

// finishDrain removes the heartbeat, then closes Drained: whoever waits on it sees
// the worker gone. Holding beatMu, it orders the removal after any heartbeat being
// written, and no later one writes it again.
func (w *Worker) finishDrain() {
	w.beatMu.Lock()
	w.mu.Lock()
	if w.heartbeatRemoved {
		w.mu.Unlock()
		w.beatMu.Unlock()
		return
	}
	w.heartbeatRemoved = true
	w.mu.Unlock()
	err := w.liveness.Remove(w.ctx, w.cfg.ID)
	w.beatMu.Unlock()
	if err != nil && w.ctx.Err() == nil {
		w.cfg.Base.Logger.Warn("heartbeat not removed", "err", err)
	}
	close(w.drained)
	w.cfg.Base.Logger.Info("worker drained")
}

// Drained is closed when a drain has ended.
func (w *Worker) Drained() <-chan struct{} { return w.drained }

func (w *Worker) isDrained() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.isDrainedLocked()
}

func (w *Worker) isDrainedLocked() bool {
	select {
	case <-w.drained:
		return true
	default:
		return false
	}
}

// onDrain answers `bgtask worker drain`.
func (w *Worker) onDrain(m *nats.Msg) {
	w.Drain()
	running := w.Running()
	slices.Sort(running)
	respond(m, events.DrainReply{ID: w.cfg.ID, Running: running})
}
