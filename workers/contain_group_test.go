//go:build darwin || (linux && bgtask_portable)

package workers_test

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/workers"
)

// Without a subreaper, what a command leaves running in its process group when
// it exits (one that ignores TERM too) is stopped by its shim after the exit is
// recorded: TERM, then KILL after the grace. What it moved to a session of its
// own is out of reach and runs on: the weaker guarantee of docs/platforms.md.
func TestTheShimStopsWhatACommandLeftInItsGroup(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startWorker(t, workers.Config{})
	dir := t.TempDir()
	id := b.arm(t, engine.Spec{
		Command: `sleep 600 & echo $! > group; bash -c 'trap "" TERM; exec sleep 600' & echo $! > stubborn; ` +
			`setsid sleep 600 & echo $! > session; exit 3`,
		Cwd: dir,
	})
	pids := map[string]int{}
	for _, name := range []string{"group", "stubborn", "session"} {
		pid := readPID(t, filepath.Join(dir, name))
		t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
		pids[name] = pid
	}
	if st := b.waitFor(t, id, 20*time.Second, "ended", ended); st.Run == nil || st.Run.ExitCode != 3 {
		t.Fatalf("ended %s (%q), want exit 3", st.Status, st.Reason)
	}
	waitPIDsGone(t, 10*time.Second, pids["group"], pids["stubborn"])
	// The shim has given its KILL to the group, the last it does.
	if err := syscall.Kill(pids["session"], 0); err != nil {
		t.Fatalf("the process in a session of its own: %v; without a subreaper it runs on", err)
	}
}
