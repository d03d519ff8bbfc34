package workers

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// waitDelay bounds how long the exit of a command waits for its output pipes: a
// background grandchild that keeps them open must not delay the exit being recorded.
const waitDelay = time.Second

// process is one running command, the leader of its own process group.
type process struct {
	cmd     *exec.Cmd
	started time.Time
	exited  chan struct{} // closed when the command has been reaped
	result  events.Exited
}

// startProcess starts a spec's command in its own process group, in env and dir,
// with stdin from /dev/null. stdout and stderr must never block.
func startProcess(spec engine.Spec, env []string, dir string, stdout, stderr io.Writer) (*process, error) {
	var cmd *exec.Cmd
	if spec.Command != "" {
		bash, err := lookPath("bash", env, dir)
		if err != nil {
			return nil, err
		}
		cmd = exec.Command(bash, "-c", spec.Command)
	} else {
		path, err := lookPath(spec.Argv[0], env, dir)
		if err != nil {
			return nil, err
		}
		cmd = exec.Command(path, spec.Argv[1:]...)
		cmd.Args[0] = spec.Argv[0]
	}
	if info, err := os.Stat(dir); err != nil || !info.IsDir() {
		return nil, errors.New("working directory " + dir + " does not exist")
	}
	cmd.Dir, cmd.Env = dir, env
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = waitDelay
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, started: time.Now(), exited: make(chan struct{})}
	go p.wait()
	return p, nil
}

func (p *process) wait() {
	defer close(p.exited)
	_ = p.cmd.Wait() // the outcome is in ProcessState; ErrWaitDelay only means a pipe was left open
	p.result = events.Exited{
		ExitCode:  p.cmd.ProcessState.ExitCode(),
		StartedAt: p.started.UTC(),
		EndedAt:   time.Now().UTC(),
	}
	if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		p.result.ExitCode = 128 + int(ws.Signal())
		p.result.Signal = signalName(ws.Signal())
	}
}

func signalName(sig syscall.Signal) string {
	name := unix.SignalName(sig)
	if len(name) > 3 && name[:3] == "SIG" {
		return name[3:]
	}
	return sig.String()
}

// stop ends the whole process group: TERM, then KILL after grace. Members left
// after the leader exited are killed too, so no grandchild outlives a stop.
func (p *process) stop(grace time.Duration) {
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(grace):
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-p.exited
}
