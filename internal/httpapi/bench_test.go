package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/events"
)

// The cost of the HTTP API against the NATS API for the same calls, and of an
// event's way to an SSE client against a JetStream consumer of its own, in one
// run: go test -run '^$' -bench . -benchtime 2000x ./internal/httpapi/
// Each reports the median of its calls (p50-µs) beside Go's mean (ns/op). Both
// clients decode the replies; the HTTP API's NATS connection, like the NATS
// client's, is over loopback TCP (a server's own is in-process).

// median reports the median of the durations of fn's calls.
func median(b *testing.B, fn func()) {
	var took []time.Duration
	for b.Loop() {
		t0 := time.Now()
		fn()
		took = append(took, time.Since(t0))
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Nanoseconds())/1e3, "p50-µs")
}

// call is one request with the token, its reply decoded into out as the NATS
// API's client decodes its own.
func (h *harness) call(b *testing.B, method, path, body string, status int, out any) {
	req, _ := http.NewRequest(method, h.url+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	err = json.NewDecoder(resp.Body).Decode(out)
	resp.Body.Close()
	if err != nil {
		b.Fatal(err)
	}
	if resp.StatusCode != status {
		b.Fatalf("%s %s: %d", method, path, resp.StatusCode)
	}
}

// A timer due in an hour: registered, it stays armed, and no worker is needed.
const benchSpec = `{"start_at":"1h","prompt":"bench"}`

func BenchmarkRegister(b *testing.B) {
	h := start(b)
	c := api.NewClient(h.nats.Conn)
	ctx := context.Background()
	b.Run("http", func(b *testing.B) {
		median(b, func() { h.call(b, "POST", "/v1/tasks", benchSpec, 201, &api.Registered{}) })
	})
	b.Run("nats", func(b *testing.B) {
		median(b, func() {
			if _, err := c.Register(ctx, []byte(benchSpec)); err != nil {
				b.Fatal(err)
			}
		})
	})
}

func BenchmarkList(b *testing.B) {
	h := start(b)
	c := api.NewClient(h.nats.Conn)
	ctx := context.Background()
	for range 100 {
		if _, err := c.Register(ctx, []byte(benchSpec)); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("http", func(b *testing.B) {
		median(b, func() { h.call(b, "GET", "/v1/tasks?limit=50", "", 200, &api.ListReply{}) })
	})
	b.Run("nats", func(b *testing.B) {
		median(b, func() {
			if _, err := c.ListPage(ctx, api.ListRequest{ListQuery: engine.ListQuery{Limit: 50}}); err != nil {
				b.Fatal(err)
			}
		})
	})
}

// storeFollower appends events to a test server's store and times their arrival
// at a JetStream ordered consumer (Follow), the baseline of the SSE benchmarks.
type storeFollower struct {
	b        *testing.B
	ctx      context.Context
	store    *events.JetStreamStore
	followed chan string
	stop     func()
}

// followStore follows h's event stream from its end until stop.
func followStore(b *testing.B, ctx context.Context, h *harness) *storeFollower {
	ctx, cancel := context.WithCancel(ctx)
	store, err := events.ConnectStore(ctx, h.nats.JS)
	if err != nil {
		cancel()
		b.Fatal(err)
	}
	last, _ := store.LastSeq(ctx)
	f := &storeFollower{b: b, ctx: ctx, store: store, followed: make(chan string, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = store.Follow(ctx, "", last, func(rec events.Record, _ error) bool {
			f.followed <- rec.TaskID
			return true
		})
	}()
	f.stop = func() { cancel(); <-done }
	return f
}

// appendOne appends an event of a new task and returns the task, when the append
// began, and how long the event took to reach the follower.
func (f *storeFollower) appendOne() (id string, t0 time.Time, followed time.Duration) {
	id = uuid.NewString()
	ev, err := events.New(id, "bench", 0, time.Now(), &events.Cancelled{Reason: "bench"})
	if err != nil {
		f.b.Fatal(err)
	}
	t0 = time.Now()
	if _, err := f.store.Append(f.ctx, ev, 0); err != nil {
		f.b.Fatal(err)
	}
	for got := ""; got != id; got = <-f.followed {
	}
	return id, t0, time.Since(t0)
}

// BenchmarkEventDelivery appends an event and times its arrival at an SSE client
// of /v1/events and at a JetStream ordered consumer (Follow) opened beside it.
func BenchmarkEventDelivery(b *testing.B) {
	h := start(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := followStore(b, ctx, h)
	defer f.stop()
	sse := h.open("/v1/events")
	var viaSSE, viaFollow []time.Duration
	for b.Loop() {
		id, t0, followed := f.appendOne()
		viaFollow = append(viaFollow, followed)
		for {
			_, rec := sse.record()
			if rec.TaskID == id {
				break
			}
		}
		viaSSE = append(viaSSE, time.Since(t0))
	}
	for name, took := range map[string][]time.Duration{"sse": viaSSE, "follow": viaFollow} {
		slices.Sort(took)
		b.ReportMetric(float64(took[len(took)/2].Nanoseconds())/1e3, fmt.Sprintf("%s-p50-µs", name))
	}
}
