package events

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/events/eventstest"
)

// oldStreamConfig is the event stream as bgtask made it before one subject per
// task: every event on bgtask.events.<task-id>.<type>.
func oldStreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        StreamName,
		Description: "bgtask lifecycle events, one subject per task and type",
		Subjects:    []string{SubjectPrefix + ".>"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardNew,
		Replicas:    1,
		Duplicates:  DefaultDuplicates,
		AllowDirect: true,
	}
}

// writeOldLayout makes the event stream of the old layout and appends evs to it
// as that layout's Append did: on the event's type subject, with its id as the
// message id, conditional on the last sequence of the task's filter.
func writeOldLayout(t *testing.T, js jetstream.JetStream, evs []Event) {
	t.Helper()
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, oldStreamConfig()); err != nil {
		t.Fatal(err)
	}
	last := map[string]uint64{}
	for _, ev := range evs {
		data, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		filter := SubjectPrefix + "." + ev.TaskID + ".>"
		ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: TaskSubject(ev.TaskID, ev.Type), Data: data, Header: nats.Header{}},
			jetstream.WithMsgID(ev.ID), jetstream.WithExpectStream(StreamName),
			jetstream.WithExpectLastSequenceForSubject(last[ev.TaskID], filter))
		if err != nil {
			t.Fatal(err)
		}
		last[ev.TaskID] = ack.Sequence
		if ev.Type == TypeArchived {
			// The old Compact: the task's filter purged down to its archived event.
			stream, err := js.Stream(ctx, StreamName)
			if err != nil {
				t.Fatal(err)
			}
			if err := stream.Purge(ctx, jetstream.WithPurgeSubject(filter), jetstream.WithPurgeKeep(1)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func oldEvents(t *testing.T) []Event {
	t.Helper()
	ev := func(task string, p Payload) Event {
		e, err := New(task, "engine-1", 1, time.Now(), p)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	return []Event{
		ev("done", &Armed{Spec: []byte(`{"command":"make","idempotency_key":"build-42"}`)}),
		ev("waiting", &Armed{Spec: []byte(`{"command":"true"}`)}),
		ev("done", &Spawned{Worker: "w1"}),
		ev("gone", &Armed{Spec: []byte(`{"command":"true"}`)}),
		ev("done", &Exited{ExitCode: 0}),
		ev("gone", &Cancelled{Reason: "no"}),
		ev("gone", &Archived{ArchiveSeq: 1}),
	}
}

// upgraded checks that the event stream is of the new layout and holds evs, with
// their ids, types and payloads, in their order: every task on its one subject.
func upgraded(t *testing.T, store *JetStreamStore, js jetstream.JetStream, evs []Event) {
	t.Helper()
	ctx := context.Background()
	stream, err := js.Stream(ctx, StreamName)
	if err != nil {
		t.Fatal(err)
	}
	if !isNewLayout(stream.CachedInfo().Config) {
		t.Fatalf("the stream is not of the new layout: %+v", stream.CachedInfo().Config)
	}
	if _, err := js.Stream(ctx, upgradeStreamName); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("%s is left: %v", upgradeStreamName, err)
	}
	want := map[string][]Event{}
	for _, ev := range evs {
		if ev.Type == TypeArchived {
			want[ev.TaskID] = nil // compacted down to it
		}
		want[ev.TaskID] = append(want[ev.TaskID], ev)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(">"))
	if err != nil {
		t.Fatal(err)
	}
	if int(info.State.NumSubjects) != len(want) {
		t.Errorf("%d subjects for %d tasks: %v", info.State.NumSubjects, len(want), info.State.Subjects)
	}
	for task, evs := range want {
		h, err := store.History(ctx, task)
		if err != nil {
			t.Fatalf("history of %s: %v", task, err)
		}
		if len(h) != len(evs) {
			t.Fatalf("history of %s has %d events, want %d", task, len(h), len(evs))
		}
		for i, rec := range h {
			if rec.ID != evs[i].ID || rec.Type != evs[i].Type || string(rec.Payload) != string(evs[i].Payload) {
				t.Fatalf("event %d of %s: %+v, want %+v", i, task, rec.Event, evs[i])
			}
		}
		// Appends go on from the last event's new sequence; the old last event,
		// appended again, is recognised as itself.
		last, before := h[len(h)-1], uint64(0)
		if len(h) > 1 {
			before = h[len(h)-2].Seq
		}
		if again, err := store.Append(ctx, evs[len(evs)-1], before); err != nil || again != last.Seq {
			t.Fatalf("retry of the last event of %s: seq %d, %v; want %d", task, again, err, last.Seq)
		}
	}
	tick, err := New("done", "w1", 1, time.Now(), &Tick{})
	if err != nil {
		t.Fatal(err)
	}
	last, err := store.Last(ctx, "done")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Append(ctx, tick, last.Seq); err != nil {
		t.Fatalf("append after the upgrade: %v", err)
	}
}

func TestAnOldLayoutStreamIsUpgradedWhenOpened(t *testing.T) {
	t.Parallel()
	srv := eventstest.Run(t)
	ctx := context.Background()
	evs := oldEvents(t)
	writeOldLayout(t, srv.JS, evs)
	old, err := ConnectStore(ctx, srv.JS)
	if err != nil {
		t.Fatal(err)
	}
	oldIdentity, err := old.Identity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	store, err := OpenStore(ctx, srv.JS, StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	upgraded(t, store, srv.JS, evs)
	identity, err := store.Identity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if identity == oldIdentity {
		t.Errorf("the upgraded stream has the old one's identity %s: snapshots of the old sequences would be read", identity)
	}
	// Opened again: nothing to upgrade, the same stream.
	again, err := OpenStore(ctx, srv.JS, StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if id, _ := again.Identity(ctx); id != identity {
		t.Errorf("a second open made another stream: %s, was %s", id, identity)
	}
}

// A server that stopped anywhere in an upgrade finishes it the next time it opens
// the stream.
func TestAnUpgradeThatStoppedIsFinished(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, c := range []struct {
		name string
		stop func(t *testing.T, js jetstream.JetStream)
	}{
		{"while copying", func(t *testing.T, js jetstream.JetStream) {
			old, err := js.Stream(ctx, StreamName)
			if err != nil {
				t.Fatal(err)
			}
			cfg := old.CachedInfo().Config
			cfg.Sealed = true
			if _, err := js.UpdateStream(ctx, cfg); err != nil {
				t.Fatal(err)
			}
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: upgradeStreamName, Subjects: []string{upgradeCopyPrefix + ".*"}}); err != nil {
				t.Fatal(err)
			}
			if _, err := js.Publish(ctx, upgradeCopyPrefix+".done", []byte(`{}`)); err != nil {
				t.Fatal(err)
			}
		}},
		{"before the old stream was deleted", func(t *testing.T, js jetstream.JetStream) {
			copyThenStop(t, js)
			writeOldLayout(t, js, oldEvents(t)[:1]) // what a crash left of the old stream
		}},
		{"while making the new stream", func(t *testing.T, js jetstream.JetStream) {
			copyThenStop(t, js)
			restoring := streamConfig(StreamConfig{}.withDefaults())
			restoring.Subjects = []string{upgradeRestorePrefix + ".*"}
			restoring.SubjectTransform = nil
			if _, err := js.CreateStream(ctx, restoring); err != nil {
				t.Fatal(err)
			}
			if _, err := js.Publish(ctx, upgradeRestorePrefix+".done", []byte(`{}`)); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv := eventstest.Run(t)
			evs := oldEvents(t)
			writeOldLayout(t, srv.JS, evs)
			c.stop(t, srv.JS)
			store, err := OpenStore(ctx, srv.JS, StreamConfig{})
			if err != nil {
				t.Fatal(err)
			}
			upgraded(t, store, srv.JS, evs)
		})
	}

	// Stopped after the new stream was made whole and opened: its events, and any
	// appended since, are kept; the copy goes.
	t.Run("before the copy was deleted", func(t *testing.T) {
		t.Parallel()
		srv := eventstest.Run(t)
		evs := oldEvents(t)
		writeOldLayout(t, srv.JS, evs)
		copyThenStop(t, srv.JS)
		copied, err := srv.JS.Stream(ctx, upgradeStreamName)
		if err != nil {
			t.Fatal(err)
		}
		dst, err := srv.JS.CreateStream(ctx, streamConfig(StreamConfig{}.withDefaults()))
		if err != nil {
			t.Fatal(err)
		}
		err = copyEvents(ctx, srv.JS, copied, dst, func(subject string) (string, error) {
			return SubjectPrefix + strings.TrimPrefix(subject, upgradeCopyPrefix), nil
		})
		if err != nil {
			t.Fatal(err)
		}
		later, err := New("waiting", "engine-1", 1, time.Now(), &Cancelled{})
		if err != nil {
			t.Fatal(err)
		}
		store, err := OpenStore(ctx, srv.JS, StreamConfig{})
		if err != nil {
			t.Fatal(err)
		}
		last, err := store.Last(ctx, "waiting")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.Append(ctx, later, last.Seq); err != nil {
			t.Fatal(err)
		}
		if _, err := OpenStore(ctx, srv.JS, StreamConfig{}); err != nil {
			t.Fatal(err)
		}
		upgraded(t, store, srv.JS, append(evs, later))
	})
}

// copyThenStop runs the upgrade's copy of the old stream (steps 1 to 3), as a
// server that stopped right after it.
func copyThenStop(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	ctx := context.Background()
	old, err := js.Stream(ctx, StreamName)
	if err != nil {
		t.Fatal(err)
	}
	if err := copyOldLayout(ctx, js, old); err != nil {
		t.Fatal(err)
	}
}

func TestAStreamOfNoLayoutIsRefused(t *testing.T) {
	t.Parallel()
	srv := eventstest.Run(t)
	ctx := context.Background()
	evs := oldEvents(t)
	writeOldLayout(t, srv.JS, evs)
	if _, err := srv.JS.Publish(ctx, SubjectPrefix+".stray", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	_, err := OpenStore(ctx, srv.JS, StreamConfig{})
	if err == nil || !strings.Contains(err.Error(), "subject bgtask.events.stray is of no task; remove it (nats stream purge BGTASK_EVENTS --subject bgtask.events.stray)") {
		t.Fatalf("open of a stream with a subject of no task: %v", err)
	}
	// Nothing changed: the old stream takes events, and once the stray subject is
	// removed, the upgrade goes through.
	old, err := srv.JS.Stream(ctx, StreamName)
	if err != nil {
		t.Fatal(err)
	}
	if cfg := old.CachedInfo().Config; cfg.Sealed || !reflect.DeepEqual(cfg.Subjects, []string{SubjectPrefix + ".>"}) {
		t.Fatalf("the old stream after a refused upgrade: sealed %v, subjects %v", cfg.Sealed, cfg.Subjects)
	}
	if _, err := srv.JS.Stream(ctx, upgradeStreamName); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("a refused upgrade left %s: %v", upgradeStreamName, err)
	}
	if err := old.Purge(ctx, jetstream.WithPurgeSubject(SubjectPrefix+".stray")); err != nil {
		t.Fatal(err)
	}
	store, err := OpenStore(ctx, srv.JS, StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	upgraded(t, store, srv.JS, evs)
}
