package workers

import (
	"context"
	"errors"
	"os"
	"sync"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// errFenced: the task changed under the worker (cancelled, or taken over); the
// worker no longer owns it and must not touch it again.
var errFenced = errors.New("worker no longer owns the task")

// appendTimeout bounds the appends made while a worker stops.
const appendTimeout = 10 * time.Second

// run is one task a worker owns.
type run struct {
	w          *Worker
	state      engine.State
	cancelOnce sync.Once
	cancelled  chan struct{}
}

func (r *run) cancel() { r.cancelOnce.Do(func() { close(r.cancelled) }) }

// append decides c on the run's state and appends it conditionally on the run's last
// event. A conflict means the worker was fenced.
func (r *run) append(ctx context.Context, c engine.Command) error {
	ev, err := r.decide(c)
	if err != nil {
		return err
	}
	return r.commit(ctx, ev)
}

func (r *run) decide(c engine.Command) (events.Event, error) {
	return engine.Decide(r.state, c, engine.Meta{Writer: r.w.cfg.ID, Now: r.w.cfg.Base.Now()})
}

// commit appends an event decided on the run's state. Retrying the same event is
// safe: the store recognises an append of it that already succeeded.
func (r *run) commit(ctx context.Context, ev events.Event) error {
	seq, err := r.w.store.Append(ctx, ev, r.state.Seq)
	if errors.Is(err, events.ErrConflict) {
		return errFenced
	}
	if err != nil {
		return err
	}
	r.state, err = engine.Apply(r.state, events.Record{Seq: seq, Event: ev})
	return err
}

// execute runs the command of a task the worker has just taken, to its end.
func (r *run) execute(ctx context.Context) {
	w, id, log := r.w, r.state.ID, r.w.cfg.Base.Logger
	w.mu.Lock()
	w.runs[id] = r
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.runs, id)
		w.mu.Unlock()
	}()

	spec := r.state.Spec
	dir := spec.Cwd
	if dir == "" {
		dir = homeDir()
	}
	env := mergeEnv(w.env(), spec.Env, "BGTASK_TASK_ID="+id)
	proc, err := startProcess(spec, env, dir, NewTail(w.cfg.TailLines, MaxLineBytes))
	if err != nil {
		log.Info("task failed to start", "task", id, "err", err)
		r.appendWhileStopping(ctx, engine.Fail{Reason: err.Error()})
		return
	}
	log.Info("task started", "task", id, "pid", proc.cmd.Process.Pid, "command", spec.CommandLine())
	ticker := time.NewTicker(w.cfg.TickInterval)
	defer ticker.Stop()
	err = r.append(ctx, engine.Tick{PID: proc.cmd.Process.Pid})
	for err == nil {
		select {
		case <-proc.exited:
			r.appendWhileStopping(ctx, engine.Exit{Run: proc.result})
			return
		case <-ticker.C:
			err = r.append(ctx, engine.Tick{OutputBytes: proc.tail.Bytes()})
		case <-r.cancelled:
			err = errFenced
		case <-ctx.Done():
			// The worker is stopping: end the command and record how it ended.
			proc.stop(w.cfg.KillGrace)
			r.appendWhileStopping(ctx, engine.Exit{Run: proc.result})
			return
		}
		if err != nil && !errors.Is(err, errFenced) && ctx.Err() == nil {
			log.Warn("tick not recorded", "task", id, "err", err)
			err = nil // NATS is away for a moment: keep running, the next tick tries again
		}
	}
	log.Info("task cancelled or taken over: stopping its process group", "task", id)
	proc.stop(w.cfg.KillGrace)
}

// appendWhileStopping appends an event that must be recorded even when the worker is
// shutting down, within a bound.
func (r *run) appendWhileStopping(ctx context.Context, c engine.Command) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), appendTimeout)
	defer cancel()
	ev, err := r.decide(c)
	if err != nil {
		r.w.cfg.Base.Logger.Error("end of task not recorded", "task", r.state.ID, "err", err)
		return
	}
	for {
		err := r.commit(ctx, ev)
		if err == nil || errors.Is(err, errFenced) {
			return
		}
		r.w.cfg.Base.Logger.Warn("could not record the end of a task, retrying", "task", r.state.ID, "err", err)
		select {
		case <-ctx.Done():
			r.w.cfg.Base.Logger.Error("end of task not recorded", "task", r.state.ID, "err", err)
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func homeDir() string {
	if h, err := os.UserHomeDir(); err == nil {
		return h
	}
	return "/"
}
