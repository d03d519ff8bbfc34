package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/events/eventstest"
	"github.com/bgtask/bgtask/internal/testkit"
	"github.com/bgtask/bgtask/projections"
)

// serveSchedulesAt runs the API with its schedules and their runner on a NATS
// server of its own, for the CLI to reach with --nats.
func serveSchedulesAt(t *testing.T) string {
	t.Helper()
	srv := eventstest.Run(t)
	ctx := context.Background()
	store, err := events.OpenStore(ctx, srv.JS, events.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	schedules, err := events.OpenSchedules(ctx, srv.JS, 1)
	if err != nil {
		t.Fatal(err)
	}
	proj := projections.New(store, nil, engine.Base{})
	if err := proj.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proj.Stop)
	svc := engine.NewService(store, "engine-1", engine.Base{})
	runner := engine.NewScheduleRunner(schedules, svc.Register, proj, svc.Cancel, engine.Base{})
	if err := runner.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(runner.Stop)
	s := api.New(srv.Conn, svc, proj, nil, store, nil, "0.0.0-test", engine.Base{})
	s.ServeSchedules(schedules, proj)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	if err := srv.Conn.Flush(); err != nil {
		t.Fatal(err)
	}
	return srv.NATS.ClientURL()
}

func TestScheduleCommands(t *testing.T) {
	quietHome(t)
	url := serveSchedulesAt(t)
	run := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := Run(context.Background(), append([]string{"--nats", url}, args...), &out, &errOut)
		if err != nil {
			err = errors.Join(err, errors.New(errOut.String()))
		}
		return out.String(), err
	}
	must := func(args ...string) string {
		t.Helper()
		out, err := run(args...)
		if err != nil {
			t.Fatalf("bgtask %s: %v", strings.Join(args, " "), err)
		}
		return out
	}
	var added api.ScheduleView
	if err := json.Unmarshal([]byte(must("schedule", "add", "tick", "--every", "1s", "--overlap", "allow", "--target", "schedbar", "--json", "--", "echo", "tick")), &added); err != nil {
		t.Fatal(err)
	}
	if added.Schedule.Every != "1s" || len(added.Next) == 0 {
		t.Fatalf("added: %+v", added)
	}
	if _, err := run("schedule", "add", "bad", "--every", "1s", "--catch-up", "sometimes", "--", "true"); err == nil || !strings.Contains(err.Error(), "catch_up") {
		t.Fatalf("a bad --catch-up: %v", err)
	}
	if _, err := run("schedule", "add", "never", "--cron", "0 0 31 2 *", "--", "true"); err == nil || !strings.Contains(err.Error(), "cron") {
		t.Fatalf("a cron that never fires: %v", err)
	}
	if _, err := run("schedule", "add", "nocmd", "--every", "1s"); err == nil {
		t.Fatal("a schedule with no -- was added")
	}
	var shown api.ScheduleView
	testkit.Eventually(t, 15*time.Second, "two occurrences of the schedule shown", func() bool {
		shown = decode[api.ScheduleView](t, must("schedule", "show", "tick", "--json"))
		return len(shown.Occurrences) >= 2
	})
	if o := shown.Occurrences[0]; o.ID == "" || o.State == "" {
		t.Fatalf("an occurrence: %+v", o)
	}
	must("schedule", "pause", "tick")
	if out := must("schedule", "list"); !strings.Contains(out, "tick\tevery 1s, paused") {
		t.Fatalf("list: %q", out)
	}
	id := strings.TrimSpace(must("schedule", "trigger", "tick"))
	if out := must("schedule", "show", "tick"); !strings.Contains(out, id) {
		t.Fatalf("show does not list the triggered %s: %q", id, out)
	}
	must("schedule", "resume", "tick", "--json")
	must("schedule", "delete", "tick")
	if _, err := run("schedule", "show", "tick"); err == nil || !strings.Contains(err.Error(), "no such schedule") {
		t.Fatalf("show after delete: %v", err)
	}
	if out := must("schedule", "add", "--help"); !strings.Contains(out, "--overlap") || !strings.Contains(out, "catch-up") {
		t.Fatalf("help: %q", out)
	}
}
