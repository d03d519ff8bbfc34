package integration

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/internal/testkit"
	"github.com/bgtask/bgtask/projections"
)

// snapshot is what the queries return: the state a restart must rebuild.
func snapshot(t *testing.T, home string, ids []string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString(ok(t, home, "list", "--json", "--limit", "0"))
	for _, id := range ids {
		b.WriteString(ok(t, home, "show", id, "--json"))
	}
	return b.String()
}

func TestRestartRebuildsTheSameState(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	srv := startServer(t, home)

	var ids []string
	for i := range 5 {
		ids = append(ids, add(t, home, "--", fmt.Sprintf("echo task %d; exit %d", i, i)))
	}
	for _, id := range ids {
		waitFor(t, home, id)
	}
	// A task that stays armed (no worker takes it) and one cancelled before it ran.
	srv.stop(syscall.SIGTERM)
	srv = startServer(t, home, "--no-worker")
	armed := add(t, home, "--", "echo never yet")
	cancelled := add(t, home, "--", "echo never")
	ok(t, home, "cancel", cancelled)
	ids = append(ids, armed, cancelled)

	before := snapshot(t, home, ids)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		srv.stop(sig)
		srv = startServer(t, home, "--no-worker")
		if after := snapshot(t, home, ids); after != before {
			t.Fatalf("state after %v and restart differs.\nbefore:\n%s\nafter:\n%s", sig, before, after)
		}
	}
	// A worker arriving later takes the armed task; nothing else changes.
	srv.stop(syscall.SIGTERM)
	startServer(t, home)
	w := waitFor(t, home, armed)
	if w.Status != "succeeded" {
		t.Fatalf("armed task after restart: %+v", w)
	}
	for _, id := range ids {
		if n := countTypes(history(t, home, id)); n["fired"] > 1 || n["spawned"] > 1 {
			t.Fatalf("task %s after restarts: %v", id, n)
		}
	}
	auditClean(t, home)
}

func TestWorkersRacingForTasksSpawnEachExactlyOnce(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home, "--no-worker")
	for i := range 3 {
		start(t, home, "worker", "--worker-id", fmt.Sprintf("w%d", i), "--max-tasks", "8", "--tick", "1s")
	}
	nc, js := connect(t, home)
	const tasks = 200
	ids := map[string]bool{}
	for i := range tasks {
		ids[register(t, nc, map[string]any{"command": fmt.Sprintf("sleep 0.2; exit %d", i%3)})] = true
	}
	// Wait for the last wake-up through the inbox stream, as a runtime would.
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, "BGTASK_INBOX", jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	delivered := map[string]int{}
	for len(delivered) < tasks {
		msg, err := cons.Next(jetstream.FetchContext(ctx))
		if err != nil {
			t.Fatalf("after %d of %d wake-ups: %v", len(delivered), tasks, err)
		}
		delivered[msg.Headers().Get("Nats-Msg-Id")]++
	}
	for id := range ids {
		if delivered[id] != 1 {
			t.Fatalf("task %s delivered %d times", id, delivered[id])
		}
	}

	spawns := map[string]int{}
	byWorker := map[string]int{}
	for _, rec := range allEvents(t, js) {
		if rec.Type == "spawned" {
			spawns[rec.TaskID]++
			byWorker[rec.Writer]++
		}
	}
	for id := range ids {
		if spawns[id] != 1 {
			t.Fatalf("task %s spawned %d times", id, spawns[id])
		}
	}
	if len(byWorker) < 2 {
		t.Fatalf("tasks were not spread over the workers: %v", byWorker)
	}
	auditClean(t, home)
	t.Logf("spawns per worker: %v", byWorker)
}

// snapshotSeq is the sequence of the projection snapshot in home, 0 while there is none.
func snapshotSeq(t *testing.T, home string) uint64 {
	t.Helper()
	seq, err := projections.SnapshotSeq(filepath.Join(home, "projection.snapshot"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	return seq
}

func TestRestartFromASnapshotServesTheSameState(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	srv := startServer(t, home, "--snapshot-every", "1")
	var ids []string
	for i := range 5 {
		ids = append(ids, add(t, home, "--", fmt.Sprintf("echo task %d; exit %d", i, i)))
	}
	for _, id := range ids {
		waitFor(t, home, id)
	}
	// With --snapshot-every 1 a snapshot is due whenever as many events as there
	// are tasks were applied since the last.
	testkit.Eventually(t, 30*time.Second, "a snapshot written", func() bool { return snapshotSeq(t, home) != 0 })
	before := snapshot(t, home, ids)
	srv.stop(syscall.SIGKILL)

	srv = startServer(t, home, "--no-worker", "--snapshot-every", "1")
	if after := snapshot(t, home, ids); after != before {
		t.Fatalf("state after a restart from the snapshot differs.\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if log := srv.out.String(); !strings.Contains(log, "projection snapshot read") {
		t.Fatalf("the restart did not read the snapshot:\n%s", log)
	}
	// A damaged snapshot is not used: the stream is replayed whole, to the same state.
	srv.stop(syscall.SIGTERM)
	path := filepath.Join(home, "projection.snapshot")
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, info.Size()/2); err != nil {
		t.Fatal(err)
	}
	srv = startServer(t, home, "--no-worker", "--snapshot-every", "1")
	if after := snapshot(t, home, ids); after != before {
		t.Fatalf("state after a restart with a damaged snapshot differs.\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if log := srv.out.String(); !strings.Contains(log, "projection snapshot not used") || !strings.Contains(log, "cut short") {
		t.Fatalf("the damaged snapshot was not reported:\n%s", log)
	}
	auditClean(t, home)
}
