package workers_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/internal/testkit"
	"github.com/bgtask/bgtask/workers"
)

// A worker shares its process with other parents: in the all-in-one server the
// engine's exec sinks and the worker's result commands are children of the same
// process, and os/exec waits for each of them itself. Reaping the shims must
// never take one of those: os/exec's wait would fail with ECHILD for a program
// that did its work, and a sink would be run again.
func TestReapingShimsLeavesTheProcesssOtherChildrenAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startWorker(t, workers.Config{MaxTasks: 8})
	stop := make(chan struct{})
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		errs   []error
		others int
	)
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				err := exec.Command("true").Run()
				mu.Lock()
				others++
				if err != nil {
					errs = append(errs, err)
				}
				mu.Unlock()
			}
		})
	}
	var ids []string
	for range 24 {
		ids = append(ids, b.arm(t, engine.Spec{Command: "true", Cwd: t.TempDir()}))
	}
	for _, id := range ids {
		b.waitFor(t, id, 60*time.Second, "ended", ended)
	}
	close(stop)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d of %d commands of this process lost their wait to the shims' reaping, first: %v", len(errs), others, errs[0])
	}
}

// Cancelling many running tasks at once ends many shims at once, their SIGCHLDs
// merged into a few: every one of them is reaped all the same.
func TestNoShimIsLeftAZombieAfterManyCancels(t *testing.T) {
	testkit.FullOnly(t)
	t.Parallel()
	b := setup(t)
	state := t.TempDir()
	w := b.startWorker(t, workers.Config{StateDir: state, MaxTasks: 50})
	var ids []string
	for range 50 {
		ids = append(ids, b.arm(t, engine.Spec{Command: "sleep 600", Cwd: t.TempDir()}))
	}
	var shims []int
	for _, id := range ids {
		st := b.waitFor(t, id, 120*time.Second, "running", hasPID)
		pids, err := readRunPIDs(filepath.Join(state, "runs", id+"-"+strconv.FormatUint(st.Epoch, 10)))
		if err != nil {
			t.Fatal(err)
		}
		shims = append(shims, pids.Shim.PID)
	}
	for _, id := range ids {
		b.cancel(t, id)
	}
	testkit.Eventually(t, 60*time.Second, "done with the cancelled tasks", func() bool { return len(w.Running()) == 0 })
	// A shim ends a moment after the worker saw its command end, and is reaped then.
	testkit.Eventually(t, 20*time.Second, "every shim of the cancelled tasks reaped, none a zombie child of the worker's process", func() bool {
		return len(zombieChildren(shims)) == 0
	})
}

// zombieChildren are those of pids that are ended, unreaped children of this process.
func zombieChildren(pids []int) []int {
	var out []int
	for _, pid := range pids {
		data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(data), ')')
		fields := strings.Fields(string(data[i+1:]))
		if len(fields) >= 2 && fields[0] == "Z" && fields[1] == strconv.Itoa(os.Getpid()) {
			out = append(out, pid)
		}
	}
	return out
}
