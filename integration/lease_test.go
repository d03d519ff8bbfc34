package integration

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/internal/testkit"
)

// A server restarted with a shorter --lease-ttl changes the lease of the workers
// connected to it: they beat at its rate from then on, so that their running tasks
// are not lost and new tasks find them, whatever TTL they read when they connected.
func TestWorkersFollowALeaseTTLLoweredByARestartOfTheServer(t *testing.T) {
	t.Parallel()
	home, dir := t.TempDir(), t.TempDir()
	srv := startServer(t, home, "--no-worker", "--lease-ttl", "4m") // a heartbeat a minute
	start(t, home, "worker", "--worker-id", "stayer")
	makeGate(t, dir, "g")
	running := add(t, home, "--cwd", dir, "--", `echo $$ $PPID > pids; `+gate("g")+`exit 0`)
	waitPIDPair(t, filepath.Join(dir, "pids"))
	srv.stop(syscall.SIGTERM)
	const ttl = 10 * time.Second
	srv = startServer(t, home, "--no-worker", "--lease-ttl", ttl.String(), "--log-level", "debug")
	// The engine checks the leases one TTL after its start, and every quarter TTL
	// after: the worker holds its lease across several of them (the first five,
	// two TTLs).
	testkit.Eventually(t, 4*ttl, "five lease checks", func() bool {
		return strings.Count(srv.out.String(), "leases checked") >= 5
	})
	added := time.Now()
	fresh := add(t, home, "--cwd", dir, "--", "true")
	if w := waitFor(t, home, fresh); w.Status != "succeeded" {
		t.Fatalf("task added after the restart: %+v", w)
	}
	if took := time.Since(added); took > ttl {
		t.Errorf("a task added after the restart took %v to run: its worker looked gone", took.Round(time.Millisecond))
	}
	openGate(t, dir, "g")
	w := waitFor(t, home, running)
	if n := openLog(t, home).count(t, running); w.Status != "succeeded" || n["lost"] != 0 || n["spawned"] != 1 {
		t.Fatalf("task running across the restart: %s, history %v", w.Status, n)
	}
}
