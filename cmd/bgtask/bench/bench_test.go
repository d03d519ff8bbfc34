package bench

import (
	"context"
	"testing"
)

// BenchmarkTaskHistory builds the history of one finished task with the engine's
// Decide and Apply, as the restart and growth scenarios generate their streams.
func BenchmarkTaskHistory(b *testing.B) {
	h, err := newHistoryMaker(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := h.task(i, 4); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkReplay is a server's restart in one process: the embedded NATS server
// recovers a store of 1,000 finished tasks (10 events each) and bgtask's projector
// replays it.
func BenchmarkReplay(b *testing.B) {
	r := &runner{opts: Options{StoreDir: "jetstream"}, size: quickSizes}
	home := b.TempDir()
	const tasks = 1000
	count, err := r.generate(context.Background(), home, tasks, 4)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		f, err := r.replayInProcess(context.Background(), home)
		if err != nil {
			b.Fatal(err)
		}
		if f.tasks != tasks {
			b.Fatalf("replayed %d tasks, want %d", f.tasks, tasks)
		}
	}
	b.ReportMetric(float64(count)*float64(b.N)/b.Elapsed().Seconds(), "events/s")
}
