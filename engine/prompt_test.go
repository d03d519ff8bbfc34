package engine_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// promptSpec is a spec with every field a prompt can show, and prompt as its template.
func promptSpec(t *testing.T, prompt string) engine.Spec {
	t.Helper()
	raw, err := json.Marshal(map[string]any{
		"command": "make test",
		"kind":    "build",
		"target":  "agent-1",
		"origin":  map[string]any{"key": "chan-1", "snowflake": int64(1234567890123456789), "inject": "{{task_id}}", "a": map[string]any{"b": "deep", "n": 3, "list": []int{1, 2}}},
		"prompt":  prompt,
	})
	if err != nil {
		t.Fatal(err)
	}
	return mustSpec(t, string(raw))
}

// persist decides PersistCompletion on an ended task and returns the wake-up it fixes.
func persist(t *testing.T, s engine.State) events.Wakeup {
	t.Helper()
	ev, err := engine.Decide(s, engine.PersistCompletion{}, engine.Meta{Writer: engineWriter, Now: t0.Add(time.Hour)})
	if err != nil {
		t.Fatalf("Decide(PersistCompletion): %v", err)
	}
	p, err := ev.Decode()
	if err != nil {
		t.Fatal(err)
	}
	return p.(*events.CompletionPersisted).Wakeup
}

// exitedWith arms spec, runs it and ends the run with run.
func exitedWith(t *testing.T, spec engine.Spec, run events.Exited) engine.State {
	t.Helper()
	f := newFold(t, taskID, spec)
	f.do(engineWriter, engine.Arm{Spec: spec})
	f.do(workerA, engine.Spawn{})
	f.do(workerA, engine.Exit{Run: run})
	return f.state
}

// failedWith arms spec and fails it before it ran.
func failedWith(t *testing.T, spec engine.Spec, reason string) engine.State {
	t.Helper()
	f := newFold(t, taskID, spec)
	f.do(engineWriter, engine.Arm{Spec: spec})
	f.do(workerA, engine.Fail{Reason: reason})
	return f.state
}

// completedWith arms spec, starts its command if started, and completes it from
// outside with result.
func completedWith(t *testing.T, spec engine.Spec, started bool, result string) engine.State {
	t.Helper()
	f := newFold(t, taskID, spec)
	f.do(engineWriter, engine.Arm{Spec: spec})
	if started {
		f.do(workerA, engine.Spawn{})
	}
	f.do(engineWriter, engine.Complete{Result: result})
	return f.state
}

// skippedWith arms spec and skips it for its first dependency, which failed.
func skippedWith(t *testing.T, spec engine.Spec) engine.State {
	t.Helper()
	f := newFold(t, taskID, spec)
	f.do(engineWriter, engine.Arm{Spec: spec})
	f.do(engineWriter, engine.Skip{Dependency: spec.After[0], Status: engine.StatusFailed})
	return f.state
}

func TestPromptRendersEachPlaceholder(t *testing.T) {
	t.Parallel()
	run := events.Exited{
		ExitCode:  2,
		Tail:      []string{"FAIL pkg/a", "exit status 2"},
		StartedAt: t0,
		EndedAt:   t0.Add(90*time.Second + 250*time.Millisecond),
	}
	cases := []struct {
		name   string
		prompt string
		want   string
	}{
		{"result is the tail", "{{result}}", "FAIL pkg/a\nexit status 2"},
		{"exit_code", "{{exit_code}}", "2"},
		{"status", "{{status}}", "failed"},
		{"reason is empty for a run that exited", "[{{reason}}]", "[]"},
		{"task_id", "{{task_id}}", taskID},
		{"kind", "{{kind}}", "build"},
		{"command", "{{command}}", "make test"},
		{"tail", "{{tail}}", "FAIL pkg/a\nexit status 2"},
		{"duration", "{{duration}}", "1m30.25s"},
		{"origin key", "{{origin.key}}", "chan-1"},
		{"nested origin key", "{{origin.a.b}}", "deep"},
		{"origin number as JSON", "{{origin.a.n}}", "3"},
		// Routing ids such as chat or channel ids are often integers beyond 2^53.
		{"large origin integer exactly as given", "{{origin.snowflake}}", "1234567890123456789"},
		{"origin array as JSON", "{{origin.a.list}}", "[1,2]"},
		{"origin object as JSON", "{{origin.a}}", `{"b":"deep","list":[1,2],"n":3}`},
		{"origin values are not templates", "{{origin.inject}}", "{{task_id}}"},
		{"missing origin key is empty", "[{{origin.nope}}]", "[]"},
		{"key below a string is empty", "[{{origin.a.b.c}}]", "[]"},
		{"spaces inside braces", "{{ status }}/{{  exit_code }}", "failed/2"},
		{"literal text around placeholders", "Task {{task_id}} {{status}} (exit {{exit_code}}) for {{origin.key}}.",
			"Task " + taskID + " failed (exit 2) for chan-1."},
		{"a placeholder twice", "{{status}} {{status}}", "failed failed"},
		{"stray closing braces stay", "}} {{status}} }}", "}} failed }}"},
		{"no placeholders", "wake up", "wake up"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := persist(t, exitedWith(t, promptSpec(t, tc.prompt), run))
			if w.Prompt != tc.want {
				t.Fatalf("prompt %q rendered %q, want %q", tc.prompt, w.Prompt, tc.want)
			}
		})
	}
}

func TestPromptOfArgvCommandIsQuoted(t *testing.T) {
	t.Parallel()
	spec := mustSpec(t, `{"argv":["echo","hello world"],"prompt":"ran {{command}}"}`)
	w := persist(t, exitedWith(t, spec, exitRun(0, "")))
	if got, want := w.Prompt, "ran echo 'hello world'"; got != want {
		t.Fatalf("prompt = %q, want %q", got, want)
	}
	if got, want := w.Command, "echo 'hello world'"; got != want {
		t.Fatalf("wake-up command = %q, want %q", got, want)
	}
}

func TestPromptOfATaskThatFailedToStart(t *testing.T) {
	t.Parallel()
	w := persist(t, failedWith(t, promptSpec(t, "{{status}} exit={{exit_code}} reason={{reason}} tail=[{{tail}}] duration=[{{duration}}]"), "exec: make: not found"))
	if got, want := w.Prompt, "failed exit=none reason=exec: make: not found tail=[] duration=[]"; got != want {
		t.Fatalf("prompt = %q, want %q", got, want)
	}
	if w.ExitCode != nil || w.StartedAt != nil || w.EndedAt != nil {
		t.Fatalf("wake-up of a task that never ran has exit code %v, start %v, end %v; want none", w.ExitCode, w.StartedAt, w.EndedAt)
	}
	if got, want := w.Reason, "exec: make: not found"; got != want {
		t.Fatalf("wake-up reason = %q, want %q", got, want)
	}
}

func TestDefaultPrompt(t *testing.T) {
	t.Parallel()
	noPrompt := mustSpec(t, `{"command":"make test","kind":"build"}`)
	cases := []struct {
		name    string
		state   engine.State
		want    []string
		notWant []string
	}{
		{
			name: "succeeded with output",
			state: exitedWith(t, noPrompt, events.Exited{ExitCode: 0, Tail: []string{"ok  pkg/a", "PASS"},
				StartedAt: t0, EndedAt: t0.Add(1500 * time.Millisecond)}),
			want: []string{"Background task " + taskID + " succeeded (exit code 0) after 1.5s.\n",
				"Command: make test\n", "Last 2 lines of output:\nok  pkg/a\nPASS\n"},
			notWant: []string{"Reason:", "printed nothing"},
		},
		{
			name: "failed with an exit code",
			state: exitedWith(t, noPrompt, events.Exited{ExitCode: 2, Tail: []string{"FAIL"},
				StartedAt: t0, EndedAt: t0.Add(time.Second)}),
			want: []string{"Background task " + taskID + " failed (exit code 2)", "Command: make test\n", "Last 1 lines of output:\nFAIL\n"},
		},
		{
			name:  "killed by a signal",
			state: exitedWith(t, noPrompt, events.Exited{ExitCode: -1, Signal: "KILL", StartedAt: t0, EndedAt: t0.Add(time.Second)}),
			want:  []string{" failed (exit code -1, signal KILL)", "It printed nothing.\n"},
		},
		{
			name:    "failed to start",
			state:   failedWith(t, noPrompt, "cwd is gone"),
			want:    []string{"Background task " + taskID + " failed.\n", "Command: make test\n", "Reason: cwd is gone\n", "Its command did not run.\n"},
			notWant: []string{"exit code", "printed nothing"},
		},
		{
			name: "ended by its completion rule",
			state: exitedWith(t, mustSpec(t, `{"command":"make test","completion":{"type":"line_pattern","regex":"^BUILD OK$"}}`),
				events.Exited{ExitCode: 143, Signal: "TERM", Matched: true, MatchedLine: "BUILD OK", StoppedBy: events.StoppedByMatch,
					Tail: []string{"BUILD OK"}, StartedAt: t0, EndedAt: t0.Add(1234567891 * time.Nanosecond)}),
			want: []string{"Background task " + taskID + " succeeded after 1.235s.\n",
				"Reason: its completion rule (line_pattern `^BUILD OK$`) matched the line `BUILD OK`; bgtask then stopped the command (exit code 143, signal TERM)\n",
				"Last 1 lines of output:\nBUILD OK\n"},
			notWant: []string{"succeeded (exit code"},
		},
		{
			name:    "completed from outside while it ran",
			state:   completedWith(t, noPrompt, true, "the CI run passed"),
			want:    []string{"Background task " + taskID + " succeeded.\n", "Reason: completed from outside; bgtask stopped the command\n", "Result: the CI run passed\n"},
			notWant: []string{"printed nothing", "did not run"},
		},
		{
			name:    "completed from outside before it ran",
			state:   completedWith(t, noPrompt, false, ""),
			want:    []string{"Background task " + taskID + " succeeded.\n", "Reason: completed from outside\n", "Its command did not run.\n"},
			notWant: []string{"printed nothing", "Result:"},
		},
		{
			name:    "skipped",
			state:   skippedWith(t, mustSpec(t, `{"command":"make test","after":["dep-1"]}`)),
			want:    []string{"Background task " + taskID + " skipped.\n", "Reason: its dependency dep-1 ended failed, not succeeded\n", "Its command did not run.\n"},
			notWant: []string{"printed nothing"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := persist(t, tc.state)
			for _, s := range tc.want {
				if !strings.Contains(w.Prompt, s) {
					t.Errorf("default prompt does not contain %q:\n%s", s, w.Prompt)
				}
			}
			for _, s := range tc.notWant {
				if strings.Contains(w.Prompt, s) {
					t.Errorf("default prompt contains %q:\n%s", s, w.Prompt)
				}
			}
		})
	}
}

func TestWakeupCarriesTheOutcomeAndRouting(t *testing.T) {
	t.Parallel()
	run := events.Exited{ExitCode: 1, Signal: "", Tail: []string{"x"}, StartedAt: t0, EndedAt: t0.Add(time.Second)}
	w := persist(t, exitedWith(t, promptSpec(t, "{{status}}"), run))
	if w.ID != taskID || w.Status != engine.StatusFailed || w.Kind != "build" || w.Target != "agent-1" || w.Command != "make test" {
		t.Fatalf("wake-up = %+v", w)
	}
	if w.ExitCode == nil || *w.ExitCode != 1 {
		t.Fatalf("exit code = %v, want 1", w.ExitCode)
	}
	if w.StartedAt == nil || !w.StartedAt.Equal(run.StartedAt) || w.EndedAt == nil || !w.EndedAt.Equal(run.EndedAt) {
		t.Fatalf("run times = %v..%v, want %v..%v", w.StartedAt, w.EndedAt, run.StartedAt, run.EndedAt)
	}
	var origin map[string]any
	if err := json.Unmarshal(w.Origin, &origin); err != nil || origin["key"] != "chan-1" {
		t.Fatalf("origin = %s (%v), want the spec's origin", w.Origin, err)
	}
}

func TestCancelledWakeupNamesTheTask(t *testing.T) {
	t.Parallel()
	f := build(t, engine.PhaseArmed)
	f.do(engineWriter, engine.Cancel{Reason: "superseded"})
	w := f.state.CancelledWakeup()
	if w.ID != taskID || w.Status != engine.StatusCancelled || w.Reason != "superseded" || w.ExitCode != nil {
		t.Fatalf("cancelled wake-up = %+v", w)
	}
	if !strings.Contains(w.Prompt, taskID) || !strings.Contains(w.Prompt, "make test") {
		t.Fatalf("prompt %q does not name the task and its command", w.Prompt)
	}
}
