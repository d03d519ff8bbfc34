package engine_test

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// longLines is n lines of size bytes of c, each ending in its number.
func longLines(n, size int, c byte) []string {
	out := make([]string, n)
	for i := range out {
		end := fmt.Sprintf(" line %d", i+1)
		out[i] = strings.Repeat(string(c), size-len(end)) + end
	}
	return out
}

// eventLen is how many bytes an event takes as it is stored.
func eventLen(t *testing.T, ev events.Event) int {
	t.Helper()
	raw, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return len(raw)
}

// decided decides c on f's task, checks that the event fits the budget, and
// records it.
func decided(t *testing.T, f *fold, writer string, c engine.Command) events.Event {
	t.Helper()
	ev := f.do(writer, c)
	if n := eventLen(t, ev); n > engine.MaxEventBytes {
		t.Fatalf("%s is %d bytes, over the budget of %d", ev.Type, n, engine.MaxEventBytes)
	}
	return ev
}

const cutMark = "cut to fit bgtask's byte budget]"

// TestOutputOverTheBudgetIsCutToFit: output the worker keeps whole (a thousand
// lines of 2,000 bytes, control bytes that JSON writes as six) gives an exited
// event and a wake-up within the budget, each tail ending with the last line and
// saying what it cut.
func TestOutputOverTheBudgetIsCutToFit(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		spec  string
		run   func(*events.Exited)
		check func(t *testing.T, w events.Wakeup)
	}{
		{"a thousand lines of 2,000 bytes", `{"command":"x","result":{"type":"tail","lines":1000}}`,
			func(r *events.Exited) { r.Tail = longLines(1000, 2000, 'x') }, nil},
		{"NUL bytes", `{"command":"x"}`, func(r *events.Exited) { r.Tail = longLines(50, 2000, 0) }, nil},
		{"ESC bytes", `{"command":"x"}`, func(r *events.Exited) { r.Tail = longLines(60, 2000, 0x1b) }, nil},
		{"HTML characters", `{"command":"x","prompt":"{{result}}\n---\n{{tail}}\n--- exit {{exit_code}}"}`,
			func(r *events.Exited) { r.Tail = longLines(1000, 2000, '<') },
			func(t *testing.T, w events.Wakeup) {
				// Two long placeholders share the prompt; the text around them stays.
				if !strings.HasSuffix(w.Prompt, " line 1000\n--- exit 3") || !strings.Contains(w.Prompt, "\n---\n") {
					t.Errorf("prompt does not keep its text and the tail's end: ...%q", w.Prompt[len(w.Prompt)-200:])
				}
			}},
		{"a result command's megabyte of control bytes", `{"command":"x","max_result_bytes":65000,"result":{"type":"command","argv":["cat"]}}`,
			func(r *events.Exited) {
				r.Tail = longLines(50, 2000, 1)
				r.Result, r.ResultBytes = strings.Repeat("\x01", engine.MaxResultBytesLimit+1), 1<<20
			},
			func(t *testing.T, w events.Wakeup) {
				if !strings.HasPrefix(w.Result, "\x01\x01") || !strings.Contains(w.Result, "[result truncated: ") || !strings.HasSuffix(w.Result, fmt.Sprintf(" of %d bytes]", 1<<20)) {
					t.Errorf("result = %q...%q, want its start and a note", w.Result[:10], w.Result[len(w.Result)-60:])
				}
			}},
		{"a matched line of control bytes", `{"command":"x","completion":{"type":"line_pattern","regex":"^"},"result":{"type":"matched_line"}}`,
			func(r *events.Exited) {
				r.Tail = longLines(1000, 2000, 2)
				r.Matched, r.MatchedLine = true, strings.Repeat("\x02", 2000)
			}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			run := exitRun(3, "")
			tc.run(&run)
			last := run.Tail[len(run.Tail)-1]
			f := newFold(t, taskID, mustSpec(t, tc.spec))
			f.do(engineWriter, engine.Arm{Spec: f.spec})
			f.do(workerA, engine.Spawn{})
			decided(t, f, workerA, engine.Exit{Run: run})
			kept := f.state.Run.Tail
			if kept[len(kept)-1] != last || !strings.HasSuffix(kept[0], "earlier lines cut to fit bgtask's byte budget]") {
				t.Fatalf("exited tail: %d lines from %.80q to %.80q, want a marker and the last line", len(kept), kept[0], kept[len(kept)-1])
			}
			if f.state.Run.ExitCode != 3 {
				t.Fatalf("exit code = %d, want 3", f.state.Run.ExitCode)
			}

			decided(t, f, engineWriter, engine.PersistCompletion{})
			w := *f.state.Wakeup
			if n := len(mustJSON(t, w)); n > engine.MaxWakeupBytes {
				t.Fatalf("wake-up is %d bytes, over %d", n, engine.MaxWakeupBytes)
			}
			if w.ExitCode == nil || *w.ExitCode != 3 || w.Status != f.state.Status {
				t.Fatalf("wake-up = %s exit %v, want %s with exit code 3", w.Status, w.ExitCode, f.state.Status)
			}
			if w.Tail[len(w.Tail)-1] != last || !strings.HasSuffix(w.Tail[0], cutMark) {
				t.Fatalf("wake-up tail from %.80q to %.80q, want a marker and the last line", w.Tail[0], w.Tail[len(w.Tail)-1])
			}
			// Cut twice, the tail still counts every line it left out.
			for what, tail := range map[string][]string{"exited": kept, "wake-up": w.Tail} {
				var cut int
				if _, err := fmt.Sscanf(tail[0], "[%d earlier lines", &cut); err != nil || cut+len(tail)-1 != len(run.Tail) {
					t.Errorf("%s tail says %q and keeps %d lines of %d", what, tail[0], len(tail)-1, len(run.Tail))
				}
			}
			if !strings.Contains(w.Prompt, cutMark) {
				t.Errorf("prompt does not say it was cut: %.200q", w.Prompt)
			}
			if tc.check != nil {
				tc.check(t, w)
			} else if !strings.HasSuffix(w.Prompt, last+"\n") {
				t.Errorf("prompt does not end with the last line: ...%q", w.Prompt[len(w.Prompt)-100:])
			}
		})
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// allocated is how many bytes f allocates.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestAnAmplifyingPromptRendersWithinTheBudget: a template of 8,000 {{tail}}
// over a 100 KB tail would be 800 MB whole; it is sized before it is built and
// cut where it reaches the budget, so persisting its wake-up allocates a few
// times the budget, not the prompt.
func TestAnAmplifyingPromptRendersWithinTheBudget(t *testing.T) {
	// Not parallel: the allocation it measures is the whole process's.
	spec := mustSpec(t, `{"command":"x","prompt":"`+strings.Repeat("{{tail}}", 8000)+`"}`)
	run := exitRun(0, "")
	run.Tail = longLines(50, 2000, 'y')
	s := exitedWith(t, spec, run)
	var ev events.Event
	n := allocated(func() {
		var err error
		if ev, err = engine.Decide(s, engine.PersistCompletion{}, engine.Meta{Writer: engineWriter, Now: t0.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("persisting the wake-up allocated %d bytes", n)
	if limit := uint64(16 << 20); n > limit {
		t.Fatalf("persisting the wake-up allocated %d bytes, over %d", n, limit)
	}
	if n := eventLen(t, ev); n > engine.MaxEventBytes {
		t.Fatalf("completion-persisted is %d bytes, over %d", n, engine.MaxEventBytes)
	}
	p, err := ev.Decode()
	if err != nil {
		t.Fatal(err)
	}
	w := p.(*events.CompletionPersisted).Wakeup
	if !strings.HasPrefix(w.Prompt, run.Tail[0]) || !strings.HasSuffix(w.Prompt, "\n[the rest of the prompt was cut to fit bgtask's byte budget]") {
		t.Fatalf("prompt starts %.60q and ends %q, want the tail, then a marker", w.Prompt, w.Prompt[len(w.Prompt)-80:])
	}
}

// TestAnExecArgvRepeatingThePromptIsBounded: each argument of an exec sink stays
// under Linux's limit, and all of them under a megabyte.
func TestAnExecArgvRepeatingThePromptIsBounded(t *testing.T) {
	// Not parallel: the allocation it measures is the whole process's.
	w := events.Wakeup{ID: taskID, Status: engine.StatusSucceeded, Prompt: strings.Repeat("p", 200<<10), Tail: longLines(50, 2000, 't')}
	argv := []string{"notify", "--id", "{{task_id}}"}
	for range 1000 {
		argv = append(argv, "{{prompt}}{{tail}}")
	}
	var out []string
	n := allocated(func() { out = engine.RenderArgv(argv, w) })
	t.Logf("rendering the argv allocated %d bytes", n)
	if n > 16<<20 {
		t.Fatalf("rendering the argv allocated %d bytes", n)
	}
	if out[2] != taskID {
		t.Fatalf("argv[2] = %q, want the task id", out[2])
	}
	total := 0
	for _, a := range out {
		if len(a) >= 128<<10 {
			t.Fatalf("an argument of %d bytes", len(a))
		}
		total += len(a)
	}
	if total > 1<<20 {
		t.Fatalf("argv of %d bytes", total)
	}
}

// TestRegistrationKeepsTheWakeupWithinTheBudget: what a wake-up carries whole,
// and the limits that size the rest, are refused at registration when over it.
func TestRegistrationKeepsTheWakeupWithinTheBudget(t *testing.T) {
	t.Parallel()
	html := strings.Repeat("<", 60<<10) // 360 KiB once JSON-escaped
	cases := []struct{ name, spec, field string }{
		{"max_result_bytes over the limit", fmt.Sprintf(`{"command":"x","max_result_bytes":%d}`, engine.MaxResultBytesLimit+1), "max_result_bytes"},
		{"an origin over what a wake-up carries", `{"command":"x","origin":{"k":"` + html + `"}}`, "origin"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := engine.ParseSpecAt([]byte(tc.spec), t0)
			checkFieldError(t, err, tc.field)
		})
	}
	t.Run("a spec over an event once escaped", func(t *testing.T) {
		t.Parallel()
		spec := mustSpec(t, `{"command":"echo `+html+`"}`)
		_, err := engine.Decide(engine.State{ID: taskID}, engine.Arm{Spec: spec}, engine.Meta{Writer: engineWriter, Now: t0})
		checkFieldError(t, err, "spec")
	})
}

// TestReasonsAreCutToTheirBound: a reason is cut in its event and its wake-up.
func TestReasonsAreCutToTheirBound(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("\x1b", 900<<10)
	f := newFold(t, taskID, mustSpec(t, `{"command":"x"}`))
	f.do(engineWriter, engine.Arm{Spec: f.spec})
	decided(t, f, workerA, engine.Fail{Reason: long})
	if n := len(mustJSON(t, f.state.Reason)); n > engine.MaxReasonBytes || !strings.HasSuffix(f.state.Reason, cutMark) {
		t.Fatalf("reason is %d bytes as JSON ending %q", n, f.state.Reason[len(f.state.Reason)-40:])
	}
	decided(t, f, engineWriter, engine.PersistCompletion{})

	c := newFold(t, taskID, mustSpec(t, `{"command":"x"}`))
	c.do(engineWriter, engine.Arm{Spec: c.spec})
	decided(t, c, engineWriter, engine.Cancel{Reason: long})
	if n := len(mustJSON(t, c.state.CancelledWakeup())); n > engine.MaxWakeupBytes {
		t.Fatalf("cancelled wake-up is %d bytes", n)
	}
}
