package engine_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// t0 is the clock every pure test starts from.
var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

const (
	taskID       = "task-1"
	engineWriter = "engine-1"
	workerA      = "worker-a"
	workerB      = "worker-b"
)

// testSpecJSON is the spec the state-machine tests arm.
const testSpecJSON = `{"command":"make test","kind":"build","origin":{"key":"chan-1","a":{"b":"deep","n":3}}}`

func mustSpec(t *testing.T, raw string) engine.Spec {
	t.Helper()
	spec, err := engine.ParseSpec([]byte(raw))
	if err != nil {
		t.Fatalf("ParseSpec(%s): %v", raw, err)
	}
	return spec
}

// fold is a task built live, the way the engine and the workers build it: each
// command is decided on the current state, recorded with the next stream sequence,
// and applied.
type fold struct {
	t       *testing.T
	spec    engine.Spec
	state   engine.State
	history []events.Record
	seq     uint64
	now     time.Time
}

func newFold(t *testing.T, id string, spec engine.Spec) *fold {
	return &fold{t: t, spec: spec, state: engine.State{ID: id}, now: t0}
}

// do decides c as writer and applies its event; either failing fails the test.
func (f *fold) do(writer string, c engine.Command) events.Event {
	f.t.Helper()
	f.now = f.now.Add(time.Second)
	ev, err := engine.Decide(f.state, c, engine.Meta{Writer: writer, Now: f.now})
	if err != nil {
		f.t.Fatalf("Decide(%T) in phase %q: %v", c, f.state.Phase, err)
	}
	if err := f.record(ev); err != nil {
		f.t.Fatalf("Apply(%s): %v", ev.Type, err)
	}
	return ev
}

// record gives ev the next stream sequence (other tasks' events sit in between, so
// sequences jump), keeps it in the history and applies it, returning Apply's error.
func (f *fold) record(ev events.Event) error {
	f.seq += 3
	rec := events.Record{Seq: f.seq, Event: ev}
	f.history = append(f.history, rec)
	next, err := engine.Apply(f.state, rec)
	f.state = next
	return err
}

// event builds an event of this task as any writer would, without deciding it.
func (f *fold) event(writer string, epoch uint64, p events.Payload) events.Event {
	f.t.Helper()
	f.now = f.now.Add(time.Second)
	ev, err := events.New(f.state.ID, writer, epoch, f.now, p)
	if err != nil {
		f.t.Fatal(err)
	}
	return ev
}

func exitRun(code int, signal string, tail ...string) events.Exited {
	return events.Exited{
		ExitCode:  code,
		Signal:    signal,
		Tail:      tail,
		StartedAt: t0.Add(2 * time.Second),
		EndedAt:   t0.Add(2*time.Second + 1500*time.Millisecond),
	}
}

// build returns a task of testSpecJSON driven to phase at ("" is a task with no
// events): workerA spawns and runs it and exits 0.
func build(t *testing.T, at engine.Phase) *fold {
	t.Helper()
	f := newFold(t, taskID, mustSpec(t, testSpecJSON))
	if at == "" {
		return f
	}
	f.do(engineWriter, engine.Arm{Spec: f.spec})
	switch at {
	case engine.PhaseArmed:
		return f
	case engine.PhaseCancelled:
		f.do(engineWriter, engine.Cancel{Reason: "not needed"})
		return f
	}
	f.do(workerA, engine.Spawn{Host: "host-a"})
	f.do(workerA, engine.Tick{PID: 4242, OutputBytes: 10})
	if at == engine.PhaseRunning {
		return f
	}
	f.do(workerA, engine.Exit{Run: exitRun(0, "", "ok")})
	if at == engine.PhaseEnded {
		return f
	}
	f.do(engineWriter, engine.PersistCompletion{})
	if at == engine.PhasePersisted {
		return f
	}
	f.do(engineWriter, engine.Fire{InboxSeq: 7})
	if at != engine.PhaseFired {
		t.Fatalf("build: unknown phase %q", at)
	}
	return f
}

func TestApplyFollowsTheHappyPath(t *testing.T) {
	t.Parallel()
	f := build(t, "")
	steps := []struct {
		name       string
		writer     string
		cmd        engine.Command
		wantPhase  engine.Phase
		wantStatus string
		check      func(t *testing.T, s engine.State)
	}{
		{"armed", engineWriter, engine.Arm{Spec: f.spec}, engine.PhaseArmed, "", func(t *testing.T, s engine.State) {
			if got, want := s.ID, taskID; got != want {
				t.Fatalf("ID = %q, want %q", got, want)
			}
			if got, want := s.Spec.Command, "make test"; got != want {
				t.Fatalf("Spec.Command = %q, want %q", got, want)
			}
			if got, want := s.Spec.Target, engine.DefaultTarget; got != want {
				t.Fatalf("Spec.Target = %q, want %q", got, want)
			}
			if got, want := s.ArmedAt, t0.Add(time.Second); !got.Equal(want) {
				t.Fatalf("ArmedAt = %v, want %v", got, want)
			}
		}},
		{"spawned", workerA, engine.Spawn{Host: "host-a"}, engine.PhaseRunning, "", func(t *testing.T, s engine.State) {
			if s.Epoch != 1 || s.Worker != workerA || s.Host != "host-a" {
				t.Fatalf("lease = epoch %d worker %q host %q, want 1 %q host-a", s.Epoch, s.Worker, s.Host, workerA)
			}
			if s.SpawnedAt == nil || !s.SpawnedAt.Equal(t0.Add(2*time.Second)) {
				t.Fatalf("SpawnedAt = %v, want %v", s.SpawnedAt, t0.Add(2*time.Second))
			}
		}},
		{"first tick carries the pid", workerA, engine.Tick{PID: 4242, OutputBytes: 10}, engine.PhaseRunning, "", func(t *testing.T, s engine.State) {
			if s.PID != 4242 || s.OutputBytes != 10 {
				t.Fatalf("pid %d bytes %d, want 4242 10", s.PID, s.OutputBytes)
			}
			if s.LastTickAt == nil || !s.LastTickAt.Equal(t0.Add(3*time.Second)) {
				t.Fatalf("LastTickAt = %v, want %v", s.LastTickAt, t0.Add(3*time.Second))
			}
		}},
		{"later tick keeps the pid", workerA, engine.Tick{OutputBytes: 20}, engine.PhaseRunning, "", func(t *testing.T, s engine.State) {
			if s.PID != 4242 || s.OutputBytes != 20 {
				t.Fatalf("pid %d bytes %d, want 4242 20", s.PID, s.OutputBytes)
			}
		}},
		{"exited", workerA, engine.Exit{Run: exitRun(0, "", "line 1", "line 2")}, engine.PhaseEnded, engine.StatusSucceeded, func(t *testing.T, s engine.State) {
			if s.Run == nil || s.Run.ExitCode != 0 || !reflect.DeepEqual(s.Run.Tail, []string{"line 1", "line 2"}) {
				t.Fatalf("Run = %+v, want exit 0 with the tail", s.Run)
			}
			if s.EndedAt == nil || !s.EndedAt.Equal(exitRun(0, "").EndedAt) {
				t.Fatalf("EndedAt = %v, want the run's end", s.EndedAt)
			}
		}},
		{"completion persisted", engineWriter, engine.PersistCompletion{}, engine.PhasePersisted, engine.StatusSucceeded, func(t *testing.T, s engine.State) {
			if s.Wakeup == nil || s.Wakeup.ID != taskID || s.Wakeup.Status != engine.StatusSucceeded {
				t.Fatalf("Wakeup = %+v, want the task's succeeded wake-up", s.Wakeup)
			}
			if s.PersistedAt == nil {
				t.Fatal("PersistedAt not set")
			}
		}},
		{"fired", engineWriter, engine.Fire{InboxSeq: 7}, engine.PhaseFired, engine.StatusSucceeded, func(t *testing.T, s engine.State) {
			if s.InboxSeq != 7 || s.FiredAt == nil {
				t.Fatalf("InboxSeq %d FiredAt %v, want 7 and set", s.InboxSeq, s.FiredAt)
			}
			if !s.Phase.Terminal() {
				t.Fatal("fired is not terminal")
			}
		}},
	}
	for i, step := range steps {
		f.do(step.writer, step.cmd)
		s := f.state
		if got, want := s.Phase, step.wantPhase; got != want {
			t.Fatalf("%s: phase = %q, want %q", step.name, got, want)
		}
		if got, want := s.Status, step.wantStatus; got != want {
			t.Fatalf("%s: status = %q, want %q", step.name, got, want)
		}
		if got, want := s.Seq, f.seq; got != want {
			t.Fatalf("%s: Seq = %d, want %d", step.name, got, want)
		}
		if got, want := s.Events, i+1; got != want {
			t.Fatalf("%s: Events = %d, want %d", step.name, got, want)
		}
		step.check(t, s)
	}
}

func TestApplyEndsARunThatFailedToStart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		from   engine.Phase
		writer string
	}{
		{"from armed, by any writer", engine.PhaseArmed, workerB},
		{"from running, by the lease holder", engine.PhaseRunning, workerA},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := build(t, tc.from)
			f.do(tc.writer, engine.Fail{Reason: "exec: make: not found"})
			s := f.state
			if s.Phase != engine.PhaseEnded || s.Status != engine.StatusFailed {
				t.Fatalf("phase %q status %q, want ended failed", s.Phase, s.Status)
			}
			if got, want := s.Reason, "exec: make: not found"; got != want {
				t.Fatalf("Reason = %q, want %q", got, want)
			}
			if s.EndedAt == nil || !s.EndedAt.Equal(f.now) {
				t.Fatalf("EndedAt = %v, want %v", s.EndedAt, f.now)
			}
			if s.Run != nil {
				t.Fatalf("Run = %+v, want none", s.Run)
			}
		})
	}
}

func TestApplyCancelsArmedAndRunningTasks(t *testing.T) {
	t.Parallel()
	for _, from := range []engine.Phase{engine.PhaseArmed, engine.PhaseRunning} {
		t.Run(string(from), func(t *testing.T) {
			t.Parallel()
			f := build(t, from)
			f.do(engineWriter, engine.Cancel{Reason: "user asked"})
			s := f.state
			if s.Phase != engine.PhaseCancelled || s.Status != engine.StatusCancelled {
				t.Fatalf("phase %q status %q, want cancelled cancelled", s.Phase, s.Status)
			}
			if got, want := s.Reason, "user asked"; got != want {
				t.Fatalf("Reason = %q, want %q", got, want)
			}
			if !s.Phase.Terminal() {
				t.Fatal("cancelled is not terminal")
			}
		})
	}
}

func TestApplyStatusFollowsTheExit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		code   int
		signal string
		want   string
	}{
		{"exit 0 succeeded", 0, "", engine.StatusSucceeded},
		{"exit 1 failed", 1, "", engine.StatusFailed},
		{"exit 255 failed", 255, "", engine.StatusFailed},
		{"negative code failed", -1, "", engine.StatusFailed},
		{"killed by a signal failed", -1, "KILL", engine.StatusFailed},
		{"signal with code 0 failed", 0, "TERM", engine.StatusFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := build(t, engine.PhaseRunning)
			f.do(workerA, engine.Exit{Run: exitRun(tc.code, tc.signal)})
			if got := f.state.Status; got != tc.want {
				t.Fatalf("status = %q, want %q", got, tc.want)
			}
			f.do(engineWriter, engine.PersistCompletion{})
			if got := f.state.Wakeup.Status; got != tc.want {
				t.Fatalf("wake-up status = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestApplyRejectsEventsThatDoNotFit: an event that does not fit is reported as a
// *TransitionError, the state is left as it was, and only Seq follows the stream.
func TestApplyRejectsEventsThatDoNotFit(t *testing.T) {
	t.Parallel()
	errAny := errors.New("any error")
	cases := []struct {
		name    string
		at      engine.Phase
		event   func(f *fold) events.Event
		wantErr error // errAny: any error, as long as it is reported
	}{
		{"tick from a writer without the lease", engine.PhaseRunning, func(f *fold) events.Event {
			return f.event(workerB, 1, &events.Tick{OutputBytes: 99})
		}, engine.ErrNotOwner},
		{"tick from the holder with a stale epoch", engine.PhaseRunning, func(f *fold) events.Event {
			return f.event(workerA, 0, &events.Tick{OutputBytes: 99})
		}, engine.ErrNotOwner},
		{"tick from the holder with a future epoch", engine.PhaseRunning, func(f *fold) events.Event {
			return f.event(workerA, 2, &events.Tick{OutputBytes: 99})
		}, engine.ErrNotOwner},
		{"exit from a writer without the lease", engine.PhaseRunning, func(f *fold) events.Event {
			r := exitRun(0, "")
			return f.event(workerB, 1, &r)
		}, engine.ErrNotOwner},
		{"exit from the holder with a wrong epoch", engine.PhaseRunning, func(f *fold) events.Event {
			r := exitRun(0, "")
			return f.event(workerA, 5, &r)
		}, engine.ErrNotOwner},
		{"failed while running from a writer without the lease", engine.PhaseRunning, func(f *fold) events.Event {
			return f.event(workerB, 1, &events.Failed{Reason: "x"})
		}, engine.ErrNotOwner},
		{"tick before anything was armed", "", func(f *fold) events.Event {
			return f.event(workerA, 0, &events.Tick{})
		}, engine.ErrWrongPhase},
		{"tick while armed", engine.PhaseArmed, func(f *fold) events.Event {
			return f.event(workerA, 0, &events.Tick{})
		}, engine.ErrWrongPhase},
		{"exit while armed", engine.PhaseArmed, func(f *fold) events.Event {
			r := exitRun(0, "")
			return f.event(workerA, 0, &r)
		}, engine.ErrWrongPhase},
		{"second armed", engine.PhaseArmed, func(f *fold) events.Event {
			return f.event(engineWriter, 0, &events.Armed{Spec: []byte(`{"command":"true"}`)})
		}, engine.ErrWrongPhase},
		{"second spawn", engine.PhaseRunning, func(f *fold) events.Event {
			return f.event(workerB, 2, &events.Spawned{Worker: workerB})
		}, engine.ErrWrongPhase},
		{"spawn with a skipped epoch", engine.PhaseArmed, func(f *fold) events.Event {
			return f.event(workerA, 2, &events.Spawned{Worker: workerA})
		}, errAny},
		{"spawn with epoch 0", engine.PhaseArmed, func(f *fold) events.Event {
			return f.event(workerA, 0, &events.Spawned{Worker: workerA})
		}, errAny},
		{"completion persisted while running", engine.PhaseRunning, func(f *fold) events.Event {
			return f.event(engineWriter, 1, &events.CompletionPersisted{})
		}, engine.ErrWrongPhase},
		{"second completion persisted", engine.PhasePersisted, func(f *fold) events.Event {
			return f.event(engineWriter, 1, &events.CompletionPersisted{})
		}, engine.ErrWrongPhase},
		{"fired before completion persisted", engine.PhaseEnded, func(f *fold) events.Event {
			return f.event(engineWriter, 1, &events.Fired{InboxSeq: 1})
		}, engine.ErrWrongPhase},
		{"second fired", engine.PhaseFired, func(f *fold) events.Event {
			return f.event(engineWriter, 1, &events.Fired{InboxSeq: 8})
		}, engine.ErrWrongPhase},
		{"exit after cancelled", engine.PhaseCancelled, func(f *fold) events.Event {
			r := exitRun(0, "")
			return f.event(workerA, 1, &r)
		}, engine.ErrWrongPhase},
		{"failed after exited", engine.PhaseEnded, func(f *fold) events.Event {
			return f.event(workerA, 1, &events.Failed{Reason: "late"})
		}, engine.ErrWrongPhase},
		{"cancelled after exited", engine.PhaseEnded, func(f *fold) events.Event {
			return f.event(engineWriter, 1, &events.Cancelled{})
		}, engine.ErrWrongPhase},
		{"cancelled after fired", engine.PhaseFired, func(f *fold) events.Event {
			return f.event(engineWriter, 1, &events.Cancelled{})
		}, engine.ErrWrongPhase},
		{"second cancelled", engine.PhaseCancelled, func(f *fold) events.Event {
			return f.event(engineWriter, 0, &events.Cancelled{})
		}, engine.ErrWrongPhase},
		{"unknown event type", engine.PhaseRunning, func(f *fold) events.Event {
			ev := f.event(workerA, 1, &events.Tick{})
			ev.Type = "teleported"
			return ev
		}, errAny},
		{"reserved type without a transition", engine.PhaseRunning, func(f *fold) events.Event {
			ev := f.event(workerA, 1, &events.Tick{})
			ev.Type = events.TypeLost
			return ev
		}, errAny},
		{"payload of the wrong JSON type", engine.PhaseRunning, func(f *fold) events.Event {
			ev := f.event(workerA, 1, &events.Tick{})
			ev.Payload = json.RawMessage(`{"output_bytes":"lots"}`)
			return ev
		}, errAny},
		{"payload that is not JSON", engine.PhaseRunning, func(f *fold) events.Event {
			ev := f.event(workerA, 1, &events.Tick{})
			ev.Payload = json.RawMessage(`{"output_bytes":`)
			return ev
		}, errAny},
		{"envelope version from the future", engine.PhaseRunning, func(f *fold) events.Event {
			ev := f.event(workerA, 1, &events.Tick{})
			ev.V = events.Version + 1
			return ev
		}, errAny},
		{"armed with a spec that does not decode", "", func(f *fold) events.Event {
			return f.event(engineWriter, 0, &events.Armed{Spec: []byte(`"make test"`)})
		}, errAny},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := build(t, tc.at)
			before := f.state
			rec := events.Record{Seq: f.seq + 10, Event: tc.event(f)}

			got, err := engine.Apply(before, rec)
			if err == nil {
				t.Fatalf("Apply accepted the event; state is now %q", got.Phase)
			}
			var te *engine.TransitionError
			if !errors.As(err, &te) {
				t.Fatalf("error %v (%T) is not a *TransitionError", err, err)
			}
			if te.Seq != rec.Seq || te.Type != rec.Type || te.Phase != before.Phase {
				t.Fatalf("TransitionError = seq %d type %q phase %q, want %d %q %q", te.Seq, te.Type, te.Phase, rec.Seq, rec.Type, before.Phase)
			}
			if tc.wantErr != errAny && !errors.Is(err, tc.wantErr) {
				t.Fatalf("error %v does not wrap %v", err, tc.wantErr)
			}
			if before.Phase == "" && !strings.Contains(err.Error(), "phase new") {
				t.Fatalf("error %q does not name the new phase", err)
			}
			want := before
			want.Seq = rec.Seq
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("state changed beyond Seq:\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

// TestApplyAdvancesSeqPastARejectedEvent: the next conditional append must be made
// against the stream's real last event, even when that event was rejected.
func TestApplyAdvancesSeqPastARejectedEvent(t *testing.T) {
	t.Parallel()
	f := build(t, engine.PhaseRunning)
	if err := f.record(f.event(workerB, 1, &events.Tick{OutputBytes: 1})); !errors.Is(err, engine.ErrNotOwner) {
		t.Fatalf("stale tick: got %v, want ErrNotOwner", err)
	}
	if got, want := f.state.Seq, f.seq; got != want {
		t.Fatalf("Seq after a rejected event = %d, want %d", got, want)
	}
	rejectedAt := f.seq
	// The holder's next event is accepted on top of the rejected one.
	f.do(workerA, engine.Exit{Run: exitRun(0, "")})
	if got, want := f.state.Phase, engine.PhaseEnded; got != want {
		t.Fatalf("phase = %q, want %q", got, want)
	}
	if f.state.Seq <= rejectedAt {
		t.Fatalf("Seq = %d, want past the rejected event's %d", f.state.Seq, rejectedAt)
	}
}

func TestDecide(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		at        engine.Phase
		writer    string
		cmd       engine.Command
		wantErr   error
		wantType  events.Type
		wantEpoch uint64
		wantPhase engine.Phase // after the event is applied
	}{
		{"arm a new task", "", engineWriter, engine.Arm{}, nil, events.TypeArmed, 0, engine.PhaseArmed},
		{"arm an armed task", engine.PhaseArmed, engineWriter, engine.Arm{}, engine.ErrWrongPhase, "", 0, ""},
		{"spawn an armed task", engine.PhaseArmed, workerA, engine.Spawn{Host: "h"}, nil, events.TypeSpawned, 1, engine.PhaseRunning},
		{"spawn a task that does not exist", "", workerA, engine.Spawn{}, engine.ErrNotFound, "", 0, ""},
		{"spawn a running task", engine.PhaseRunning, workerB, engine.Spawn{}, engine.ErrWrongPhase, "", 0, ""},
		{"tick by the lease holder", engine.PhaseRunning, workerA, engine.Tick{OutputBytes: 3}, nil, events.TypeTick, 1, engine.PhaseRunning},
		{"tick by another worker", engine.PhaseRunning, workerB, engine.Tick{}, engine.ErrNotOwner, "", 0, ""},
		{"tick an armed task", engine.PhaseArmed, workerA, engine.Tick{}, engine.ErrWrongPhase, "", 0, ""},
		{"exit by the lease holder", engine.PhaseRunning, workerA, engine.Exit{Run: exitRun(1, "")}, nil, events.TypeExited, 1, engine.PhaseEnded},
		{"exit by another worker", engine.PhaseRunning, workerB, engine.Exit{Run: exitRun(0, "")}, engine.ErrNotOwner, "", 0, ""},
		{"exit an ended task", engine.PhaseEnded, workerA, engine.Exit{Run: exitRun(0, "")}, engine.ErrWrongPhase, "", 0, ""},
		{"fail an armed task", engine.PhaseArmed, workerB, engine.Fail{Reason: "no cwd"}, nil, events.TypeFailed, 0, engine.PhaseEnded},
		{"fail a running task by the lease holder", engine.PhaseRunning, workerA, engine.Fail{Reason: "x"}, nil, events.TypeFailed, 1, engine.PhaseEnded},
		{"fail a running task by another worker", engine.PhaseRunning, workerB, engine.Fail{Reason: "x"}, engine.ErrNotOwner, "", 0, ""},
		{"fail a task that does not exist", "", workerA, engine.Fail{}, engine.ErrNotFound, "", 0, ""},
		{"persist an ended task", engine.PhaseEnded, engineWriter, engine.PersistCompletion{}, nil, events.TypeCompletionPersisted, 1, engine.PhasePersisted},
		{"persist a running task", engine.PhaseRunning, engineWriter, engine.PersistCompletion{}, engine.ErrWrongPhase, "", 0, ""},
		{"persist twice", engine.PhasePersisted, engineWriter, engine.PersistCompletion{}, engine.ErrWrongPhase, "", 0, ""},
		{"persist a task that does not exist", "", engineWriter, engine.PersistCompletion{}, engine.ErrNotFound, "", 0, ""},
		{"fire a persisted task", engine.PhasePersisted, engineWriter, engine.Fire{InboxSeq: 3}, nil, events.TypeFired, 1, engine.PhaseFired},
		{"fire before persisting", engine.PhaseEnded, engineWriter, engine.Fire{InboxSeq: 3}, engine.ErrWrongPhase, "", 0, ""},
		{"fire twice", engine.PhaseFired, engineWriter, engine.Fire{InboxSeq: 3}, engine.ErrWrongPhase, "", 0, ""},
		{"cancel an armed task", engine.PhaseArmed, engineWriter, engine.Cancel{}, nil, events.TypeCancelled, 0, engine.PhaseCancelled},
		{"cancel a running task", engine.PhaseRunning, engineWriter, engine.Cancel{}, nil, events.TypeCancelled, 1, engine.PhaseCancelled},
		{"cancel a task that does not exist", "", engineWriter, engine.Cancel{}, engine.ErrNotFound, "", 0, ""},
		{"cancel an ended task", engine.PhaseEnded, engineWriter, engine.Cancel{}, engine.ErrFinished, "", 0, ""},
		{"cancel a persisted task", engine.PhasePersisted, engineWriter, engine.Cancel{}, engine.ErrFinished, "", 0, ""},
		{"cancel a fired task", engine.PhaseFired, engineWriter, engine.Cancel{}, engine.ErrFinished, "", 0, ""},
		{"cancel a cancelled task", engine.PhaseCancelled, engineWriter, engine.Cancel{}, engine.ErrFinished, "", 0, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := build(t, tc.at)
			if arm, ok := tc.cmd.(engine.Arm); ok {
				arm.Spec = f.spec
				tc.cmd = arm
			}
			now := f.now.Add(time.Minute)
			ev, err := engine.Decide(f.state, tc.cmd, engine.Meta{Writer: tc.writer, Now: now})
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Decide: got %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Decide: %v", err)
			}
			if ev.Type != tc.wantType || ev.TaskID != taskID || ev.Writer != tc.writer || ev.Epoch != tc.wantEpoch {
				t.Fatalf("event = %s of %q by %q at epoch %d, want %s of %q by %q at epoch %d",
					ev.Type, ev.TaskID, ev.Writer, ev.Epoch, tc.wantType, taskID, tc.writer, tc.wantEpoch)
			}
			if !ev.Time.Equal(now) || ev.V != events.Version || ev.ID == "" {
				t.Fatalf("envelope = v%d id %q time %v, want v%d, an id, %v", ev.V, ev.ID, ev.Time, events.Version, now)
			}
			if err := f.record(ev); err != nil {
				t.Fatalf("Apply of the decided event: %v", err)
			}
			if got := f.state.Phase; got != tc.wantPhase {
				t.Fatalf("phase after apply = %q, want %q", got, tc.wantPhase)
			}
		})
	}
}

func TestDecideFireNamesTheTargetsInbox(t *testing.T) {
	t.Parallel()
	f := newFold(t, taskID, mustSpec(t, `{"command":"true","target":"agent-7"}`))
	f.do(engineWriter, engine.Arm{Spec: f.spec})
	f.do(workerA, engine.Fail{Reason: "no"})
	f.do(engineWriter, engine.PersistCompletion{})
	ev := f.do(engineWriter, engine.Fire{InboxSeq: 12})
	p, err := ev.Decode()
	if err != nil {
		t.Fatal(err)
	}
	fired := p.(*events.Fired)
	if got, want := fired.Subject, events.InboxSubject("agent-7"); got != want {
		t.Fatalf("fired subject = %q, want %q", got, want)
	}
	if got, want := fired.InboxSeq, uint64(12); got != want {
		t.Fatalf("fired inbox seq = %d, want %d", got, want)
	}
}

// liveHistory builds a task's history step by step, including events that were
// rejected when they were applied, the way the projector saw them live.
func liveHistory(t *testing.T) *fold {
	t.Helper()
	f := newFold(t, taskID, mustSpec(t, `{"command":"make test","env":{"CI":"1"},"kind":"build","origin":{"k":"v"},"prompt":"{{status}}: {{tail}}"}`))
	f.do(engineWriter, engine.Arm{Spec: f.spec})
	f.do(workerA, engine.Spawn{Host: "host-a"})
	f.do(workerA, engine.Tick{PID: 99, OutputBytes: 1})
	if err := f.record(f.event(workerB, 1, &events.Tick{OutputBytes: 5})); err == nil {
		t.Fatal("a tick from a writer without the lease was accepted")
	}
	f.do(workerA, engine.Tick{OutputBytes: 2048})
	bad := f.event(workerA, 1, &events.Tick{})
	bad.Type = "teleported"
	if err := f.record(bad); err == nil {
		t.Fatal("an unknown event was accepted")
	}
	f.do(workerA, engine.Exit{Run: exitRun(3, "", "a", "b")})
	f.do(engineWriter, engine.PersistCompletion{})
	f.do(engineWriter, engine.Fire{InboxSeq: 41})
	return f
}

func TestReplayEqualsTheLiveFold(t *testing.T) {
	t.Parallel()
	f := liveHistory(t)
	got, problems := engine.Replay(f.history)
	if !reflect.DeepEqual(got, f.state) {
		t.Fatalf("replayed state differs from the live one:\n got %+v\nwant %+v", got, f.state)
	}
	if got, want := len(problems), 2; got != want {
		t.Fatalf("Replay reported %d problems, want %d: %v", got, want, problems)
	}
	for _, p := range problems {
		var te *engine.TransitionError
		if !errors.As(p, &te) {
			t.Fatalf("problem %v is not a *TransitionError", p)
		}
	}
	if got, want := got.Phase, engine.PhaseFired; got != want {
		t.Fatalf("replayed phase = %q, want %q", got, want)
	}
}

// TestReplayOfTheStoredBytesEqualsTheLiveFold: the history as it comes back from the
// stream (encoded and decoded) folds to the same state as the live events.
func TestReplayOfTheStoredBytesEqualsTheLiveFold(t *testing.T) {
	t.Parallel()
	f := liveHistory(t)
	stored := make([]events.Record, len(f.history))
	for i, rec := range f.history {
		data, err := json.Marshal(rec.Event)
		if err != nil {
			t.Fatal(err)
		}
		if stored[i], err = events.DecodeRecord(rec.Seq, data); err != nil {
			t.Fatal(err)
		}
	}
	got, _ := engine.Replay(stored)
	if !reflect.DeepEqual(got, f.state) {
		t.Fatalf("state replayed from stored bytes differs from the live one:\n got %+v\nwant %+v", got, f.state)
	}
}

func TestReplayOfEveryPrefixEqualsTheLiveStateAtThatPoint(t *testing.T) {
	t.Parallel()
	f := build(t, "")
	var live []engine.State
	step := func(writer string, c engine.Command) {
		f.do(writer, c)
		live = append(live, f.state)
	}
	step(engineWriter, engine.Arm{Spec: f.spec})
	step(workerA, engine.Spawn{})
	step(workerA, engine.Tick{PID: 1})
	step(workerA, engine.Fail{Reason: "oom"})
	step(engineWriter, engine.PersistCompletion{})
	step(engineWriter, engine.Fire{InboxSeq: 2})
	for i := range f.history {
		got, problems := engine.Replay(f.history[:i+1])
		if len(problems) != 0 {
			t.Fatalf("prefix %d: problems %v", i+1, problems)
		}
		if !reflect.DeepEqual(got, live[i]) {
			t.Fatalf("prefix %d: replayed %+v, live %+v", i+1, got, live[i])
		}
	}
}

func TestReplayOfNothingIsTheEmptyState(t *testing.T) {
	t.Parallel()
	got, problems := engine.Replay(nil)
	if !reflect.DeepEqual(got, engine.State{}) || problems != nil {
		t.Fatalf("Replay(nil) = %+v, %v; want the zero state and no problems", got, problems)
	}
}

// A lost run says why: its worker gone past its lease (the engine's lease check
// gives no reason), or its shim dead (the worker says so), and the wake-up says it.
func TestLostSaysWhyTheRunCannotBeFollowed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, reason, want string
	}{
		{"worker gone", "", "its worker " + workerA + " was gone past its lease"},
		{"shim dead", "the shim died", "the shim died"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := build(t, engine.PhaseRunning)
			f.do(workerA, engine.Lose{Reason: tc.reason})
			if f.state.Status != engine.StatusLost || f.state.Reason != tc.want {
				t.Fatalf("lost task: status %q reason %q, want lost with %q", f.state.Status, f.state.Reason, tc.want)
			}
			f.do(engineWriter, engine.PersistCompletion{})
			if w := f.state.Wakeup; w.Reason != tc.want || !strings.Contains(w.Prompt, tc.want) {
				t.Fatalf("wake-up reason %q, prompt:\n%s\nwant %q in both", w.Reason, w.Prompt, tc.want)
			}
		})
	}
}
