package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/bgtask/bgtask/events"
)

// The cluster test: three NATS nodes with R3 streams, two engines and three
// workers with different labels run 300 tasks; the node leading the event stream
// and one engine are killed while tasks run. Every task fires exactly once, on a
// worker its placement allows, no worker runs more than its capacity, and the
// audit is clean.
func TestAClusterFiresEveryTaskOnceThroughTheLossOfALeaderAndAnEngine(t *testing.T) {
	if testing.Short() {
		t.Skip("300 tasks on a cluster: not with -short")
	}
	const tasks, maxTasks, killAfter = 300, 4, 60
	d := startDeployment(t, 3)
	engineArgs := []string{"server", "--no-worker", "--replicas", "3", "--client-user", "client", "--log-level", "warn"}
	engines := []*proc{d.start(t, "engine", engineArgs...), d.start(t, "engine", engineArgs...)}
	pools := []string{"a", "b", "c"}
	for _, pool := range pools {
		d.start(t, "worker", "worker", "--worker-id", "pool-"+pool, "--label", "pool="+pool,
			"--max-tasks", fmt.Sprint(maxTasks), "--tick", "500ms", "--log-level", "warn")
	}
	d.workersReady(t, len(pools))

	nc, js := d.connect(t, "engine")
	placedOn := map[string]string{} // task id → the pool it must run in, "" for any
	for i := range tasks {
		spec := map[string]any{
			"command":         fmt.Sprintf("sleep 0.%d; echo task %d", i%4, i),
			"kind":            fmt.Sprint("k", i%3),
			"idempotency_key": fmt.Sprintf("%s-%d", t.Name(), i),
		}
		pool := ""
		if i%4 != 3 {
			pool = pools[i%3]
			spec["placement"] = map[string]any{"labels": map[string]string{"pool": pool}}
		}
		placedOn[registerOn(t, nc, spec)] = pool
	}

	// Follow the fired events; kill the stream leader and an engine once some fired.
	store, err := events.ConnectStore(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	fired := map[string]int{}
	killed := false
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var after uint64
	for len(fired) < tasks {
		err := store.Follow(ctx, "", after, func(rec events.Record, err error) bool {
			after = rec.Seq
			if err != nil || rec.Type != events.TypeFired {
				return true
			}
			fired[rec.TaskID]++
			if len(fired) == killAfter && !killed {
				killed = true
				leader := d.cluster.StreamLeader("BGTASK", events.StreamName)
				if leader == nil {
					t.Error("no leader of the event stream to kill")
				} else {
					t.Logf("killing %s, the event stream's leader, and an engine after %d tasks fired", leader.Name(), killAfter)
					leader.Shutdown()
				}
				engines[0].signal(syscall.SIGKILL)
			}
			return len(fired) < tasks
		})
		if ctx.Err() != nil {
			for id := range placedOn {
				if fired[id] == 0 {
					var st struct {
						State, Worker, Waiting string
						LastEvent              string `json:"last_event"`
						Epoch                  int
					}
					r := d.run(t, "client", "show", id, "--json")
					_ = json.Unmarshal([]byte(r.stdout), &st)
					t.Logf("not fired: %s: %+v %s", id, st, r.stderr)
				}
			}
			t.Logf("workers: %s", d.run(t, "client", "workers", "--json").stdout)
			t.Fatalf("%d of %d tasks fired before the timeout: %v", len(fired), tasks, err)
		}
		if err != nil {
			t.Logf("following the log again after seq %d: %v", after, err) // its node went away
		}
	}
	if !killed {
		t.Fatal("the tasks ended before the leader could be killed")
	}

	// Exactly once, placement and capacity, from the whole log.
	open := map[string]int{}
	maxOpen := map[string]int{}
	spawnedBy := map[string]string{}
	count := map[string]map[events.Type]int{}
	for _, rec := range allEvents(t, js) {
		if count[rec.TaskID] == nil {
			count[rec.TaskID] = map[events.Type]int{}
		}
		count[rec.TaskID][rec.Type]++
		switch rec.Type {
		case events.TypeSpawned:
			spawnedBy[rec.TaskID] = rec.Writer
			open[rec.Writer]++
			maxOpen[rec.Writer] = max(maxOpen[rec.Writer], open[rec.Writer])
		case events.TypeExited, events.TypeFailed:
			open[spawnedBy[rec.TaskID]]--
		}
	}
	for id, pool := range placedOn {
		c := count[id]
		if c[events.TypeFired] != 1 || c[events.TypeCompletionPersisted] != 1 || c[events.TypeSpawned] != 1 {
			t.Errorf("task %s: %v, want one spawned, one completion-persisted and one fired", id, c)
		}
		if pool != "" && spawnedBy[id] != "pool-"+pool {
			t.Errorf("task %s placed on pool=%s ran on %s", id, pool, spawnedBy[id])
		}
	}
	for w, n := range maxOpen {
		if n > maxTasks {
			t.Errorf("worker %s ran %d tasks at once, more than --max-tasks %d", w, n, maxTasks)
		}
	}
	t.Logf("most tasks at once per worker: %v", maxOpen)
	auditClusterClean(t, d) // one inbox wake-up per fired task, among the rest
	nc.Close()
}

// registerOn arms a spec with a request on nc and returns its id. The spec has an
// idempotency key, so a request whose answer was lost (its engine was killed) is
// simply made again.
func registerOn(t *testing.T, nc *nats.Conn, spec map[string]any) string {
	t.Helper()
	data, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	for attempt := 0; ; attempt++ {
		msg, err := nc.Request("bgtask.register", data, 30*time.Second)
		if err == nil {
			var reply struct {
				ID    string          `json:"id"`
				Error json.RawMessage `json:"error"`
			}
			if err := json.Unmarshal(msg.Data, &reply); err != nil || reply.ID == "" {
				t.Fatalf("register %s: %s", data, msg.Data)
			}
			return reply.ID
		}
		if attempt == 5 {
			t.Fatalf("register %s: %v", data, err)
		}
	}
}
