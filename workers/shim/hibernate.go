package shim

import (
	"errors"
	"runtime"
	"syscall"
)

// A shim whose command runs long hibernates: it execs its own binary as a waiter
// written in C (package waiter), which does only what the shim must while the
// command runs (reap its children, watch its deadline and its output for a
// stall, its output files' bound) in a few pages of memory, where a Go runtime
// holds half a MiB for each running task. The process stays the command's parent and subreaper, with its
// PID, its start lock and its reserved exit file; when the command ends, or a
// timer is due, the waiter execs the Go side again (--woken), which carries on
// where it left off: stops the command if a timer is due, writes the exit, and
// may take the worker's next run.
const (
	hibernatedFlag = "--hibernated" // the waiter's arguments, read by its C side
	wokenFlag      = "--woken"      // the shim's, once the waiter is done
)

// hibernation says whether this binary has the waiter, which registers itself.
var hibernation bool

// EnableHibernation is called by package waiter's init, as it is linked in. It
// keeps the main goroutine on the main thread (LockOSThread in an init runs main
// there), which a hibernation execs from: an exec from any other thread ends the
// process's leader first, and for that moment the shim reads as a zombie, which
// its worker would take for the shim's death.
func EnableHibernation() {
	runtime.LockOSThread()
	hibernation = true
}

// hibernate execs the waiter, unless the command's end is already passed on. It
// returns where it did not.
func (c *running) hibernate(reap *reaper) {
	reap.mu.Lock()
	defer reap.mu.Unlock()
	if awaitReadable(reap.ended[0], 0) || !onMainThread() {
		return
	}
	line, err := commandLine()
	if err != nil || len(line) <= c.args {
		return
	}
	// The shim's own arguments give way to the waiter's; what ran the shim
	// (bgtask-shim, or a binary and its "shim") stays, and runs it again.
	argv := append(append(line[:len(line)-c.args:len(line)-c.args], hibernatedFlag), c.flags()...)
	keep := []int{c.exit.fd, c.lock}
	setCloexec(keep, false)
	_ = syscall.Exec("/proc/self/exe", argv, syscall.Environ())
	setCloexec(keep, true) // the exec failed: the shim carries on
}

// setCloexec marks the descriptors fds (-1: none) close-on-exec, or not.
func setCloexec(fds []int, on bool) {
	for _, fd := range fds {
		switch {
		case fd < 0:
		case on:
			syscall.CloseOnExec(fd)
		default:
			clearCloexec(fd)
		}
	}
}

// flags are the arguments that carry c through a hibernation.
func (c *running) flags() []string {
	n := func(name string, v int64) string { return name + "=" + string(appendInt(nil, v)) }
	return []string{
		n("--pid", int64(c.pid)), "--dir=" + c.Dir,
		n("--deadline-unix-ns", c.Deadline), n("--stall-after-ns", c.StallAfter), n("--kill-grace-ns", c.KillGrace),
		n("--started-at-ns", c.startedAt), n("--exit-fd", int64(c.exit.fd)), n("--lock-fd", int64(c.lock)),
		n("--idle-ns", c.idleAfter), n("--stall-size", c.output.size), n("--stall-since-ns", c.output.since),
		n("--output-keep-bytes", c.outputKeep),
	}
}

// parseWoken reads what flags wrote, and what the waiter added: a later flag
// wins. ended is the command's status if it has ended.
func parseWoken(args []string) (c running, ended *syscall.WaitStatus, err error) {
	var pid, exitFD, lock, status int64 = 0, -1, -1, -1
	numbers := map[string]*int64{
		"--pid": &pid, "--deadline-unix-ns": &c.Deadline, "--stall-after-ns": &c.StallAfter, "--kill-grace-ns": &c.KillGrace,
		"--started-at-ns": &c.startedAt, "--exit-fd": &exitFD, "--lock-fd": &lock, "--idle-ns": &c.idleAfter,
		"--stall-size": &c.output.size, "--stall-since-ns": &c.output.since, "--status": &status,
		"--output-keep-bytes": &c.outputKeep,
	}
	for _, arg := range args {
		name, value, _ := cut(arg, '=')
		if name == "--dir" {
			c.Dir = value
			continue
		}
		number, ok := numbers[name]
		if ok {
			*number, ok = parseInt64(value)
		}
		if !ok {
			return running{}, nil, errors.New("shim: " + wokenFlag + ": argument " + arg + ": only a hibernated shim wakes so")
		}
	}
	if pid <= 0 || c.Dir == "" || lock < 0 {
		return running{}, nil, errors.New("shim: " + wokenFlag + ": want --pid, --dir and --lock-fd")
	}
	c.pid, c.exit, c.lock = int(pid), exitFile{dir: c.Dir, fd: int(exitFD)}, int(lock)
	setCloexec([]int{c.exit.fd, c.lock}, true)
	if status >= 0 {
		ws := syscall.WaitStatus(status)
		ended = &ws
	}
	return c, ended, nil
}

// resume carries on with a run after a hibernation: it watches the command again
// unless it has ended, and records its end.
func (c *running) resume(ended *syscall.WaitStatus) error {
	defer c.exit.close()
	if ended != nil {
		return c.end("", *ended)
	}
	reap, err := newReaper()
	if err != nil {
		return err
	}
	defer reap.close()
	go reap.wait(c.pid)
	return c.end(c.watch(reap))
}
