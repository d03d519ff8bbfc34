package bench

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/projections"
	"github.com/bgtask/bgtask/workers"
)

// BenchmarkTaskHistory builds the history of one finished task with the engine's
// Decide and Apply, as the restart and growth scenarios generate their streams.
func BenchmarkTaskHistory(b *testing.B) {
	h, err := newHistoryMaker(b.TempDir(), 1)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := h.task(i, 5); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// Generated tasks have all ended a day ago, one second apart, however many there
// are: with the first of 200,000 starting a day ago, a sixth of them would end in
// the future, out of reach of a server archiving every finished task.
func TestGeneratedTasksEndADayAgo(t *testing.T) {
	const tasks, ticks = 60, 3 // each runs 30 s
	h, err := newHistoryMaker(t.TempDir(), tasks)
	if err != nil {
		t.Fatal(err)
	}
	var last events.Event
	for i := range tasks {
		evs, err := h.task(i, ticks)
		if err != nil {
			t.Fatal(err)
		}
		last = evs[len(evs)-1].event
	}
	if dayAgo := time.Now().Add(-24 * time.Hour); last.Time.After(dayAgo.Add(time.Minute)) {
		t.Fatalf("the last of %d tasks fired at %v, %v after a day ago; want at most its 30 s run after", tasks, last.Time, last.Time.Sub(dayAgo))
	}
}

// The generated streams must be ones bgtask itself could have written: the audit
// of every invariant finds nothing wrong, and every task fired once, with its
// wake-up in the inbox.
func TestGeneratedStreamPassesTheAudit(t *testing.T) {
	r := &runner{opts: Options{StoreDir: "jetstream"}, size: quickSizes}
	home := t.TempDir()
	ctx := context.Background()
	const tasks = 30
	count, err := r.generate(ctx, home, tasks, 5)
	if err != nil {
		t.Fatal(err)
	}
	if count != tasks*10 {
		t.Fatalf("%d events, want %d", count, tasks*10)
	}
	ns, nc, err := embeddedNATS(filepath.Join(home, "jetstream"))
	if err != nil {
		t.Fatal(err)
	}
	defer shutdownNATS(ns, nc)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	audit := projections.NewAudit()
	for _, stream := range []string{events.StreamName, events.InboxStreamName} {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
		if err != nil {
			t.Fatal(err)
		}
		batch, err := cons.FetchNoWait(count)
		if err != nil {
			t.Fatal(err)
		}
		for msg := range batch.Messages() {
			meta, err := msg.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			if stream == events.InboxStreamName {
				audit.AddDelivery(msg.Headers().Get(jetstream.MsgIDHeader))
			} else {
				audit.Add(events.DecodeRecord(meta.Sequence.Stream, msg.Data()))
			}
		}
	}
	rep := audit.Report()
	if len(rep.Violations) > 0 || rep.Fired != tasks || rep.Events != count {
		t.Fatalf("audit: %d events, %d fired, violations %+v", rep.Events, rep.Fired, rep.Violations)
	}
}

// The shim's start is measured in the environment a worker starts it in.
func TestStartCostRunsInTheEnvironmentGiven(t *testing.T) {
	env := append(os.Environ(), "BGTASK_BENCH_TEST=given")
	if _, _, err := startCost(context.Background(), 1, env, "sh", "-c", `test "$BGTASK_BENCH_TEST" = given`); err != nil {
		t.Fatalf("the command did not get the environment given: %v", err)
	}
	if _, _, err := startCost(context.Background(), 1, workers.ShimEnviron(os.Environ()), "sh", "-c", `test "$GOMAXPROCS" = 1`); err != nil {
		t.Fatalf("the shim's environment has no GOMAXPROCS=1: %v", err)
	}
}
