package engine_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// A probe is run again, probe_every after each run that does not meet its rule,
// each run a spawn of its own, until one meets it; the wake-up gives that run's
// output and counts the others.
func TestAProbeRunsAgainUntilItsRuleMatches(t *testing.T) {
	t.Parallel()
	spec := specAt(t, `{"command":"gh run view 1","probe_every":"30s","completion":{"type":"line_pattern","regex":"^done$"}}`)
	f := newFold(t, taskID, spec)
	f.do(engineWriter, engine.Arm{Spec: spec})
	for run := 1; run <= 3; run++ {
		if run > 1 {
			if _, err := engine.Decide(f.state, engine.Spawn{}, engine.Meta{Writer: workerA, Now: f.now}); !errors.Is(err, engine.ErrWrongPhase) {
				t.Fatalf("probe run %d spawned before its time: %v", run, err)
			}
			f.now = f.state.NotBefore()
		}
		f.do(workerA, engine.Spawn{})
		if f.state.Epoch != uint64(run) {
			t.Fatalf("probe run %d at epoch %d", run, f.state.Epoch)
		}
		if run == 3 {
			break
		}
		f.do(workerA, engine.Exit{Run: exitRun(0, "", "running")})
		if f.state.Status != engine.StatusFailed || !f.state.Probing() {
			t.Fatalf("run %d without a match: %s, probing %v", run, f.state.Status, f.state.Probing())
		}
		ended := f.now
		f.do(engineWriter, engine.ProbeLater{})
		if f.state.Phase != engine.PhaseArmed || f.state.Probes != run || f.state.Run != nil {
			t.Fatalf("after probe-scheduled %d: phase %s, probes %d, run %+v", run, f.state.Phase, f.state.Probes, f.state.Run)
		}
		if got := f.state.RetryAt.Sub(ended); got != 30*time.Second+time.Second {
			t.Fatalf("next probe %s after the run ended, want 30s (+1s of the fold's clock)", got)
		}
	}
	run := exitRun(0, "", "done")
	run.Matched, run.MatchedLine = true, "done"
	f.do(workerA, engine.Exit{Run: run})
	if f.state.Probing() {
		t.Fatal("a probe that matched is probed again")
	}
	if _, err := engine.Decide(f.state, engine.ProbeLater{}, engine.Meta{Writer: engineWriter, Now: f.now}); !errors.Is(err, engine.ErrWrongPhase) {
		t.Fatalf("ProbeLater after a match: %v", err)
	}
	f.do(engineWriter, engine.PersistCompletion{})
	w := f.state.Wakeup
	if w.Status != engine.StatusSucceeded || w.Probes != 2 || len(w.Tail) != 1 || w.Tail[0] != "done" {
		t.Fatalf("wake-up: %+v", w)
	}
	if !strings.Contains(w.Prompt, "probe run 3; the 2 before it did not meet its rule") {
		t.Fatalf("prompt %q", w.Prompt)
	}
	if _, problems := engine.Replay(f.history); len(problems) > 0 {
		t.Fatalf("replay: %v", problems)
	}
}

// With no completion rule a probe is done at its first exit 0; a run stopped by
// something else than its own end (the deadline) is not probed again.
func TestAProbeWithoutARuleIsDoneAtExitZero(t *testing.T) {
	t.Parallel()
	spec := specAt(t, `{"command":"curl -f localhost","probe_every":"1s","deadline":"1h"}`)
	f := newFold(t, taskID, spec)
	f.do(engineWriter, engine.Arm{Spec: spec})
	f.do(workerA, engine.Spawn{})
	f.do(workerA, engine.Exit{Run: exitRun(7, "")})
	if !f.state.Probing() {
		t.Fatal("exit 7 is not probed again")
	}
	f.do(engineWriter, engine.ProbeLater{})
	f.now = f.state.NotBefore()
	f.do(workerA, engine.Spawn{})
	f.do(workerA, engine.Exit{Run: exitRun(0, "")})
	if f.state.Status != engine.StatusSucceeded || f.state.Probing() {
		t.Fatalf("exit 0: %s, probing %v", f.state.Status, f.state.Probing())
	}

	g := newFold(t, taskID, spec)
	g.do(engineWriter, engine.Arm{Spec: spec})
	g.do(workerA, engine.Spawn{})
	timedOut := exitRun(143, "SIGTERM")
	timedOut.StoppedBy = events.StoppedByDeadline
	g.do(workerA, engine.Exit{Run: timedOut})
	if g.state.Status != engine.StatusTimedOut || g.state.Probing() {
		t.Fatalf("a probe stopped at its deadline: %s, probing %v", g.state.Status, g.state.Probing())
	}
}

// The deadline bounds the whole: a next run past it is set for the deadline,
// where the task ends timed out with the last run's output and exit code.
func TestAProbeDeadlineEndsItWithTheLastRun(t *testing.T) {
	t.Parallel()
	spec := specAt(t, `{"command":"check","probe_every":"10m","deadline":"5m"}`)
	f := newFold(t, taskID, spec)
	f.do(engineWriter, engine.Arm{Spec: spec})
	f.do(workerA, engine.Spawn{})
	f.do(workerA, engine.Exit{Run: exitRun(2, "", "not yet")})
	f.do(engineWriter, engine.ProbeLater{})
	if !f.state.RetryAt.Equal(spec.DeadlineTime()) {
		t.Fatalf("next probe at %s, want the deadline %s", f.state.RetryAt, spec.DeadlineTime())
	}
	f.now = spec.DeadlineTime()
	f.do(workerA, engine.Spawn{})
	now := f.now
	f.do(workerA, engine.Exit{Run: events.Exited{NotStarted: true, StoppedBy: events.StoppedByDeadline, StartedAt: now, EndedAt: now}})
	if f.state.Status != engine.StatusTimedOut || f.state.Reason != engine.ReasonProbeDeadline || f.state.Probing() {
		t.Fatalf("after the deadline: %s %q, probing %v", f.state.Status, f.state.Reason, f.state.Probing())
	}
	f.do(engineWriter, engine.PersistCompletion{})
	w := f.state.Wakeup
	if w.ExitCode == nil || *w.ExitCode != 2 || len(w.Tail) != 1 || w.Tail[0] != "not yet" || w.Probes != 1 {
		t.Fatalf("wake-up of a probe past its deadline: %+v", w)
	}
}

func TestProbeFieldsAreChecked(t *testing.T) {
	t.Parallel()
	for raw, field := range map[string]string{
		`{"command":"x","probe_every":"soon"}`:                                                                    "probe_every",
		`{"command":"x","probe_every":"100ms"}`:                                                                   "probe_every",
		`{"external":true,"probe_every":"1m"}`:                                                                    "probe_every",
		`{"command":"x","probe_every":"1m","retry":{"max":2}}`:                                                    "retry",
		`{"command":"x","probe_every":"1m","stall_after":"1m","on_stall":"respawn"}`:                              "on_stall",
		`{"command":"x","probe_every":"1m","on_lost":"respawn"}`:                                                  "on_lost",
		`{"command":"x","probe_every":"1m","keep_running":true,"completion":{"type":"line_pattern","regex":"x"}}`: "keep_running",
	} {
		_, err := engine.ParseSpecAt([]byte(raw), t0)
		var fe *engine.FieldError
		if !errors.As(err, &fe) || fe.Field != field {
			t.Errorf("%s: %v, want an error on %s", raw, err, field)
		}
	}
}
