package workers

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/workers/shim"
)

// reattach finds the runs a previous process of this worker left in its state
// directory and watches them again: a run still going resumes its ticks and its
// output where the log stands; a run whose command ended while no worker watched
// has its exit recorded now, once (the append is conditional on the run's last
// event); a run that is no longer this worker's is stopped.
func (w *Worker) reattach(ctx context.Context) error {
	dirs, err := filepath.Glob(filepath.Join(w.cfg.StateDir, "runs", "*"))
	if err != nil {
		return err
	}
	// Known only where both boots are.
	now, runsMadeIn := hostBoot(), runsBoot(w.cfg.StateDir)
	hostRestarted := now != "" && runsMadeIn != "" && now != runsMadeIn
	for _, dir := range dirs {
		if err := w.reattachRun(ctx, dir, hostRestarted); err != nil {
			return fmt.Errorf("worker: find run %s again: %w", dir, err)
		}
	}
	if now == "" || now == runsMadeIn {
		return nil
	}
	return shim.WriteDurable(filepath.Join(w.cfg.StateDir, bootFile), []byte(now+"\n"))
}

// reattachRun settles the run in dir, as reattach says; hostRestarted: the host
// has restarted since the run was made.
func (w *Worker) reattachRun(ctx context.Context, dir string, hostRestarted bool) error {
	log := w.cfg.Base.Logger
	sr, ok := intentOf(dir)
	if !ok { // not made by a worker for a run
		_ = os.RemoveAll(dir)
		return nil
	}
	state, err := engine.Load(ctx, w.store, sr.TaskID)
	if err != nil && !errors.Is(err, engine.ErrNotFound) {
		return err
	}
	proc, perr := w.awaitRun(dir, &sr)
	if errors.Is(err, engine.ErrNotFound) {
		// The log does not know the task (another deployment's, or a log that was
		// reset): nothing will ever record it, so nothing may keep running for it.
		log.Warn("a run of a task the log does not know: stopping it", "task", sr.TaskID)
		if perr == nil {
			proc.stop(w.cfg.KillGrace)
		}
		_ = os.RemoveAll(dir)
		return nil
	}
	if owned := state.Phase == engine.PhaseRunning && state.Worker == w.cfg.ID && state.Epoch == sr.Epoch; !owned {
		w.letGo(dir, state, sr, proc, perr)
		return nil
	}
	r := &run{w: w, state: state, cancelled: make(chan struct{})}
	switch {
	case errors.Is(perr, errShimNotStarted) && hostRestarted:
		log.Error("a run was starting when the host restarted: not started again", "task", sr.TaskID)
		if r.recordEnd(ctx, engine.Lose{Reason: ReasonHostRestarted}) {
			_ = os.RemoveAll(dir)
		}
	case errors.Is(perr, errShimNotStarted):
		// Taken, but the worker stopped before its shim started the command: start
		// it now.
		log.Info("starting a task taken before a restart", "task", sr.TaskID)
		logAt, err := w.logEnds(ctx, sr.TaskID)
		if err != nil {
			return err
		}
		w.resume(ctx, r, logAt, func(logAt *offsets) bool { return r.runOnce(ctx, logAt) })
	case errors.Is(perr, errShimDied):
		r.loseStarted(ctx, dir)
	case perr != nil:
		// The command could not start (its start error), or its PIDs cannot be read.
		if r.recordEnd(ctx, engine.Fail{Reason: perr.Error()}) {
			_ = os.RemoveAll(dir)
		}
	case state.RespawnPending:
		// Stalled, and to be started again when the worker went away: finish the
		// stop, then respawn.
		proc.stop(w.cfg.KillGrace)
		_ = os.RemoveAll(dir)
		logAt, err := w.logEnds(ctx, sr.TaskID)
		if err != nil {
			return err
		}
		w.resume(ctx, r, logAt, func(*offsets) bool { return true })
	default:
		return w.watchAgain(ctx, r, dir, sr, proc)
	}
	return nil
}

// awaitRun finds the shim of the run in dir, once it started (or failed to start)
// the command. The shim of a run whose run.json is written may still be starting
// (this worker's previous process died meanwhile): what it does is awaited first.
func (w *Worker) awaitRun(dir string, sr *shimRun) (*process, error) {
	// It holds the run's environment too, which a result command runs in.
	if readJSON(filepath.Join(dir, runFile), sr) != nil {
		return nil, errShimNotStarted
	}
	return awaitShim(w.notify, dir, func() {
		w.cfg.Base.Logger.Info("the shim of a run is still starting its command: waiting for it", "task", sr.TaskID)
	})
}

// letGo lets go of a run that is not this worker's any more: cancelled, ended or
// taken over while this worker was away; or left running on purpose (its rule
// matched with keep_running), recorded just before this worker's previous process
// died with the directory still there.
func (w *Worker) letGo(dir string, state engine.State, sr shimRun, proc *process, perr error) {
	kept := state.Epoch == sr.Epoch && state.Run != nil && state.Run.KeptRunning
	switch {
	case perr == nil && kept:
		proc.detach()
		_ = os.RemoveAll(dir)
	case perr == nil:
		w.cfg.Base.Logger.Info("stopping a run that is no longer this worker's", "task", sr.TaskID, "state", state.Phase)
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			proc.stop(w.cfg.KillGrace)
			_ = os.RemoveAll(dir)
		}()
	default:
		_ = os.RemoveAll(dir)
	}
}

// watchAgain watches a run that goes on, from where its log stands.
func (w *Worker) watchAgain(ctx context.Context, r *run, dir string, sr shimRun, proc *process) error {
	logAt, err := w.logEnds(ctx, sr.TaskID)
	if err != nil {
		return err
	}
	again := &foundAgain{decided: decisionOf(dir, r.state)}
	again.fileAt.stdout, logAt.stdout = resumeAt(filepath.Join(dir, shim.StdoutFile), logAt.stdout, sr.LogOffsets.stdout)
	again.fileAt.stderr, logAt.stderr = resumeAt(filepath.Join(dir, shim.StderrFile), logAt.stderr, sr.LogOffsets.stderr)
	w.cfg.Base.Logger.Info("watching a run again", "task", sr.TaskID, "pid", proc.pids.Command.PID)
	w.resume(ctx, r, logAt, func(logAt *offsets) bool { return r.watch(ctx, proc, sr, logAt, again) })
	return nil
}

// resumeAt is where in the output file at path the log of a run found again goes
// on, and where its log stream then stands: the stream stands at logAt, and stood
// at started when the run began. A log that fell far behind (NATS was away) while
// a previous process of this worker read and freed the output goes on after what
// was freed: it is gone.
func resumeAt(path string, logAt, started int64) (fileAt, newLogAt int64) {
	fileAt = max(0, logAt-started)
	skip := max(0, dataFrom(path, fileAt)-fileAt)
	return fileAt + skip, logAt + skip
}

// logEnds is where the task's stdout and stderr logs end.
func (w *Worker) logEnds(ctx context.Context, id string) (logAt offsets, err error) {
	if logAt.stdout, err = w.logs.End(ctx, id, events.Stdout); err != nil {
		return logAt, err
	}
	logAt.stderr, err = w.logs.End(ctx, id, events.Stderr)
	return logAt, err
}

// resume runs a task found again after a restart, in a slot of its own if one is
// free: more runs than capacity (it was lowered) still need watching.
func (w *Worker) resume(ctx context.Context, r *run, logAt offsets, first func(*offsets) bool) {
	w.hold(r) // now, not when the goroutine runs: a drain must count this run
	slot := false
	select {
	case w.slots <- struct{}{}:
		slot = true
	default:
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		if slot {
			defer func() { <-w.slots }()
		}
		r.execute(ctx, logAt, first)
	}()
}

// saveDecision writes d into the run directory dir of task id. It takes the id, not
// the run, since it is called from the copy of the output, where the run's state is
// not to be read.
func (w *Worker) saveDecision(id, dir string, d stopDecision) error {
	err := writeJSONAtomic(filepath.Join(dir, decisionFile), d)
	if err != nil {
		w.cfg.Base.Logger.Warn("a decision about a run is not on disk yet: it is written again if the worker stops before the run's end is recorded",
			"task", id, "stopped_by", d.StoppedBy, "err", err)
	}
	return err
}

// decisionOf returns what was decided about a run before a restart, if anything: from
// its directory, or, for a stall that the log says was to be killed, from the log.
func decisionOf(dir string, state engine.State) *stopDecision {
	var d stopDecision
	if readJSON(filepath.Join(dir, decisionFile), &d) == nil && d.StoppedBy != "" {
		return &d
	}
	if state.Stall != nil && state.Stall.Action == engine.OnStallKill {
		return &stopDecision{StoppedBy: events.StoppedByStall}
	}
	return nil
}

// ErrStateDirInUse: another worker process holds the state directory.
var ErrStateDirInUse = errors.New("the worker state directory is in use by another worker")

// lockStateDir takes a worker's state directory for this process: two workers
// sharing one would watch the same runs.
func lockStateDir(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("worker state directory: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, shim.WorkerLock), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	// A lock held a moment longer than its worker lives is let go soon: a worker
	// that just ended (the kernel drops its locks as it exits), or a process of
	// ours being started (it holds a copy of every descriptor until its exec).
	for deadline := time.Now().Add(stateLockWait); ; {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		switch {
		case err == nil:
			return f, nil
		case !errors.Is(err, unix.EWOULDBLOCK):
			f.Close()
			return nil, err
		case time.Now().After(deadline):
			f.Close()
			return nil, fmt.Errorf("%w: %s: give each worker its own --state-dir", ErrStateDirInUse, dir)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stateLockWait is how long a worker waits for its state directory's lock.
const stateLockWait = 2 * time.Second

// stableID is the worker's identity, kept in its state directory: a restarted
// worker is the same worker and finds its runs again. want is the identity asked
// for, if any (default: the directory's, or a new one). A directory holding runs
// keeps its identity: the log gives those runs to the worker it names, and a worker
// with another identity would find none of them its own and stop them all.
func stableID(dir, want string) (string, error) {
	path := filepath.Join(dir, "id")
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	have := strings.TrimSpace(string(data))
	switch {
	case have != "" && (want == "" || want == have):
		return have, nil
	case have != "":
		if runs, _ := filepath.Glob(filepath.Join(dir, "runs", "*")); len(runs) > 0 {
			return "", fmt.Errorf("worker state directory %s holds %d runs of worker %s: start worker %s on it to watch them to their end, or give worker %s a state directory of its own",
				dir, len(runs), have, have, want)
		}
	}
	id := want
	if id == "" {
		id = hostname() + "-" + randomHex(4)
	}
	return id, os.WriteFile(path, []byte(id+"\n"), 0o600)
}
