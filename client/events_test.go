package client_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/events"
)

// errEnough ends a read that has what it wanted.
var errEnough = errors.New("enough")

// readEvents reads a feed until until says it has what it wanted, and returns
// what it read.
func readEvents(t *testing.T, f *client.EventFeed, until func([]client.Event) bool) []client.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var got []client.Event
	err := f.Read(ctx, func(ev client.Event) error {
		got = append(got, ev)
		if until(got) {
			return errEnough
		}
		return nil
	})
	if !errors.Is(err, errEnough) {
		t.Fatalf("read %d events: %v", len(got), err)
	}
	return got
}

// count is an until: n events read.
func count(n int) func([]client.Event) bool {
	return func(got []client.Event) bool { return len(got) == n }
}

func openEvents(t *testing.T, c *client.Client, o client.EventOptions) *client.EventFeed {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f, err := c.Events(ctx, o)
	if err != nil {
		t.Fatalf("events %+v: %v", o, err)
	}
	return f
}

// A feed reads what is appended after it opened, a task's events from its
// first, a target's tasks' (one armed before the feed opened too), and resumes
// after a sequence; every reader sees a spec's env hidden.
func TestEventsReadsWhatItSelects(t *testing.T) {
	c := connect(t, os.Getenv("BGTASK_HOME"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	register := func(spec client.Spec) string {
		t.Helper()
		reg, err := c.Register(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		return reg.ID
	}
	// No worker runs: a command stays armed until it is cancelled.
	old := register(client.Spec{Command: "true", Target: "events-a", Env: map[string]string{"TOKEN": "s3cret"}})
	all := openEvents(t, c, client.EventOptions{FromNow: true})
	ofA := openEvents(t, c, client.EventOptions{Target: "events-a", FromNow: true})
	ofB := register(client.Spec{Command: "true", Target: "events-b"})
	newer := register(client.Spec{Command: "true", Target: "events-a"})
	if _, err := c.Cancel(ctx, old, "done with it"); err != nil {
		t.Fatal(err)
	}

	seen := readEvents(t, all, func(got []client.Event) bool {
		return got[len(got)-1].TaskID == old && got[len(got)-1].Type == events.TypeCancelled
	})
	var mine []client.Event // the shared engine's other tasks may have events too
	for _, ev := range seen {
		if ev.TaskID == old || ev.TaskID == ofB || ev.TaskID == newer {
			mine = append(mine, ev)
		}
	}
	if mine[0].TaskID != ofB || mine[0].Type != events.TypeArmed || len(mine) != 3 {
		t.Fatalf("the events after the feed opened: %+v, want b's and the newer's armed, the old's cancelled", mine)
	}
	for _, want := range []struct {
		id  string
		typ events.Type
	}{{newer, events.TypeArmed}, {old, events.TypeCancelled}} {
		if got := readEvents(t, ofA, count(1))[0]; got.TaskID != want.id || got.Type != want.typ {
			t.Fatalf("target events-a: %s of %s, want %s of %s", got.Type, got.TaskID, want.typ, want.id)
		}
	}

	ofOld := readEvents(t, openEvents(t, c, client.EventOptions{Task: old[:8]}), count(2))
	if ofOld[0].Type != events.TypeArmed || ofOld[1].Type != events.TypeCancelled || ofOld[0].Seq >= ofOld[1].Seq {
		t.Fatalf("the task's events: %+v", ofOld)
	}
	if !strings.Contains(string(ofOld[0].Payload), "TOKEN") || strings.Contains(string(ofOld[0].Payload), "s3cret") {
		t.Fatalf("the armed event shows the env's values: %s", ofOld[0].Payload)
	}

	resumed := readEvents(t, openEvents(t, c, client.EventOptions{After: seen[0].Seq}), count(len(seen)-1))
	for i, ev := range resumed {
		if ev.Seq != seen[i+1].Seq {
			t.Fatalf("resumed after %d: event %d is seq %d, want %d", seen[0].Seq, i, ev.Seq, seen[i+1].Seq)
		}
	}
}

func TestEventsRefusesWhatSelectsNothing(t *testing.T) {
	c := connect(t, os.Getenv("BGTASK_HOME"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		o     client.EventOptions
		code  int
		field string
	}{
		{client.EventOptions{Task: "no-such-task"}, 404, "id"},
		{client.EventOptions{Target: "a.b"}, 400, "target"},
		{client.EventOptions{Task: "no-such-task", Target: "a"}, 400, "target"},
	} {
		var apiErr *client.Error
		if _, err := c.Events(ctx, tc.o); !errors.As(err, &apiErr) || apiErr.Code != tc.code || apiErr.Field != tc.field {
			t.Errorf("events %+v: %v, want a %d naming %q", tc.o, err, tc.code, tc.field)
		}
	}
}
