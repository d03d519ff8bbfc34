package workers

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// exitPoll is how often a worker looks for a run's exit file.
const exitPoll = 25 * time.Millisecond

// process is a command a shim runs, watched through its run directory.
type process struct {
	dir     string
	pids    shimPIDs
	exited  chan struct{} // closed when the exit file is read, or the shim is gone
	result  events.Exited
	lost    bool   // the shim ended without writing an exit file
	failure string // the shim could not run or wait for the command
	quit    chan struct{}
	stopped chan struct{}
}

// startProcess writes a run directory and starts the shim that runs the spec's
// command, in a new session of its own.
func startProcess(shim []string, dir string, run shimRun, spec engine.Spec) (*process, error) {
	if spec.Command != "" {
		bash, err := lookPath("bash", run.Env, run.Dir)
		if err != nil {
			return nil, err
		}
		run.Path, run.Args = bash, []string{"bash", "-c", spec.Command}
	} else {
		path, err := lookPath(spec.Argv[0], run.Env, run.Dir)
		if err != nil {
			return nil, err
		}
		run.Path, run.Args = path, spec.Argv
	}
	if info, err := os.Stat(run.Dir); err != nil || !info.IsDir() {
		return nil, errors.New("working directory " + run.Dir + " does not exist")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	for _, name := range []string{stdoutFile, stderrFile} {
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_CREATE, 0o600)
		if err != nil {
			return nil, err
		}
		f.Close()
	}
	if err := writeJSONAtomic(filepath.Join(dir, runFile), run); err != nil {
		return nil, err
	}
	// The shim starts itself again, detached, and returns at once.
	if out, err := exec.Command(shim[0], append(shim[1:], dir)...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("start the shim: %w: %s", err, out)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var exit shimExit
		if readJSON(filepath.Join(dir, exitFile), &exit) == nil && exit.StartError != "" {
			return nil, errors.New(exit.StartError)
		}
		if _, err := os.Stat(filepath.Join(dir, pidFile)); err == nil {
			return attachProcess(dir)
		}
		if time.Now().After(deadline) {
			return nil, errors.New("the shim did not start the command in 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// attachProcess watches a run that a shim started, from its directory: after a
// start, or after the worker restarted.
func attachProcess(dir string) (*process, error) {
	p := &process{dir: dir, exited: make(chan struct{}), quit: make(chan struct{}), stopped: make(chan struct{})}
	if err := readJSON(filepath.Join(dir, pidFile), &p.pids); err != nil {
		return nil, fmt.Errorf("run %s: %w", dir, err)
	}
	go p.watch()
	return p, nil
}

func (p *process) watch() {
	defer close(p.stopped)
	ticker := time.NewTicker(exitPoll)
	defer ticker.Stop()
	for {
		if p.readExit() {
			close(p.exited)
			return
		}
		if !p.pids.Shim.alive() {
			// The exit file may have landed just before the shim ended.
			if !p.readExit() {
				p.lost = true
			}
			close(p.exited)
			return
		}
		select {
		case <-ticker.C:
		case <-p.quit:
			return
		}
	}
}

func (p *process) readExit() bool {
	var exit shimExit
	if readJSON(filepath.Join(p.dir, exitFile), &exit) != nil {
		return false
	}
	p.result = events.Exited{ExitCode: exit.ExitCode, Signal: exit.Signal, StoppedBy: exit.StoppedBy, StartedAt: exit.StartedAt, EndedAt: exit.EndedAt}
	p.failure = exit.StartError
	return true
}

// detach stops watching; the command goes on.
func (p *process) detach() {
	select {
	case <-p.quit:
	default:
		close(p.quit)
	}
	<-p.stopped
}

// stop ends the command's whole process group: TERM, then KILL after grace.
// Members left after the leader exited are killed too, so no grandchild outlives a
// stop. The group is never signalled when its number may have been reused.
func (p *process) stop(grace time.Duration) {
	p.signalGroup(unix.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(grace):
	}
	p.signalGroup(unix.SIGKILL)
	<-p.exited
}

// signalGroup signals the command's process group while it is still the group the
// shim started: a group number is not reused while any member lives, and a new
// group with the same number has a leader with that PID and another start time.
func (p *process) signalGroup(sig unix.Signal) {
	pgid := p.pids.Command.PID
	if start, err := procStart(pgid); err == nil && start != p.pids.Command.Start {
		return // the PID now names another process: the group is not ours
	}
	_ = unix.Kill(-pgid, sig)
}

func signalName(sig syscall.Signal) string {
	name := unix.SignalName(sig)
	if len(name) > 3 && name[:3] == "SIG" {
		return name[3:]
	}
	return sig.String()
}
