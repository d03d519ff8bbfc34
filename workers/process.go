package workers

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/secretenv"
	"github.com/bgtask/bgtask/workers/shim"
)

// process is a command a shim runs, watched through its run directory.
type process struct {
	dir    string
	pids   shimPIDs
	exited chan struct{} // closed when the exit file is read, or the shim is gone
	// commandEnded is closed when the command has ended, which is before its shim
	// has reaped it and written the exit file; never where its end cannot be
	// watched (exited says it then).
	commandEnded chan struct{}
	commandWatch *endWatch
	result       events.Exited
	lost         bool // the shim ended without writing an exit file, and how the command ended is unknown
	// adopted: the shim died and the worker learned how the command ended
	// (adoptCommand); what the command left running is the worker's to stop.
	adopted bool
	failure string // the shim could not run or wait for the command
	quit    chan struct{}
	// looks looks at the exit file and the shim when they may have changed, until
	// the exit is known or the worker lets go of the run; then release.
	looks   looks
	changes *waiter
	release sync.Once
}

// launchProcess hands a prepared run (prepareRun) in dir to the worker's shim,
// and watches the command it starts.
func launchProcess(n *notifier, shims *shims, dir string, run shimRun) (*process, error) {
	if err := shims.hand(dir, run); err != nil {
		return nil, err
	}
	return awaitShim(n, dir, nil)
}

// prepareRun writes what the shim of a run needs into its directory, and returns
// the run with the program it starts.
func prepareRun(dir string, run shimRun, spec engine.Spec) (shimRun, error) {
	run, err := resolveRun(run, spec)
	if err != nil {
		return run, err
	}
	return run, writeRun(dir, run)
}

// resolveRun finds the program a run starts, in the command's PATH.
func resolveRun(run shimRun, spec engine.Spec) (shimRun, error) {
	if spec.Command != "" {
		bash, err := lookPath("bash", run.Env, run.Dir)
		if err != nil {
			return run, err
		}
		run.Path, run.Args = bash, []string{"bash", "-c", spec.Command}
	} else {
		path, err := lookPath(spec.Argv[0], run.Env, run.Dir)
		if err != nil {
			return run, err
		}
		run.Path, run.Args = path, spec.Argv
	}
	if info, err := os.Stat(run.Dir); err != nil || !info.IsDir() {
		return run, errors.New("working directory " + run.Dir + " does not exist")
	}
	return run, nil
}

// writeRun writes a resolved run's files into its directory.
func writeRun(dir string, run shimRun) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, name := range []string{shim.StdoutFile, shim.StderrFile} {
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_CREATE, 0o600)
		if err != nil {
			return err
		}
		f.Close()
	}
	data, err := json.Marshal(run)
	if err != nil {
		return err
	}
	return shim.WriteWhole(filepath.Join(dir, runFile), data)
}

// lockRun takes a run's start lock: its directory, which a lock file would be
// one more file made and removed with every run.
func lockRun(dir string) (*os.File, error) {
	lock, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		lock.Close()
		return nil, err
	}
	return lock, nil
}

// shimEnviron is the shim's own environment: the worker's without its
// credentials (secretenv.Names; a command may read its shim's environment), with
// one Go scheduler thread (GOMAXPROCS=1): a shim's work is one loop, and with
// GOMAXPROCS unset the Go runtime would set up a scheduler for each CPU and a
// goroutine that follows the cgroup's CPU limit. A command's own environment is
// not this but its run's (in run.json), which the shim reads on its stdin.
func shimEnviron(env []string) []string {
	env = slices.DeleteFunc(secretenv.Without(env), func(kv string) bool { return strings.HasPrefix(kv, "GOMAXPROCS=") })
	return append(env, "GOMAXPROCS=1")
}

// recorded says whether the shim of a run recorded the command's start: its PIDs,
// or its start error.
func recorded(dir string) bool {
	return exists(filepath.Join(dir, shim.PIDFile)) || exists(filepath.Join(dir, shim.ExitFile))
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// shimChildren are the shims this process started that have not been reaped, by
// a reference each (shimRef): on Linux a pidfd, opened by their start. A shim
// ends after its last run is over, often after the worker let go of it; until
// someone waits for it, it stays a zombie. The same process runs other children (exec sinks, result
// commands, the login shell) that os/exec waits for: a wait by PID, or for any
// child, could take one of those, and os/exec's wait would then fail with ECHILD
// while the program's work was done, and be retried. A pidfd names its process
// alone, for as long as it is open.
var shimChildren = struct {
	sync.Mutex
	pidfds map[int]bool
}{pidfds: map[int]bool{}}

// adoptShim hands the shim proc, named by pidfd (shimRef), to reapShims.
func adoptShim(proc *os.Process, pidfd int) {
	_ = proc.Release() // os's own pidfd; reapShims waits on pidfd
	shimChildren.Lock()
	defer shimChildren.Unlock()
	// It may have ended already, its SIGCHLD handled before it was adopted.
	if !reapShim(pidfd) {
		shimChildren.pidfds[pidfd] = true
	}
}

// reapShims collects the shims of this process that have ended. SIGCHLDs merge,
// so each call looks at them all.
func reapShims() {
	shimChildren.Lock()
	defer shimChildren.Unlock()
	for pidfd := range shimChildren.pidfds {
		if reapShim(pidfd) {
			delete(shimChildren.pidfds, pidfd)
		}
	}
}

// How a shim's start can go wrong besides the command's own start error.
var (
	// errShimNotStarted: the shim ended before it started the command; nothing ran.
	errShimNotStarted = errors.New("the shim ended before it started the command")
	// errShimDied: the shim died while it started the command, before it recorded
	// the command's PID; the command, if it started, runs on unrecorded until the
	// worker stops it (stopLeftovers).
	errShimDied = errors.New("the shim died while it started the command")
)

// awaitShim waits for the shim of a run, started by this worker or by a process
// of it that died meanwhile, to record how the command's start went: its PIDs, a
// start error (returned as the error), or nothing before no shim holds the run's
// start lock any more (errShimDied or errShimNotStarted). waiting, if set, is
// called once if the shim is still starting when first looked at.
func awaitShim(n *notifier, dir string, waiting func()) (*process, error) {
	outcome := func() (*process, error, bool) {
		var exit shimExit
		hasExit := readJSON(filepath.Join(dir, shim.ExitFile), &exit) == nil
		if hasExit && exit.StartError != "" {
			return nil, errors.New(exit.StartError), true
		}
		var pids shimPIDs
		if readJSON(filepath.Join(dir, shim.PIDFile), &pids) == nil {
			return attachProcess(n, dir, pids), nil, true
		}
		if hasExit {
			// The exit is on disk and the PIDs are not: pid.json is not durable, the
			// exit file is, and the host crashed. The run ended as the file says.
			return endedProcess(dir, exit), nil, true
		}
		return nil, nil, false
	}
	for {
		if p, err, ok := outcome(); ok {
			return p, err
		}
		if !shimAlive(dir) {
			// It may have written its outcome just before it ended.
			if p, err, ok := outcome(); ok {
				return p, err
			}
			if _, err := os.Stat(filepath.Join(dir, shim.ExitTempFile)); err == nil {
				return nil, errShimDied
			}
			return nil, errShimNotStarted
		}
		if waiting != nil {
			waiting()
			waiting = nil
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// shimAlive reports whether a shim holds the start lock of the run in dir, the
// directory: it works on the run.
func shimAlive(dir string) bool {
	f, err := os.Open(dir)
	if err != nil {
		return false
	}
	defer f.Close() // releases the lock if this took it
	return errors.Is(unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB), unix.EWOULDBLOCK)
}

// endedProcess is a run whose exit file, exit, is all that is left of it: ended,
// with no process to watch or signal.
func endedProcess(dir string, exit shimExit) *process {
	p := &process{dir: dir, exited: make(chan struct{}), commandEnded: make(chan struct{}), quit: make(chan struct{})}
	p.take(exit)
	close(p.exited)
	close(p.commandEnded)
	return p
}

// attachProcess watches a run that a shim started, with the PIDs it recorded in
// its directory: after a start, or after the worker restarted.
func attachProcess(n *notifier, dir string, pids shimPIDs) *process {
	p := &process{dir: dir, pids: pids, exited: make(chan struct{}), commandEnded: make(chan struct{}), quit: make(chan struct{})}
	p.commandWatch = n.ends.watch(p.pids.Command, func() { close(p.commandEnded) })
	// Armed before the first look: an exit that lands in between still calls one.
	p.changes = n.watch(p.looks.call, dir, shim.ExitFile)
	p.changes.watchProcess(p.pids.Shim)
	p.looks.start(p.look)
	return p
}

// look looks for the exit file, the truth of how the command ended (the shim
// writes it once it has reaped the command), and for the shim's end without it.
// It reports false once exited is closed, or the worker stopped meanwhile.
func (p *process) look() (again bool) {
	if p.readExit() {
		close(p.exited)
		p.stopWatching()
		return false
	}
	// The exit file may have landed just before the shim ended.
	if !p.pids.Shim.Alive() && !p.readExit() {
		if p.adoptCommand() {
			close(p.exited)
		} // else the worker stops; the next start watches the command again
		p.stopWatching()
		return false
	}
	p.changes.looked()
	return true
}

// stopWatching gives back the watches of the exit file and of the processes.
func (p *process) stopWatching() {
	p.release.Do(func() {
		p.changes.close()
		p.commandWatch.close()
	})
}

// adoptCommand follows a command whose shim died before it wrote the exit file:
// the command goes on, and when it ends, the worker writes its exit file as the
// shim would have (adopt_linux.go). Where it cannot learn the exit, the run is
// lost. False if the worker stops first.
func (p *process) adoptCommand() bool {
	if !canAdopt {
		p.lost = true
		return true
	}
	ws, ok := reapedExit(p.pids.Command) // it ended before its watch began
	if !ok && p.commandWatch != nil {
		select {
		case <-p.commandEnded:
		case <-p.quit:
			return false
		}
		if p.readExit() { // the shim wrote it after all
			return true
		}
		ws, ok = p.commandWatch.exitStatus(p.pids.Command.PID, p.quit)
		if !ok {
			select {
			case <-p.quit:
				return false // the worker stops: its next start looks again
			default:
			}
			ws, ok = reapedExit(p.pids.Command)
		}
	}
	if !ok {
		p.lost = true
		return true
	}
	record := shim.ExitRecord(ws, p.pids.Started.UnixNano(), time.Now().UnixNano())
	var exit shimExit
	if err := json.Unmarshal(record, &exit); err != nil {
		p.lost = true
		return true
	}
	// Not durably, as the shim writes it while a worker watches (recordEnd keeps
	// it where the log cannot take the exit at once). Where it cannot be written,
	// a worker that stops before the exit is recorded finds the run lost.
	_ = shim.WriteWhole(filepath.Join(p.dir, shim.ExitFile), record)
	p.take(exit)
	p.adopted = true
	return true
}

func (p *process) readExit() bool {
	var exit shimExit
	if readJSON(filepath.Join(p.dir, shim.ExitFile), &exit) != nil {
		return false
	}
	p.take(exit)
	return true
}

// take takes how the run ended from its exit file.
func (p *process) take(exit shimExit) {
	p.result = events.Exited{ExitCode: exit.ExitCode, Signal: exit.Signal, StoppedBy: exit.StoppedBy, StartedAt: exit.StartedAt, EndedAt: exit.EndedAt}
	p.failure = exit.StartError
}

// ended says whether the command has ended: exited closes soon.
func (p *process) ended() bool {
	select {
	case <-p.exited:
		return true
	case <-p.commandEnded:
		return true
	default:
		return exists(filepath.Join(p.dir, shim.ExitFile))
	}
}

// detach stops watching; the command goes on.
func (p *process) detach() {
	select {
	case <-p.quit:
	default:
		close(p.quit)
	}
	p.looks.stop()
	p.stopWatching()
}

// stop ends the command's whole process group: TERM, then KILL after grace.
// Members left after the leader exited are killed too, so no grandchild outlives a
// stop. The group is never signalled when its number may have been reused. If
// the shim turns out to have died, what its command left is stopped too.
func (p *process) stop(grace time.Duration) {
	p.signalGroup(unix.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(grace):
	}
	p.signalGroup(unix.SIGKILL)
	<-p.exited
	if p.lost || p.adopted {
		stopLeftovers(p.dir, grace)
	}
}

// signalGroup signals the command's process group while it is still the group the
// shim started: a group number is not reused while any member lives, and a new
// group with the same number has a leader with that PID and another start time.
func (p *process) signalGroup(sig unix.Signal) {
	pgid := p.pids.Command.PID
	if pgid <= 0 {
		return // no PIDs known (endedProcess): kill(0) would signal the worker's own group
	}
	if start, err := shim.ProcStart(pgid); err == nil && start != p.pids.Command.Start {
		return // the PID now names another process: the group is not ours
	}
	_ = unix.Kill(-pgid, sig)
}
