//go:build linux && !bgtask_portable

package workers

import (
	"errors"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// shimAttr starts a shim in a session of its own, with a pidfd on it in *pidfd.
func shimAttr(pidfd *int) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setsid: true, PidFD: pidfd}
}

// shimRef is what names a shim in shimChildren: its pidfd.
func shimRef(proc *os.Process, pidfd int) int { return pidfd }

// reapShim reaps the shim of pidfd if it has ended, and then closes pidfd.
func reapShim(pidfd int) bool {
	var info unix.Siginfo
	err := unix.Waitid(unix.P_PIDFD, pidfd, &info, unix.WEXITED|unix.WNOHANG, nil)
	for errors.Is(err, unix.EINTR) {
		err = unix.Waitid(unix.P_PIDFD, pidfd, &info, unix.WEXITED|unix.WNOHANG, nil)
	}
	// The kernel fills in the signal number only when it reaped the child; an error
	// (ECHILD) says there is nothing left to wait for.
	if err != nil || info.Signo == int32(unix.SIGCHLD) {
		_ = unix.Close(pidfd)
		return true
	}
	return false
}
