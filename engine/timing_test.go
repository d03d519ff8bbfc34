package engine_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

func specAt(t *testing.T, raw string) engine.Spec {
	t.Helper()
	spec, err := engine.ParseSpecAt([]byte(raw), t0)
	if err != nil {
		t.Fatalf("ParseSpecAt(%s): %v", raw, err)
	}
	return spec
}

// A spec with no command is a timer: it is never spawned, fires once at its time
// with status succeeded and kind timer, and its wake-up says how late it is.
func TestATimerFiresOnceAtItsTimeAndSucceeds(t *testing.T) {
	t.Parallel()
	spec := specAt(t, `{"start_at":"1h","prompt":"remind me: {{late_by}}"}`)
	if spec.Kind != engine.KindTimer || spec.StartAt != t0.Add(time.Hour).Format(time.RFC3339Nano) {
		t.Fatalf("timer spec: kind %q, start_at %q", spec.Kind, spec.StartAt)
	}
	f := newFold(t, taskID, spec)
	f.do(engineWriter, engine.Arm{Spec: spec})
	if _, err := engine.Decide(f.state, engine.Spawn{}, engine.Meta{Writer: workerA, Now: t0.Add(2 * time.Hour)}); !errors.Is(err, engine.ErrWrongPhase) {
		t.Fatalf("spawn of a timer: %v, want ErrWrongPhase", err)
	}
	if _, err := engine.Decide(f.state, engine.ComeDue{}, engine.Meta{Writer: engineWriter, Now: t0.Add(59 * time.Minute)}); !errors.Is(err, engine.ErrWrongPhase) {
		t.Fatalf("a timer due before its time: %v, want ErrWrongPhase", err)
	}
	f.now = t0.Add(time.Hour + 90*time.Second) // do adds a second: 91 s late
	f.do(engineWriter, engine.ComeDue{})
	if f.state.Phase != engine.PhaseEnded || f.state.Status != engine.StatusSucceeded {
		t.Fatalf("after due: %s %s", f.state.Phase, f.state.Status)
	}
	if _, err := engine.Decide(f.state, engine.ComeDue{}, engine.Meta{Writer: engineWriter, Now: f.now}); err == nil {
		t.Fatal("a timer came due twice")
	}
	f.do(engineWriter, engine.PersistCompletion{})
	w := f.state.Wakeup
	if w.Status != engine.StatusSucceeded || w.Kind != engine.KindTimer || w.LateBy != "1m31s" || w.Prompt != "remind me: 1m31s" || w.ExitCode != nil {
		t.Fatalf("wake-up: %+v", w)
	}
}

func TestATimerWithoutAPromptSaysItIsDueAndHowLate(t *testing.T) {
	t.Parallel()
	spec := specAt(t, `{"start_at":"10s"}`)
	f := newFold(t, taskID, spec)
	f.do(engineWriter, engine.Arm{Spec: spec})
	f.now = t0.Add(10 * time.Second)
	f.do(engineWriter, engine.ComeDue{})
	f.do(engineWriter, engine.PersistCompletion{})
	if got, want := f.state.Wakeup.Prompt, "Timer task-1 is due (late by 1s).\n"; got != want {
		t.Fatalf("prompt %q, want %q", got, want)
	}
}

func TestADelayedStartWaitsAndItsDeadlineCountsFromTheStart(t *testing.T) {
	t.Parallel()
	spec := specAt(t, `{"command":"true","start_at":"10m","deadline":"5m"}`)
	if want := t0.Add(15 * time.Minute); !spec.DeadlineTime().Equal(want) {
		t.Fatalf("deadline %s, want %s (5m after the start)", spec.Deadline, want)
	}
	f := newFold(t, taskID, spec)
	f.do(engineWriter, engine.Arm{Spec: spec})
	if _, err := engine.Decide(f.state, engine.Spawn{}, engine.Meta{Writer: workerA, Now: t0.Add(5 * time.Minute)}); !errors.Is(err, engine.ErrWrongPhase) {
		t.Fatalf("spawn before the start: %v, want ErrWrongPhase", err)
	}
	f.now = t0.Add(10*time.Minute + 2*time.Second)
	f.do(workerA, engine.Spawn{})
	if f.state.LateBy != "3s" {
		t.Fatalf("late_by %q, want 3s", f.state.LateBy)
	}
	f.do(workerA, engine.Exit{Run: exitRun(0, "")})
	f.do(engineWriter, engine.PersistCompletion{})
	if f.state.Wakeup.LateBy != "3s" {
		t.Fatalf("wake-up late_by %q", f.state.Wakeup.LateBy)
	}
}

// A command with retries runs again after each attempt its rule names, each run a
// new epoch, and is delivered once, after the last, with the attempts listed.
func TestRetriesRunAgainAndDeliverOnceAfterTheLast(t *testing.T) {
	t.Parallel()
	spec := specAt(t, `{"command":"make","deadline":"1m","retry":{"max":2,"backoff":"10s"}}`)
	f := newFold(t, taskID, spec)
	f.do(engineWriter, engine.Arm{Spec: spec})
	for attempt := 1; attempt <= 3; attempt++ {
		if attempt > 1 {
			if _, err := engine.Decide(f.state, engine.Spawn{}, engine.Meta{Writer: workerA, Now: f.now}); !errors.Is(err, engine.ErrWrongPhase) {
				t.Fatalf("attempt %d spawned before its retry time: %v", attempt, err)
			}
			f.now = f.state.NotBefore()
			if want := f.now.Add(time.Second + time.Minute); !f.state.Spec.DeadlineTime().Equal(want.Add(-time.Second)) {
				t.Fatalf("attempt %d deadline %s, want a minute after its start %s", attempt, f.state.Spec.Deadline, f.now)
			}
		}
		f.do(workerA, engine.Spawn{})
		if f.state.Epoch != uint64(attempt) {
			t.Fatalf("attempt %d at epoch %d", attempt, f.state.Epoch)
		}
		f.do(workerA, engine.Exit{Run: exitRun(3, "")})
		if attempt < 3 {
			if !f.state.Retryable() {
				t.Fatalf("attempt %d not retryable", attempt)
			}
			if _, err := engine.Decide(f.state, engine.PersistCompletion{}, engine.Meta{Writer: engineWriter, Now: f.now}); err != nil {
				t.Fatalf("persist of a retryable attempt is still possible: %v", err)
			}
			f.do(engineWriter, engine.RetryLater{Jitter: 0})
			wait := f.state.RetryAt.Sub(f.now)
			if want := 10 * time.Second << (attempt - 1); wait != want {
				t.Fatalf("retry %d waits %s, want %s", attempt, wait, want)
			}
		}
	}
	if f.state.Retryable() {
		t.Fatal("the last attempt is retryable")
	}
	f.do(engineWriter, engine.PersistCompletion{})
	w := f.state.Wakeup
	if w.Status != engine.StatusFailed || len(w.Attempts) != 2 || w.Attempts[0].Epoch != 1 || *w.Attempts[1].ExitCode != 3 {
		t.Fatalf("wake-up: status %s, attempts %+v", w.Status, w.Attempts)
	}
	if !strings.Contains(w.Prompt, "attempt 3; the earlier ones: failed (exit code 3), failed (exit code 3)") {
		t.Fatalf("prompt: %q", w.Prompt)
	}
	if _, problems := engine.Replay(f.history); len(problems) > 0 {
		t.Fatalf("replay: %v", problems)
	}
}

func TestARetryIsOnlyForTheStatusesItNames(t *testing.T) {
	t.Parallel()
	spec := specAt(t, `{"command":"make","retry":{"max":3,"on":["lost"]}}`)
	f := newFold(t, taskID, spec)
	f.do(engineWriter, engine.Arm{Spec: spec})
	f.do(workerA, engine.Spawn{})
	f.do(workerA, engine.Exit{Run: exitRun(1, "")})
	if f.state.Retryable() {
		t.Fatal("a failed attempt is retried on lost only")
	}
	if _, err := engine.Decide(f.state, engine.RetryLater{}, engine.Meta{Writer: engineWriter, Now: f.now}); !errors.Is(err, engine.ErrWrongPhase) {
		t.Fatalf("RetryLater of a failure the rule does not name: %v", err)
	}
}

func TestRetryBackoffIsCappedAndJitterTakesUpToHalf(t *testing.T) {
	t.Parallel()
	spec := specAt(t, `{"command":"make","retry":{"max":10,"backoff":"1s","max_backoff":"5s"}}`)
	for _, c := range []struct {
		attempts int
		jitter   float64
		want     time.Duration
	}{
		{0, 0, time.Second}, {1, 0, 2 * time.Second}, {2, 0, 4 * time.Second}, {3, 0, 5 * time.Second},
		{8, 0, 5 * time.Second}, {0, 0.5, 750 * time.Millisecond}, {3, 0.999, 2502500 * time.Microsecond},
	} {
		s := engine.State{ID: taskID, Spec: spec, Phase: engine.PhaseEnded, Status: engine.StatusFailed}
		s.Attempts = make([]events.Attempt, c.attempts)
		ev, err := engine.Decide(s, engine.RetryLater{Jitter: c.jitter}, engine.Meta{Writer: engineWriter, Now: t0})
		if err != nil {
			t.Fatal(err)
		}
		p, _ := ev.Decode()
		if got := p.(*events.RetryScheduled).At.Sub(t0); got != c.want {
			t.Errorf("retry after %d attempts, jitter %v: waits %s, want %s", c.attempts, c.jitter, got, c.want)
		}
	}
}

func TestTimingFieldsAreChecked(t *testing.T) {
	t.Parallel()
	for raw, field := range map[string]string{
		`{"start_at":"1h","cwd":"/tmp"}`:                                      "cwd",
		`{"start_at":"1h","deadline":"2h"}`:                                   "deadline",
		`{"start_at":"1h","retry":{"max":1}}`:                                 "retry",
		`{"start_at":"soon"}`:                                                 "start_at",
		`{"start_at":"2020-01-01T00:00:00Z"}`:                                 "start_at",
		`{"command":"x","retry":{"max":0}}`:                                   "retry.max",
		`{"command":"x","retry":{"max":101}}`:                                 "retry.max",
		`{"command":"x","retry":{"max":1,"backoff":"-1s"}}`:                   "retry.backoff",
		`{"command":"x","retry":{"max":1,"backoff":"1m","max_backoff":"1s"}}`: "retry.max_backoff",
		`{"command":"x","retry":{"max":1,"on":["succeeded"]}}`:                "retry.on",
		`{"command":"x","rerun_of":"a b"}`:                                    "rerun_of",
		`{}`:                                                                  "command",
	} {
		_, err := engine.ParseSpecAt([]byte(raw), t0)
		var fe *engine.FieldError
		if !errors.As(err, &fe) || fe.Field != field {
			t.Errorf("%s: %v, want an error on %s", raw, err, field)
		}
	}
}

func TestARerunKeepsTheSpecAndItsTimesFromRegistration(t *testing.T) {
	t.Parallel()
	spec := specAt(t, `{"command":"make","start_at":"10m","deadline":"5m","idempotency_key":"k1","kind":"build"}`)
	s := engine.State{ID: taskID, Spec: spec, ArmedAt: t0, Phase: engine.PhaseFired}
	got := s.RerunSpec()
	if got.RerunOf != taskID || got.IdempotencyKey != "" || got.Kind != "build" || got.Command != "make" {
		t.Fatalf("rerun spec: %+v", got)
	}
	if got.StartAt != "10m0s" || got.Deadline != "5m0s" {
		t.Fatalf("rerun start_at %q, deadline %q; want 10m0s and 5m0s", got.StartAt, got.Deadline)
	}
	later := t0.Add(time.Hour)
	again, err := engine.ParseSpecAt(mustJSON(t, got), later)
	if err != nil {
		t.Fatal(err)
	}
	if !again.StartTime().Equal(later.Add(10*time.Minute)) || !again.DeadlineTime().Equal(later.Add(15*time.Minute)) {
		t.Fatalf("registered again: start %s, deadline %s", again.StartAt, again.Deadline)
	}
}

// A paused task is neither started nor fired until it is resumed; one that has
// started cannot be paused.
func TestAPausedTaskWaitsUntilItIsResumed(t *testing.T) {
	t.Parallel()
	timer := specAt(t, `{"start_at":"1s"}`)
	f := newFold(t, taskID, timer)
	f.do(engineWriter, engine.Arm{Spec: timer})
	f.do(engineWriter, engine.Pause{})
	later := engine.Meta{Writer: engineWriter, Now: t0.Add(time.Hour)}
	if _, err := engine.Decide(f.state, engine.ComeDue{}, later); !errors.Is(err, engine.ErrWrongPhase) {
		t.Fatalf("a paused timer came due: %v", err)
	}
	if _, err := engine.Decide(f.state, engine.Pause{}, later); !errors.Is(err, engine.ErrWrongPhase) {
		t.Fatalf("paused twice: %v", err)
	}
	f.do(engineWriter, engine.Resume{})
	f.now = t0.Add(time.Hour)
	f.do(engineWriter, engine.ComeDue{})

	g := build(t, engine.PhaseArmed)
	g.do(engineWriter, engine.Pause{})
	if _, err := engine.Decide(g.state, engine.Spawn{}, engine.Meta{Writer: workerA, Now: g.now}); !errors.Is(err, engine.ErrWrongPhase) {
		t.Fatalf("a paused task spawned: %v", err)
	}
	g.do(engineWriter, engine.Resume{})
	g.do(workerA, engine.Spawn{})
	if _, err := engine.Decide(g.state, engine.Pause{}, engine.Meta{Writer: engineWriter, Now: g.now}); !errors.Is(err, engine.ErrWrongPhase) {
		t.Fatalf("a running task paused: %v", err)
	}
	for _, h := range [][]events.Record{f.history, g.history} {
		if _, problems := engine.Replay(h); len(problems) > 0 {
			t.Fatalf("replay: %v", problems)
		}
	}
}
