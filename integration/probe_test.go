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

// probeWakeup is the part of a wake-up a probe's test reads.
type probeWakeup struct {
	Status string   `json:"status"`
	Probes int      `json:"probes"`
	Tail   []string `json:"tail"`
}

// A probe whose server is killed between two of its runs goes on with the next
// run after the restart, counting on from where it was, and is done once, at the
// first run that meets its rule.
func TestAProbeGoesOnAcrossAKillOfTheServer(t *testing.T) {
	t.Parallel()
	home, dir := t.TempDir(), t.TempDir()
	srv := startServer(t, home)
	status := filepath.Join(dir, "status")
	if err := os.WriteFile(status, []byte("running\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	id := add(t, home, "--cwd", dir, "--target", "probes", "--probe-every", "1s", "--complete-on-regex", "^done$",
		"--", "echo run >> runs; cat status")
	testkit.Eventually(t, 30*time.Second, "two probe runs that did not match", func() bool {
		return countTypes(history(t, home, id))["probe-scheduled"] >= 2
	})
	before := countTypes(history(t, home, id))["probe-scheduled"]
	srv.stop(syscall.SIGKILL)
	if err := os.WriteFile(status, []byte("done\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	startServer(t, home)
	w := decodeJSON[probeWakeup](t, ok(t, home, "wait", id, "--json", "--timeout", "45s"))
	n := countTypes(history(t, home, id))
	if w.Status != "succeeded" || w.Probes < before || w.Probes != n["probe-scheduled"] || len(w.Tail) != 1 || w.Tail[0] != "done" {
		t.Fatalf("wake-up of the probe: %+v; %d probe runs had not matched before the kill; history %v", w, before, n)
	}
	data, err := os.ReadFile(filepath.Join(dir, "runs"))
	if err != nil {
		t.Fatal(err)
	}
	if runs := strings.Count(string(data), "run\n"); runs != n["spawned"] || runs != w.Probes+1 || n["fired"] != 1 {
		t.Fatalf("the probe ran %d times; history %v, wake-up probes %d", runs, n, w.Probes)
	}
	if got := inboxLines(t, home, "probes"); len(got) != 1 {
		t.Fatalf("the inbox holds %d wake-ups of the probe, want 1", len(got))
	}
	auditClean(t, home)
}
