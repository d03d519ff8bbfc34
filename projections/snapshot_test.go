package projections_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/events/eventstest"
	"github.com/bgtask/bgtask/projections"
)

// awaitSnapshot waits until p has written a snapshot of the stream up to seq,
// which it does in the background. Its snapshots signal only if a test set
// p.TestSignals.Snapshotted up before p started.
func awaitSnapshot(t testing.TB, p *projections.Projector, seq uint64) {
	t.Helper()
	p.TestSignals.Snapshotted.WaitFor(20*time.Second, fmt.Sprintf("a snapshot at seq %d", seq), func(at uint64) bool { return at >= seq })
}

// served is what a projector serves.
type served struct {
	All          []engine.State
	Total        int
	ByPhase      map[engine.Phase][]engine.State
	Phases       map[engine.Phase]int
	Problems     []projections.Problem
	ProblemCount int
	Applied      uint64
}

func stateOf(p *projections.Projector) served {
	var s served
	s.All, s.Total = p.List(engine.ListQuery{})
	s.ByPhase = map[engine.Phase][]engine.State{}
	for _, phase := range []engine.Phase{engine.PhaseArmed, engine.PhaseRunning, engine.PhaseEnded, engine.PhasePersisted, engine.PhaseFired, engine.PhaseCancelled, engine.PhaseArchived} {
		s.ByPhase[phase], _ = p.List(engine.ListQuery{Phase: phase})
	}
	s.Phases = p.Phases()
	s.Problems, s.ProblemCount = p.Problems()
	s.Applied = p.Applied()
	return s
}

// sameState fails the test unless two projectors serve the same: equal values,
// not only equal JSON (a number decoded as float64 and as json.Number print alike).
func sameState(t *testing.T, what string, got, want *projections.Projector) {
	t.Helper()
	g, w := stateOf(got), stateOf(want)
	for _, s := range []served{g, w} {
		for phase, tasks := range s.ByPhase {
			if s.Phases[phase] != len(tasks) {
				t.Fatalf("%s: Phases counts %d tasks %s, List lists %d", what, s.Phases[phase], phase, len(tasks))
			}
		}
	}
	if !reflect.DeepEqual(g, w) {
		gj, _ := json.MarshalIndent(g, "", " ")
		wj, _ := json.MarshalIndent(w, "", " ")
		t.Fatalf("%s:\n%s\nfrom a full replay:\n%s", what, gj, wj)
	}
}

func startProjector(t *testing.T, store projections.Log, snaps *projections.Snapshots) *projections.Projector {
	t.Helper()
	p := projections.New(store, nil, engine.Base{})
	if snaps != nil {
		p.UseSnapshots(*snaps)
		p.TestSignals.Snapshotted.Init(t)
	}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

func lastSeq(t *testing.T, store *events.JetStreamStore) uint64 {
	t.Helper()
	seq, err := store.LastSeq(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return seq
}

// armSpec arms a task with the spec in JSON, parsed as the API parses it.
func (w writer) armSpec(spec string) engine.State {
	parsed, err := engine.ParseSpec([]byte(spec))
	if err != nil {
		w.t.Fatal(err)
	}
	id, err := engine.TaskID(parsed)
	if err != nil {
		w.t.Fatal(err)
	}
	return w.do(engine.State{ID: id}, engine.Arm{Spec: parsed}, "engine")
}

// tasksInEveryPhase writes tasks that end up in every phase, one of them with
// big and decimal numbers in its completion rule, one stalled, one with a push
// sink waiting to retry, one archived, and one corrupt event; it returns the
// running and the ended task.
func tasksInEveryPhase(t *testing.T, srv *eventstest.Server, w writer) (running, ended engine.State) {
	t.Helper()
	fired := w.run(w.arm("echo a"), 0)
	fired = w.do(fired, engine.PersistCompletion{}, "engine")
	w.do(fired, engine.Fire{InboxSeq: 1}, "engine")
	ended = w.run(w.arm("exit 1"), 1)
	cancelled := w.do(w.arm("sleep 1"), engine.Cancel{Reason: "test"}, "engine")
	w.do(cancelled, engine.Archive{Seq: 7}, "engine")
	running = w.do(w.arm("sleep 2"), engine.Spawn{Host: "h"}, "w1")
	w.arm("still armed")
	w.armSpec(`{"command":"make","completion":{"type":"json_line","match":{"build_id":12345678901234567891,"ratio":1.50,"ok":true}}}`)
	stalled := w.do(w.armSpec(`{"command":"sleep 3","stall_after":"1m","on_stall":"notify"}`), engine.Spawn{Host: "h"}, "w1")
	w.do(stalled, engine.Stall{SilentFor: time.Minute, Action: engine.OnStallNotify}, "w1")
	pushed := w.run(w.armSpec(`{"command":"echo b","deliver":[{"type":"webhook","url":"http://127.0.0.1:1/hook"}]}`), 0)
	pushed = w.do(pushed, engine.PersistCompletion{}, "engine")
	pushed = w.do(pushed, engine.Fire{InboxSeq: 2}, "engine")
	pushed = w.do(pushed, engine.ClaimDelivery{Sink: 0, Engine: engine.Engine{Writer: "engine", Instance: "i1"}}, "engine")
	w.do(pushed, engine.RecordDelivery{Sink: 0, Outcome: engine.SinkOutcome{Error: "503"}, Backoff: time.Minute}, "engine")
	if _, err := srv.JS.Publish(context.Background(), events.TaskSubject(fired.ID, events.TypeTick), []byte("{broken")); err != nil {
		t.Fatal(err)
	}
	return running, ended
}

func TestStartFromASnapshotEqualsAFullReplay(t *testing.T) {
	t.Parallel()
	srv := eventstest.Run(t)
	store, err := events.OpenStore(context.Background(), srv.JS, events.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	w := writer{t: t, store: store}
	running, ended := tasksInEveryPhase(t, srv, w)
	snaps := projections.Snapshots{Path: filepath.Join(t.TempDir(), "projection.snapshot"), Every: 5}
	first := startProjector(t, store, &snaps)
	snapSeq := lastSeq(t, store)
	// The whole stream was replayed: more events than tasks, so a snapshot is due.
	if r := first.Replayed(); r.SnapshotSeq != 0 || r.Seqs != snapSeq {
		t.Fatalf("first start: %+v, want the whole stream (%d events)", r, snapSeq)
	}
	awaitSnapshot(t, first, snapSeq)

	// After the snapshot, applied live by the first projector too: the running task
	// exits, the ended one is persisted, one more is armed.
	w.do(running, engine.Exit{Run: events.Exited{ExitCode: 3, Tail: []string{"x"}, StartedAt: time.Now(), EndedAt: time.Now()}}, "w1")
	w.do(ended, engine.PersistCompletion{}, "engine")
	w.arm("after the snapshot")
	end := lastSeq(t, store)
	if err := first.WaitFor(context.Background(), end); err != nil {
		t.Fatal(err)
	}

	restarted := startProjector(t, store, &snaps)
	if r := restarted.Replayed(); r.SnapshotSeq != snapSeq || r.Seqs != end-snapSeq || r.SnapshotSkipped != "" {
		t.Fatalf("restart: %+v, want the snapshot at %d and %d events after it", r, snapSeq, end-snapSeq)
	}
	full := startProjector(t, store, nil)
	sameState(t, "state from the snapshot", restarted, full)
	sameState(t, "live state", first, full)
}

func TestASnapshotThatDoesNotFitIsIgnored(t *testing.T) {
	t.Parallel()
	srv := eventstest.Run(t)
	store, err := events.OpenStore(context.Background(), srv.JS, events.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	tasksInEveryPhase(t, srv, writer{t: t, store: store})
	dir := t.TempDir()
	snaps := projections.Snapshots{Path: filepath.Join(dir, "valid.snapshot"), Every: 5}
	p := startProjector(t, store, &snaps)
	awaitSnapshot(t, p, lastSeq(t, store))
	p.Stop()
	valid, err := os.ReadFile(snaps.Path)
	if err != nil {
		t.Fatal(err)
	}
	full := startProjector(t, store, nil)

	// Another stream with the same number of events: a store of another home.
	other := eventstest.Run(t)
	otherStore, err := events.OpenStore(context.Background(), other.JS, events.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	tasksInEveryPhase(t, other, writer{t: t, store: otherStore})

	lines := bytes.SplitAfter(valid, []byte("\n"))
	withHeader := func(field string, value any) []byte {
		var h map[string]any
		if err := json.Unmarshal(lines[0], &h); err != nil {
			t.Fatal(err)
		}
		h[field] = value
		header, err := json.Marshal(h)
		if err != nil {
			t.Fatal(err)
		}
		return bytes.Join(append([][]byte{append(header, '\n')}, lines[1:]...), nil)
	}
	// Still valid JSON: a command changed by one bit.
	damaged := bytes.Replace(valid, []byte(`"command":"sleep 2"`), []byte(`"command":"sleep 3"`), 1)
	cases := []struct {
		name   string
		data   []byte
		store  *events.JetStreamStore
		reason string
	}{
		{"damaged", damaged, store, "CRC"},
		{"cut short", valid[:len(valid)*2/3], store, "cut short"},
		{"empty", nil, store, "empty"},
		{"of another version", withHeader("fingerprint", "0123456789abcdef"), store, "another version of bgtask"},
		{"of another fold", withHeader("version", 0), store, "another version of bgtask"},
		{"of another build", withHeader("build", "0.9.0"), store, "another version of bgtask"},
		{"past the stream's end", withHeader("seq", 1000), store, "past the stream's last event"},
		{"of a stream that went back", withHeader("check_id", "an-event-the-stream-lost"), store, "the stream went back"},
		{"of another stream", valid, otherStore, "another event stream"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-")+".snapshot")
			if err := os.WriteFile(path, c.data, 0o600); err != nil {
				t.Fatal(err)
			}
			p := startProjector(t, c.store, &projections.Snapshots{Path: path, Every: 1000})
			r := p.Replayed()
			if r.SnapshotSeq != 0 || r.Seqs != lastSeq(t, c.store) || !strings.Contains(r.SnapshotSkipped, c.reason) {
				t.Fatalf("replayed %+v, want the whole stream and a reason with %q", r, c.reason)
			}
			if c.store == store {
				sameState(t, "state", p, full)
			}
			if _, err := os.Stat(path); !os.IsNotExist(err) {
				t.Fatalf("the snapshot that was not used is still there: %v", err)
			}
		})
	}
}
