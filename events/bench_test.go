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
