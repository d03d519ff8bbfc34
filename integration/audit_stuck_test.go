package integration

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/internal/testkit"
)

// A running task whose worker appends no tick for longer than the lease TTL plus
// --stuck-after is stuck: here the worker's --tick is longer than the bound, the
// misconfiguration the audit's help warns of, which makes a live run look just
// as a run that nothing watches would.
func TestAuditReportsATaskStuckRunning(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	srv := startServer(t, home, "--lease-ttl", "3s", "--tick", "1h")
	t.Cleanup(func() { srv.stop(syscall.SIGTERM); killRuns(home) })
	id := add(t, home, "--", "exec sleep 600")
	type report struct {
		Open []struct {
			TaskID string    `json:"task_id"`
			Phase  string    `json:"state"`
			Since  time.Time `json:"since"`
		} `json:"open"`
		Violations []struct {
			TaskID string `json:"task_id"`
			Rule   string `json:"rule"`
			Detail string `json:"detail"`
		} `json:"violations"`
	}
	var spawned time.Time
	testkit.Eventually(t, 30*time.Second, "the task running", func() bool {
		r := decodeJSON[report](t, ok(t, home, "audit", "--json"))
		if len(r.Open) == 1 && r.Open[0].Phase == "running" {
			spawned = r.Open[0].Since
			return true
		}
		return false
	})
	if spawned.IsZero() || time.Since(spawned) > time.Minute {
		t.Fatalf("open since %v, want the time it was spawned", spawned)
	}

	// The default bound (2m past the lease) is far away: open, not stuck.
	if out := ok(t, home, "audit"); !strings.Contains(out, "open "+id+" running") || !strings.Contains(out, "0 violations") {
		t.Fatalf("audit of a task running a few seconds:\n%s", out)
	}

	var got report
	testkit.Eventually(t, 30*time.Second, "the silent run stuck with --stuck-after 1s", func() bool {
		r := run(t, home, "audit", "--json", "--stuck-after", "1s")
		got = decodeJSON[report](t, r.stdout)
		if len(got.Violations) == 0 {
			if r.code != 0 {
				t.Fatalf("audit exit %d with no violation:\n%s%s", r.code, r.stdout, r.stderr)
			}
			return false
		}
		if r.code != 1 {
			t.Fatalf("audit exit %d with violations, want 1:\n%s", r.code, r.stdout)
		}
		return true
	})
	v := got.Violations[0]
	if len(got.Violations) != 1 || v.TaskID != id || v.Rule != "stuck" ||
		!strings.Contains(v.Detail, "running on worker ") || !strings.Contains(v.Detail, "over the lease TTL 3s + 1s: waits for a tick, its end or its loss") {
		t.Fatalf("violations = %+v, want stuck on %s for want of a tick", got.Violations, id)
	}
	human := run(t, home, "audit", "--stuck-after", "1s")
	if human.code != 1 || !strings.Contains(human.stdout, "VIOLATION stuck task "+id+" seq ") {
		t.Fatalf("human audit (exit %d):\n%s", human.code, human.stdout)
	}

	bad := run(t, home, "audit", "--stuck-after", "0s")
	if bad.code != 2 || !strings.Contains(bad.stderr, "--stuck-after 0s: must be positive") {
		t.Fatalf("audit --stuck-after 0s: exit %d\n%s%s", bad.code, bad.stdout, bad.stderr)
	}
}
