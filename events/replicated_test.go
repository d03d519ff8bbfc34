package events_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/events/eventstest"
)

// On a replicated stream a losing conditional append comes back as 10164, not
// 10071, and a retry of an append that was stored comes back as a duplicate
// acknowledgement, not as a conflict. The store must read both the same way as on
// one server: ErrConflict for the loser, the original sequence for the retry.
func TestAppendOnAReplicatedStream(t *testing.T) {
	t.Parallel()
	cluster := eventstest.RunCluster(t, 3)
	nc, err := nats.Connect(cluster.URLs())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	store, err := events.OpenStore(ctx, js, events.StreamConfig{Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}

	armed := mustEvent(t, "r1", &events.Armed{Spec: []byte(`{}`)})
	seq, err := store.Append(ctx, armed, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The same event again, as after a lost acknowledgement: the same sequence.
	again, err := store.Append(ctx, armed, 0)
	if err != nil || again != seq {
		t.Fatalf("retried append: seq %d, err %v; want seq %d and no error", again, err, seq)
	}

	// Writers that all read the same history: exactly one wins, the others get
	// ErrConflict (10164 from the replicated stream).
	const writers = 8
	var wg sync.WaitGroup
	results := make(chan error, writers)
	for range writers {
		wg.Go(func() {
			_, err := store.Append(ctx, mustEvent(t, "r1", &events.Spawned{Worker: "w"}), seq)
			results <- err
		})
	}
	wg.Wait()
	close(results)
	won := 0
	for err := range results {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, events.ErrConflict):
			t.Errorf("losing append: %v, want ErrConflict", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d writers won, want exactly 1", won)
	}
	h, err := store.History(ctx, "r1")
	if err != nil {
		t.Fatal(err)
	}
	if len(h) != 2 {
		t.Errorf("history has %d events, want armed and one spawned", len(h))
	}
}
