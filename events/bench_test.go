package events_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/events/eventstest"
)

func BenchmarkEventEncodeDecode(b *testing.B) {
	ev, err := events.New("01a22a60-c563-7096-9a88-ac2479fc52d0", "worker-1", 1, time.Now(), &events.Exited{
		ExitCode: 3, Tail: []string{"ok  github.com/x/y 0.1s", "FAIL github.com/x/z 2.3s"}, StartedAt: time.Now(), EndedAt: time.Now(),
	})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		data, err := json.Marshal(ev)
		if err != nil {
			b.Fatal(err)
		}
		rec, err := events.DecodeRecord(1, data)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := rec.Decode(); err != nil {
			b.Fatal(err)
		}
	}
}

// benchmarkAppend measures conditional appends, each on the task's last event, the
// way workers and the dispatcher write.
func benchmarkAppend(b *testing.B, configure ...func(*server.Options)) {
	srv := eventstest.Run(b, configure...)
	ctx := context.Background()
	store, err := events.OpenStore(ctx, srv.JS, events.StreamConfig{})
	if err != nil {
		b.Fatal(err)
	}
	const tasks = 64
	last := make([]uint64, tasks)
	i := 0
	for b.Loop() {
		task := fmt.Sprintf("task-%d", i%tasks)
		ev, err := events.New(task, "bench", 1, time.Now(), &events.Tick{OutputBytes: int64(i)})
		if err != nil {
			b.Fatal(err)
		}
		if last[i%tasks], err = store.Append(ctx, ev, last[i%tasks]); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "appends/s")
}

// BenchmarkAppend uses JetStream's default file store: acknowledged writes reach the
// disk within its sync interval (2 minutes).
func BenchmarkAppend(b *testing.B) { benchmarkAppend(b) }

// BenchmarkAppendSyncAlways fsyncs every write before acknowledging it.
func BenchmarkAppendSyncAlways(b *testing.B) {
	benchmarkAppend(b, func(o *server.Options) { o.SyncAlways = true })
}

// BenchmarkArchivePut archives one finished task's history (ten events), gzip and
// publish, as the archiver does for every task it compacts.
func BenchmarkArchivePut(b *testing.B) {
	srv := eventstest.Run(b)
	ctx := context.Background()
	archive, err := events.OpenArchive(ctx, srv.JS, 1)
	if err != nil {
		b.Fatal(err)
	}
	var history []events.Record
	for seq := range uint64(10) {
		ev, err := events.New("01a22a60-c563-7096-9a88-ac2479fc52d0", "worker-1", 1, time.Now(), &events.Tick{PID: 1234, OutputBytes: int64(seq)})
		if err != nil {
			b.Fatal(err)
		}
		history = append(history, events.Record{Seq: seq + 1, Event: ev})
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := archive.Put(ctx, fmt.Sprintf("task-%d", i), history); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkHistory reads one task's ten events out of a stream of 200,000 tasks'
// (2,000,000 events, each task's ten spread over the whole stream, as tasks that
// run side by side write them): as History does, not knowing how many there are,
// and as the archiver does with HistoryOf, knowing. The stream is filled with
// asynchronous publishes on the events' subjects, stored as appends store them:
// one subject per task.
func BenchmarkHistory(b *testing.B) {
	srv := eventstest.Run(b)
	ctx := context.Background()
	store, err := events.OpenStore(ctx, srv.JS, events.StreamConfig{})
	if err != nil {
		b.Fatal(err)
	}
	const tasks, each = 200_000, 10
	for j := range each {
		for i := range tasks {
			var p events.Payload = &events.Tick{OutputBytes: int64(j)}
			if j == 0 {
				p = &events.Armed{Spec: []byte(`{}`)}
			}
			ev, err := events.New(fmt.Sprintf("task-%d", i), "bench", 1, time.Now(), p)
			if err != nil {
				b.Fatal(err)
			}
			data, err := json.Marshal(ev)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := srv.JS.PublishAsync(events.TaskSubject(ev.TaskID, ev.Type), data); err != nil {
				b.Fatal(err)
			}
			if i%1000 == 999 {
				select {
				case <-srv.JS.PublishAsyncComplete():
				case <-time.After(time.Minute):
					b.Fatal("1,000 publishes not acknowledged in a minute")
				}
			}
		}
	}
	stream, err := srv.JS.Stream(ctx, events.StreamName)
	if err != nil {
		b.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if info.State.NumSubjects != tasks {
		b.Fatalf("%d subjects in the stream for %d tasks", info.State.NumSubjects, tasks)
	}
	target := fmt.Sprintf("task-%d", tasks/2)
	for _, bc := range []struct {
		name string
		n    int
	}{{"count-unknown", 0}, {"count-known", each}} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				h, err := store.HistoryOf(ctx, target, bc.n)
				if err != nil || len(h) != each {
					b.Fatalf("%d events, %v; want %d", len(h), err, each)
				}
			}
		})
	}
}
