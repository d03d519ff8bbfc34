package projections_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/events/eventstest"
	"github.com/bgtask/bgtask/projections"
)

// finishedTask is one finished task's history as bgtask writes it: armed, spawned,
// a first tick with the PID and four more, exited with a 12-line tail, completion
// persisted and fired, each decided by the engine on the state folded so far.
func finishedTask(b *testing.B, i int, at time.Time) []events.Event {
	b.Helper()
	spec, err := engine.ParseSpecAt([]byte(fmt.Sprintf(`{"command":"go test ./pkg%d/...","kind":"test","target":"agent-7",
		"origin":{"session":"s-123","channel":"dev"},
		"prompt":"Tests {{status}} (exit {{exit_code}}) in session {{origin.session}}:\n{{result}}"}`, i)), at)
	if err != nil {
		b.Fatal(err)
	}
	tail := make([]string, 12)
	for l := range tail {
		tail[l] = fmt.Sprintf("ok  \tgithub.com/acme/app/pkg%d/part%d\t0.%03ds", i, l, l)
	}
	const worker = "bench-worker"
	cmds := []struct {
		c      engine.Command
		writer string
	}{
		{engine.Arm{Spec: spec}, "engine@bench"},
		{engine.Spawn{Host: "bench-host"}, worker},
		{engine.Tick{PID: 1000 + i}, worker},
	}
	for t := 1; t < 5; t++ {
		cmds = append(cmds, struct {
			c      engine.Command
			writer string
		}{engine.Tick{OutputBytes: int64(t * 100)}, worker})
	}
	cmds = append(cmds, []struct {
		c      engine.Command
		writer string
	}{
		{engine.Exit{Run: events.Exited{Tail: tail, StartedAt: at, EndedAt: at.Add(time.Minute), OutputBytes: 1000}}, worker},
		{engine.PersistCompletion{}, "engine@bench"},
		{engine.Fire{InboxSeq: uint64(i + 1)}, "engine@bench"},
	}...)
	id, err := engine.TaskID(spec)
	if err != nil {
		b.Fatal(err)
	}
	state := engine.State{ID: id}
	var out []events.Event
	for n, c := range cmds {
		ev, err := engine.Decide(state, c.c, engine.Meta{Writer: c.writer, Now: at})
		if err != nil {
			b.Fatal(err)
		}
		if state, err = engine.Apply(state, events.Record{Seq: uint64(n + 1), Event: ev}); err != nil {
			b.Fatal(err)
		}
		out = append(out, ev)
	}
	return out
}

// BenchmarkReplay is the projector's start on a stream of 2,000 finished tasks
// (20,000 events): the read of the stream, the decoding and the fold of every
// event, as a server does on a restart; the same start from a snapshot at the
// stream's end; and, for scale, a raw read of the same
// stream with an ordered consumer, as the restart scenario of `bgtask bench`
// compares it.
func BenchmarkReplay(b *testing.B) {
	const tasks = 2000
	srv := eventstest.Run(b)
	ctx := context.Background()
	store, err := events.OpenStore(ctx, srv.JS, events.StreamConfig{})
	if err != nil {
		b.Fatal(err)
	}
	js, err := jetstream.New(srv.Conn, jetstream.WithPublishAsyncMaxPending(1024))
	if err != nil {
		b.Fatal(err)
	}
	count := 0
	at := time.Now().Add(-time.Hour)
	for i := range tasks {
		for _, ev := range finishedTask(b, i, at) {
			data, err := json.Marshal(ev)
			if err != nil {
				b.Fatal(err)
			}
			msg := &nats.Msg{Subject: events.TaskSubject(ev.TaskID, ev.Type), Data: data}
			if _, err := js.PublishMsgAsync(msg); err != nil {
				b.Fatal(err)
			}
			count++
		}
	}
	<-js.PublishAsyncComplete()
	b.Run("projector", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			p := projections.New(store, nil, engine.Base{})
			if err := p.Start(ctx); err != nil {
				b.Fatal(err)
			}
			p.Stop()
			if _, n := p.List(engine.ListQuery{Limit: 1}); n != tasks {
				b.Fatalf("replayed %d tasks, want %d", n, tasks)
			}
		}
		b.ReportMetric(float64(count*b.N)/b.Elapsed().Seconds(), "events/s")
	})
	b.Run("snapshot", func(b *testing.B) {
		snaps := projections.Snapshots{Path: filepath.Join(b.TempDir(), "projection.snapshot"), Every: 1}
		p := projections.New(store, nil, engine.Base{})
		p.UseSnapshots(snaps)
		p.TestSignals.Snapshotted.Init(b)
		if err := p.Start(ctx); err != nil {
			b.Fatal(err)
		}
		awaitSnapshot(b, p, uint64(count))
		p.Stop()
		b.ReportAllocs()
		for b.Loop() {
			p := projections.New(store, nil, engine.Base{})
			p.UseSnapshots(snaps)
			if err := p.Start(ctx); err != nil {
				b.Fatal(err)
			}
			p.Stop()
			if r := p.Replayed(); r.SnapshotSeq != uint64(count) {
				b.Fatalf("started %+v, want from the snapshot", r)
			}
		}
		b.ReportMetric(float64(count*b.N)/b.Elapsed().Seconds(), "events/s")
	})
	b.Run("raw", func(b *testing.B) {
		stream, err := srv.JS.Stream(ctx, events.StreamName)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
			if err != nil {
				b.Fatal(err)
			}
			it, err := cons.Messages(jetstream.PullMaxMessages(1024))
			if err != nil {
				b.Fatal(err)
			}
			for range count {
				if _, err := it.Next(); err != nil {
					b.Fatal(err)
				}
			}
			it.Stop()
		}
		b.ReportMetric(float64(count*b.N)/b.Elapsed().Seconds(), "events/s")
	})
}
