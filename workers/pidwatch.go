package workers

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/proc"
)

// watchProcess follows the process a task watches (spec process), which bgtask
// did not start, to its end, and records it. No shim runs for it: a shim is a
// command's parent, to reap it, keep its output and stop it, and this process
// has a parent of its own (the only one that can read how it exited), prints
// nothing here and is never stopped by bgtask. A pidfd on the worker's poller
// waits for it, so a watch costs a descriptor, not a process; it ticks as a
// command does.
//
// The run's directory, its intent, is all a restart needs: a worker that finds
// it with no run.json in it comes back here, and a process that ended meanwhile,
// whose PID names another process now, or that ran before the host restarted,
// is found gone at once. Its end is then recorded when it is seen, and the
// deadline too: whichever the worker sees first decides.
func (r *run) watchProcess(ctx context.Context) {
	w, id := r.w, r.state.ID
	target := proc.Identity(*r.state.Spec.Process)
	dir := w.runDir(id, r.state.Epoch)
	started := time.Now().UTC()
	if r.state.SpawnedAt != nil {
		started = *r.state.SpawnedAt
	}
	end := func(stoppedBy string) {
		run := events.Exited{WatchedPID: target.PID, StoppedBy: stoppedBy, StartedAt: started, EndedAt: time.Now().UTC()}
		if r.recordEnd(ctx, engine.Exit{Run: run}) {
			_ = os.RemoveAll(dir)
		}
	}
	watch, err := proc.Start(target)
	switch {
	case errors.Is(err, proc.ErrGone):
		w.cfg.Base.Logger.Info("watched process has ended", "task", id, "pid", target.PID, "why", err)
		end("")
		return
	case err != nil:
		w.cfg.Base.Logger.Info("watched process cannot be watched", "task", id, "pid", target.PID, "err", err)
		if r.recordEnd(ctx, engine.Fail{Reason: err.Error()}) {
			_ = os.RemoveAll(dir)
		}
		return
	}
	defer watch.Stop()
	var deadline <-chan time.Time
	if at := r.state.Spec.DeadlineTime(); !at.IsZero() {
		timer := time.NewTimer(time.Until(at))
		defer timer.Stop()
		deadline = timer.C
	}
	// Ticks say the watch is alive, as a command's say it runs; the first names
	// the PID.
	ticker := time.NewTicker(w.cfg.TickInterval)
	defer ticker.Stop()
	for err := r.record(ctx, engine.Tick{PID: target.PID}); ; err = r.record(ctx, engine.Tick{}) {
		if errors.Is(err, errFenced) {
			_ = os.RemoveAll(dir)
			return
		} else if err != nil {
			w.cfg.Base.Logger.Warn("event not recorded", "task", id, "err", err)
		}
		select {
		case <-watch.Ended:
			end("")
			return
		case <-deadline:
			end(events.StoppedByDeadline)
			return
		case <-r.cancelled:
			// Cancelled or completed from outside: nothing to stop, the process is
			// not bgtask's.
			_ = os.RemoveAll(dir)
			return
		case <-ctx.Done():
			// The worker is stopping: its next start watches the process again.
			return
		case <-ticker.C:
		}
	}
}
