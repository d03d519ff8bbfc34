package integration

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/bgtask/bgtask/internal/testkit"
)

// A completion line matched while the disk of the worker's runs is full: the
// worker cannot write down its decision (stop.json), says so, and goes on to stop
// the command and record the match. The line itself is written: it goes on in the
// output file's last page, which the command's first output took.
func TestALineMatchedWhileTheRunsDiskIsFullCompletesTheTask(t *testing.T) {
	t.Parallel()
	home, dir := t.TempDir(), t.TempDir()
	runs := filepath.Join(home, "worker")
	mountTmpfs(t, runs, diskBytes)
	srv := startServer(t, home)
	makeGate(t, dir, "go")
	id := add(t, home, "--cwd", dir, "--complete-on-regex", "^MATCH$", "--", `printf MAT; `+gate("go")+`echo CH; exec sleep 600`)
	stdout := filepath.Join(runs, "runs", id+"-1", "stdout")
	testkit.Eventually(t, 30*time.Second, "the command printed the first half of its line", func() bool {
		data, _ := os.ReadFile(stdout)
		return string(data) == "MAT"
	})
	// The worker has written the run's state since it began to read its output.
	testkit.Eventually(t, 30*time.Second, "a tick recorded", func() bool { return countTypes(history(t, home, id))["tick"] > 0 })
	ballast := fillDisk(t, runs)
	openGate(t, dir, "go")
	w := waitFor(t, home, id)
	if w.Status != "succeeded" || w.MatchedLine != "MATCH" {
		t.Fatalf("status %s (%s), matched line %q; want succeeded with the line\n%s", w.Status, w.Reason, w.MatchedLine, srv.out.String())
	}
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	auditClean(t, home)
}
