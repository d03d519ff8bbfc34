package integration

import (
	"context"
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/testkit"
)

// A home whose event stream has the layout before one subject per task (every
// event on bgtask.events.<task-id>.<type>) is upgraded when the server starts:
// the same tasks with the same event ids, idempotency keys that still name
// their tasks, a run that was going on ends as it would have, and the audit is
// clean.
func TestAnOldLayoutHomeIsUpgradedWhenTheServerStarts(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	srv := startServer(t, home, "--archive-after", "1s")
	archived := add(t, home, "--idempotency-key", "nightly-7", "--", "echo archived-output; exit 3")
	waitFor(t, home, archived)
	testkit.Eventually(t, 60*time.Second, "the task archived", func() bool {
		return strings.Contains(ok(t, home, "list", "--json"), `"state": "archived"`)
	})
	// The default --archive-after from here, so that the archiver leaves the next
	// finished task whole: the test compares its history before and after.
	srv.stop(syscall.SIGTERM)
	srv = startServer(t, home)
	done := add(t, home, "--idempotency-key", "build-42", "--", "echo built")
	waitFor(t, home, done)
	running := add(t, home, "--idempotency-key", "deploy-1", "--", "sleep 3; echo deployed")
	testkit.Eventually(t, 30*time.Second, "the task started", func() bool {
		return countTypes(history(t, home, running))["spawned"] == 1
	})
	tasks := []string{archived, done, running}
	_, js := connect(t, home)
	before := map[string][]string{}
	for _, id := range tasks {
		before[id] = eventIDs(t, js, id)
	}
	srv.stop(syscall.SIGKILL)

	rewriteAsOldLayout(t, home)

	startServer(t, home)
	_, js = connect(t, home)
	for _, id := range []string{archived, done} {
		if got := eventIDs(t, js, id); strings.Join(got, ",") != strings.Join(before[id], ",") {
			t.Fatalf("events of %s after the upgrade: %v, want %v", id, got, before[id])
		}
	}
	for _, k := range []struct{ key, id, command string }{
		{"nightly-7", archived, "echo archived-output; exit 3"},
		{"build-42", done, "echo built"},
		{"deploy-1", running, "sleep 3; echo deployed"},
	} {
		if again := add(t, home, "--idempotency-key", k.key, "--", k.command); again != k.id {
			t.Fatalf("the key %s registered a new task %s, want %s", k.key, again, k.id)
		}
	}
	if w := waitFor(t, home, running); w.Status != "succeeded" || strings.Join(w.Tail, ",") != "deployed" {
		t.Fatalf("the run that went on across the upgrade: %+v", w)
	}
	if got := eventIDs(t, js, running); strings.Join(got[:len(before[running])], ",") != strings.Join(before[running], ",") {
		t.Fatalf("events of %s after the upgrade: %v, want %v first", running, got, before[running])
	}
	stream, err := js.Stream(context.Background(), events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	if n := stream.CachedInfo().State.NumSubjects; n != uint64(len(tasks)) {
		t.Errorf("the upgraded stream has %d subjects for %d tasks", n, len(tasks))
	}
	auditClean(t, home)
	if out := ok(t, home, "audit"); !strings.Contains(out, "1 archived") {
		t.Fatalf("audit does not count the archived task:\n%s", out)
	}
}

func eventIDs(t *testing.T, js jetstream.JetStream, id string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, err := events.ConnectStore(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	h, err := store.History(ctx, id)
	if err != nil {
		t.Fatalf("history of %s: %v", id, err)
	}
	ids := make([]string, len(h))
	for i, rec := range h {
		ids[i] = string(rec.Type) + ":" + rec.ID
	}
	return ids
}

// rewriteAsOldLayout opens the home's JetStream store with a server of its own
// and writes the event stream again as bgtask stored it before one subject per
// task: the same events, in order, each on its type's subject, with its id as the
// message id and the condition on its task's filter bgtask.events.<task-id>.>.
func rewriteAsOldLayout(t *testing.T, home string) {
	t.Helper()
	js, closeStore := openStore(t, home)
	defer closeStore()
	recs := allEvents(t, js)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := js.DeleteStream(ctx, events.StreamName); err != nil {
		t.Fatal(err)
	}
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:        events.StreamName,
		Description: "bgtask lifecycle events, one subject per task and type",
		Subjects:    []string{events.SubjectPrefix + ".>"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardNew,
		Replicas:    1,
		Duplicates:  events.DefaultDuplicates,
		AllowDirect: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]uint64{}
	for _, rec := range recs {
		data, err := json.Marshal(rec.Event)
		if err != nil {
			t.Fatal(err)
		}
		ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: events.TaskSubject(rec.TaskID, rec.Type), Data: data, Header: nats.Header{}},
			jetstream.WithMsgID(rec.ID), jetstream.WithExpectStream(events.StreamName),
			jetstream.WithExpectLastSequenceForSubject(last[rec.TaskID], events.SubjectPrefix+"."+rec.TaskID+".>"))
		if err != nil {
			t.Fatal(err)
		}
		last[rec.TaskID] = ack.Sequence
	}
}
