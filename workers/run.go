package workers

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/secretenv"
	"github.com/bgtask/bgtask/workers/shim"
)

// The reasons of a task lost because the shim of its run died; what was left of
// the command is killed.
const (
	// ReasonShimDied: the shim died without recording how the command ended, and
	// the worker could not learn it (adoptCommand).
	ReasonShimDied = "the shim of its run died without recording how the command ended; what was left of the command was killed"
	// ReasonShimDiedStarting: the shim died while it started the command, before
	// it recorded the command's PID, which no one else knows. One shim starts all
	// of a worker's runs, so a shim killed loses each run it was starting.
	ReasonShimDiedStarting = "the shim of its run died while it started the command, before it recorded its PID; what was left of the command was killed"
)

// ReasonHostRestarted is the reason of a task lost to a restart of its worker's
// host while its command was starting: whether it started is not known, and it
// is not started a second time.
const ReasonHostRestarted = "the host restarted while the command of its run was starting: whether it started is not known, so it was not started again"

// errFenced: the task changed under the worker (cancelled, or taken over); the
// worker no longer owns it and must not touch it again.
var errFenced = errors.New("worker no longer owns the task")

// appendTimeout bounds how long one event is retried.
const appendTimeout = 10 * time.Second

// run is one task a worker owns.
type run struct {
	w          *Worker
	state      engine.State
	cancelOnce sync.Once
	cancelled  chan struct{}
	// prepared is the first run's directory, written while its spawn was appended
	// (take), if it was: a task's start need not wait for the two one after the other.
	prepared *preparedRun
}

// preparedRun is a run directory written by prepareRun for the run at epoch.
type preparedRun struct {
	epoch uint64
	run   shimRun
	err   error
}

func (r *run) cancel() { r.cancelOnce.Do(func() { close(r.cancelled) }) }

// record appends the event c decides on the run's state, conditional on the run's
// last event, and retries the same event (so a write whose ack was lost counts
// once) until it is in the log, the worker is fenced, or appendTimeout passes. It
// does not end with the worker's context: a stopping worker must still record how
// its runs ended.
func (r *run) record(ctx context.Context, c engine.Command) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), appendTimeout)
	defer cancel()
	decide := func(s engine.State) (events.Event, error) {
		return engine.Decide(s, c, engine.Meta{Writer: r.w.cfg.ID, Now: r.w.cfg.Base.Now()})
	}
	// Another event came after the run's last one: fenced, unless it is one of the
	// run's own appends whose ack was lost.
	reload := func(ctx context.Context) (engine.State, error) {
		if !r.resync(ctx) {
			return r.state, errFenced
		}
		return r.state, nil
	}
	retrying := func(ev events.Event, err error) {
		r.w.cfg.Base.Logger.Warn("event not recorded yet, retrying", "task", r.state.ID, "type", ev.Type, "err", err)
	}
	var err error
	r.state, err = engine.Update(ctx, r.w.store, r.state, reload, decide,
		engine.RetrySameEvent{Backoff: 200 * time.Millisecond, Retrying: retrying})
	return err
}

// resync reloads the task from the log and reports whether this run still holds it.
func (r *run) resync(ctx context.Context) bool {
	for {
		s, err := engine.Load(ctx, r.w.store, r.state.ID)
		if err == nil {
			owned := s.Phase == engine.PhaseRunning && s.Worker == r.w.cfg.ID && s.Epoch == r.state.Epoch
			r.state = s
			return owned
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// execute runs the command of a task the worker holds, to its end: once,
// or again after each stall the spec says to respawn on.
// first is the first run: a new one (runOnce), or one found again after a restart.
// logAt is where the task's log stands, so a respawned run's log goes on after it.
func (r *run) execute(ctx context.Context, logAt offsets, first func(*offsets) bool) {
	w, id := r.w, r.state.ID
	defer w.release(id) // held by whoever started the run
	for respawn := first(&logAt); respawn; respawn = r.runOnce(ctx, &logAt) {
		dir := w.runDir(id, r.state.Epoch+1)
		if err := writeIntent(dir); err != nil {
			w.cfg.Base.Logger.Error("respawn not started", "task", id, "err", err)
			return
		}
		held, err := r.claim(ctx)
		if err != nil {
			// Stopping with the spawn's outcome unknown: the next start settles it.
			w.cfg.Base.Logger.Warn("stopping before a respawn was settled", "task", id, "err", err)
			return
		}
		if !held {
			_ = os.RemoveAll(dir) // cancelled meanwhile
			return
		}
	}
}

// claim appends the spawn of a run: the take of an armed task, or the respawn of
// a stalled one. It reports whether this worker now holds the run, as the log says:
// a spawn whose outcome is unknown (its ack lost, the server away longer than an
// append is retried) may be in the log, so it is tried again, and the log read
// again, until the log says who holds the task or the worker stops (held false with
// the error: the run's directory then settles it at the next start).
func (r *run) claim(ctx context.Context) (held bool, err error) {
	me, want := r.w.cfg.ID, r.state.Epoch+1
	for {
		err = r.record(ctx, engine.Spawn{Host: r.w.host})
		if err == nil {
			return true, nil
		}
		st, lerr := engine.Load(ctx, r.w.store, r.state.ID)
		switch {
		case lerr != nil:
		case st.Phase == engine.PhaseRunning && st.Worker == me && st.Epoch == want:
			r.state = st // this spawn is in the log; its ack did not come back
			return true, nil
		case st.Epoch+1 != want || !(st.Phase == engine.PhaseArmed || st.RespawnPending && st.Worker == me):
			return false, nil // taken by another worker, or cancelled
		default:
			r.state = st // the spawn is not in the log: again
		}
		r.w.cfg.Base.Logger.Warn("spawn not recorded yet, retrying", "task", r.state.ID, "err", err)
		select {
		case <-ctx.Done():
			return false, err
		case <-time.After(time.Second):
		}
	}
}

// runLogs are the two log writers of a run.
type runLogs struct {
	stdout, stderr *events.LogWriter
	logAt          *offsets // where the streams stand once closed
	closed         bool
	total, dropped int64
}

func (l *runLogs) close(ctx context.Context, final bool) {
	if l.closed {
		return
	}
	l.closed = true
	// The two streams flush side by side: the exit waits for both.
	var ends offsets
	var droppedOut, droppedErr int64
	l.sideBySide(ctx,
		func(ctx context.Context) { ends.stdout, droppedOut = l.stdout.Close(ctx, final) },
		func(ctx context.Context) { ends.stderr, droppedErr = l.stderr.Close(ctx, final) })
	*l.logAt = ends
	l.total, l.dropped = ends.stdout+ends.stderr, droppedOut+droppedErr
}

// sideBySide runs stdout and stderr, each the work of one stream's writer, at
// once, for at most appendTimeout, even if the worker is stopping.
func (l *runLogs) sideBySide(ctx context.Context, stdout, stderr func(context.Context)) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), appendTimeout)
	defer cancel()
	var stderrDone sync.WaitGroup
	stderrDone.Go(func() { stderr(ctx) })
	stdout(ctx)
	stderrDone.Wait()
}

// runOnce starts the command once, watches it and records how the run ended. It
// reports whether the run stalled and is to be started again.
func (r *run) runOnce(ctx context.Context, logAt *offsets) (respawn bool) {
	w, id, log := r.w, r.state.ID, r.w.cfg.Base.Logger
	spec := r.state.Spec
	if spec.Process != nil {
		r.watchProcess(ctx)
		return false
	}
	if at := spec.DeadlineTime(); !at.IsZero() && !time.Now().Before(at) {
		// Waited past its deadline: starting it now would only stop it half way.
		now := time.Now().UTC()
		if r.recordEnd(ctx, engine.Exit{Run: events.Exited{NotStarted: true, StoppedBy: events.StoppedByDeadline, StartedAt: now, EndedAt: now}}) {
			_ = os.RemoveAll(w.runDir(id, r.state.Epoch))
		}
		return false
	}
	dir := w.runDir(id, r.state.Epoch)
	run, err := r.prepare(dir, *logAt)
	var proc *process
	if err == nil {
		proc, err = launchProcess(w.notify, w.shims, dir, run)
	}
	// The run's directory goes once its end is in the log, not before: a worker that
	// stops in between finds it at its next start and settles the task from it.
	if errors.Is(err, errShimDied) {
		r.loseStarted(ctx, dir)
		return false
	}
	if err != nil {
		log.Info("task failed to start", "task", id, "err", err)
		if r.recordEnd(ctx, engine.Fail{Reason: err.Error()}) {
			_ = os.RemoveAll(dir)
		}
		return false
	}
	log.Info("task started", "task", id, "pid", proc.pids.Command.PID, "command", spec.CommandLine())
	return r.watch(ctx, proc, run, logAt, nil)
}

// shimRun is what the shim of the task's run at epoch starts, in dir, its log going
// on at logAt.
func (r *run) shimRun(dir string, epoch uint64, logAt offsets) shimRun {
	id, spec := r.state.ID, r.state.Spec
	cwd := spec.Cwd
	if cwd == "" {
		cwd = homeDir()
	}
	var base []string // with environment caller, the spec's env is the whole environment
	if spec.Environment != engine.EnvironmentCaller {
		base = r.w.env()
	}
	run := shimRun{
		TaskID: id, Epoch: epoch, Dir: cwd, LogOffsets: logAt,
		// The spec's env may hold a credential too (a registrant's shell that had
		// one): the command gets none, under any name.
		Env:      secretenv.Without(mergeEnv(base, spec.Env, "BGTASK_TASK_ID="+id, runMarker(dir))),
		Deadline: spec.DeadlineTime(), KillGrace: r.w.cfg.KillGrace,
	}
	if spec.OnStall == engine.OnStallKill {
		run.StallAfter = spec.StallDuration() // notify and respawn need the worker
	}
	return run
}

// prepare writes the directory of the current run for its shim, unless take
// wrote it already.
func (r *run) prepare(dir string, logAt offsets) (shimRun, error) {
	if p := r.prepared; p != nil && p.epoch == r.state.Epoch {
		r.prepared = nil
		return p.run, p.err
	}
	r.prepared = nil
	return prepareRun(dir, r.shimRun(dir, r.state.Epoch, logAt), r.state.Spec)
}

// foundAgain is what a worker finds of a run its previous process watched.
type foundAgain struct {
	fileAt offsets // where the log stands in the run's output files
	// decided is what the previous process decided to do with the run (stop it for
	// a rule, or leave it running after a match) and did not record before it
	// died; nil if nothing.
	decided *stopDecision
}

// watch follows a run to its end: its output into the tail, the log and the
// completion rule, its ticks, stall and deadline, and its exit. logAt is where the
// task's log stands; again is nil for a run just started, whose first tick is
// still to be written. When the worker stops, watch lets go of the run and the
// command goes on, to be watched again after the restart.
func (r *run) watch(ctx context.Context, proc *process, run shimRun, logAt *offsets, again *foundAgain) (respawn bool) {
	r.releaseEnv()
	var fileAt offsets
	var decided *stopDecision
	if again != nil {
		fileAt, decided = again.fileAt, again.decided
	}
	x := r.newWatcher(proc, run, logAt, fileAt, decided)
	defer x.stopCopying()
	if decided != nil {
		r.w.cfg.Base.Logger.Info("finishing what the worker decided before it restarted", "task", r.state.ID, "stopped_by", decided.StoppedBy)
		if !decided.KeepRunning {
			proc.stop(r.w.cfg.KillGrace)
		}
		x.end(ctx, decided.StoppedBy, decided.KeepRunning)
		return false
	}
	return x.follow(ctx, again == nil)
}

// releaseEnv lets go of the spec's env once the command runs with it, unless a
// stall may start the command again: a caller's whole environment, decoded, is
// a few KiB that every running task would hold until it ends. (A result
// command's environment is the run's own, kept by its watcher.)
func (r *run) releaseEnv() {
	if r.state.Spec.OnStall != engine.OnStallRespawn {
		r.state.Spec.Env = nil
	}
}

// watcher is one run being watched.
type watcher struct {
	r       *run
	proc    *process
	run     shimRun
	spec    engine.Spec
	tail    *Tail
	logs    *runLogs
	lines   *lineWatch   // the completion rule's, nil without one
	notices *noticeWatch // the notify rule's, nil without one
	// unsaved is a decision about the run that could not be written (a full
	// disk): it is written again if the run's end is not recorded before the
	// worker stops, for the next start to finish what was decided.
	unsaved    atomic.Pointer[stopDecision]
	id         string       // the task's: decide runs in the copy of the output, which must not read the run's state
	lastOutput atomic.Int64 // when the command last printed, in Unix nanoseconds
	copying    *copier      // nil once stopped
	bounds     []*boundOutput
}

func (r *run) newWatcher(proc *process, run shimRun, logAt *offsets, fileAt offsets, decided *stopDecision) *watcher {
	w, id, spec := r.w, r.state.ID, r.state.Spec
	if res := spec.Result; res == nil || res.Type != engine.ResultCommand {
		run.Env = nil // only a result command runs in it: a running task does not keep it
	}
	x := &watcher{
		r: r, proc: proc, run: run, spec: spec, id: id,
		tail: NewTail(max(w.cfg.TailLines, spec.TailLines()), MaxLineBytes),
		logs: &runLogs{
			stdout: w.logs.Writer(id, events.Stdout, logAt.stdout),
			stderr: w.logs.Writer(id, events.Stderr, logAt.stderr),
			logAt:  logAt,
		},
	}
	x.lastOutput.Store(time.Now().UnixNano())
	tailOut, tailErr := x.tail.Stream(), x.tail.Stream()
	stdout := output{writers: []OutputWriter{tailOut, x.logs.stdout}, last: &x.lastOutput}
	stderr := output{writers: []OutputWriter{tailErr, x.logs.stderr}, last: &x.lastOutput}
	if m := spec.Matcher(); m != nil {
		// A match is on disk before the log has its line, so a worker that dies at
		// any moment finds either the match or, where the log stands, the line again.
		x.lines = newLineWatch(m, func(line string) {
			x.decide(stopDecision{StoppedBy: events.StoppedByMatch, MatchedLine: &line, KeepRunning: spec.KeepRunning})
		})
		stdout.writers = append([]OutputWriter{x.lines}, stdout.writers...)
		if decided != nil && decided.MatchedLine != nil {
			x.lines.matchedBefore(*decided.MatchedLine)
		} else {
			x.lines.resume(filepath.Join(proc.dir, shim.StdoutFile), fileAt.stdout)
		}
	}
	if x.notices = newNoticeWatch(r.state); x.notices != nil {
		x.notices.resume(proc.dir, fileAt.stdout)
		stdout.writers = append(stdout.writers, x.notices)
	}
	// After a restart, the tail starts with what the run printed before it.
	_, _ = tailOut.Write(lastData(filepath.Join(proc.dir, shim.StdoutFile), fileAt.stdout, tailRereadBytes))
	_, _ = tailErr.Write(lastData(filepath.Join(proc.dir, shim.StderrFile), fileAt.stderr, tailRereadBytes))
	x.copy(fileAt, stdout, stderr)
	return x
}

// copy copies what the command prints from its output files, from fileAt, where
// the log stands in them, until stopCopying.
func (x *watcher) copy(fileAt offsets, stdout, stderr output) {
	files := []*growingFile{
		{path: filepath.Join(x.proc.dir, shim.StdoutFile), offset: fileAt.stdout, w: stdout},
		{path: filepath.Join(x.proc.dir, shim.StderrFile), offset: fileAt.stderr, w: stderr},
	}
	for _, f := range files {
		bound := newBoundOutput(f.path, f.offset, f.w, x.r.w.cfg.Base.Logger)
		x.bounds = append(x.bounds, bound)
		f.w = bound
	}
	x.copying = copyGrowing(x.r.w.notify, files)
}

// stopCopying copies what the output files hold, and then no more. Only the
// run's own goroutine calls it.
func (x *watcher) stopCopying() {
	if x.copying == nil {
		return
	}
	x.copying.stop()
	x.copying = nil
	for _, b := range x.bounds {
		b.close()
	}
}

// firstTickAfter is how long a command runs before its first tick, at most.
const firstTickAfter = time.Second

// follow waits for what happens to the run next and does what the spec says, until
// the run ends, is to be started again (respawn), is no longer the worker's, or the
// worker stops.
func (x *watcher) follow(ctx context.Context, started bool) (respawn bool) {
	log, id := x.r.w.cfg.Base.Logger, x.r.state.ID
	ticker := time.NewTicker(x.r.w.cfg.TickInterval)
	defer ticker.Stop()
	deadline, stopDeadline := x.deadline()
	defer stopDeadline()
	stallCheck, stopStallCheck := x.stallCheck()
	defer stopStallCheck()
	var matched <-chan struct{}
	if x.lines != nil {
		matched = x.lines.hit
	}
	var noticeDue <-chan struct{}
	if x.notices != nil {
		noticeDue = x.notices.ready
		defer x.notices.stop()
	}
	// The first tick says the command runs, with its PID, once it has run a
	// while: a short command gets none, its exit says it all, and the exit is not
	// held up behind one more append.
	var firstTick <-chan time.Time
	if started {
		first := time.NewTimer(min(x.r.w.cfg.TickInterval, firstTickAfter))
		defer first.Stop()
		firstTick = first.C
	}
	var err error
	for !errors.Is(err, errFenced) {
		if err != nil {
			// NATS is away: the command goes on, and the next event tries again.
			log.Warn("event not recorded", "task", id, "err", err)
		}
		err = nil
		var over bool
		select {
		case <-x.proc.exited:
			x.end(ctx, "", false)
			return false
		case <-x.proc.commandEnded:
			// Its shim is reaping it and writing the exit file: the output is complete,
			// and the log's last chunk is flushed meanwhile, not after.
			x.stopCopying()
			x.logs.close(ctx, true)
			x.end(ctx, "", false)
			return false
		case <-matched:
			x.matched(ctx)
			return false
		case <-deadline:
			x.deadlinePassed(ctx)
			return false
		case now := <-stallCheck:
			if over, respawn, err = x.checkStall(ctx, now, &stallCheck); over {
				return respawn
			}
		case <-firstTick:
			firstTick = nil
			if !x.proc.ended() {
				err = x.recordAside(ctx, engine.Tick{PID: x.proc.pids.Command.PID})
			}
		case <-ticker.C:
			err = x.recordAside(ctx, engine.Tick{OutputBytes: x.tail.Bytes()})
		case <-noticeDue:
			err = x.sendNotice(ctx)
		case <-x.r.cancelled:
			err = errFenced
		case <-ctx.Done():
			// The worker is stopping (an upgrade, a restart): the command goes on under
			// its shim, and the next start of this worker watches it again.
			log.Info("worker stopping: leaving the task running", "task", id)
			x.proc.detach()
			x.stopCopying()
			x.logs.close(ctx, false)
			return false
		}
	}
	x.fenced(ctx)
	return false
}

// recordAside records c on a goroutine of its own, and waits for it. An append
// runs deep (the engine, JetStream, JSON) and grows the stack of the goroutine it
// runs on to 16 or 32 KiB; the run's goroutine waits for as long as the command
// runs, and would keep that stack until a GC shrinks it, more than anything else
// a sleeping task costs the worker. The goroutine that appends ends with the
// append, and its stack is freed with it.
func (x *watcher) recordAside(ctx context.Context, c engine.Command) error {
	done := make(chan error, 1)
	go func() { done <- x.r.record(ctx, c) }()
	return <-done
}

// sendNotice records the notice that is due, if any. One the engine refuses (the
// rule's count reached) ends the notices of the run.
func (x *watcher) sendNotice(ctx context.Context) error {
	n, ok := x.notices.due()
	if !ok {
		return nil
	}
	err := x.recordAside(ctx, n)
	if errors.Is(err, engine.ErrWrongPhase) {
		x.r.w.cfg.Base.Logger.Warn("notice refused: no more notices for this run", "task", x.r.state.ID, "err", err)
		x.notices.stop()
		return nil
	}
	x.notices.recorded(err)
	return err
}

// deadline fires when the spec's deadline passes; never without one.
func (x *watcher) deadline() (<-chan time.Time, func()) {
	at := x.spec.DeadlineTime()
	if at.IsZero() {
		return nil, func() {}
	}
	timer := time.NewTimer(time.Until(at))
	return timer.C, func() { timer.Stop() }
}

// stallCheck ticks while a stall is watched for: never without stall_after, nor
// after this run's one stall notice.
func (x *watcher) stallCheck() (<-chan time.Time, func()) {
	stallAfter := x.spec.StallDuration()
	if stallAfter <= 0 || x.r.state.StallNotified {
		return nil, func() {}
	}
	check := time.NewTicker(max(stallAfter/10, 50*time.Millisecond))
	return check.C, check.Stop
}

// matched ends a run whose completion rule matched: stopped, or kept running.
func (x *watcher) matched(ctx context.Context) {
	if x.spec.KeepRunning {
		x.end(ctx, events.StoppedByMatch, true)
		return
	}
	x.proc.stop(x.r.w.cfg.KillGrace)
	x.end(ctx, events.StoppedByMatch, false)
}

// deadlinePassed stops the command as timed out, unless it ended first (while no
// worker watched, perhaps).
func (x *watcher) deadlinePassed(ctx context.Context) {
	select {
	case <-x.proc.exited:
		x.end(ctx, "", false)
		return
	default:
	}
	x.r.w.cfg.Base.Logger.Info("deadline passed: stopping the task", "task", x.r.state.ID)
	x.decide(stopDecision{StoppedBy: events.StoppedByDeadline})
	x.proc.stop(x.r.w.cfg.KillGrace)
	x.end(ctx, events.StoppedByDeadline, false)
}

// checkStall does what the spec says once the command has printed nothing for
// stall_after: notify (once, and the run goes on), respawn, or kill. over says the
// run ended, respawn that it is to be started again; err is a stall not recorded,
// which is tried again at the next check.
func (x *watcher) checkStall(ctx context.Context, now time.Time, check *<-chan time.Time) (over, respawn bool, err error) {
	silent := now.Sub(time.Unix(0, x.lastOutput.Load()))
	if silent < x.spec.StallDuration() {
		return false, false, nil
	}
	log, id, grace := x.r.w.cfg.Base.Logger, x.r.state.ID, x.r.w.cfg.KillGrace
	action := x.r.stallAction(x.spec)
	if action != engine.OnStallNotify && action != engine.OnStallRespawn {
		action = engine.OnStallKill
	}
	if action == engine.OnStallNotify {
		*check = nil // told once, or tried to: the command goes on
	}
	if err := x.r.record(ctx, engine.Stall{SilentFor: silent.Round(time.Millisecond), Action: action}); err != nil {
		return false, false, err
	}
	switch action {
	case engine.OnStallNotify:
		return false, false, nil
	case engine.OnStallRespawn:
		log.Info("task stalled: starting it again", "task", id, "silent", silent)
		x.proc.stop(grace)
		if ctx.Err() != nil { // the worker is stopping: no new run
			x.end(ctx, events.StoppedByWorker, false)
			return true, false, nil
		}
		x.stopCopying()
		x.logs.close(ctx, false)
		_ = os.RemoveAll(x.proc.dir)
		return true, true, nil
	}
	log.Info("task stalled: stopping it", "task", id, "silent", silent)
	x.decide(stopDecision{StoppedBy: events.StoppedByStall})
	x.proc.stop(grace)
	x.end(ctx, events.StoppedByStall, false)
	return true, false, nil
}

// fenced stops a run that is no longer the worker's: cancelled, or taken over.
func (x *watcher) fenced(ctx context.Context) {
	x.r.w.cfg.Base.Logger.Info("task cancelled or taken over: stopping its process group", "task", x.r.state.ID)
	x.proc.stop(x.r.w.cfg.KillGrace)
	x.stopCopying()
	x.logs.close(ctx, true)
	x.r.w.finished.remove(x.proc.dir)
}

// end records the run's end. stoppedBy names what stopped it, if anything; a kept
// run is one whose rule matched with keep_running, still going.
func (x *watcher) end(ctx context.Context, stoppedBy string, kept bool) {
	result := x.result(ctx, stoppedBy, kept)
	engine.CrashPoint(engine.CrashBeforeExitSave)
	var recorded bool
	switch {
	case x.proc.lost:
		// The shim died without recording the exit: nobody can know how it ended,
		// and nothing watches the command any more. Stop what is left of it.
		x.r.w.cfg.Base.Logger.Error("the shim of a run died without an exit file", "task", x.r.state.ID)
		x.proc.signalGroup(unix.SIGKILL)
		stopLeftovers(x.proc.dir, x.r.w.cfg.KillGrace)
		recorded = x.r.recordEnd(ctx, engine.Lose{Reason: ReasonShimDied})
	case x.proc.failure != "":
		recorded = x.r.recordEnd(ctx, engine.Fail{Reason: x.proc.failure})
	default:
		recorded = x.r.recordEnd(ctx, engine.Exit{Run: result})
		if x.proc.adopted {
			// Its shim died: what the command left running is stopped here, as the
			// shim would have once the exit was recorded.
			stopLeftovers(x.proc.dir, x.r.w.cfg.KillGrace)
		}
	}
	if recorded {
		x.r.w.finished.remove(x.proc.dir)
		return
	}
	// The run stays on disk, and the worker's next start records its exit, and
	// finishes what was decided, if that is on disk by now.
	if d := x.unsaved.Load(); d != nil {
		_ = x.r.w.saveDecision(x.id, x.proc.dir, *d)
	}
}

// decide writes what was decided about the run into its directory before it is
// done, so that a worker that stops before the run's end is recorded finishes it
// at its next start; one the disk has no room for is kept to be written again.
func (x *watcher) decide(d stopDecision) {
	if x.r.w.saveDecision(x.id, x.proc.dir, d) != nil {
		x.unsaved.Store(&d)
	}
}

// result is how the run ended, once the command has (or, kept, with it running):
// the exit, its output's tail and totals, the match and the spec's result.
func (x *watcher) result(ctx context.Context, stoppedBy string, kept bool) events.Exited {
	var result events.Exited
	if kept {
		x.proc.detach()
		result = events.Exited{StartedAt: x.proc.pids.Started, EndedAt: time.Now().UTC(), KeptRunning: true}
	} else {
		<-x.proc.exited
		result = x.proc.result
	}
	x.stopCopying() // the output is complete: the command has ended
	if stoppedBy != "" || result.StoppedBy == "" {
		result.StoppedBy = stoppedBy
	} // else the shim stopped it (deadline or stall) while no worker watched
	if x.lines != nil {
		x.lines.finish()
		result.MatchedLine, result.Matched = x.lines.result()
	}
	result.Tail = x.tail.Lines()
	x.logs.close(ctx, true)
	result.OutputBytes, result.OutputDropped = x.logs.total, x.logs.dropped
	if res := x.spec.Result; res != nil && res.Type == engine.ResultCommand {
		result.Result, result.ResultBytes, result.ResultError = resultCommand(ctx, *res, x.run.Env, x.run.Dir)
	}
	return result
}

// stallAction is what a stall does now: a respawn past the limit becomes a kill.
// Notify is asked for once per run at most (the caller stops checking after it).
func (r *run) stallAction(spec engine.Spec) string {
	if spec.OnStall == engine.OnStallRespawn && r.state.Respawns >= spec.Respawns() {
		return engine.OnStallKill
	}
	return spec.OnStall
}

// loseStarted loses the run in dir, whose shim died while it started the command
// (errShimDied): the command may run, unrecorded, and is stopped first.
func (r *run) loseStarted(ctx context.Context, dir string) {
	r.w.cfg.Base.Logger.Error("the shim of a run died while it started the command", "task", r.state.ID)
	stopLeftovers(dir, r.w.cfg.KillGrace)
	if r.recordEnd(ctx, engine.Lose{Reason: ReasonShimDiedStarting}) {
		_ = os.RemoveAll(dir)
	}
}

// recordEnd records the end of a run: its exit, a failure to start, or a lost run. The end of a run must not be lost to an
// outage of NATS: it is tried again until it is recorded, or the run is no longer
// this worker's (both true), or the worker stops (false: the run's directory keeps
// what to record, for the worker's next start).
func (r *run) recordEnd(ctx context.Context, c engine.Command) bool {
	for kept := false; ; {
		err := r.record(ctx, c)
		if err == nil || errors.Is(err, errFenced) {
			return true
		}
		r.w.cfg.Base.Logger.Error("end of task not recorded yet", "task", r.state.ID, "err", err)
		if !kept {
			// The shim wrote the exit file durably only if no worker watched.
			kept = true
			if err := shim.KeepExit(r.w.runDir(r.state.ID, r.state.Epoch)); err != nil {
				r.w.cfg.Base.Logger.Error("exit file not made durable", "task", r.state.ID, "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(time.Second):
		}
	}
}

func homeDir() string {
	if h, err := os.UserHomeDir(); err == nil {
		return h
	}
	return "/"
}
