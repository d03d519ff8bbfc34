//go:build darwin || (linux && bgtask_portable)

package shim

import "syscall"

// Containment by process group: macOS's, which has no subreaper; on Linux the
// tag bgtask_portable selects it, so that its tests run there.

// adoptOrphans does nothing: there is no subreaper. What the command leaves
// behind in its process group is stopped by group (stopLeftovers); what it moves
// to a group or session of its own (setsid, a daemon's double fork) goes to init
// (launchd) and outlives the run.
func adoptOrphans() {}

// commandAttr puts the command in its own process group. A shim killed between
// the command's start and its pid.json leaves the command running, until the
// worker finds the shim died and stops the run's processes by their marker
// (workers.RunEnv).
func commandAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// stopLeftovers ends what the command left running in its process group pgid:
// TERM, and KILL once grace (nanoseconds) has passed with the group not empty.
// While a process of the group lives, its ID names no other process or group.
func stopLeftovers(pgid int, grace int64) {
	if syscall.Kill(-pgid, syscall.SIGTERM) != nil {
		return // nothing is left
	}
	killAt := monotonic() + grace
	for syscall.Kill(-pgid, 0) == nil {
		if monotonic() >= killAt {
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			return
		}
		sleep(20e6)
	}
}
