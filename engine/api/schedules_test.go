package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/events/eventstest"
	"github.com/bgtask/bgtask/internal/testkit"
	"github.com/bgtask/bgtask/projections"
)

// serveSchedules serves the API with its schedules and runs them.
func serveSchedules(t *testing.T) *api.Client {
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
	nc, _ := srv.Connect(t)
	s := api.New(nc, svc, proj, noFleet{}, store, nil, "0.0.0-test", engine.Base{})
	s.ServeSchedules(schedules, proj)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	client, _ := srv.Connect(t)
	return api.NewClient(client)
}

func TestScheduleEndpoints(t *testing.T) {
	c := serveSchedules(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	add := engine.Schedule{Name: "tick", Every: "1s", Overlap: engine.OverlapAllow, Spec: json.RawMessage(`{"command":"echo tick","target":"sched"}`)}
	v, err := c.AddSchedule(ctx, add)
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Next) != api.ScheduleNext || v.Schedule.CatchUp != engine.CatchUpLatest {
		t.Fatalf("added: %+v", v)
	}
	var e *api.Error
	if _, err := c.AddSchedule(ctx, add); !errors.As(err, &e) || e.Code != 409 || e.Field != "name" {
		t.Fatalf("second add: %v", err)
	}
	bad := add
	bad.Name, bad.Overlap = "other", "sometimes"
	if _, err := c.AddSchedule(ctx, bad); !errors.As(err, &e) || e.Code != 400 || e.Field != "overlap" {
		t.Fatalf("bad overlap: %v", err)
	}
	if list, err := c.Schedules(ctx); err != nil || len(list.Schedules) != 1 {
		t.Fatalf("list: %+v %v", list, err)
	}
	var show api.ScheduleView
	testkit.Eventually(t, 10*time.Second, "two occurrences shown", func() bool {
		if show, err = c.ShowSchedule(ctx, "tick"); err != nil {
			t.Fatalf("show: %v", err)
		}
		return len(show.Occurrences) >= 2
	})
	if o := show.Occurrences; !o[0].Slot.After(o[1].Slot) || o[0].State != engine.PhaseArmed || o[0].ID == "" {
		t.Fatalf("occurrences, newest first: %+v", o)
	}
	if v, err := c.PauseSchedule(ctx, "tick", true); err != nil || !v.Schedule.Paused || len(v.Next) != 0 {
		t.Fatalf("pause: %+v %v", v, err)
	}
	reg, err := c.TriggerSchedule(ctx, "tick")
	if err != nil || reg.ID == "" {
		t.Fatalf("trigger: %+v %v", reg, err)
	}
	if task, err := c.Get(ctx, reg.ID); err != nil || task.Spec.Occurrence == nil || task.Spec.Target != "sched" {
		t.Fatalf("the triggered occurrence: %+v %v", task, err)
	}
	if v, err := c.PauseSchedule(ctx, "tick", false); err != nil || v.Schedule.Paused {
		t.Fatalf("resume: %+v %v", v, err)
	}
	if _, err := c.DeleteSchedule(ctx, "tick"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ShowSchedule(ctx, "tick"); !errors.As(err, &e) || e.Code != 404 || e.Field != "name" {
		t.Fatalf("show after delete: %v", err)
	}
	if _, err := c.TriggerSchedule(ctx, "no good"); !errors.As(err, &e) || e.Code != 400 || e.Field != "name" {
		t.Fatalf("bad name: %v", err)
	}
}
