package engine

import (
	"os"
	"syscall"
)

// CrashEnv names the crash point a test asks a bgtask process to die at, by
// SIGKILL, so that fault tests can hit windows no outside signal can time: between
// two appends, between an append and the step that follows it.
const CrashEnv = "BGTASK_CRASH_AT"

// Crash points.
const (
	CrashAfterPersist   = "dispatcher-after-persist"    // completion-persisted appended, nothing delivered
	CrashAfterDeliver   = "dispatcher-after-deliver"    // the wake-up is in the inbox, fired not appended
	CrashAfterPush      = "pusher-after-push"           // a push sink's attempt succeeded, its result not appended
	CrashAfterSpawn     = "worker-after-spawn"          // spawned appended, the command not started
	CrashBeforeExitSave = "worker-before-exit-recorded" // the command exited, exited not appended
	CrashShimAfterStart = "shim-after-start"            // the shim started the command, its PID not recorded
)

// CrashPoint kills this process if a test named this point.
func CrashPoint(name string) {
	if os.Getenv(CrashEnv) == name {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}
