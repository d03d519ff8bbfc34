package integration

import (
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"
)

// pidfdKeepsExits says whether the kernel keeps a reaped process's exit for its
// pidfds (PIDFD_INFO_EXIT, Linux 6.15).
func pidfdKeepsExits(t *testing.T) bool {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.PidfdOpen(cmd.Process.Pid, 0) // before the reap: it is a zombie at most
	_ = cmd.Wait()
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	info := unix.PidfdInfo{Mask: unix.PIDFD_INFO_EXIT}
	return unix.IoctlPidfdInfo(fd, &info) == nil && info.Mask&unix.PIDFD_INFO_EXIT != 0
}
