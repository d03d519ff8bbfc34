package workers

import (
	"context"
	"errors"
	"io"
	"os"
	"sync"
	"sync/atomic"
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

// appendNow appends an event of a running command. It does not end with the
// worker's context: an append cut short by a stopping worker could leave the run
// without the exit it is about to record.
func (r *run) appendNow(ctx context.Context, c engine.Command) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), appendTimeout)
	defer cancel()
	return r.append(ctx, c)
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

// execute runs the command of a task the worker has just taken, to its end: once,
// or again after each stall the spec says to respawn on.
func (r *run) execute(ctx context.Context) {
	w, id := r.w, r.state.ID
	w.mu.Lock()
	w.runs[id] = r
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.runs, id)
		w.mu.Unlock()
	}()
	var offsets [2]int64 // output so far, so a respawned run's log goes on after it
	for r.runOnce(ctx, &offsets) {
		if err := r.appendNow(ctx, engine.Spawn{Host: w.host}); err != nil {
			w.cfg.Base.Logger.Warn("respawn not recorded", "task", id, "err", err)
			return
		}
	}
}

// runOnce runs the command once and records how the run ended. It reports whether
// the run stalled and is to be started again.
func (r *run) runOnce(ctx context.Context, offsets *[2]int64) (respawn bool) {
	w, id, log := r.w, r.state.ID, r.w.cfg.Base.Logger
	spec := r.state.Spec
	dir := spec.Cwd
	if dir == "" {
		dir = homeDir()
	}
	env := mergeEnv(w.env(), spec.Env, "BGTASK_TASK_ID="+id)

	tail := NewTail(max(w.cfg.TailLines, spec.TailLines()), MaxLineBytes)
	stdoutLog := w.logs.Writer(id, events.Stdout, offsets[0])
	stderrLog := w.logs.Writer(id, events.Stderr, offsets[1])
	var lastOutput atomic.Int64
	lastOutput.Store(time.Now().UnixNano())
	stdout := output{writers: []io.Writer{tail, stdoutLog}, last: &lastOutput}
	stderr := output{writers: []io.Writer{tail, stderrLog}, last: &lastOutput}
	var watch *lineWatch
	var matched <-chan struct{}
	if m := spec.Matcher(); m != nil {
		watch = newLineWatch(m)
		stdout.writers = append(stdout.writers, watch)
		matched = watch.hit
	}
	closeLogs := func() int64 {
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), appendTimeout)
		defer cancel()
		var outTotal, errTotal int64
		outTotal, _ = stdoutLog.Close(lctx)
		errTotal, _ = stderrLog.Close(lctx)
		offsets[0], offsets[1] = outTotal, errTotal
		return outTotal + errTotal
	}

	proc, err := startProcess(spec, env, dir, stdout, stderr)
	if err != nil {
		closeLogs()
		log.Info("task failed to start", "task", id, "err", err)
		r.appendWhileStopping(ctx, engine.Fail{Reason: err.Error()})
		return false
	}
	log.Info("task started", "task", id, "pid", proc.cmd.Process.Pid, "command", spec.CommandLine())

	// end records the run's end; stoppedBy names the rule that stopped it, if any.
	end := func(stoppedBy string) {
		if watch != nil {
			watch.finish()
		}
		run := proc.result
		run.StoppedBy = stoppedBy
		run.Tail = tail.Lines()
		if watch != nil {
			run.MatchedLine, run.Matched = watch.result()
		}
		run.OutputBytes = closeLogs()
		if res := spec.Result; res != nil && res.Type == engine.ResultCommand {
			run.Result, run.ResultError = resultCommand(ctx, *res, env, dir)
		}
		r.appendWhileStopping(ctx, engine.Exit{Run: run})
	}

	ticker := time.NewTicker(w.cfg.TickInterval)
	defer ticker.Stop()
	var deadline <-chan time.Time
	if at := spec.DeadlineTime(); !at.IsZero() {
		timer := time.NewTimer(time.Until(at))
		defer timer.Stop()
		deadline = timer.C
	}
	var stallCheck <-chan time.Time
	stallAfter := spec.StallDuration()
	if stallAfter > 0 {
		check := time.NewTicker(max(stallAfter/10, 50*time.Millisecond))
		defer check.Stop()
		stallCheck = check.C
	}

	err = r.appendNow(ctx, engine.Tick{PID: proc.cmd.Process.Pid})
	for err == nil {
		select {
		case <-proc.exited:
			end("")
			return false
		case <-matched:
			if spec.KeepRunning {
				// The rule is met and the command goes on, no longer watched.
				run := events.Exited{StartedAt: proc.started.UTC(), EndedAt: time.Now().UTC(), KeptRunning: true, Tail: tail.Lines()}
				run.MatchedLine, run.Matched = watch.result()
				run.OutputBytes = closeLogs()
				r.appendWhileStopping(ctx, engine.Exit{Run: run})
				return false
			}
			proc.stop(w.cfg.KillGrace)
			end(events.StoppedByMatch)
			return false
		case <-deadline:
			log.Info("deadline passed: stopping the task", "task", id)
			proc.stop(w.cfg.KillGrace)
			end(events.StoppedByDeadline)
			return false
		case now := <-stallCheck:
			silent := now.Sub(time.Unix(0, lastOutput.Load()))
			if silent < stallAfter {
				continue
			}
			switch action := r.stallAction(spec); action {
			case engine.OnStallNotify:
				stallCheck = nil // told once; the command goes on
				err = r.appendNow(ctx, engine.Stall{SilentFor: silent.Round(time.Millisecond), Action: action})
			case engine.OnStallRespawn:
				if err = r.appendNow(ctx, engine.Stall{SilentFor: silent.Round(time.Millisecond), Action: action}); err == nil {
					log.Info("task stalled: starting it again", "task", id, "silent", silent)
					proc.stop(w.cfg.KillGrace)
					closeLogs()
					return true
				}
			default:
				if err = r.appendNow(ctx, engine.Stall{SilentFor: silent.Round(time.Millisecond), Action: engine.OnStallKill}); err == nil {
					log.Info("task stalled: stopping it", "task", id, "silent", silent)
					proc.stop(w.cfg.KillGrace)
					end(events.StoppedByStall)
					return false
				}
			}
		case <-ticker.C:
			err = r.appendNow(ctx, engine.Tick{OutputBytes: tail.Bytes()})
		case <-r.cancelled:
			err = errFenced
		case <-ctx.Done():
			// The worker is stopping: end the command and record how it ended.
			proc.stop(w.cfg.KillGrace)
			end("")
			return false
		}
		if err != nil && !errors.Is(err, errFenced) {
			log.Warn("event not recorded", "task", id, "err", err)
			err = nil // NATS is away for a moment: keep running, the next tick tries again
		}
	}
	log.Info("task cancelled or taken over: stopping its process group", "task", id)
	proc.stop(w.cfg.KillGrace)
	closeLogs()
	return false
}

// stallAction is what a stall does now: a respawn past the limit, or a second
// notify, becomes a kill or nothing.
func (r *run) stallAction(spec engine.Spec) string {
	switch spec.OnStall {
	case engine.OnStallRespawn:
		if r.state.Respawns < spec.Respawns() {
			return engine.OnStallRespawn
		}
		return engine.OnStallKill
	case engine.OnStallNotify:
		if !r.state.StallNotified {
			return engine.OnStallNotify
		}
	}
	return spec.OnStall
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
