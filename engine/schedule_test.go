package engine_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
)

var created = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

func sched(t *testing.T, s engine.Schedule) engine.Schedule {
	t.Helper()
	if s.Name == "" {
		s.Name = "nightly"
	}
	if s.Spec == nil {
		s.Spec = json.RawMessage(`{"command":"echo tick"}`)
	}
	if s.CreatedAt.IsZero() {
		s.CreatedAt, s.After = created, created
	}
	if err := s.Validate(); err != nil {
		t.Fatalf("validate: %v", err)
	}
	return s
}

func TestScheduleValidateNamesTheField(t *testing.T) {
	spec := json.RawMessage(`{"command":"true"}`)
	for _, c := range []struct {
		s     engine.Schedule
		field string
	}{
		{engine.Schedule{Name: "a b", Every: "1m", Spec: spec}, "name"},
		{engine.Schedule{Name: "a", Spec: spec}, "cron"},
		{engine.Schedule{Name: "a", Cron: "61 * * * *", Spec: spec}, "cron"},
		{engine.Schedule{Name: "a", Cron: "@every 1m", Spec: spec}, "cron"},
		{engine.Schedule{Name: "a", Cron: "* * * * *", Every: "1m", Spec: spec}, "every"},
		{engine.Schedule{Name: "a", Cron: "0 0 31 2 *", Spec: spec, CreatedAt: created}, "cron"},
		{engine.Schedule{Name: "a", Cron: "0 0 30 2 *", TZ: "Europe/Paris", Spec: spec, CreatedAt: created}, "cron"},
		{engine.Schedule{Name: "a", Cron: "0 0 31 4,6,9,11 *", Spec: spec}, "cron"},
		{engine.Schedule{Name: "a", Every: "500ms", Spec: spec}, "every"},
		{engine.Schedule{Name: "a", Every: "1m", TZ: "Europe/Paris", Spec: spec}, "tz"},
		{engine.Schedule{Name: "a", Cron: "0 3 * * *", TZ: "Mars/Olympus", Spec: spec}, "tz"},
		{engine.Schedule{Name: "a", Every: "1m", Overlap: "queue", Spec: spec}, "overlap"},
		{engine.Schedule{Name: "a", Every: "1m", CatchUp: "some", Spec: spec}, "catch_up"},
		{engine.Schedule{Name: "a", Every: "1m"}, "spec"},
		{engine.Schedule{Name: "a", Every: "1m", Spec: json.RawMessage(`{"command":"x","idempotency_key":"k"}`)}, "spec.idempotency_key"},
		{engine.Schedule{Name: "a", Every: "1m", Spec: json.RawMessage(`{"command":"x","cwd":"relative"}`)}, "spec.cwd"},
		{engine.Schedule{Name: "a", Every: "1m", Spec: json.RawMessage(`{"command":"x","start_at":"2099-01-01T00:00:00Z"}`)}, "spec.start_at"},
	} {
		err := c.s.Validate()
		var fe *engine.FieldError
		if !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%+v: got %v, want an error naming %s", c.s, err, c.field)
		}
	}
	sched(t, engine.Schedule{Every: "1m", Spec: json.RawMessage(`{"command":"x","start_at":"90s","deadline":"10m"}`)})
	sched(t, engine.Schedule{Cron: "0 12 29 2 *"}) // a leap day: within four years
	s := sched(t, engine.Schedule{Cron: "@hourly"})
	if s.Overlap != engine.OverlapSkip || s.CatchUp != engine.CatchUpLatest {
		t.Errorf("defaults: overlap %q catch_up %q", s.Overlap, s.CatchUp)
	}
}

func TestScheduleEverySlotsCountFromCreation(t *testing.T) {
	s := sched(t, engine.Schedule{Every: "2s", CreatedAt: created.Add(300 * time.Millisecond), After: created.Add(300 * time.Millisecond)})
	got := s.Next(s.After, 3)
	want := []time.Time{created.Add(2 * time.Second), created.Add(4 * time.Second), created.Add(6 * time.Second)}
	if !slicesEqualTimes(got, want) {
		t.Fatalf("next: %v, want %v", got, want)
	}
	slots, n := s.SlotsBetween(created.Add(2*time.Second), created.Add(9*time.Second), 2)
	if n != 3 || !slicesEqualTimes(slots, []time.Time{created.Add(6 * time.Second), created.Add(8 * time.Second)}) {
		t.Fatalf("between: %v (%d)", slots, n)
	}
}

func TestScheduleCronInItsZoneAcrossDST(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Skip(err)
	}
	s := sched(t, engine.Schedule{Cron: "30 2 * * *", TZ: "America/New_York"})
	// Spring forward, 2026-03-08: 02:00 EST becomes 03:00 EDT, so 02:30 is no time
	// of that day there: that day's slot is when the clocks jump, 03:00 EDT.
	from := time.Date(2026, 3, 6, 12, 0, 0, 0, ny)
	want := []time.Time{time.Date(2026, 3, 7, 2, 30, 0, 0, ny), time.Date(2026, 3, 8, 7, 0, 0, 0, time.UTC), time.Date(2026, 3, 9, 2, 30, 0, 0, ny)}
	if got := s.Next(from, 3); !slicesEqualTimes(got, want) {
		t.Errorf("spring forward: %v, want %v", got, want)
	}
	// A slot outside the skipped hour is not moved, and 03:30 still runs.
	s = sched(t, engine.Schedule{Cron: "30 1,3 * * *", TZ: "America/New_York"})
	want = []time.Time{time.Date(2026, 3, 8, 1, 30, 0, 0, ny), time.Date(2026, 3, 8, 3, 30, 0, 0, ny)}
	if got := s.Next(time.Date(2026, 3, 8, 0, 0, 0, 0, ny), 2); !slicesEqualTimes(got, want) {
		t.Errorf("around the skipped hour: %v, want %v", got, want)
	}
	// Fall back, 2026-11-01: 01:30 is shown twice (EDT, then EST); it runs once.
	s = sched(t, engine.Schedule{Cron: "30 1 * * *", TZ: "America/New_York"})
	from = time.Date(2026, 10, 31, 12, 0, 0, 0, ny)
	first := time.Date(2026, 11, 1, 5, 30, 0, 0, time.UTC) // 01:30 EDT
	want = []time.Time{first, time.Date(2026, 11, 2, 6, 30, 0, 0, time.UTC)}
	if got := s.Next(from, 2); !slicesEqualTimes(got, want) {
		t.Errorf("fall back: %v, want %v", got, want)
	}
	if slots, n := s.SlotsBetween(first, first.Add(3*time.Hour), 10); n != 0 {
		t.Errorf("the repeated 01:30 is a slot again: %v", slots)
	}
	// Without a zone, UTC.
	s = sched(t, engine.Schedule{Cron: "0 9 * * 1"})
	if got := s.Next(created, 1); !slicesEqualTimes(got, []time.Time{time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)}) {
		t.Errorf("monday 09:00 UTC: %v", got)
	}
}

func TestOccurrenceSpecCarriesKeyAndSlot(t *testing.T) {
	s := sched(t, engine.Schedule{Every: "1h"})
	slot := created.Add(time.Hour)
	raw, err := s.OccurrenceSpec(slot)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := engine.ParseSpec(raw)
	if err != nil {
		t.Fatal(err)
	}
	if spec.IdempotencyKey != "schedule/nightly/2026-12-01T11:00:00Z" || spec.Occurrence == nil ||
		spec.Occurrence.Schedule != "nightly" || !spec.Occurrence.Slot.Equal(slot) || spec.Command != "echo tick" {
		t.Errorf("occurrence spec: %+v", spec)
	}
}

func TestDecideScheduleCatchUp(t *testing.T) {
	now := created.Add(10*time.Minute + 5*time.Second) // slots at every minute are due
	for _, c := range []struct {
		catchUp string
		now     time.Time
		want    int
		skipped int
	}{
		{engine.CatchUpLatest, now, 1, 9},
		{engine.CatchUpAll, now, 10, 0},
		{engine.CatchUpNone, now, 1, 9},
		{engine.CatchUpNone, now.Add(time.Minute - 10*time.Second), 0, 10},
	} {
		s := sched(t, engine.Schedule{Every: "1m", CatchUp: c.catchUp})
		d := engine.DecideSchedule(s, c.now, engine.Previous{})
		if len(d.Register) != c.want || d.Skipped != c.skipped || !d.Next.After.Equal(created.Add(10*time.Minute)) {
			t.Errorf("%s at %s: register %v skipped %d after %s", c.catchUp, c.now, d.Register, d.Skipped, d.Next.After)
		}
	}
	s := sched(t, engine.Schedule{Every: "1m"})
	if d := engine.DecideSchedule(s, created.Add(59*time.Second), engine.Previous{}); d.Changed(s) {
		t.Errorf("nothing due, yet %+v", d)
	}
	s.Paused = true
	if d := engine.DecideSchedule(s, now, engine.Previous{}); d.Changed(s) {
		t.Errorf("paused, yet %+v", d)
	}
}

func TestDecideScheduleOverlap(t *testing.T) {
	now := created.Add(time.Minute)
	running := engine.Previous{ID: "prev", Active: true}
	for _, c := range []struct {
		overlap  string
		register int
		cancel   string
		buffered bool
	}{
		{engine.OverlapSkip, 0, "", false},
		{engine.OverlapAllow, 1, "", false},
		{engine.OverlapCancelPrevious, 1, "prev", false},
		{engine.OverlapBufferOne, 0, "", true},
	} {
		s := sched(t, engine.Schedule{Every: "1m", Overlap: c.overlap})
		d := engine.DecideSchedule(s, now, running)
		if len(d.Register) != c.register || d.Cancel != c.cancel || (d.Next.Buffered != nil) != c.buffered || !d.Next.After.Equal(now) {
			t.Errorf("%s: %+v", c.overlap, d)
		}
		if c.register == 0 && !d.Changed(s) {
			t.Errorf("%s: a skipped slot must still move after", c.overlap)
		}
		if !c.buffered {
			continue
		}
		// The buffered slot waits while the previous runs, then runs once.
		next := d.Next
		if again := engine.DecideSchedule(next, now.Add(time.Second), running); again.Changed(next) {
			t.Errorf("buffered slot registered while the previous runs: %+v", again)
		}
		done := engine.DecideSchedule(next, now.Add(time.Second), engine.Previous{ID: "prev"})
		if len(done.Register) != 1 || !done.Register[0].Equal(now) || done.Next.Buffered != nil {
			t.Errorf("buffered slot once the previous ended: %+v", done)
		}
	}
}

func slicesEqualTimes(a, b []time.Time) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].Equal(b[i]) {
			return false
		}
	}
	return true
}
