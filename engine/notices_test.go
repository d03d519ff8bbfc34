package engine_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// Notices are numbered in order by the worker that holds the run, up to the rule's
// max; each is an inbox message of its own, and the final wake-up comes after.
func TestNoticesAreNumberedUpToTheirMax(t *testing.T) {
	t.Parallel()
	spec := specAt(t, `{"command":"build","notify":{"type":"line_pattern","regex":"^step","max":2}}`)
	if spec.Notify.Max != 2 || !spec.NoticeMatcher()([]byte("step 1")) || spec.NoticeMatcher()([]byte("other")) {
		t.Fatalf("notify rule %+v", spec.Notify)
	}
	f := newFold(t, taskID, spec)
	f.do(engineWriter, engine.Arm{Spec: spec})
	f.do(workerA, engine.Spawn{})
	if _, err := engine.Decide(f.state, engine.Notice{Lines: []string{"step 1"}}, engine.Meta{Writer: workerB, Now: f.now}); !errors.Is(err, engine.ErrNotOwner) {
		t.Fatalf("a notice from a worker without the lease: %v", err)
	}
	f.do(workerA, engine.Notice{Lines: []string{"step 1"}, Upto: 7})
	f.do(workerA, engine.Notice{Lines: []string{"step 2", "step 3"}, Dropped: 4, Upto: 21})
	if f.state.Notices != 2 || f.state.LastNotice.N != 2 || f.state.NoticeEpoch != 1 || f.state.Phase != engine.PhaseRunning {
		t.Fatalf("after two notices: %+v", f.state)
	}
	if _, err := engine.Decide(f.state, engine.Notice{Lines: []string{"step 4"}}, engine.Meta{Writer: workerA, Now: f.now}); !errors.Is(err, engine.ErrWrongPhase) {
		t.Fatalf("a notice past max: %v", err)
	}
	w := f.state.NoticeWakeup(f.state.LastNotice)
	if w.Notice != "n2" || w.Status != "running" || w.ExitCode != nil || len(w.Tail) != 2 ||
		!strings.Contains(w.Prompt, "notice 2 of its output:\nstep 2\nstep 3\n") || !strings.Contains(w.Prompt, "4 more matching lines") {
		t.Fatalf("notice wake-up %+v", w)
	}
	f.do(workerA, engine.Exit{Run: exitRun(0, "")})
	f.do(engineWriter, engine.PersistCompletion{})
	if f.state.Wakeup.Notice != "" || f.state.Notices != 2 {
		t.Fatalf("final wake-up %+v", f.state.Wakeup)
	}
	if _, problems := engine.Replay(f.history); len(problems) > 0 {
		t.Fatalf("replay: %v", problems)
	}
}

func TestNotifyFieldsAreChecked(t *testing.T) {
	t.Parallel()
	for raw, field := range map[string]string{
		`{"start_at":"1h","notify":{"type":"line_pattern","regex":"x"}}`:                    "notify",
		`{"command":"x","notify":{"type":"exit"}}`:                                          "notify.type",
		`{"command":"x","notify":{"type":"line_pattern"}}`:                                  "notify.regex",
		`{"command":"x","notify":{"type":"line_pattern","regex":"("}}`:                      "notify.regex",
		`{"command":"x","notify":{"type":"json_line"}}`:                                     "notify.match",
		`{"command":"x","notify":{"type":"line_pattern","regex":"x","batch":"soon"}}`:       "notify.batch",
		`{"command":"x","notify":{"type":"line_pattern","regex":"x","min_interval":"-1s"}}`: "notify.min_interval",
		`{"command":"x","notify":{"type":"line_pattern","regex":"x","max":1001}}`:           "notify.max",
		`{"command":"x","notify":{"type":"line_pattern","regex":"x","every":"1s"}}`:         "notify.every",
	} {
		_, err := engine.ParseSpecAt([]byte(raw), t0)
		var fe *engine.FieldError
		if !errors.As(err, &fe) || fe.Field != field {
			t.Errorf("%s: %v, want an error on %s", raw, err, field)
		}
	}
}

// A notice record that does not follow the last (a forged or doubled one) does not
// fit the task.
func TestANoticeOutOfOrderDoesNotFit(t *testing.T) {
	t.Parallel()
	spec := specAt(t, `{"command":"build","notify":{"type":"line_pattern","regex":"x"}}`)
	f := newFold(t, taskID, spec)
	f.do(engineWriter, engine.Arm{Spec: spec})
	f.do(workerA, engine.Spawn{})
	ev, err := events.New(taskID, workerA, 1, f.now, &events.Notice{N: 2, Lines: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.record(ev); err == nil {
		t.Fatal("notice 2 before notice 1 was applied")
	}
}
