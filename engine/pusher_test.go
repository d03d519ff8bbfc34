package engine_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/sinks"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/projections"
)

// receiver is a webhook endpoint that fails each task's first failFirst requests
// and counts every request by task and attempt.
type receiver struct {
	mu        sync.Mutex
	failFirst int
	requests  map[string][]string // task id -> attempt headers, in arrival order
	accepted  map[string]int
}

func newReceiver(t *testing.T, failFirst int) (*receiver, string) {
	r := &receiver{failFirst: failFirst, requests: map[string][]string{}, accepted: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.Copy(io.Discard, req.Body)
		id := req.Header.Get(sinks.IdempotencyHeader)
		r.mu.Lock()
		r.requests[id] = append(r.requests[id], req.Header.Get(sinks.AttemptHeader))
		ok := len(r.requests[id]) > r.failFirst
		if ok {
			r.accepted[id]++
		}
		r.mu.Unlock()
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(srv.Close)
	return r, srv.URL
}

func (r *receiver) snapshot() (map[string][]string, map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	requests, accepted := map[string][]string{}, map[string]int{}
	for id, a := range r.requests {
		requests[id] = append([]string(nil), a...)
	}
	for id, n := range r.accepted {
		accepted[id] = n
	}
	return requests, accepted
}

// replica is one engine's projector and pusher over a shared store.
func startReplica(t *testing.T, store *events.JetStreamStore, me engine.Engine) {
	t.Helper()
	var pusher *engine.Pusher
	proj := projections.New(store, func(s engine.State) { pusher.Notify(s) }, engine.Base{})
	pusher = engine.NewPusher(store, proj, sinks.New([]byte("a test secret of enough bytes")), me, 20*time.Millisecond, engine.Base{})
	if err := proj.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	all, _ := proj.List(engine.ListQuery{})
	pusher.Recover(all)
	pusher.Start()
	t.Cleanup(func() {
		proj.Stop()
		pusher.Stop()
	})
}

// fireInStore appends the life of a task that ran and fired, as the engine and a
// worker would.
func fireInStore(t *testing.T, store events.Store, id, spec string) {
	t.Helper()
	s := engine.State{ID: id}
	for _, step := range []struct {
		writer string
		c      engine.Command
	}{
		{engineWriter, engine.Arm{Spec: mustSpec(t, spec)}},
		{workerA, engine.Spawn{Host: "h"}},
		{workerA, engine.Exit{Run: exitRun(0, "")}},
		{engineWriter, engine.PersistCompletion{}},
		{engineWriter, engine.Fire{InboxSeq: 1}},
	} {
		ev, err := engine.Decide(s, step.c, engine.Meta{Writer: step.writer, Now: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		seq, err := store.Append(context.Background(), ev, s.Seq)
		if err != nil {
			t.Fatal(err)
		}
		if s, err = engine.Apply(s, events.Record{Seq: seq, Event: ev}); err != nil {
			t.Fatal(err)
		}
	}
}

// Two engine replicas push the same fired tasks: each attempt is made by one of
// them only, failed attempts are retried, and every task is accepted exactly once.
func TestReplicasPushEachAttemptOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rcv, url := newReceiver(t, 1)
	const tasks = 20
	for i := range tasks {
		fireInStore(t, b.store, fmt.Sprintf("task-%02d", i), `{"command":"true","target":"t`+fmt.Sprint(i%3)+`","policy":"immediate","deliver":[{"type":"webhook","url":"`+url+`"}]}`)
	}
	startReplica(t, b.store, engine.Engine{Writer: "engine-a", Instance: "a"})
	startReplica(t, b.store, engine.Engine{Writer: "engine-b", Instance: "b"})

	deadline := time.Now().Add(60 * time.Second)
	for {
		_, accepted := rcv.snapshot()
		if len(accepted) == tasks {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("accepted %d of %d tasks", len(accepted), tasks)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i := range tasks {
		id := fmt.Sprintf("task-%02d", i)
		s := waitDelivered(t, b.store, id)
		requests, accepted := rcv.snapshot()
		if got := requests[id]; accepted[id] != 1 || len(got) != 2 || got[0] != "1" || got[1] != "2" {
			t.Fatalf("task %s: requests %v (attempt headers), accepted %d; want attempts 1 then 2, one accepted", id, got, accepted[id])
		}
		if k := s.Deliveries[0]; k.Attempts != 2 || !k.Delivered {
			t.Fatalf("task %s: sink %+v", id, k)
		}
	}
}

// waitDelivered waits until the log says task id's sinks are done.
func waitDelivered(t *testing.T, store events.Store, id string) engine.State {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		s, err := engine.Load(context.Background(), store, id)
		if err != nil {
			t.Fatal(err)
		}
		if s.Acknowledged() {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s not delivered: %+v", id, s.Deliveries)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
