package projections

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// armedProjector is a projector that has applied n armed tasks, a second apart,
// and every third of them spawned.
func armedProjector(tb testing.TB, n int) *Projector {
	tb.Helper()
	return armedProjectorEvery(tb, n, time.Second)
}

// armedProjectorEvery is armedProjector with the tasks armed apart by gap.
func armedProjectorEvery(tb testing.TB, n int, gap time.Duration) *Projector {
	tb.Helper()
	p := New(nil, nil, engine.Base{})
	at := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	seq := uint64(0)
	for i := range n {
		spec, err := engine.ParseSpecAt(fmt.Appendf(nil, `{"command":"make test-%d"}`, i), at.Add(time.Duration(i)*gap))
		if err != nil {
			tb.Fatal(err)
		}
		id, err := engine.TaskID(spec)
		if err != nil {
			tb.Fatal(err)
		}
		state := engine.State{ID: id}
		cmds := []engine.Command{engine.Arm{Spec: spec}}
		if i%3 == 0 {
			cmds = append(cmds, engine.Spawn{Host: "h"})
		}
		for _, c := range cmds {
			ev, err := engine.Decide(state, c, engine.Meta{Writer: "w", Now: at.Add(time.Duration(i) * gap)})
			if err != nil {
				tb.Fatal(err)
			}
			seq++
			rec := events.Record{Seq: seq, Event: ev}
			if state, err = engine.Apply(state, rec); err != nil {
				tb.Fatal(err)
			}
			p.apply(rec, nil)
		}
	}
	return p
}

func TestListIsNewestFirstAndKeepsToItsState(t *testing.T) {
	p := armedProjector(t, 300)
	all, total := p.List(engine.ListQuery{Limit: 50})
	if total != 300 || len(all) != 50 {
		t.Fatalf("listed %d of %d, want 50 of 300", len(all), total)
	}
	if !slices.IsSortedFunc(all, func(a, b engine.State) int { return b.ArmedAt.Compare(a.ArmedAt) }) {
		t.Error("not newest first")
	}
	running, total := p.List(engine.ListQuery{Phase: engine.PhaseRunning})
	if total != 100 || len(running) != 100 {
		t.Fatalf("listed %d of %d running, want 100", len(running), total)
	}
	for _, s := range running {
		if s.Phase != engine.PhaseRunning {
			t.Fatalf("task %s listed as running is %s", s.ID, s.Phase)
		}
	}
}

// Paging by the position of the last task listed gives every task once, in the
// order of one whole list, tasks armed at the same instant too (ordered by id);
// the total counts them all on every page.
func TestListAfterPagesThroughEveryTaskOnce(t *testing.T) {
	for _, gap := range []time.Duration{time.Second, 0} {
		p := armedProjectorEvery(t, 100, gap)
		for _, phase := range []engine.Phase{"", engine.PhaseArmed, engine.PhaseRunning} {
			whole, total := p.List(engine.ListQuery{Phase: phase})
			var paged []engine.State
			var at time.Time
			var after string
			for {
				page, pageTotal := p.ListAfter(engine.ListQuery{Phase: phase, Limit: 7}, at, after)
				if pageTotal != total {
					t.Fatalf("gap %s, state %q: a page counts %d tasks, the whole list %d", gap, phase, pageTotal, total)
				}
				if len(page) == 0 {
					break
				}
				paged = append(paged, page...)
				last := page[len(page)-1]
				at, after = last.ArmedAt, last.ID
			}
			ids := func(states []engine.State) []string {
				out := make([]string, len(states))
				for i, s := range states {
					out[i] = s.ID
				}
				return out
			}
			if !slices.Equal(ids(paged), ids(whole)) || len(whole) != total {
				t.Fatalf("gap %s, state %q: paged %d tasks, listed %d of %d, or not in the same order", gap, phase, len(paged), len(whole), total)
			}
		}
	}
}

// BenchmarkApplyWhileListing is how long the projector waits to apply an event
// while clients list every task, 100,000 of them, without pause: the wait holds
// up every wake-up. It reports the mean, the p99 and the longest wait.
func BenchmarkApplyWhileListing(b *testing.B) {
	p := armedProjector(b, 100_000)
	stop := make(chan struct{})
	var listing sync.WaitGroup
	listing.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				p.List(engine.ListQuery{Limit: 100})
			}
		}
	})
	var waits []time.Duration
	// An event each millisecond, not a writer that starves the lists.
	pace := time.NewTicker(time.Millisecond)
	defer pace.Stop()
	for b.Loop() {
		<-pace.C
		start := time.Now()
		p.mu.Lock()
		waits = append(waits, time.Since(start))
		p.mu.Unlock()
	}
	close(stop)
	listing.Wait()
	var sum time.Duration
	for _, w := range waits {
		sum += w
	}
	slices.Sort(waits)
	b.ReportMetric(float64(sum.Microseconds())/float64(len(waits)), "µs-mean-wait")
	b.ReportMetric(float64(waits[len(waits)-1].Microseconds()), "µs-max-wait")
	b.ReportMetric(float64(waits[len(waits)*99/100].Microseconds()), "µs-p99-wait")
}
