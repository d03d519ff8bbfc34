package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/internal/testkit"
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

// A Claude Code session's waiter fetches a wake-up the moment it is delivered,
// while a `wait --consume` in the session's turn is about to return it: the
// waiter leaves it to the wait, and hands over only the next one.
func TestAClaudeWaiterLeavesAWakeUpToAWaitThatConsumesIt(t *testing.T) {
	quietHome(t)
	home := t.TempDir()
	startServer(t, home)
	claudeWaiterEnv(t, "s4")
	dir := t.TempDir()
	held := addTask(t, home, "--target", "claude-s4", "--prompt", "WAKE {{task_id}}", "--cwd", dir, "--",
		"while [ ! -e go ]; do sleep 0.05; done")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waiter := runWaiter(ctx, home)
	testkit.Eventually(t, 30*time.Second, "the waiter takes the session's lock", func() bool {
		f, err := os.Open(filepath.Join(home, "claude-sessions", "claude-s4.lock"))
		if err != nil {
			return false
		}
		defer f.Close()
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
			return true
		}
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		return false
	})
	waited := make(chan result, 1)
	go func() { waited <- bgtask(t, home, "wait", "--consume", held, "--timeout", "60s") }()
	nc, err := (&globals{home: home}).connect("test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	testkit.Eventually(t, 30*time.Second, "the wait says it will consume the wake-up", func() bool {
		_, err := nc.Request(client.ConsumingPrefix+"."+held, nil, time.Second)
		return err == nil
	})
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	(<-waited).must(t, 0, "wait --consume")
	next := addTask(t, home, "--target", "claude-s4", "--prompt", "WAKE {{task_id}}", "--", "true")
	if o := awaitWaiter(t, waiter, "the waiter"); o.code != 2 || strings.TrimSpace(o.stderr) != "WAKE "+next {
		t.Fatalf("the waiter: exit %d, stderr %q; want only the next task's wake-up, WAKE %s", o.code, o.stderr, next)
	}
	if p, a := inboxState(t, home, "claude-s4"); p != 0 || a != 0 {
		t.Fatalf("the inbox has %d unread, %d unacknowledged", p, a)
	}
}
