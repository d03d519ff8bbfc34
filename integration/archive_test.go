package integration

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/internal/testkit"
)

// Tasks finished longer ago than --archive-after leave the event stream for the
// archive; show, wait, history and the audit still see them whole, across a restart.
func TestFinishedTasksAreArchivedAndStayWhole(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	srv := startServer(t, home, "--archive-after", "1s")
	const command = "echo archived-output; exit 3"
	id := add(t, home, "--idempotency-key", "nightly-7", "--", command)
	waitFor(t, home, id)
	testkit.Eventually(t, 60*time.Second, "the task archived", func() bool {
		return strings.Contains(ok(t, home, "list", "--json"), `"state": "archived"`)
	})
	check := func(when string) {
		t.Helper()
		s := show(t, home, id)
		if s.Status != "failed" || s.ExitCode == nil || *s.ExitCode != 3 {
			t.Fatalf("%s: show of an archived task: %+v", when, s)
		}
		w := waitFor(t, home, id)
		if w.ExitCode == nil || *w.ExitCode != 3 || strings.Join(w.Tail, ",") != "archived-output" {
			t.Fatalf("%s: wait on an archived task: %+v", when, w)
		}
		n := countTypes(history(t, home, id))
		if n["armed"] != 1 || n["exited"] != 1 || n["fired"] != 1 || n["archived"] != 1 {
			t.Fatalf("%s: history of an archived task: %v", when, n)
		}
		// The same idempotency key and spec still name the same task, which does not
		// run again; the key with another command is refused.
		if again := add(t, home, "--idempotency-key", "nightly-7", "--", command); again != id {
			t.Fatalf("%s: the key registered a new task %s", when, again)
		}
		if r := run(t, home, "add", "--idempotency-key", "nightly-7", "--", "echo again"); r.code != 6 || !strings.Contains(r.stderr, "command") {
			t.Fatalf("%s: the key with another command: exit %d, %s", when, r.code, r.stderr)
		}
		auditClean(t, home)
		if out := ok(t, home, "audit"); !strings.Contains(out, "1 archived") {
			t.Fatalf("%s: audit does not count the archived task:\n%s", when, out)
		}
	}
	check("live")
	srv.stop(syscall.SIGKILL)
	startServer(t, home, "--archive-after", "1s")
	check("after a restart")
}
