//go:build linux && !bgtask_portable

package workers

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/internal/testkit"
	"github.com/bgtask/bgtask/workers/shim"
)

// As a subreaper, a worker reaps an orphan that comes to it when it ends, and
// keeps its status for a run's watch that comes late; a child that os/exec
// started and waits for is left to it.
func TestTheWorkerReapsTheOrphansItAdoptsAndNoOtherChild(t *testing.T) {
	becomeSubreaper()
	waited := exec.Command("true")
	if err := waited.Start(); err != nil {
		t.Fatal(err)
	}
	// An orphan: its parent, bash, ends first, and it comes to this process.
	out, err := exec.Command("bash", "-c", "(sleep 0.2; exit 3) & echo $!").Output()
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("the orphan's PID %q: %v", out, err)
	}
	start, err := shim.ProcStart(pid)
	if err != nil {
		t.Fatal(err)
	}
	held, err := pidfdsHeld()
	if err != nil || !held[waited.Process.Pid] {
		t.Fatalf("os/exec's child %d among the processes a pidfd names: %v (%v)", waited.Process.Pid, held, err)
	}
	testkit.Eventually(t, 10*time.Second, "the orphan reaped", func() bool {
		reapAdopted()
		ws, ok := reapedExit(shim.ProcRef{PID: pid, Start: start})
		if ok && ws.ExitStatus() != 3 {
			t.Fatalf("the orphan's status %v, want exit 3", ws)
		}
		return ok
	})
	if err := waited.Wait(); err != nil {
		t.Fatalf("os/exec's own child: %v", err)
	}
}
