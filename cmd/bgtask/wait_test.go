package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
)

// A unique start of an id names its task; wait takes several ids and waits for
// all of them, or with --any for the first, its exit status the worst outcome.
func TestWaitForSeveralTasksNamedByAStartOfTheirID(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	startServer(t, home)
	ok := addTask(t, home, "--", "echo fine")
	failed := addTask(t, home, "--", "echo broken; exit 3")
	cancelled := addTask(t, home, "--", "sleep 30")
	bgtask(t, home, "cancel", cancelled[:8]).must(t, 0, "cancel by a start of the id")
	bgtask(t, home, "wait", ok[:6], failed, "--timeout", "30s").must(t, client.ExitTaskFailed, "wait for a success and a failure")

	if v := decode[mcpTask](t, bgtask(t, home, "show", ok[:8], "--json").must(t, 0, "show by a start").stdout); v.ID != ok {
		t.Errorf("show %s: task %s, want %s", ok[:8], v.ID, ok)
	}
	for _, c := range []struct {
		args []string
		code int
	}{
		{[]string{ok, ok[:8]}, 0}, // one task, named twice
		{[]string{ok, cancelled[:8]}, client.ExitTaskCancelled},
		{[]string{cancelled, failed[:8], ok}, client.ExitTaskFailed},
	} {
		what := "wait " + strings.Join(c.args, " ")
		r := bgtask(t, home, append(append([]string{"wait", "--json"}, c.args...), "--timeout", "30s")...).must(t, c.code, what)
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		want := map[string]bool{}
		for _, ref := range c.args {
			want[ref[:8]] = true
		}
		if len(want) == 1 {
			if w := decode[struct{ ID string }](t, r.stdout); w.ID != ok {
				t.Errorf("%s printed %s, want the one wake-up of %s", what, r.stdout, ok)
			}
			continue
		}
		if len(lines) != len(want) {
			t.Errorf("%s printed %d lines, want a wake-up a line for each of %d tasks:\n%s", what, len(lines), len(want), r.stdout)
		}
		for i, line := range lines {
			if w := decode[struct{ ID string }](t, line); !want[w.ID[:8]] || w.ID[:8] != c.args[i][:8] {
				t.Errorf("%s: wake-up %d is of %s, want those of %v in order", what, i, w.ID, c.args)
			}
		}
	}

	running := addTask(t, home, "--", "sleep 30")
	r := bgtask(t, home, "wait", "--any", running, ok[:8], "--json", "--timeout", "30s").must(t, 0, "wait --any")
	if w := decode[struct{ ID string }](t, r.stdout); w.ID != ok {
		t.Errorf("wait --any printed the wake-up of %s, want %s's", w.ID, ok)
	}
	r = bgtask(t, home, "wait", ok, running[:8], "--timeout", "300ms").must(t, client.ExitTimeout, "wait past its --timeout")
	if !strings.Contains(r.stdout, ok) || !strings.Contains(r.stderr, "1 of 2 tasks: "+running+" (") {
		t.Errorf("wait of an ended and a running task past its --timeout: stdout %q, stderr %q", r.stdout, r.stderr)
	}
	r = bgtask(t, home, "wait", ok, "0000000000", "--timeout", "30s").must(t, client.ExitNotFound, "wait for a task and no task")
	if r.stdout != "" {
		t.Errorf("wait for a task and no task printed %q before it failed", r.stdout)
	}
	bgtask(t, home, "cancel", running).must(t, 0, "cancel")
}

// A start of an id too short, or several tasks' ids have, is bad input: the
// error names the field, and lists the tasks it could be.
func TestAStartOfAnIDThatNamesNoOneTaskIsAnError(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	startServer(t, home)
	a, b := keysWithIDsOfOneStart(t)
	idA := addTask(t, home, "--idempotency-key", a, "--", "true")
	idB := addTask(t, home, "--idempotency-key", b, "--", "true")
	r := bgtask(t, home, "show", idA[:6], "--json").must(t, client.ExitUsage, "show by a start of two ids")
	e := decode[struct{ Error api.Error }](t, r.stdout).Error
	if e.Code != api.CodeAmbiguous || e.Field != "id" || len(e.Matches) != 2 || !strings.Contains(e.Message, idA) || !strings.Contains(e.Message, idB) {
		t.Errorf("show by a start of %s and %s: %+v", idA, idB, e)
	}
	r = bgtask(t, home, "wait", idA[:5]).must(t, client.ExitUsage, "wait by a start of 5 characters")
	if !strings.Contains(r.stderr, "id: ") || !strings.Contains(r.stderr, "too short") {
		t.Errorf("wait by a start of 5 characters says %q", r.stderr)
	}
	// One character more than they share tells them apart.
	shared := 0
	for idA[shared] == idB[shared] {
		shared++
	}
	bgtask(t, home, "wait", idA[:shared+1], idB[:shared+1], "--timeout", "30s").must(t, 0, "wait by longer starts")
}

// keysWithIDsOfOneStart finds two idempotency keys whose tasks' ids share
// their first api.MinIDPart characters.
func keysWithIDsOfOneStart(t *testing.T) (string, string) {
	t.Helper()
	seen := map[string]string{}
	for i := range 1_000_000 {
		key := fmt.Sprintf("shared-start-%d", i)
		id, err := engine.TaskID(engine.Spec{IdempotencyKey: key})
		if err != nil {
			t.Fatal(err)
		}
		if other, ok := seen[id[:api.MinIDPart]]; ok {
			return other, key
		}
		seen[id[:api.MinIDPart]] = key
	}
	t.Fatal("no two keys of a million make ids of one start")
	return "", ""
}

// join takes a start of a member's id, and registers the whole id.
func TestJoinTakesAStartOfAnID(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	startServer(t, home)
	a := addTask(t, home, "--wake-on", "none", "--", "true")
	b := addTask(t, home, "--wake-on", "none", "--", "true")
	j := decode[struct{ ID string }](t, bgtask(t, home, "join", "--all", a[:8], b, "--json").must(t, 0, "join").stdout).ID
	if got := decode[mcpTask](t, bgtask(t, home, "show", j, "--json").must(t, 0, "show").stdout).Spec.Join; got == nil || !slices.Equal(got.Members, []string{a, b}) {
		t.Errorf("the join's members: %+v, want %s and %s", got, a, b)
	}
	bgtask(t, home, "join", "--all", a[:5], b).must(t, client.ExitUsage, "join with a start of 5 characters")
	// The members' shims write into the home until their runs are over, and the
	// server that stops at the test's end leaves them running.
	bgtask(t, home, "wait", a, b, "--timeout", "30s").must(t, 0, "wait for the members")
}
