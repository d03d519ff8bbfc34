package projections

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/events/eventstest"
)

// finishedRecords are the events of n tasks that ran a test suite, printed 50
// lines and fired their wake-up, as an agent registers them.
func finishedRecords(tb testing.TB, n int) []events.Record {
	tb.Helper()
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	tail := make([]string, 50)
	for i := range tail {
		tail[i] = fmt.Sprintf("ok  \tgithub.com/example/pkg%d\t0.%03ds", i, i)
	}
	var recs []events.Record
	seq := uint64(0)
	for i := range n {
		now := at.Add(time.Duration(i) * time.Second)
		spec, err := engine.ParseSpecAt(fmt.Appendf(nil, `{"command":"go test ./... # %d","kind":"test","target":"agent-7",
			"cwd":%q,"origin":{"session":"s-123","channel":"dev"},
			"prompt":"Tests {{status}} (exit {{exit_code}}) in session {{origin.session}}:\n{{result}}"}`, i, os.TempDir()), now)
		if err != nil {
			tb.Fatal(err)
		}
		id, err := engine.TaskID(spec)
		if err != nil {
			tb.Fatal(err)
		}
		state := engine.State{ID: id}
		for _, step := range []struct {
			c   engine.Command
			who string
		}{
			{engine.Arm{Spec: spec}, "engine"},
			{engine.Spawn{Host: "h"}, "w"},
			{engine.Tick{PID: 42, OutputBytes: 1800}, "w"},
			{engine.Exit{Run: events.Exited{ExitCode: i % 2, Tail: tail, StartedAt: now, EndedAt: now.Add(time.Second)}}, "w"},
			{engine.PersistCompletion{}, "engine"},
			{engine.Fire{InboxSeq: uint64(i + 1)}, "engine"},
		} {
			ev, err := engine.Decide(state, step.c, engine.Meta{Writer: step.who, Now: now})
			if err != nil {
				tb.Fatal(err)
			}
			seq++
			rec := events.Record{Seq: seq, Event: ev}
			if state, err = engine.Apply(state, rec); err != nil {
				tb.Fatal(err)
			}
			recs = append(recs, rec)
		}
	}
	return recs
}

func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// A finished task is most of what a long stream holds: the projector keeps it as
// a summary, not its spec, output tail and wake-up (3.8 KB a task of the bench's
// when it kept them whole).
func TestASettledTaskTakesLittleMemory(t *testing.T) {
	const n = 1000
	recs := finishedRecords(t, n)
	p := New(nil, nil, engine.Base{})
	before := liveHeap()
	for _, rec := range recs {
		p.apply(rec, nil)
	}
	perTask := (int64(liveHeap()) - int64(before)) / n
	runtime.KeepAlive(recs)
	if _, total := p.List(engine.ListQuery{}); total != n {
		t.Fatalf("%d tasks, want %d", total, n)
	}
	t.Logf("%d bytes a settled task", perTask)
	if perTask > 600 {
		t.Errorf("a settled task takes %d bytes of the projector's heap, want at most 600", perTask)
	}
}

// A settled task's summary, as a state, is what the list shows of it: its phase,
// outcome, times, command, exit code and the condition of its next append.
func TestASettledTaskIsListedByItsSummary(t *testing.T) {
	recs := finishedRecords(t, 2)
	p := New(nil, nil, engine.Base{})
	var whole engine.State
	for _, rec := range recs[:6] {
		p.apply(rec, nil)
		whole, _ = engine.Apply(whole, rec)
	}
	listed, _ := p.List(engine.ListQuery{})
	if len(listed) != 1 {
		t.Fatalf("listed %d tasks, want 1", len(listed))
	}
	got := listed[0]
	want := engine.State{
		ID: whole.ID, Phase: engine.PhaseFired, Status: whole.Status, Seq: whole.Seq, Epoch: whole.Epoch,
		Spec:    engine.Spec{Command: whole.Spec.Command, Kind: "test", Target: "agent-7"},
		ArmedAt: whole.ArmedAt, EndedAt: whole.EndedAt, FiredAt: whole.FiredAt,
		Run: &events.Exited{ExitCode: 0}, LastType: events.TypeFired, Events: 6,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("listed as\n%+v\nwant\n%+v", got, want)
	}
	if !strings.HasPrefix(got.Spec.CommandLine(), "go test ./...") {
		t.Errorf("command %q", got.Spec.CommandLine())
	}
}

// An archived task's summary is its whole state: the archived event left nothing
// else of it.
func TestAnArchivedTaskIsWholeInItsSummary(t *testing.T) {
	recs := finishedRecords(t, 1)
	var whole engine.State
	for _, rec := range recs {
		whole, _ = engine.Apply(whole, rec)
	}
	ev, err := engine.Decide(whole, engine.Archive{Seq: 9}, engine.Meta{Writer: "engine", Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	archived, err := engine.Apply(whole, events.Record{Seq: whole.Seq + 1, Event: ev})
	if err != nil {
		t.Fatal(err)
	}
	sum := summarize(&archived, new(interner))
	if got := sum.state(); !reflect.DeepEqual(got, archived) {
		t.Fatalf("summary as a state:\n%+v\nthe archived state:\n%+v", got, archived)
	}
}

// A replay of many events hands its garbage back once the state is built, and a
// short one does not pay for a collection.
func TestALongReplayReleasesItsGarbage(t *testing.T) {
	srv := eventstest.Run(t)
	ctx := context.Background()
	store, err := events.OpenStore(ctx, srv.JS, events.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	recs := finishedRecords(t, 2)
	lastOf := map[string]uint64{}
	for _, rec := range recs {
		if lastOf[rec.TaskID], err = store.Append(ctx, rec.Event, lastOf[rec.TaskID]); err != nil {
			t.Fatal(err)
		}
	}
	last, err := store.LastSeq(ctx)
	if err != nil || last == 0 {
		t.Fatal(last, err)
	}
	defer func(after uint64, release func()) { releaseAfter, releaseMemory = after, release }(releaseAfter, releaseMemory)
	for _, c := range []struct {
		after uint64
		want  bool
	}{{last + 1, false}, {last, true}} {
		var released atomic.Bool
		releaseAfter, releaseMemory = c.after, func() { released.Store(true) }
		p := New(store, nil, engine.Base{})
		if err := p.Start(ctx); err != nil {
			t.Fatal(err)
		}
		p.Stop()
		if released.Load() != c.want {
			t.Errorf("a replay of %d events with the release after %d: released %v, want %v", last, c.after, released.Load(), c.want)
		}
	}
}

// releases is a projector following a stream of the finished records of tasks
// tasks, with the release's thresholds set for a test (and set back after it),
// its looks at the stream made by the test, and its releases counted.
type releases struct {
	t          *testing.T
	p          *Projector
	n          atomic.Int64
	ticks      chan time.Time
	appended   int
	recs       []events.Record
	appendUpTo func(n int) // appends the records up to n and waits for the projector
}

// looked has the projector look n times at the stream, every event appended so
// far in it: it has been quiet for as long.
func (r *releases) looked(n int) {
	r.t.Helper()
	for range n {
		select {
		case r.ticks <- time.Now():
		case <-time.After(10 * time.Second):
			r.t.Fatal("the projector no longer looks at the stream")
		}
		if applied := r.p.TestSignals.looked.WaitFor(10*time.Second, "a look at the stream", nil); applied != uint64(r.appended) {
			r.t.Fatalf("a look saw the stream up to event %d, want %d", applied, r.appended)
		}
	}
}

// released has the projector look at the stream until its release number n,
// for as long as releaseQuiet at most.
func (r *releases) released(n int64) {
	r.t.Helper()
	for range releaseLooks {
		if r.n.Load() >= n {
			return
		}
		r.looked(1)
	}
	if r.n.Load() < n {
		r.t.Fatalf("no release number %d in %d looks at a quiet stream", n, releaseLooks)
	}
}

func newReleases(t *testing.T, tasks int, burst, trickle uint64) *releases {
	t.Helper()
	srv := eventstest.Run(t)
	ctx := context.Background()
	store, err := events.OpenStore(ctx, srv.JS, events.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	r := &releases{t: t, recs: finishedRecords(t, tasks), ticks: make(chan time.Time)}
	burst0, trickle0, share0, release0, ticks0 := releaseBurst, releaseTrickle, releaseShare, releaseMemory, releaseTicks
	t.Cleanup(func() { // after the projector's Stop, registered below
		releaseBurst, releaseTrickle, releaseShare, releaseMemory, releaseTicks = burst0, trickle0, share0, release0, ticks0
	})
	releaseBurst, releaseTrickle, releaseShare = burst, trickle, 10
	releaseMemory = func() { r.n.Add(1) }
	releaseTicks = func(time.Duration) (<-chan time.Time, func()) { return r.ticks, func() {} }
	p := New(store, nil, engine.Base{})
	p.TestSignals.looked.Init(t)
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	r.p = p
	lastOf := map[string]uint64{}
	r.appendUpTo = func(n int) {
		t.Helper()
		for ; r.appended < n; r.appended++ {
			rec := r.recs[r.appended]
			if lastOf[rec.TaskID], err = store.Append(ctx, rec.Event, lastOf[rec.TaskID]); err != nil {
				t.Fatal(err)
			}
		}
		if err := p.WaitFor(ctx, uint64(n)); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// A burst of events applied live is given back to the system once the stream has
// been quiet for a while, once a burst: not for fewer events, and not again while
// the stream stays quiet; a trickle of events, as a few running tasks' ticks make,
// does not hold it off. (The Go runtime would keep an idle server's heap at the
// burst's size: bgtask bench --scenario burst.)
func TestABurstReleasesItsGarbageOnceQuiet(t *testing.T) {
	const burst = 5
	r := newReleases(t, 3, burst, 2)
	quiet := func() { r.looked(2 * releaseLooks) } // twice the time it judges by
	r.appendUpTo(burst - 1)
	quiet()
	if n := r.n.Load(); n != 0 {
		t.Fatalf("%d events, fewer than a burst, released the memory %d times", burst-1, n)
	}
	r.appendUpTo(burst)
	r.released(1)
	if n := r.n.Load(); n != 1 {
		t.Fatalf("a burst of %d events then a quiet stream released the memory %d times, want once", burst, n)
	}
	quiet()
	if n := r.n.Load(); n != 1 {
		t.Fatalf("a quiet stream after the release released the memory %d times more", n-1)
	}
	r.appendUpTo(2 * burst)
	for r.n.Load() == 1 && r.appended < len(r.recs) {
		// One event each two looks: at most releaseTrickle (2) in the three
		// looks of releaseQuiet.
		r.looked(2)
		r.appendUpTo(r.appended + 1)
	}
	if n := r.n.Load(); n != 2 {
		t.Fatalf("a second burst then a trickle of %d events released the memory %d times in all, want twice", r.appended-2*burst, n)
	}
}

// A burst is given back once the stream has calmed to a small share of it, even
// where what goes on is more than a trickle: many running tasks tick, each once in
// 10 s, and would otherwise keep the server at its peak for as long as they run.
func TestABurstIsReleasedBesideTheTicksOfManyRunningTasks(t *testing.T) {
	// A burst of 120 events, then 3 between two looks, 9 in releaseQuiet: more
	// than the trickle, at most a tenth (releaseShare) of the burst.
	const burst, each = 120, 3
	r := newReleases(t, 40, 100, 2)
	r.appendUpTo(burst)
	for r.n.Load() == 0 && r.appended+each <= len(r.recs) {
		r.looked(1)
		r.appendUpTo(r.appended + each)
	}
	if r.n.Load() == 0 {
		t.Fatalf("a burst of %d events then %d more, %d between two looks, never released the memory", burst, r.appended-burst, each)
	}
}

// What the engine recovers at its start is the unsettled tasks alone: their whole
// states, and none of the settled ones, which need nothing more.
func TestUnsettledIsEveryTaskButTheSettledOnes(t *testing.T) {
	recs := finishedRecords(t, 3)
	p := New(nil, nil, engine.Base{})
	for _, rec := range append(append(recs[:6:6], recs[6:10]...), recs[12]) {
		p.apply(rec, nil)
	}
	phases := map[string]engine.Phase{}
	for _, s := range p.Unsettled() {
		phases[s.ID] = s.Phase
		if s.Spec.Prompt == "" {
			t.Errorf("task %s is not whole: %+v", s.ID, s)
		}
	}
	want := map[string]engine.Phase{recs[6].TaskID: engine.PhaseEnded, recs[12].TaskID: engine.PhaseArmed}
	if !reflect.DeepEqual(phases, want) {
		t.Fatalf("unsettled %v, want %v", phases, want)
	}
}

// What the archiver is given is the settled tasks that finished by the cutoff, and
// no other: not one still open, not one finished after it, not one archived.
func TestSettledIsWhatFinishedByTheCutoff(t *testing.T) {
	recs := finishedRecords(t, 4) // task i fires i seconds after the first
	p := New(nil, nil, engine.Base{})
	for _, rec := range append(recs[:18:18], recs[18:22]...) { // the fourth only ends
		p.apply(rec, nil)
	}
	var first engine.State
	for _, rec := range recs[:6] {
		first, _ = engine.Apply(first, rec)
	}
	ev, err := engine.Decide(first, engine.Archive{Seq: 1}, engine.Meta{Writer: "engine", Now: first.FiredAt.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	p.apply(events.Record{Seq: 100, Event: ev}, nil)
	var ids []string
	for _, s := range p.Settled(first.FiredAt.Add(time.Second)) {
		ids = append(ids, s.ID)
	}
	if want := []string{recs[6].TaskID}; !reflect.DeepEqual(ids, want) {
		t.Fatalf("settled by the cutoff: %v, want only the second task %v", ids, want)
	}
}
