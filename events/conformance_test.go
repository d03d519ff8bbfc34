package events_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/events/eventstest"
	"github.com/bgtask/bgtask/internal/testkit"
)

// conformanceDedupe is the suite's dedupe window: short, so that a retry after it
// is tried in the time of a test.
const conformanceDedupe = time.Second

// conformanceRounds is how often the cases that race run in one go: enough that
// the history read after an append that once came back empty on a replicated
// stream (a fresh consumer's first fetch) would be seen.
const conformanceRounds = 30

// topology is where the suite runs: servers, and stores on each of them.
type topology struct {
	// stores are one store per server (or several on one), each with its own
	// connection: a write on one and a read on another cross servers.
	stores []*events.JetStreamStore
	js     []jetstream.JetStream
	conns  []*nats.Conn
	// replicas is how many copies of a stream the topology keeps.
	replicas int
}

func singleNode(t *testing.T) *topology {
	srv := eventstest.Run(t)
	top := &topology{}
	for range 3 {
		nc, js := srv.Connect(t)
		top.add(t, nc, js, 1)
	}
	return top
}

func threeNodes(t *testing.T) *topology {
	testkit.FullOnly(t) // a cluster, as the full lane's tests start
	cluster := eventstest.RunCluster(t, 3)
	top := &topology{}
	for _, s := range cluster.Servers {
		nc, err := nats.Connect(s.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		top.add(t, nc, js, 3)
	}
	return top
}

func (top *topology) add(t *testing.T, nc *nats.Conn, js jetstream.JetStream, replicas int) {
	t.Helper()
	store, err := events.OpenStore(context.Background(), js, events.StreamConfig{Replicas: replicas, Duplicates: conformanceDedupe})
	if err != nil {
		t.Fatal(err)
	}
	top.stores = append(top.stores, store)
	top.js = append(top.js, js)
	top.conns = append(top.conns, nc)
	top.replicas = replicas
}

var taskCounter atomic.Int64

// newTask is a task id no other case of the run uses.
func newTask(t *testing.T) string {
	return fmt.Sprintf("%s-%d", strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())[:min(len(t.Name()), 60)], taskCounter.Add(1))
}

// TestStoreConformance is what every Store must do, on one server and on a
// 3-node cluster with a replicated stream.
func TestStoreConformance(t *testing.T) {
	for _, topo := range []struct {
		name  string
		start func(*testing.T) *topology
	}{{"single-node", singleNode}, {"three-nodes", threeNodes}} {
		t.Run(topo.name, func(t *testing.T) {
			t.Parallel()
			top := topo.start(t)
			for _, c := range []struct {
				name string
				run  func(*testing.T, *topology)
			}{
				{"ConditionalAppendAndConflict", conformConditionalAppend},
				{"RetriedAppendWhoseAckWasLost", conformRetriedAppend},
				{"ConcurrentWritersOnOneTask", conformConcurrentWriters},
				{"HistoryCompleteRightAfterAnAppend", conformHistoryRightAfterAppend},
				{"DedupeWindowEdges", conformDedupeWindow},
				{"CompactionAndArchive", conformCompactionAndArchive},
				{"OneStoredSubjectPerTask", conformOneSubjectPerTask},
				{"LastSeqIsTheLastEventStored", conformLastSeqIsTheLastEventStored},
			} {
				t.Run(c.name, func(t *testing.T) { c.run(t, top) })
			}
		})
	}
}

func armed(t *testing.T, task string) events.Event {
	return mustEvent(t, task, &events.Armed{Spec: []byte(`{}`)})
}

func conformConditionalAppend(t *testing.T, top *topology) {
	ctx := context.Background()
	s := top.stores[0]
	task, other := newTask(t), newTask(t)
	first, err := s.Append(ctx, armed(t, task), 0)
	if err != nil {
		t.Fatal(err)
	}
	// A second "first event" loses: the task is no longer empty.
	if _, err := s.Append(ctx, armed(t, task), 0); !errors.Is(err, events.ErrConflict) {
		t.Fatalf("second armed: %v, want ErrConflict", err)
	}
	// Another task's events do not move this one's sequence.
	if _, err := s.Append(ctx, armed(t, other), 0); err != nil {
		t.Fatal(err)
	}
	spawned, err := s.Append(ctx, mustEvent(t, task, &events.Spawned{Worker: "w1"}), first)
	if err != nil {
		t.Fatalf("spawned after armed: %v", err)
	}
	// A writer that still believes armed is last is fenced, on any server.
	for i, st := range top.stores {
		if _, err := st.Append(ctx, mustEvent(t, task, &events.Spawned{Worker: "w2"}), first); !errors.Is(err, events.ErrConflict) {
			t.Fatalf("stale spawned through store %d: %v, want ErrConflict", i, err)
		}
	}
	// A sequence of another task is no condition for this one.
	if _, err := s.Append(ctx, mustEvent(t, other, &events.Tick{}), spawned); !errors.Is(err, events.ErrConflict) {
		t.Fatalf("append on another task's sequence: %v, want ErrConflict", err)
	}
	last, err := s.Last(ctx, task)
	if err != nil || last.Seq != spawned || last.Type != events.TypeSpawned {
		t.Fatalf("last: %+v, %v; want the spawned at seq %d", last, err, spawned)
	}
	if _, err := s.Last(ctx, newTask(t)); !errors.Is(err, events.ErrNotFound) {
		t.Fatalf("last of an unknown task: %v, want ErrNotFound", err)
	}
	if _, err := s.History(ctx, newTask(t)); !errors.Is(err, events.ErrNotFound) {
		t.Fatalf("history of an unknown task: %v, want ErrNotFound", err)
	}
}

// A retry of an append whose acknowledgement was lost: the server answers it with
// a conflict on one server (10071), a conflict or a duplicate acknowledgement on a
// replicated stream (10164), or, while the first is still being replicated, 10158.
// Each way the store gives the first append's sequence and stores it once.
func conformRetriedAppend(t *testing.T, top *topology) {
	ctx := context.Background()
	for range conformanceRounds {
		task := newTask(t)
		ev := armed(t, task)
		// The same event from every store at once: the first stores it, the others
		// are its retries, some while it is being stored.
		seqs := make([]uint64, len(top.stores))
		errs := make([]error, len(top.stores))
		var wg sync.WaitGroup
		for i, s := range top.stores {
			wg.Go(func() { seqs[i], errs[i] = s.Append(ctx, ev, 0) })
		}
		wg.Wait()
		for i := range seqs {
			if errs[i] != nil || seqs[i] != seqs[0] {
				t.Fatalf("concurrent copies of one append: seqs %v, errors %v; want one sequence", seqs, errs)
			}
		}
		again, err := top.stores[1].Append(ctx, ev, 0)
		if err != nil || again != seqs[0] {
			t.Fatalf("retry: seq %d, %v; want %d", again, err, seqs[0])
		}
		// A retry that no longer is the last event is a conflict, not a success.
		if _, err := top.stores[0].Append(ctx, mustEvent(t, task, &events.Tick{}), seqs[0]); err != nil {
			t.Fatal(err)
		}
		if _, err := top.stores[2].Append(ctx, ev, 0); !errors.Is(err, events.ErrConflict) {
			t.Fatalf("retry after a later event: %v, want ErrConflict", err)
		}
		assertHistory(t, top.stores[0], task, events.TypeArmed, events.TypeTick)
	}
}

func conformConcurrentWriters(t *testing.T, top *topology) {
	ctx := context.Background()
	for range conformanceRounds {
		task := newTask(t)
		first, err := top.stores[0].Append(ctx, armed(t, task), 0)
		if err != nil {
			t.Fatal(err)
		}
		const writers = 8
		var wg sync.WaitGroup
		results := make(chan error, writers)
		for i := range writers {
			s := top.stores[i%len(top.stores)]
			wg.Go(func() {
				_, err := s.Append(ctx, mustEvent(t, task, &events.Spawned{Worker: fmt.Sprint("w", i)}), first)
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
				t.Fatalf("losing append: %v, want ErrConflict", err)
			}
		}
		if won != 1 {
			t.Fatalf("%d writers won, want exactly 1", won)
		}
		for _, s := range top.stores {
			assertHistory(t, s, task, events.TypeArmed, events.TypeSpawned)
		}
	}
}

// Right after an append is acknowledged, every store on every server reads it as
// the task's last event and its history ends with it.
func conformHistoryRightAfterAppend(t *testing.T, top *topology) {
	ctx := context.Background()
	for range conformanceRounds {
		task := newTask(t)
		want := []events.Type{events.TypeArmed, events.TypeSpawned, events.TypeTick, events.TypeExited}
		payloads := []events.Payload{&events.Armed{Spec: []byte(`{}`)}, &events.Spawned{Worker: "w"}, &events.Tick{}, &events.Exited{}}
		var seq uint64
		for i, p := range payloads {
			writer := top.stores[i%len(top.stores)]
			var err error
			if seq, err = writer.Append(ctx, mustEvent(t, task, p), seq); err != nil {
				t.Fatal(err)
			}
			for j, s := range top.stores {
				h, err := s.History(ctx, task)
				if err != nil {
					t.Fatalf("history through store %d right after the append of seq %d: %v", j, seq, err)
				}
				if got := types(h); !reflect.DeepEqual(got, want[:i+1]) || h[len(h)-1].Seq != seq {
					t.Fatalf("history through store %d right after the append of seq %d: %v, want %v", j, seq, got, want[:i+1])
				}
			}
		}
	}
}

// Inside the dedupe window a retry is the server's duplicate; after it, the store
// still recognises its own event as the task's last; either way it is stored once.
func conformDedupeWindow(t *testing.T, top *topology) {
	ctx := context.Background()
	s := top.stores[0]
	task := newTask(t)
	ev := armed(t, task)
	seq, err := s.Append(ctx, ev, 0)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := s.Append(ctx, ev, 0); err != nil || again != seq {
		t.Fatalf("retry inside the window: %d, %v; want %d", again, err, seq)
	}
	// The window has passed for the store once the server no longer answers a
	// retry made as the store makes it, conditional on the task's last sequence,
	// as a duplicate. (A single server checks the condition before the dedupe:
	// there that is at once; a cluster checks it after.)
	asTheStore := jetstream.WithExpectLastSequenceForSubject(0, events.StoredSubject(task))
	awaitForgotten(t, top.js[0], events.TaskSubject(task, ev.Type), ev.ID, asTheStore)
	if again, err := top.stores[1].Append(ctx, ev, 0); err != nil || again != seq {
		t.Fatalf("retry after the window: %d, %v; want %d", again, err, seq)
	}
	tick := mustEvent(t, task, &events.Tick{})
	tickSeq, err := s.Append(ctx, tick, seq)
	if err != nil {
		t.Fatal(err)
	}
	awaitForgotten(t, top.js[0], events.TaskSubject(task, tick.Type), tick.ID, asTheStore)
	// Past the window and no longer last: the event is not written again.
	if _, err := s.Append(ctx, ev, 0); !errors.Is(err, events.ErrConflict) {
		t.Fatalf("retry of an older event after the window: %v, want ErrConflict", err)
	}
	if again, err := s.Append(ctx, tick, seq); err != nil || again != tickSeq {
		t.Fatalf("retry of the last event after the window: %d, %v; want %d", again, err, tickSeq)
	}
	assertHistory(t, s, task, events.TypeArmed, events.TypeTick)
}

func conformCompactionAndArchive(t *testing.T, top *topology) {
	ctx := context.Background()
	s := top.stores[0]
	archive, err := events.OpenArchive(ctx, top.js[0], top.replicas)
	if err != nil {
		t.Fatal(err)
	}
	task, kept := newTask(t), newTask(t)
	var seq, keptSeq uint64
	for _, p := range []events.Payload{&events.Armed{Spec: []byte(`{}`)}, &events.Spawned{Worker: "w"}, &events.Exited{}} {
		if seq, err = s.Append(ctx, mustEvent(t, task, p), seq); err != nil {
			t.Fatal(err)
		}
		if keptSeq, err = s.Append(ctx, mustEvent(t, kept, p), keptSeq); err != nil {
			t.Fatal(err)
		}
	}
	full, err := s.History(ctx, task)
	if err != nil {
		t.Fatal(err)
	}
	archiveSeq, err := archive.Put(ctx, task, full)
	if err != nil {
		t.Fatal(err)
	}
	archivedSeq, err := s.Append(ctx, mustEvent(t, task, &events.Archived{ArchiveSeq: archiveSeq}), seq)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Compact(ctx, task); err != nil {
		t.Fatal(err)
	}
	for i, st := range top.stores {
		h, err := st.History(ctx, task)
		if err != nil || len(h) != 1 || h[0].Seq != archivedSeq || h[0].Type != events.TypeArchived {
			t.Fatalf("history of the compacted task through store %d: %v, %v; want its archived event", i, types(h), err)
		}
	}
	// The stream keeps the archived event alone.
	stream, err := top.js[0].Stream(ctx, events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(events.StoredSubject(task)))
	if err != nil {
		t.Fatal(err)
	}
	if n := info.State.Subjects[events.StoredSubject(task)]; n != 1 {
		t.Fatalf("the compacted task's subject holds %d events, want 1", n)
	}
	got, err := archive.Get(ctx, archiveSeq)
	if err != nil || got.TaskID != task || !reflect.DeepEqual(got.Events, full) {
		t.Fatalf("archived history: %+v, %v; want the %d events before", got, err, len(full))
	}
	// A writer that read the task before it was compacted is fenced.
	if _, err := s.Append(ctx, mustEvent(t, task, &events.Tick{}), seq); !errors.Is(err, events.ErrConflict) {
		t.Fatalf("append after the compaction on a stale sequence: %v, want ErrConflict", err)
	}
	assertHistory(t, s, kept, events.TypeArmed, events.TypeSpawned, events.TypeExited)
}

// Events are published on bgtask.events.<task-id>.<type> — subject permissions
// and core subscriptions by type see them so — and stored on one subject per
// task; a reader takes an event's type from its envelope.
func conformOneSubjectPerTask(t *testing.T, top *topology) {
	ctx := context.Background()
	task := newTask(t)
	sub, err := top.conns[1].SubscribeSync(events.TypeFilter(events.TypeCancelled))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	awaitInterest(t, top.conns[1], top.conns[0])
	var seq uint64
	for _, p := range []events.Payload{&events.Armed{Spec: []byte(`{}`)}, &events.Cancelled{Reason: "r"}} {
		if seq, err = top.stores[0].Append(ctx, mustEvent(t, task, p), seq); err != nil {
			t.Fatal(err)
		}
	}
	for {
		msg, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("no cancelled event on %s: %v", events.TypeFilter(events.TypeCancelled), err)
		}
		if msg.Subject == events.TaskSubject(task, events.TypeCancelled) {
			break
		}
	}
	stream, err := top.js[0].Stream(ctx, events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(">"))
	if err != nil {
		t.Fatal(err)
	}
	if n := info.State.Subjects[events.StoredSubject(task)]; n != 2 {
		t.Errorf("%s holds %d events, want the task's 2", events.StoredSubject(task), n)
	}
	for subject := range info.State.Subjects {
		if strings.Count(subject, ".") != 2 {
			t.Errorf("the stream stores %s, a subject of no one task", subject)
		}
	}
	if uint64(len(info.State.Subjects)) != info.State.NumSubjects {
		t.Errorf("%d subjects listed, %d counted", len(info.State.Subjects), info.State.NumSubjects)
	}
	// One task followed: its events, in order, with their types.
	var followed []events.Type
	err = top.stores[2].Follow(ctx, task, 0, func(rec events.Record, err error) bool {
		followed = append(followed, rec.Type)
		return rec.Seq < seq
	})
	if err != nil || !reflect.DeepEqual(followed, []events.Type{events.TypeArmed, events.TypeCancelled}) {
		t.Fatalf("follow of the task: %v, %v", followed, err)
	}
}

func types(h []events.Record) []events.Type {
	out := make([]events.Type, len(h))
	for i, r := range h {
		out[i] = r.Type
	}
	return out
}

func assertHistory(t *testing.T, s *events.JetStreamStore, task string, want ...events.Type) {
	t.Helper()
	h, err := s.History(context.Background(), task)
	if err != nil {
		t.Fatalf("history of %s: %v", task, err)
	}
	if got := types(h); !reflect.DeepEqual(got, want) {
		t.Fatalf("history of %s: %v, want %v", task, got, want)
	}
	for i := 1; i < len(h); i++ {
		if h[i].Seq <= h[i-1].Seq {
			t.Fatalf("history of %s out of order at %d", task, i)
		}
	}
}

// LastSeq is the sequence of the last event stored, not the stream's last
// sequence: a write that fails for lack of space takes a sequence and stores
// nothing, as a last message deleted leaves it.
func conformLastSeqIsTheLastEventStored(t *testing.T, top *topology) {
	ctx := context.Background()
	task := newTask(t)
	first, err := top.stores[0].Append(ctx, armed(t, task), 0)
	if err != nil {
		t.Fatal(err)
	}
	second, err := top.stores[0].Append(ctx, mustEvent(t, task, &events.Spawned{Worker: "w"}), first)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := top.js[0].Stream(ctx, events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.DeleteMsg(ctx, second); err != nil {
		t.Fatal(err)
	}
	for i, st := range top.stores {
		if got, err := st.LastSeq(ctx); err != nil || got != first {
			t.Fatalf("LastSeq through store %d with the last message gone: %d, %v; want %d", i, got, err, first)
		}
	}
}

// awaitInterest returns once the subscriptions made on sub so far are known
// where pub publishes. In a cluster a subscription reaches the other servers
// over their routes a moment after its own server has it; a subscription made
// after them travels behind them, so a request pub can get answered on it says
// they have arrived.
func awaitInterest(t *testing.T, sub, pub *nats.Conn) {
	t.Helper()
	probe := nats.NewInbox()
	responder, err := sub.Subscribe(probe, func(m *nats.Msg) { _ = m.Respond(nil) })
	if err != nil {
		t.Fatal(err)
	}
	defer responder.Unsubscribe()
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the subscription known across the cluster", func() bool {
		_, err := pub.Request(probe, nil, time.Second)
		return err == nil
	})
}
