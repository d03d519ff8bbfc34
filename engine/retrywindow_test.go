package engine_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/sinks"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/testkit"
	"github.com/bgtask/bgtask/projections"
)

func TestRetryForIsValidated(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ retryFor, reason string }{
		{`"8d"`, "not a duration"},
		{`"169h"`, "over the limit of 168h0m0s (7 days)"},
		{`"-1h"`, "shorter than"},
	} {
		spec := `{"command":"x","deliver":[{"type":"exec","argv":["a"],"retry_for":` + tc.retryFor + `}]}`
		_, err := engine.ParseSpec([]byte(spec))
		var fe *engine.FieldError
		if !errors.As(err, &fe) || !strings.HasPrefix(fe.Field, "deliver[0].retry_for") || !strings.Contains(fe.Reason, tc.reason) {
			t.Errorf("retry_for %s: %v, want deliver[0].retry_for: ...%s...", tc.retryFor, err, tc.reason)
		}
	}
	if got := mustSpec(t, `{"command":"x","deliver":[{"type":"exec","argv":["a"],"retry_for":"168h"}]}`).Deliver[0].RetryWindow(); got != engine.MaxRetryFor {
		t.Fatalf("retry_for 168h: a window of %s", got)
	}
}

// failUntilGivenUp fails sink 0's attempts, each backoff after the one before, and
// returns the times the attempts were claimed at.
func failUntilGivenUp(t *testing.T, f *fold, backoff time.Duration) []time.Time {
	t.Helper()
	var claims []time.Time
	for len(claims) < 1000 {
		f.do(engineWriter, engine.ClaimDelivery{Sink: 0, Engine: me})
		claims = append(claims, f.now)
		f.do(engineWriter, engine.RecordDelivery{Sink: 0, Outcome: engine.SinkOutcome{Error: "connection refused"}, Backoff: backoff})
		k := f.state.Deliveries[0]
		if k.GivingUp {
			return claims
		}
		if k.RetryAt == nil || k.RetryAt.After(f.now.Add(backoff)) {
			t.Fatalf("after attempt %d: retry at %v, want at most %s later", k.Attempts, k.RetryAt, backoff)
		}
		f.now = k.RetryAt.Add(-time.Second) // the next do is at the retry's time
	}
	t.Fatal("the sink never gave up")
	return nil
}

// A failed push is retried for its sink's retry_for after its first attempt,
// however many attempts that takes; the attempt the window's end comes before is
// made at that end, and the one that fails after it is the last. max_attempts,
// if set, bounds it too.
func TestAPushIsRetriedForItsWindow(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, sink string
		window     time.Duration
		attempts   int
	}{
		// Attempts 5m1s apart (a second to make each): the 289th at the 24 hours.
		{"default window", `"max_attempts":0`, 24 * time.Hour, 289},
		{"retry_for", `"retry_for":"1h"`, time.Hour, 13},
		{"max_attempts first", `"retry_for":"1h","max_attempts":3`, time.Hour, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := fired(t, taskID, `{"command":"make","target":"agent","deliver":[{"type":"webhook","url":"http://127.0.0.1:1/hook",`+tc.sink+`}]}`)
			claims := failUntilGivenUp(t, f, engine.MaxRetryWait)
			k := f.state.Deliveries[0]
			if len(claims) != tc.attempts || k.Attempts != tc.attempts || !k.FirstAttemptAt.Equal(claims[0]) {
				t.Fatalf("%d attempts (sink %+v), want %d", len(claims), k, tc.attempts)
			}
			if tc.attempts == 3 {
				return
			}
			end := claims[0].Add(tc.window)
			if last := claims[len(claims)-1]; !last.Equal(end) || !k.RetryUntil(f.spec.Deliver[0]).Equal(end) {
				t.Fatalf("the last attempt at %s, want at the window's end %s", last, end)
			}
			f.do(engineWriter, engine.GiveUpDelivery{Sink: 0})
			if again, _ := engine.Replay(f.history); !reflect.DeepEqual(again, f.state) {
				t.Fatalf("replay differs from the live state:\n%+v\n%+v", again.Deliveries, f.state.Deliveries)
			}
		})
	}
}

// A receiver that always fails gets the push until the sink's retry_for has
// passed since the first attempt, the last one at its end, then delivery-failed:
// a real engine's pusher, a real HTTP receiver.
func TestAPusherGivesUpWhenTheWindowEnds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	var keys []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get(sinks.IdempotencyHeader))
		mu.Unlock()
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	fireInStore(t, b.store, "window", `{"command":"true","deliver":[{"type":"webhook","url":"`+srv.URL+`","retry_for":"3s"}]}`)
	startReplica(t, b.store, engine.Engine{Writer: "engine-a", Instance: "a"})

	var s engine.State
	testkit.Eventually(t, 30*time.Second, "delivery-failed", func() bool {
		var err error
		s, err = engine.Load(context.Background(), b.store, "window")
		return err == nil && s.Deliveries[0].Failed
	})
	history, err := b.store.History(context.Background(), "window")
	if err != nil {
		t.Fatal(err)
	}
	var attempts []time.Time
	for _, rec := range history {
		if rec.Type == events.TypeDeliveryAttempt {
			attempts = append(attempts, rec.Time)
		}
	}
	end := s.Deliveries[0].RetryUntil(s.Spec.Deliver[0])
	if len(attempts) < 3 || !attempts[0].Equal(*s.Deliveries[0].FirstAttemptAt) || attempts[len(attempts)-1].Before(end) {
		t.Fatalf("attempts at %v, want the last at or after the window's end %s", attempts, end)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(keys) != len(attempts) {
		t.Fatalf("%d requests for %d attempts", len(keys), len(attempts))
	}
	for _, k := range keys {
		if k != "window" {
			t.Fatalf("Idempotency-Key %q, want the task id on every attempt", k)
		}
	}
}

// A push's retry window is counted from its first attempt as the history has
// it, not from when an engine started: an engine started two hours after a
// push's first failed attempt, with retry_for 1h, makes the one attempt that
// was due and gives up when it fails. A real pusher and receiver; the second
// engine's clock is two hours ahead.
func TestARetryWindowHoldsAcrossARestart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	requests := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		requests++
		mu.Unlock()
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	fireInStore(t, b.store, "restart", `{"command":"true","deliver":[{"type":"webhook","url":"`+srv.URL+`","retry_for":"1h"}]}`)
	ctx := context.Background()
	load := func() engine.State {
		s, err := engine.Load(ctx, b.store, "restart")
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	start := func(me engine.Engine, base engine.Base) (stop func()) {
		var pusher *engine.Pusher
		proj := projections.New(b.store, func(s engine.State, _ events.Record) { pusher.Notify(s) }, engine.Base{})
		// A retry base of an hour: each wait is the 5-minute cap.
		pusher = engine.NewPusher(b.store, proj, sinks.New([]byte("a test secret of enough bytes")), me, time.Hour, base)
		if err := proj.Start(ctx); err != nil {
			t.Fatal(err)
		}
		all, _ := proj.List(engine.ListQuery{})
		pusher.Recover(all)
		if err := pusher.Start(ctx); err != nil {
			t.Fatal(err)
		}
		return func() { proj.Stop(); pusher.Stop() }
	}

	stop := start(engine.Engine{Writer: "engine-a", Instance: "a"}, engine.Base{})
	testkit.Eventually(t, 30*time.Second, "the first attempt failed", func() bool { return load().Deliveries[0].RetryAt != nil })
	stop()
	later := func() time.Time { return time.Now().Add(2 * time.Hour) }
	stop = start(engine.Engine{Writer: "engine-a", Instance: "b"}, engine.Base{Now: later})
	t.Cleanup(stop)
	testkit.Eventually(t, 30*time.Second, "delivery-failed", func() bool { return load().Deliveries[0].Failed })
	mu.Lock()
	defer mu.Unlock()
	if k := load().Deliveries[0]; k.Attempts != 2 || requests != 2 {
		t.Fatalf("%d attempts, %d requests; want 2: the one before the restart and the one due after it", k.Attempts, requests)
	}
}
