package integration

import (
	"encoding/json"
	"fmt"
	"slices"
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
	home := t.TempDir()
	srv := startServer(t, home)
	const lines = 8
	id := add(t, home, "--target", "progress", "--notify-on-regex", "^PROGRESS",
		"--", fmt.Sprintf("for i in $(seq %d); do echo PROGRESS $i; echo other; sleep 0.5; done", lines))
	testkit.Eventually(t, 30*time.Second, "two notices", func() bool {
		return countTypes(history(t, home, id))["notice"] >= 2
	})
	srv.stop(syscall.SIGKILL)
	time.Sleep(time.Second) // the command prints on while no server watches it
	startServer(t, home)
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
