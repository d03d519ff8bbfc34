package engine

import (
	"slices"
	"strconv"
	"testing"
)

// queued returns a dispatcher with n ended tasks queued, as a recovery queues
// every task that ended and did not fire.
func queued(n int) *Dispatcher {
	d := NewDispatcher(nil, nil, nil, "engine", 1, Base{})
	for i := range n {
		d.enqueue("task-"+strconv.Itoa(i), false)
	}
	return d
}

// Taking a task from the dispatcher's queue allocates nothing: a new array for
// the rest of the queue at each take made delivering a recovered queue quadratic
// in its length. (That the first is taken without moving the rest, the benchmark
// below shows.)
func TestTakingFromTheQueueAllocatesNothing(t *testing.T) {
	d := queued(1000)
	take := func() {
		id, _, ok := d.next()
		if !ok {
			t.Fatal("the queue ran out")
		}
		d.done(id)
	}
	if allocs := testing.AllocsPerRun(100, take); allocs != 0 {
		t.Errorf("a take from a queue of 1000 allocates %.0f times, want 0", allocs)
	}
	// Those a loop works on are passed over, and stay first.
	d = queued(3)
	for range 3 {
		d.next()
	}
	d.done("task-2")
	for i := range 3 { // each ended again
		d.enqueue("task-"+strconv.Itoa(i), false)
	}
	if id, _, _ := d.next(); id != "task-2" || !slices.Equal(d.queue, []string{"task-0", "task-1"}) {
		t.Fatalf("took %s, leaving %v; want task-2, leaving [task-0 task-1]", id, d.queue)
	}
}

// go test -run '^$' -bench DispatcherQueue ./engine: the whole of a recovered
// queue taken, one task after the other.
func BenchmarkDispatcherQueue(b *testing.B) {
	for _, n := range []int{100, 10_000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				d := queued(n)
				b.StartTimer()
				for range n {
					id, _, _ := d.next()
					d.done(id)
				}
			}
		})
	}
}
