//go:build linux && !bgtask_portable

package workers

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A command does not die with its shim. A shim killed (or its waiter) leaves the
// command to the worker that started the shim, a subreaper: the command goes on,
// and when it ends the worker reaps it and writes its exit file as the shim would
// have. A worker that did not start the shim (it restarted since) reads the exit
// through the command's pidfd once whoever has the command reaps it (Linux 6.15).

// canAdopt: a worker learns how the command of a dead shim ends.
const canAdopt = true

// becomeSubreaper makes this process the reaper of the orphans of its
// descendants: the commands of its shims that die. Only where pidfds work:
// reapAdopted tells the children others wait for by their pidfds.
func becomeSubreaper() {
	fd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return
	}
	_ = unix.Close(fd)
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
	conn, err := e.pidfd.SyscallConn()
	if err != nil {
		return 0, false
	}
	give := time.Now().Add(exitWait)
	for {
		var ws syscall.WaitStatus
		var ok bool
		_ = conn.Control(func(fd uintptr) { ws, ok = pidfdExit(int(fd), pid) })
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
	if err == nil && info.Signo == int32(unix.SIGCHLD) {
		// This process's child, ended and not reaped: its PID names it alone
		// until the reap, and nothing else here reaps a child with a pidfd open
		// on it (reapAdopted).
		var ws syscall.WaitStatus
		got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		return ws, err == nil && got == pid
	}
	pi := unix.PidfdInfo{Mask: unix.PIDFD_INFO_EXIT}
	if unix.IoctlPidfdInfo(pidfd, &pi) == nil && pi.Mask&unix.PIDFD_INFO_EXIT != 0 {
		return syscall.WaitStatus(pi.Exit_code), true
	}
	return 0, false
}

// reapAdopted reaps the orphans this process adopted that have ended: what the
// command of a dead shim started and left. A child that a pidfd of this process
// names is left to whoever holds it: os/exec waits for its own children on one,
// a run watches its command on one, and shimChildren its shims.
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
		if err != nil || !zombie(pid) {
			continue
		}
		if held == nil {
			held = pidfdsHeld()
		}
		if !held[pid] {
			var ws syscall.WaitStatus
			_, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
			for errors.Is(err, syscall.EINTR) {
				_, err = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
			}
		}
	}
}

// zombie says whether process pid has ended and is not reaped.
func zombie(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && len(stat) > i+2 && stat[i+2] == 'Z'
}

// pidfdsHeld are the processes this process holds a pidfd on.
func pidfdsHeld() map[int]bool {
	held := map[int]bool{}
	entries, err := os.ReadDir("/proc/self/fdinfo")
	if err != nil {
		return held
	}
	for _, e := range entries {
		info, err := os.ReadFile("/proc/self/fdinfo/" + e.Name())
		if err != nil {
			continue
		}
		if _, rest, ok := bytes.Cut(info, []byte("\nPid:\t")); ok {
			line, _, _ := bytes.Cut(rest, []byte("\n"))
			if pid, err := strconv.Atoi(string(line)); err == nil {
				held[pid] = true
			}
		}
	}
	return held
}
