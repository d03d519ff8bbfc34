package client_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/client/clienttest"
	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/internal/testkit"
)

// hookReceiver is a webhook endpoint that answers 503 until it is up, asking
// for the next attempt in 5 minutes (Retry-After), and keeps the
// Idempotency-Key of each request it accepted.
type hookReceiver struct {
	mu       sync.Mutex
	up       bool
	refused  int
	accepted []string
}

func newHookReceiver(t *testing.T) (*hookReceiver, string) {
	r := &hookReceiver{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if !r.up {
			r.refused++
			w.Header().Set("Retry-After", "300")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		r.accepted = append(r.accepted, req.Header.Get("Idempotency-Key"))
	}))
	t.Cleanup(srv.Close)
	return r, srv.URL
}

func (r *hookReceiver) counts() (refused int, accepted []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.refused, append([]string(nil), r.accepted...)
}

func (r *hookReceiver) setUp() {
	r.mu.Lock()
	r.up = true
	r.mu.Unlock()
}

// waitDelivery waits until the task's pushes are, as a whole, in state want.
func waitDelivery(t *testing.T, c *client.Client, id, want string) client.Task {
	t.Helper()
	var task client.Task
	testkit.Eventually(t, 30*time.Second, "task "+id+" delivery "+want, func() bool {
		var err error
		if task, err = c.Get(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		return task.Delivery == want
	})
	return task
}

// A push that gave up (max_attempts 1 against a receiver that answers 503) is
// sent again by Redeliver, named by a start of its id: the receiver, up now, gets
// it once, with the task id as its Idempotency-Key. A push that was delivered is
// sent again when asked for by its sink, once more.
func TestRedeliverSendsAPushThatGaveUpOnce(t *testing.T) {
	dir := t.TempDir()
	clienttest.Run(t, dir)
	c := connect(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rcv, url := newHookReceiver(t)

	reg, err := c.Register(ctx, client.Spec{StartAt: "100ms", Prompt: "redeliver me", Target: "redeliver",
		Deliver: []engine.Sink{{Type: engine.SinkWebhook, URL: url, MaxAttempts: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	gaveUp := waitDelivery(t, c, reg.ID, engine.DeliveryFailed)
	if k := gaveUp.Deliveries[0]; !k.Failed || k.Attempts != 1 {
		t.Fatalf("the push before the redelivery: %+v", k)
	}
	rcv.setUp()
	task, err := c.Redeliver(ctx, client.RedeliverRequest{ID: reg.ID[:8]})
	if err != nil {
		t.Fatal(err)
	}
	if k := task.Deliveries[0]; task.ID != reg.ID || !k.Redelivering || k.Failed || task.Delivery != engine.DeliveryPending {
		t.Fatalf("the reply: %s, sink %+v, delivery %q", task.ID, k, task.Delivery)
	}
	delivered := waitDelivery(t, c, reg.ID, engine.DeliveryDelivered)
	if refused, accepted := rcv.counts(); refused != 1 || len(accepted) != 1 || accepted[0] != reg.ID {
		t.Fatalf("the receiver refused %d and accepted %q, want 1 and one request with key %s", refused, accepted, reg.ID)
	}
	if k := delivered.Deliveries[0]; k.Attempts != 2 || k.Redeliveries != 1 || k.Redelivering {
		t.Fatalf("after the redelivery: %+v", k)
	}

	sink := 0
	if _, err := c.Redeliver(ctx, client.RedeliverRequest{ID: reg.ID, Sink: &sink}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "a second request accepted", func() bool {
		_, accepted := rcv.counts()
		return len(accepted) == 2
	})
	waitDelivery(t, c, reg.ID, engine.DeliveryDelivered)
	if _, accepted := rcv.counts(); len(accepted) != 2 || accepted[1] != reg.ID {
		t.Fatalf("the receiver accepted %q, want two requests with key %s", accepted, reg.ID)
	}
}

// Redeliver of what has no push to make again is an error that names the field
// at fault and says why, and appends nothing.
func TestRedeliverRefusesWhatHasNoPushToMakeAgain(t *testing.T) {
	dir := t.TempDir()
	clienttest.Run(t, dir)
	c := connect(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, url := newHookReceiver(t) // down: every push is retried
	hook := []engine.Sink{{Type: engine.SinkWebhook, URL: url}}
	register := func(spec client.Spec) string {
		t.Helper()
		reg, err := c.Register(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		return reg.ID
	}
	noSink := register(client.Spec{StartAt: "100ms", Prompt: "no push"})
	if _, err := c.Wait(ctx, noSink); err != nil {
		t.Fatal(err)
	}
	notFired := register(client.Spec{StartAt: "1h", Prompt: "later", Deliver: hook})
	if _, err := c.SetTarget(ctx, "held", client.TargetBusy, 0); err != nil {
		t.Fatal(err)
	}
	held := register(client.Spec{StartAt: "100ms", Prompt: "held", Target: "held", Deliver: hook})
	if _, err := c.Wait(ctx, held); err != nil {
		t.Fatal(err)
	}
	retrying := register(client.Spec{StartAt: "100ms", Prompt: "retried", Deliver: hook})
	testkit.Eventually(t, 30*time.Second, "a failed attempt", func() bool {
		task, err := c.Get(ctx, retrying)
		return err == nil && len(task.Deliveries) == 1 && task.Deliveries[0].RetryAt != nil
	})

	one, minus := 1, -1
	for _, tc := range []struct {
		name  string
		req   client.RedeliverRequest
		code  int
		field string
		says  string
	}{
		{"no push sink", client.RedeliverRequest{ID: noSink}, 409, "id", "has no push sink (deliver)"},
		{"not fired", client.RedeliverRequest{ID: notFired}, 409, "id", "is armed: its pushes are made once it fires"},
		{"held for its target", client.RedeliverRequest{ID: held}, 409, "id", "push 0 is not made yet"},
		{"retried", client.RedeliverRequest{ID: retrying}, 409, "id", "push 0 is retried, next at"},
		{"retried, by its sink", client.RedeliverRequest{ID: retrying, Sink: new(int)}, 409, "sink", "push 0 is retried"},
		{"no such sink", client.RedeliverRequest{ID: retrying, Sink: &one}, 400, "sink", "1: task " + retrying + " has push sinks 0 to 0"},
		{"a negative sink", client.RedeliverRequest{ID: retrying, Sink: &minus}, 400, "sink", "-1: task"},
		{"no such task", client.RedeliverRequest{ID: "01a00000-0000-7000-8000-000000000000"}, 404, "id", "no such task"},
		{"too short an id", client.RedeliverRequest{ID: "01a"}, 400, "id", "too short"},
	} {
		before := -1
		if len(tc.req.ID) == 36 && tc.code != 404 {
			h, err := c.History(ctx, tc.req.ID)
			if err != nil {
				t.Fatal(err)
			}
			before = len(h.Events)
		}
		_, err := c.Redeliver(ctx, tc.req)
		var apiErr *client.Error
		if !errors.As(err, &apiErr) || apiErr.Code != tc.code || apiErr.Field != tc.field || !strings.Contains(apiErr.Message, tc.says) {
			t.Errorf("%s: %v, want a %d naming %s that says %q", tc.name, err, tc.code, tc.field, tc.says)
			continue
		}
		if before >= 0 {
			h, err := c.History(ctx, tc.req.ID)
			if err != nil || len(h.Events) != before {
				t.Errorf("%s: %d events after the refusal, %d before (%v)", tc.name, len(h.Events), before, err)
			}
		}
	}
}
