package events_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/events/eventstest"
	"github.com/bgtask/bgtask/internal/testkit"
)

func TestSchedulesCreateGetListUpdateDelete(t *testing.T) {
	srv := eventstest.Run(t)
	ctx := context.Background()
	s, err := events.OpenSchedules(ctx, srv.JS, 1)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := s.Create(ctx, "nightly", []byte(`{"v":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(ctx, "nightly", []byte(`{"v":2}`)); !errors.Is(err, events.ErrScheduleExists) {
		t.Fatalf("second create: %v", err)
	}
	if _, err := s.Create(ctx, "no good", nil); err == nil {
		t.Fatal("a name with a space was stored")
	}
	next, err := s.Update(ctx, "nightly", []byte(`{"v":3}`), rev)
	if err != nil {
		t.Fatal(err)
	}
	// A change conditional on a revision read before another's fails.
	if _, err := s.Update(ctx, "nightly", []byte(`{"v":4}`), rev); !errors.Is(err, events.ErrScheduleChanged) {
		t.Fatalf("stale update: %v", err)
	}
	e, err := s.Get(ctx, "nightly")
	if err != nil || string(e.Value) != `{"v":3}` || e.Revision != next {
		t.Fatalf("get: %+v %v", e, err)
	}
	if _, err := s.Create(ctx, "hourly", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	list, err := s.List(ctx)
	if err != nil || len(list) != 2 {
		t.Fatalf("list: %+v %v", list, err)
	}
	if err := s.Delete(ctx, "nightly"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "nightly"); !errors.Is(err, events.ErrNoSchedule) {
		t.Fatalf("get after delete: %v", err)
	}
	if err := s.Delete(ctx, "nightly"); !errors.Is(err, events.ErrNoSchedule) {
		t.Fatalf("second delete: %v", err)
	}
	if _, err := s.Update(ctx, "nightly", []byte(`{}`), next); !errors.Is(err, events.ErrNoSchedule) {
		t.Fatalf("update after delete: %v", err)
	}
	if _, err := s.Create(ctx, "nightly", []byte(`{"v":5}`)); err != nil {
		t.Fatalf("create after delete: %v", err)
	}
}

func TestSchedulesWatchHearsChanges(t *testing.T) {
	srv := eventstest.Run(t)
	ctx, cancel := context.WithCancel(context.Background())
	s, err := events.OpenSchedules(ctx, srv.JS, 1)
	if err != nil {
		t.Fatal(err)
	}
	changed := make(chan struct{}, 10)
	done := make(chan error, 1)
	go func() { done <- s.Watch(ctx, func() { changed <- struct{}{} }) }()
	// The watch may start after the first create: create until one is heard.
	testkit.Eventually(t, 10*time.Second, "a change heard", func() bool {
		_, _ = s.Create(ctx, "w"+time.Now().Format("150405.000000")[7:], []byte(`{}`))
		select {
		case <-changed:
			return true
		case <-time.After(100 * time.Millisecond):
			return false
		}
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
