package engine_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

const pidSpec = `{"process":{"pid":4242,"start":98765,"boot":"98b49cbe-ca14-45a0-bc9e-35d76fb689ac"},"placement":{"labels":{"host":"build-1"}}`

// A watch of a process bgtask did not start ends succeeded when the process ends,
// with no exit code (its parent alone can read it) and a reason that says so.
func TestAWatchedProcessEndsWithNoExitCode(t *testing.T) {
	t.Parallel()
	spec := specAt(t, pidSpec+`,"deadline":"1h"}`)
	if !spec.HasCommand() || spec.IsTimer() || spec.CommandLine() != "pid 4242" {
		t.Fatalf("a watch: runs on a worker %v, timer %v, command line %q", spec.HasCommand(), spec.IsTimer(), spec.CommandLine())
	}
	f := newFold(t, taskID, spec)
	f.do(engineWriter, engine.Arm{Spec: spec})
	f.do(workerA, engine.Spawn{Host: "build-1"})
	f.do(workerA, engine.Exit{Run: events.Exited{WatchedPID: 4242, StartedAt: t0, EndedAt: t0.Add(90e9)}})
	f.do(engineWriter, engine.PersistCompletion{})
	w := f.state.Wakeup
	if w.Status != engine.StatusSucceeded || w.ExitCode != nil || w.Reason != engine.ReasonProcessEnded(4242) {
		t.Fatalf("wake-up: status %s, exit code %v, reason %q", w.Status, w.ExitCode, w.Reason)
	}
	if !strings.Contains(w.Reason, "exit status cannot be read") {
		t.Fatalf("the reason does not say why there is no exit code: %q", w.Reason)
	}
	want := "Background task task-1 succeeded after watching for 1m30s.\nWatched: pid 4242\nReason: " + w.Reason + "\n"
	if w.Prompt != want {
		t.Fatalf("prompt %q, want %q", w.Prompt, want)
	}
}

// At its deadline a watch times out, still with no exit code: the process runs on.
func TestAWatchTimesOutWithNoExitCode(t *testing.T) {
	t.Parallel()
	spec := specAt(t, pidSpec+`,"deadline":"1h"}`)
	f := newFold(t, taskID, spec)
	f.do(engineWriter, engine.Arm{Spec: spec})
	f.do(workerA, engine.Spawn{})
	f.do(workerA, engine.Exit{Run: events.Exited{WatchedPID: 4242, StoppedBy: events.StoppedByDeadline, StartedAt: t0, EndedAt: t0}})
	f.do(engineWriter, engine.PersistCompletion{})
	if w := f.state.Wakeup; w.Status != engine.StatusTimedOut || w.ExitCode != nil {
		t.Fatalf("wake-up: status %s, exit code %v", w.Status, w.ExitCode)
	}
}

// A watch's spec names the process whole (PID, start time, boot) and the host it
// runs on, and nothing that only a command has; each error names its field.
func TestAWatchSpecIsValidated(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ spec, field string }{
		{`{"process":{"pid":0,"start":1,"boot":"b"},"placement":{"labels":{"host":"h"}}}`, "process.pid"},
		{`{"process":{"pid":-4,"start":1,"boot":"b"},"placement":{"labels":{"host":"h"}}}`, "process.pid"},
		{`{"process":{"pid":4242,"boot":"b"},"placement":{"labels":{"host":"h"}}}`, "process.start"},
		{`{"process":{"pid":4242,"start":1},"placement":{"labels":{"host":"h"}}}`, "process.boot"},
		{`{"process":{"pid":4242,"start":1,"boot":"a b"},"placement":{"labels":{"host":"h"}}}`, "process.boot"},
		{`{"process":{"pid":4242,"start":1,"boot":"b"}}`, "placement.labels.host"},
		{`{"process":{"pid":4242,"start":1,"boot":"b"},"placement":{"labels":{"pool":"x"}}}`, "placement.labels.host"},
		{`{"process":{"pid":4242,"start":1,"boot":"b","name":"x"},"placement":{"labels":{"host":"h"}}}`, "process.name"},
	} {
		assertFieldErr(t, c.spec, c.field)
	}
	for _, field := range []string{
		`"command":"true"`, `"argv":["true"]`, `"start_at":"1h"`, `"external":true`,
		`"join":{"mode":"all","members":["a"]}`, `"cwd":"/"`, `"env":{"A":"1"}`,
		`"completion":{"type":"line_pattern","regex":"x"}`, `"keep_running":true`, `"stall_after":"1m"`,
		`"on_stall":"kill"`, `"max_respawns":1`, `"result":{"type":"tail","lines":1}`, `"max_result_bytes":10`,
		`"retry":{"max":1}`, `"after":["a"]`, `"after_policy":"ended"`, `"probe_every":"1m"`,
		`"notify":{"type":"line_pattern","regex":"x"}`,
	} {
		name := strings.Trim(strings.SplitN(field, ":", 2)[0], `"`)
		assertFieldErr(t, pidSpec+","+field+"}", name)
	}
	for _, ok := range []string{`,"deadline":"30m","on_lost":"respawn","wake_on":["timed_out"],"kind":"migration","prompt":"{{status}}"}`, `}`} {
		if _, err := engine.ParseSpecAt([]byte(pidSpec+ok), t0); err != nil {
			t.Fatalf("%s: %v", pidSpec+ok, err)
		}
	}
}

func assertFieldErr(t *testing.T, raw, field string) {
	t.Helper()
	var fe *engine.FieldError
	if _, err := engine.ParseSpecAt([]byte(raw), t0); !errors.As(err, &fe) || fe.Field != field {
		t.Fatalf("%s: %v, want an error naming %s", raw, err, field)
	}
}
