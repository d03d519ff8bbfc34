//go:build linux && !bgtask_portable

package workers

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bgtask/bgtask/workers/shim"
)

// A command does not die with its shim. A shim killed (or its waiter) leaves the
// command to the worker that started the shim, a subreaper: the command goes on,
// and when it ends the worker reaps it and writes its exit file as the shim would
// have. A worker that did not start the shim (it restarted since) reads the exit
// through the command's pidfd once whoever has the command reaps it (Linux 6.15).

// canAdopt: a worker learns how the command of a dead shim ends.
const canAdopt = true

// becomeSubreaper makes this process the reaper of the orphans of its
// descendants: the commands of its shims that die. Only where the Go runtime
// waits for its own children on pidfds, as os does when the kernel has all it
// needs: reapAdopted tells the children others wait for by their pidfds.
func becomeSubreaper() {
	fd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PIDFD, fd, &info, unix.WEXITED|unix.WNOHANG, nil); !errors.Is(err, unix.ECHILD) {
		return
	}
	if unix.PidfdSendSignal(fd, 0, nil, 0) != nil {
		return
	}
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
}

// exitWait bounds how long an ended command that is not this process's child
// is waited for, for its reaper to reap it and the kernel to keep its exit.
const exitWait = 5 * time.Second

// exitStatus is how the watched process, pid, ended, once it has: reaped here
// where it is this process's child, or read from its pidfd where another process
// reaped it. False where neither tells before exitWait passes or quit is closed.
func (e *endWatch) exitStatus(pid int, quit <-chan struct{}) (syscall.WaitStatus, bool) {
	if e == nil {
		return 0, false
	}
	give := time.Now().Add(exitWait)
	for {
		ws, ok := pidfdExit(e.pidfd, pid) // the watch is open: closed by the same caller, after
		if ok || time.Now().After(give) {
			return ws, ok
		}
		select {
		case <-quit:
			return 0, false
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// pidfdExit reads the exit status of the ended process of pidfd, pid.
func pidfdExit(pidfd, pid int) (syscall.WaitStatus, bool) {
	var info unix.Siginfo
	err := unix.Waitid(unix.P_PIDFD, pidfd, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
	for errors.Is(err, unix.EINTR) {
		err = unix.Waitid(unix.P_PIDFD, pidfd, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
	}
	if err == nil && info.Signo == int32(unix.SIGCHLD) {
		// This process's child, ended and not reaped: its PID names it alone
		// until the reap, and nothing else here reaps a child with a pidfd open
		// on it (reapAdopted).
		var ws syscall.WaitStatus
		got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		for errors.Is(err, syscall.EINTR) {
			got, err = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		}
		return ws, err == nil && got == pid
	}
	pi := unix.PidfdInfo{Mask: unix.PIDFD_INFO_EXIT}
	if unix.IoctlPidfdInfo(pidfd, &pi) == nil && pi.Mask&unix.PIDFD_INFO_EXIT != 0 {
		return syscall.WaitStatus(pi.Exit_code), true
	}
	return 0, false
}

// reapAdopted reaps the orphans this process adopted that have ended: what the
// command of a dead shim started and left, or the command itself where its run's
// watch has not begun (reapedExit keeps its status for it). A child that a pidfd
// of this process names is left to whoever holds it: os/exec waits for its own
// children on one, a run watches its command on one, and shimChildren its shims.
func reapAdopted() {
	self := strconv.Itoa(os.Getpid())
	// Orphans go to the subreaper's main thread.
	kids, err := os.ReadFile("/proc/" + self + "/task/" + self + "/children")
	if err != nil {
		return
	}
	var held map[int]bool
	for _, field := range bytes.Fields(kids) {
		pid, err := strconv.Atoi(string(field))
		if err != nil {
			continue
		}
		p, ended := shim.Zombie(pid)
		if !ended {
			continue
		}
		if held == nil {
			if held, err = pidfdsHeld(); err != nil {
				return // who waits for what is not known: nothing is reaped
			}
		}
		if !held[pid] {
			reapOrphan(p)
		}
	}
}

// reapOrphan reaps the zombie child p through a pidfd, which names the process
// looked at alone, and keeps its status (reapedExit).
func reapOrphan(p shim.ProcRef) {
	fd, err := unix.PidfdOpen(p.PID, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	if start, err := shim.ProcStart(p.PID); err != nil || start != p.Start {
		return // reaped meanwhile, and the PID taken
	}
	if ws, ok := pidfdExit(fd, p.PID); ok {
		keepReaped(p, ws)
	}
}

// reaped are the statuses reapOrphan took, by process, the latest last: a shim
// that dies between its command's start and the worker's watch of it leaves the
// command to this process, and its end may come before the watch does.
var reaped struct {
	sync.Mutex
	exits map[shim.ProcRef]syscall.WaitStatus
	order []shim.ProcRef
}

// reapedKept bounds reaped: a run's watch begins within moments of its start.
const reapedKept = 256

func keepReaped(p shim.ProcRef, ws syscall.WaitStatus) {
	reaped.Lock()
	defer reaped.Unlock()
	if reaped.exits == nil {
		reaped.exits = map[shim.ProcRef]syscall.WaitStatus{}
	}
	if len(reaped.order) == reapedKept {
		delete(reaped.exits, reaped.order[0])
		reaped.order = reaped.order[1:]
	}
	reaped.exits[p] = ws
	reaped.order = append(reaped.order, p)
}

// reapedExit is the status reapAdopted took of process p, if it did.
func reapedExit(p shim.ProcRef) (syscall.WaitStatus, bool) {
	reaped.Lock()
	defer reaped.Unlock()
	ws, ok := reaped.exits[p]
	return ws, ok
}

// pidfdsHeld are the processes this process holds a pidfd on; an error where
// that cannot be known.
func pidfdsHeld() (map[int]bool, error) {
	entries, err := os.ReadDir("/proc/self/fdinfo")
	if err != nil {
		return nil, err
	}
	held := map[int]bool{}
	for _, e := range entries {
		info, err := os.ReadFile("/proc/self/fdinfo/" + e.Name())
		if errors.Is(err, fs.ErrNotExist) {
			continue // closed meanwhile
		}
		if err != nil {
			return nil, err
		}
		if _, rest, ok := bytes.Cut(info, []byte("\nPid:\t")); ok {
			line, _, _ := bytes.Cut(rest, []byte("\n"))
			if pid, err := strconv.Atoi(string(line)); err == nil {
				held[pid] = true
			}
		}
	}
	return held, nil
}
