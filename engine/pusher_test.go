package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
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

// startReplica starts one engine's projector and pusher over a shared store;
// setup is done to the pusher before it starts.
func startReplica(t *testing.T, store *events.JetStreamStore, me engine.Engine, setup ...func(*engine.Pusher)) {
	t.Helper()
	var pusher *engine.Pusher
	proj := projections.New(store, func(s engine.State, _ events.Record) { pusher.Notify(s) }, engine.Base{})
	pusher = engine.NewPusher(store, proj, sinks.New([]byte("a test secret of enough bytes")), me, 20*time.Millisecond, engine.Base{})
	for _, f := range setup {
		f(pusher)
	}
	if err := proj.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	all, _ := proj.List(engine.ListQuery{})
	pusher.Recover(all)
	if err := pusher.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
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

	testkit.Eventually(t, 60*time.Second, fmt.Sprintf("every one of %d tasks accepted", tasks), func() bool {
		_, accepted := rcv.snapshot()
		return len(accepted) == tasks
	})
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
	var s engine.State
	testkit.Eventually(t, 30*time.Second, "task "+id+" delivered", func() bool {
		var err error
		if s, err = engine.Load(context.Background(), store, id); err != nil {
			t.Fatal(err)
		}
		return s.Acknowledged()
	})
	return s
}

// On an idle target, queue pushes each wake-up at once, while an earlier push is
// still running; defer_idle waits until the earlier wake-up is delivered. The sink
// is a real program that runs until the test releases it.
func TestQueuePushesAtOnceAndDeferIdleWaitsForTheEarlierPush(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{engine.PolicyQueue, engine.PolicyDeferIdle} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			dir := t.TempDir()
			const script = `echo "$BGTASK_TASK_ID start" >>"$1/log"
while [ ! -e "$1/release-$BGTASK_TASK_ID" ]; do sleep 0.02; done
echo "$BGTASK_TASK_ID end" >>"$1/log"`
			argv, err := json.Marshal([]string{"sh", "-c", script, "sh", dir})
			if err != nil {
				t.Fatal(err)
			}
			spec := `{"command":"true","target":"agent","policy":"` + policy + `","deliver":[{"type":"exec","argv":` + string(argv) + `}]}`
			fireInStore(t, b.store, "first", spec)
			fireInStore(t, b.store, "second", spec)
			var pusher *engine.Pusher
			startReplica(t, b.store, engine.Engine{Writer: "engine-a", Instance: "a"}, func(p *engine.Pusher) {
				pusher = p
				p.TestSignals.Planned.Init(t)
			})

			lines := func() []string {
				data, err := os.ReadFile(filepath.Join(dir, "log"))
				if err != nil && !errors.Is(err, fs.ErrNotExist) {
					t.Fatal(err)
				}
				return strings.Fields(strings.ReplaceAll(string(data), " ", "-"))
			}
			waitLog := func(line string) {
				t.Helper()
				testkit.Eventually(t, 20*time.Second, fmt.Sprintf("%q in the sinks' log", line), func() bool { return slices.Contains(lines(), line) })
			}
			release := func(id string) {
				if err := os.WriteFile(filepath.Join(dir, "release-"+id), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}

			waitLog("first-start")
			if policy == engine.PolicyQueue {
				waitLog("second-start") // the first push is still running
				release("first")
				release("second")
			} else {
				// Once the pusher sees the first push in flight, it plans to start
				// nothing: a second push started with the first shows in that plan,
				// or in one before it.
				startsSecond := func(p engine.Plan) bool {
					return slices.ContainsFunc(p.Start, func(push engine.Push) bool { return push.TaskID == "second" })
				}
				plan := pusher.TestSignals.Planned.WaitFor(20*time.Second, "a plan with the first push in flight", func(p engine.Plan) bool {
					return len(p.Start) == 0 || startsSecond(p)
				})
				if startsSecond(plan) || !slices.Contains(plan.Held, "second") {
					t.Fatalf("defer_idle: the plan while the first push ran is %+v, want the second held", plan)
				}
				if s, err := engine.Load(context.Background(), b.store, "second"); err != nil || s.Deliveries[0].Attempts != 0 {
					t.Fatalf("defer_idle: the second push started while the first was running: %+v %v", s.Deliveries, err)
				}
				release("first")
				waitLog("second-start")
				release("second")
			}
			waitDelivered(t, b.store, "first")
			waitDelivered(t, b.store, "second")
			got := lines()
			want := []string{"first-start", "second-start", "first-end", "second-end"}
			if policy == engine.PolicyDeferIdle {
				want = []string{"first-start", "first-end", "second-start", "second-end"}
			}
			if policy == engine.PolicyQueue && len(got) == 4 {
				// Two pushes at once: they start, and end, in either order.
				slices.Sort(got[:2])
				slices.Sort(got[2:])
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%s: the sinks' log is %q, want %q", policy, got, want)
			}
		})
	}
}
