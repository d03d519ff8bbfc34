//go:build darwin || (linux && bgtask_portable)

package shim

import "syscall"

// Containment by process group: macOS's, which has no subreaper; on Linux the
// tag bgtask_portable selects it, so that its tests run there.

// adoptOrphans does nothing: there is no subreaper. What a command leaves behind
// in its process group is stopped by group (keeper.sweep); what it moves to a
// group or session of its own (setsid, a daemon's double fork) goes to init
// (launchd) and outlives the run.
func adoptOrphans() {}

// commandAttr puts the command in its own process group. A shim killed between
// the command's start and its pid.json leaves the command running, until the
// worker finds the shim died and stops the run's processes by their marker
// (RunEnv).
func commandAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// strays are none: without a subreaper, what a command left outside its process
// group is not the shim's child.
func (k *keeper) strays([]byte) []int { return nil }
