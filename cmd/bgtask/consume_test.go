package main

import (
	"strings"
	"testing"

	"github.com/bgtask/bgtask/projections"
)

// wait --consume removes the wake-up it printed from the target's inbox, and only
// that one: the wake-ups of the same target before and after it stay, the audit
// accounts for the removal, and a restart of the server does not bring it back.
func TestWaitConsumeRemovesOnlyItsWakeupFromTheInbox(t *testing.T) {
	home := t.TempDir()
	server := startServer(t, home)
	before := addTask(t, home, "--target", "agent", "--", "echo before")
	bgtask(t, home, "wait", before, "--timeout", "30s").must(t, 0, "wait before")
	// Not ended yet when the wait starts: it waits, then consumes.
	consumed := addTask(t, home, "--target", "agent", "--", "sleep 0.5; echo consumed")
	if r := bgtask(t, home, "wait", "--consume", consumed, "--timeout", "30s").must(t, 0, "wait --consume"); !strings.Contains(r.stdout, "consumed") {
		t.Fatalf("wait --consume printed %q, not the wake-up", r.stdout)
	}
	after := addTask(t, home, "--target", "agent", "--", "echo after")
	bgtask(t, home, "wait", after, "--timeout", "30s").must(t, 0, "wait after")
	// Consuming again does no harm; a task that woke nobody has nothing to consume.
	bgtask(t, home, "wait", "--consume", consumed, "--timeout", "30s").must(t, 0, "wait --consume again")
	quiet := addTask(t, home, "--target", "agent", "--wake-on", "failed", "--", "true")
	bgtask(t, home, "wait", "--consume", quiet, "--timeout", "30s").must(t, 0, "wait --consume of a quiet task")

	if v := decode[struct{ Consumed bool }](t, bgtask(t, home, "show", consumed, "--json").must(t, 0, "show").stdout); !v.Consumed {
		t.Errorf("show: the consumed task does not say it was consumed")
	}
	auditClean(t, home)
	server.stop()
	startServer(t, home)

	var ids []string
	for _, line := range strings.Split(strings.TrimSpace(bgtask(t, home, "inbox", "--target", "agent", "--json").must(t, 0, "inbox").stdout), "\n") {
		ids = append(ids, decode[struct{ ID string }](t, line).ID)
	}
	if len(ids) != 2 || ids[0] != before || ids[1] != after {
		t.Fatalf("inbox after a restart: %v, want [%s %s] without %s", ids, before, after, consumed)
	}
	auditClean(t, home)
}

func auditClean(t *testing.T, home string) {
	t.Helper()
	r := decode[projections.Report](t, bgtask(t, home, "audit", "--json").stdout)
	if len(r.Violations) > 0 {
		t.Fatalf("audit: %+v", r.Violations)
	}
}
