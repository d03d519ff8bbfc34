//go:build darwin || (linux && bgtask_portable)

package workers

import (
	"syscall"

	"github.com/bgtask/bgtask/workers/shim"
)

// Without a subreaper or a pidfd (macOS; on Linux the tag bgtask_portable
// selects this file) nothing can learn how a command ends once its shim died:
// its run is lost, and what is left of it stopped.

const canAdopt = false

func becomeSubreaper() {}

func reapAdopted() {}

func reapedExit(shim.ProcRef) (syscall.WaitStatus, bool) { return 0, false }

func (e *endWatch) exitStatus(int, <-chan struct{}) (syscall.WaitStatus, bool) { return 0, false }
