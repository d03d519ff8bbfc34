package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/internal/testkit"
)

// A command's notices go on across a SIGKILL of the server while it prints: every
// matching line is in exactly one notice, lines printed while nothing watched
// included, notices are numbered on from the last, and the final wake-up comes
// once, after them.
func TestNoticesAreNeitherLostNorRepeatedAcrossAKillOfTheServer(t *testing.T) {
	t.Parallel()
	home, dir := t.TempDir(), t.TempDir()
	srv := startServer(t, home)
	const lines = 8
	// The command prints two lines, then three more once the server is killed,
	// then the rest once it is back; it counts its lines in a file of its own too.
	makeGate(t, dir, "down")
	makeGate(t, dir, "up")
	command := fmt.Sprintf(`for i in $(seq %d); do
if [ $i = 3 ]; then %sfi
if [ $i = 6 ]; then %sfi
echo PROGRESS $i; echo $i >> printed; echo other; sleep 0.5
done`, lines, gate("down"), gate("up"))
	id := add(t, home, "--cwd", dir, "--target", "progress", "--notify-on-regex", "^PROGRESS", "--", command)
	testkit.Eventually(t, 30*time.Second, "two notices", func() bool {
		return countTypes(history(t, home, id))["notice"] >= 2
	})
	srv.stop(syscall.SIGKILL)
	openGate(t, dir, "down")
	testkit.Eventually(t, 30*time.Second, "three lines printed while no server watches the command", func() bool {
		data, _ := os.ReadFile(filepath.Join(dir, "printed"))
		return strings.Count(string(data), "\n") == 5
	})
	startServer(t, home)
	openGate(t, dir, "up")
	ok(t, home, "wait", id, "--timeout", "45s")

	var got []string
	var final int
	for i, line := range inboxLines(t, home, "progress") {
		var w struct {
			Status string   `json:"status"`
			Notice string   `json:"notice"`
			Tail   []string `json:"tail"`
		}
		if err := json.Unmarshal([]byte(line), &w); err != nil {
			t.Fatal(err)
		}
		switch {
		case w.Notice == "":
			final++
		case w.Notice != fmt.Sprintf("n%d", i+1) || final > 0:
			t.Fatalf("inbox message %d is notice %q (after %d final wake-ups)", i+1, w.Notice, final)
		default:
			got = append(got, w.Tail...)
		}
	}
	var want []string
	for i := 1; i <= lines; i++ {
		want = append(want, fmt.Sprintf("PROGRESS %d", i))
	}
	if final != 1 || !slices.Equal(got, want) {
		t.Fatalf("final wake-ups %d, notice lines %q, want every PROGRESS line once, in order", final, got)
	}
	auditClean(t, home)
}
