//go:build darwin || (linux && bgtask_portable)

package workers

import (
	"os"
	"syscall"
)

// Without a pidfd (macOS has none; on Linux the tag bgtask_portable selects this
// file), a shim is named by its PID, which names no other process while the shim
// is this process's child and not yet reaped: reapShim waits for that PID alone,
// never for any child.

// shimAttr starts a shim in a session of its own.
func shimAttr(*int) *syscall.SysProcAttr { return &syscall.SysProcAttr{Setsid: true} }

// shimRef is what names a shim in shimChildren: its PID.
func shimRef(proc *os.Process, _ int) int { return proc.Pid }

// reapShim reaps the shim pid if it has ended.
func reapShim(pid int) bool {
	var ws syscall.WaitStatus
	got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
	for err == syscall.EINTR {
		got, err = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
	}
	// ECHILD: nothing is left to wait for.
	return err != nil || got == pid
}
