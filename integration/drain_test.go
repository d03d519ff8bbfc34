package integration

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/internal/testkit"
)

type workersJSON struct {
	Workers []struct {
		ID     string            `json:"id"`
		State  string            `json:"state"`
		Labels map[string]string `json:"labels"`
		Tasks  []string          `json:"tasks"`
	} `json:"workers"`
}

type taskJSON struct {
	ID      string `json:"id"`
	State   string `json:"state"`
	Worker  string `json:"worker"`
	Waiting string `json:"waiting"`
	Spec    struct {
		Placement struct {
			Labels map[string]string `json:"labels"`
		} `json:"placement"`
	} `json:"spec"`
}

func showPlaced(t *testing.T, home, id string) taskJSON {
	t.Helper()
	return decodeJSON[taskJSON](t, ok(t, home, "show", id, "--json"))
}

// The command line of a fleet on one machine: workers with labels are listed, a
// task goes only where its labels allow and says what it waits for, and a worker
// drained by `bgtask worker drain` or SIGUSR1 takes no new task, finishes its
// running one and exits.
func TestLabelsPlacementAndDrainFromTheCommandLine(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home)
	blue := start(t, home, "worker", "--worker-id", "blue", "--label", "pool=blue", "--tick", "200ms")
	green := start(t, home, "worker", "--worker-id", "green", "--label", "pool=green")
	testkit.Eventually(t, 60*time.Second, "three workers ready", func() bool {
		return strings.Count(ok(t, home, "workers", "--json"), `"state": "ready"`) == 3
	})
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range decodeJSON[workersJSON](t, ok(t, home, "workers", "--json")).Workers {
		if w.Labels["host"] != host {
			t.Errorf("worker %s labels %v, want host=%s", w.ID, w.Labels, host)
		}
	}

	// By default a task with a cwd is placed on the registering host.
	if got := showPlaced(t, home, add(t, home, "--", "true")).Spec.Placement.Labels; got["host"] != host {
		t.Errorf("default placement %v, want host=%s", got, host)
	}
	if got := showPlaced(t, home, add(t, home, "--anywhere", "--", "true")).Spec.Placement.Labels; len(got) != 0 {
		t.Errorf("--anywhere placement %v, want none", got)
	}
	red := add(t, home, "--label", "pool=red", "--", "echo red")
	testkit.Eventually(t, 30*time.Second, "the red task saying what it waits for", func() bool {
		return strings.Contains(showPlaced(t, home, red).Waiting, "no live worker has these labels")
	})
	if list := ok(t, home, "list"); !strings.Contains(list, red+" waiting for a worker with pool=red") {
		t.Errorf("list does not say what %s waits for:\n%s", red, list)
	}

	gate := filepath.Join(t.TempDir(), "go")
	long := add(t, home, "--label", "pool=blue", "--", `while [ ! -e "`+gate+`" ]; do sleep 0.05; done`)
	testkit.Eventually(t, 30*time.Second, "the blue task running", func() bool { return showPlaced(t, home, long).State == "running" })
	if w := showPlaced(t, home, long).Worker; w != "blue" {
		t.Fatalf("task placed on pool=blue runs on %s", w)
	}

	if out := ok(t, home, "worker", "drain", "blue"); !strings.Contains(out, "exits after 1 running task") {
		t.Errorf("drain: %s", out)
	}
	later := add(t, home, "--label", "pool=blue", "--", "echo later")
	testkit.Eventually(t, 30*time.Second, "the later task waiting for the draining worker", func() bool {
		return strings.Contains(showPlaced(t, home, later).Waiting, "draining")
	})
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, home, long)
	select {
	case <-blue.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the drained worker did not exit after its last task")
	}
	if code := blue.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("drained worker exit status %d, want 0", code)
	}
	if st := showPlaced(t, home, later); st.State != "armed" || !strings.Contains(st.Waiting, "no live worker has these labels") {
		t.Errorf("task for the drained pool: %s, %q; want armed, waiting for a worker", st.State, st.Waiting)
	}

	// SIGUSR1 drains too; an idle worker exits at once.
	green.signal(syscall.SIGUSR1)
	select {
	case <-green.done:
	case <-time.After(30 * time.Second):
		t.Fatal("an idle worker did not exit on SIGUSR1")
	}
	if r := run(t, home, "worker", "drain", "green"); r.code == 0 || !strings.Contains(r.stderr, "no worker with this id is running") {
		t.Errorf("drain of a worker that is gone: exit %d, %s", r.code, r.stderr)
	}
	if r := run(t, home, "add", "--label", "pool", "--", "true"); r.code != 2 {
		t.Errorf("add --label without a value: exit %d, want 2", r.code)
	}
	if r := run(t, home, "add", "--label", "bad key=x", "--", "true"); r.code != 2 || !strings.Contains(r.stderr, "placement.labels") {
		t.Errorf("add with a bad label: exit %d, %s", r.code, r.stderr)
	}
	auditClean(t, home)
}
