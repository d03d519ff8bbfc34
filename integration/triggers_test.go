package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/internal/testkit"
)

// gatedCommand waits for the gate name, then marks its end with name.done.
func gatedCommand(name string) string { return gate(name) + "touch " + name + ".done" }

// endGated opens the gate name in dir and waits for its command to end.
func endGated(t *testing.T, dir, name string) {
	t.Helper()
	openGate(t, dir, name)
	testkit.Eventually(t, 30*time.Second, name+" ended", func() bool {
		_, err := os.Stat(filepath.Join(dir, name+".done"))
		return err == nil
	})
}

// A dependency that ends while the server (and its worker) is down starts its
// dependent once the server is back, once.
func TestADependencyThatEndsWhileTheServerIsDownStartsItsDependentOnce(t *testing.T) {
	t.Parallel()
	home, dir := t.TempDir(), t.TempDir()
	srv := startServer(t, home)
	makeGate(t, dir, "a")
	a := add(t, home, "--cwd", dir, "--", gatedCommand("a"))
	b := add(t, home, "--cwd", dir, "--after", a, "--", "echo ran >> b.runs")
	testkit.Eventually(t, 30*time.Second, "a running", func() bool { return countTypes(history(t, home, a))["spawned"] == 1 })
	srv.stop(syscall.SIGKILL)
	endGated(t, dir, "a")
	startServer(t, home)
	if w := waitFor(t, home, b); w.Status != "succeeded" {
		t.Fatalf("the dependent after a restart: %+v", w)
	}
	data, err := os.ReadFile(filepath.Join(dir, "b.runs"))
	if err != nil || string(data) != "ran\n" {
		t.Fatalf("the dependent ran %q (%v), want once", data, err)
	}
	if n := countTypes(history(t, home, b)); n["spawned"] != 1 || n["fired"] != 1 {
		t.Fatalf("the dependent's history: %v", n)
	}
	auditClean(t, home)
}

type joinWakeup struct {
	Status  string
	Members []struct {
		ID, Status string
		ExitCode   *int `json:"exit_code"`
	}
}

// A join whose last member ends while the server is down fires once after the
// restart, listing both members; one failed, so the join did.
func TestAJoinWhoseLastMemberEndsDuringARestartFiresOnce(t *testing.T) {
	t.Parallel()
	home, dir := t.TempDir(), t.TempDir()
	srv := startServer(t, home)
	makeGate(t, dir, "last")
	first := add(t, home, "--target", "group", "--wake-on", "none", "--", "exit 3")
	last := add(t, home, "--cwd", dir, "--target", "group", "--wake-on", "none", "--", gatedCommand("last"))
	join := decodeJSON[struct{ ID string }](t, ok(t, home, "join", "--all", first, last, "--target", "group", "--json")).ID
	waitFor(t, home, first)
	srv.stop(syscall.SIGKILL)
	endGated(t, dir, "last")
	startServer(t, home)
	r := run(t, home, "wait", join, "--json", "--timeout", "45s")
	out := r.stdout
	w := decodeJSON[joinWakeup](t, out)
	if r.code != 3 || w.Status != "failed" || len(w.Members) != 2 || w.Members[0].Status != "failed" || *w.Members[0].ExitCode != 3 || w.Members[1].Status != "succeeded" {
		t.Fatalf("the join's wake-up: %s", out)
	}
	if got := inboxLines(t, home, "group"); len(got) != 1 || !strings.Contains(got[0], join) {
		t.Fatalf("the group's inbox holds %d wake-ups, want the join's alone", len(got))
	}
	auditClean(t, home)
}

// `complete` racing the command's own exit: whichever is first decides, once, and
// the history says which.
func TestCompleteRacingTheExitDecidesOnce(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home)
	const tasks = 12
	ids := make([]string, tasks)
	dir := t.TempDir()
	for i := range ids {
		// Commands that run from 0 to 2.75 s once started: completes made as each
		// starts land after the end of the short ones, before that of the long.
		ids[i] = add(t, home, "--cwd", dir, "--target", "race", "--", fmt.Sprintf("touch started.%d; sleep %.2f", i, 0.25*float64(i)))
	}
	var wg sync.WaitGroup
	for i, id := range ids {
		testkit.Eventually(t, 30*time.Second, fmt.Sprintf("command %d started", i), func() bool {
			_, err := os.Stat(filepath.Join(dir, fmt.Sprintf("started.%d", i)))
			return err == nil
		})
		wg.Go(func() { run(t, home, "complete", id, "--status", "failed", "--result", "raced") })
	}
	wg.Wait()
	outcomes := map[string]int{}
	for _, id := range ids {
		w := waitFor(t, home, id)
		n := countTypes(history(t, home, id))
		outcomes[w.Status]++
		switch {
		case n["fired"] != 1:
			t.Fatalf("task %s fired %d times", id, n["fired"])
		case w.Status == "failed" && n["completed"] != 1, w.Status == "succeeded" && n["completed"] != 0:
			t.Fatalf("task %s is %s with %d completed events", id, w.Status, n["completed"])
		}
	}
	if got := inboxLines(t, home, "race"); len(got) != tasks {
		t.Fatalf("the inbox holds %d wake-ups for %d tasks", len(got), tasks)
	}
	t.Logf("outcomes of the race: %v", outcomes)
	auditClean(t, home)
}
