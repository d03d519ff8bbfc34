package events_test

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/events/eventstest"
	"github.com/bgtask/bgtask/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// awaitForgotten waits until the server no longer answers a publish of a message
// with id msgID, made under condition, as a duplicate: the stream's dedupe
// window has passed for it. The probe goes to subject, and condition must fail
// for it, so that it is never stored: inside the window it is acknowledged as a
// duplicate; after, it is refused.
func awaitForgotten(t *testing.T, js jetstream.JetStream, subject, msgID string, condition jetstream.PublishOpt) {
	t.Helper()
	testkit.Eventually(t, 30*time.Second, "message "+msgID+" out of the dedupe window", func() bool {
		ack, err := js.PublishMsg(context.Background(), &nats.Msg{Subject: subject}, jetstream.WithMsgID(msgID), condition)
		var apiErr *jetstream.APIError
		switch {
		case err == nil && ack.Duplicate:
			return false
		case errors.As(err, &apiErr):
			return true
		}
		t.Fatalf("probe of message %s: %+v, %v; want a duplicate or a refusal", msgID, ack, err)
		return false
	})
}

func openStore(t *testing.T) (*events.JetStreamStore, *eventstest.Server) {
	t.Helper()
	srv := eventstest.Run(t)
	store, err := events.OpenStore(context.Background(), srv.JS, events.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return store, srv
}

func mustEvent(t *testing.T, task string, p events.Payload) events.Event {
	t.Helper()
	ev, err := events.New(task, "test", 0, time.Now(), p)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func TestHistoryIsInOrderAndPerTask(t *testing.T) {
	t.Parallel()
	store, _ := openStore(t)
	ctx := context.Background()
	var seq uint64
	var err error
	want := []events.Type{events.TypeArmed}
	if seq, err = store.Append(ctx, mustEvent(t, "a", &events.Armed{Spec: []byte(`{}`)}), 0); err != nil {
		t.Fatal(err)
	}
	var other uint64
	for i := range 300 {
		if other, err = store.Append(ctx, mustEvent(t, "b", &events.Tick{}), other); err != nil {
			t.Fatal(err)
		}
		if i%100 == 0 {
			if seq, err = store.Append(ctx, mustEvent(t, "a", &events.Tick{OutputBytes: int64(i)}), seq); err != nil {
				t.Fatal(err)
			}
			want = append(want, events.TypeTick)
		}
	}
	hist, err := store.History(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != len(want) {
		t.Fatalf("history has %d events, want %d", len(hist), len(want))
	}
	for i, rec := range hist {
		if rec.Type != want[i] || rec.TaskID != "a" {
			t.Fatalf("event %d = %s of %s", i, rec.Type, rec.TaskID)
		}
		if i > 0 && rec.Seq <= hist[i-1].Seq {
			t.Fatalf("history out of order at %d", i)
		}
	}
	bHist, err := store.History(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	if len(bHist) != 300 {
		t.Fatalf("task b has %d events, want 300", len(bHist))
	}
	if _, err := store.History(ctx, "nope"); !errors.Is(err, events.ErrNotFound) {
		t.Fatalf("unknown task: got %v, want ErrNotFound", err)
	}

	// Known to have its events, or fewer (a count gone stale), or more: the same
	// history.
	for _, n := range []int{len(want), 2, len(want) + 5} {
		got, err := store.HistoryOf(ctx, "a", n)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, hist) {
			t.Fatalf("history of a task said to have %d events = %d events, want the %d of History", n, len(got), len(hist))
		}
	}
}

func TestFollowReportsUndecodableEventsAndGoesOn(t *testing.T) {
	t.Parallel()
	store, srv := openStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := srv.JS.Publish(ctx, events.TaskSubject("x", events.TypeTick), []byte("not json")); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Append(ctx, mustEvent(t, "y", &events.Armed{Spec: []byte(`{}`)}), 0); err != nil {
		t.Fatal(err)
	}
	var bad, good int
	err := store.Follow(ctx, "", 0, func(rec events.Record, err error) bool {
		if err != nil {
			bad++
		} else {
			good++
		}
		return good < 1
	})
	if err != nil {
		t.Fatal(err)
	}
	if bad != 1 || good != 1 {
		t.Fatalf("bad=%d good=%d, want 1 and 1", bad, good)
	}
}

func TestInboxDeliversOnceAcrossARecheck(t *testing.T) {
	t.Parallel()
	srv := eventstest.Run(t)
	ctx := context.Background()
	const window = 100 * time.Millisecond
	inbox, err := events.OpenInbox(ctx, srv.JS, events.InboxConfig{Duplicates: window})
	if err != nil {
		t.Fatal(err)
	}
	w := events.Wakeup{ID: "task-1", Status: "succeeded", Target: "default"}
	persisted := time.Now()
	// Nothing there yet: the recheck finds nothing and publishes.
	seq, err := inbox.Deliver(ctx, w, persisted)
	if err != nil {
		t.Fatal(err)
	}
	// A second attempt, as after a crash before fired was written, finds the first
	// even when JetStream's dedupe window has passed (as after a long outage).
	// (A single server checks the last message expected after the dedupe, and no
	// message has this id.)
	awaitForgotten(t, srv.JS, events.InboxSubject(w.Target), w.ID, jetstream.WithExpectLastMsgID("no message's id"))
	again, err := inbox.Deliver(ctx, w, persisted)
	if err != nil {
		t.Fatal(err)
	}
	if again != seq {
		t.Fatalf("redelivery seq = %d, want %d", again, seq)
	}
	stream, err := srv.JS.Stream(ctx, events.InboxStreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Fatalf("inbox has %d messages, want 1", info.State.Msgs)
	}
}
