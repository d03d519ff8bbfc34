package events_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/events/eventstest"
)

// A one-off read removes its consumer when it is done. JetStream counts a stream's
// consumers against a limit (1,000 by default since nats-server 2.15): consumers
// left for their inactivity threshold made reads fail with "maximum consumers
// limit reached" once more than the limit were made within it. Each stream's limit
// is lowered here, so that a read leaving its consumer behind fails within a few.
func TestOneOffReadsLeaveNoConsumerBehind(t *testing.T) {
	t.Parallel()
	srv := eventstest.Run(t)
	ctx := context.Background()
	store, err := events.OpenStore(ctx, srv.JS, events.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	logs, err := events.OpenLogs(ctx, srv.JS, events.LogConfig{})
	if err != nil {
		t.Fatal(err)
	}
	inbox, err := events.OpenInbox(ctx, srv.JS, events.InboxConfig{})
	if err != nil {
		t.Fatal(err)
	}
	archive, err := events.OpenArchive(ctx, srv.JS, 1)
	if err != nil {
		t.Fatal(err)
	}
	const limit, reads = 3, 10
	for _, name := range []string{events.StreamName, events.LogStreamName, events.InboxStreamName, events.ArchiveStreamName} {
		limitConsumers(t, srv.JS, name, limit)
	}

	seq, err := store.Append(ctx, mustEvent(t, "t1", &events.Armed{Spec: []byte(`{}`)}), 0)
	if err != nil {
		t.Fatal(err)
	}
	w := logs.Writer("t1", events.Stdout, 0)
	_, _ = w.Write([]byte("hello\n"))
	w.Close(ctx, true)
	history, err := store.History(ctx, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := archive.Put(ctx, "t1", history); err != nil {
		t.Fatal(err)
	}

	for _, read := range []struct {
		name   string
		stream string
		read   func(i int) error
	}{
		{"history", events.StreamName, func(int) error {
			_, err := store.History(ctx, "t1")
			return err
		}},
		{"follow", events.StreamName, func(int) error {
			return store.Follow(ctx, "t1", seq-1, func(events.Record, error) bool { return false })
		}},
		{"logs", events.LogStreamName, func(int) error {
			return logs.Read(ctx, "t1", nil, func(events.LogChunk) error { return nil })
		}},
		{"inbox recheck", events.InboxStreamName, func(i int) error {
			_, err := inbox.Deliver(ctx, events.Wakeup{ID: fmt.Sprintf("task-%d", i), Status: "succeeded", Target: "default"}, time.Now().Add(-time.Hour))
			return err
		}},
		{"archive", events.ArchiveStreamName, func(int) error {
			return archive.Each(ctx, func(uint64, events.ArchivedHistory, error) bool { return true })
		}},
	} {
		for i := range reads {
			if err := read.read(i); err != nil {
				t.Fatalf("%s, read %d of %d with at most %d consumers: %v", read.name, i+1, reads, limit, err)
			}
		}
		if n := consumers(t, srv.JS, read.stream); n != 0 {
			t.Errorf("%s: %d consumers left on %s after its reads, want 0", read.name, n, read.stream)
		}
	}
}

func limitConsumers(t *testing.T, js jetstream.JetStream, name string, limit int) {
	t.Helper()
	ctx := context.Background()
	stream, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	cfg := stream.CachedInfo().Config
	cfg.MaxConsumers = limit
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
}

func consumers(t *testing.T, js jetstream.JetStream, name string) int {
	t.Helper()
	stream, err := js.Stream(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return stream.CachedInfo().State.Consumers
}
