package engine_test

import (
	"errors"
	"testing"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// A join of all waits for every member; of any, for the first; its wake-up lists
// each member's status and exit code.
func TestAJoinFiresWhenItsMembersEnded(t *testing.T) {
	t.Parallel()
	three := 3
	members := map[string]engine.State{
		"a": {Phase: engine.PhaseFired, Status: engine.StatusSucceeded, Run: &events.Exited{}},
		"b": {Phase: engine.PhaseRunning},
	}
	task := func(id string) (engine.State, bool) { s, ok := members[id]; return s, ok }
	all := engine.State{ID: taskID, Phase: engine.PhaseArmed, Spec: specAt(t, `{"join":{"mode":"all","members":["a","b"]},"target":"t"}`)}
	if end := all.JoinEnd(task); end != nil {
		t.Fatalf("a join of all with b running ended: %+v", end)
	}
	var reads []string
	counted := func(id string) (engine.State, bool) { reads = append(reads, id); return task(id) }
	ofThree := all
	ofThree.Spec.Join = &engine.Join{Mode: engine.JoinAll, Members: []string{"a", "b", "c"}}
	if end := ofThree.JoinEnd(counted); end != nil || len(reads) != 2 {
		t.Fatalf("a join of all with b running: %+v, read %v; want no end, and c not read", end, reads)
	}
	anyOf := all
	anyOf.Spec.Join = &engine.Join{Mode: engine.JoinAny, Members: []string{"a", "b"}}
	if end := anyOf.JoinEnd(task); end == nil || end.Members[0].Status != engine.StatusSucceeded || end.Members[1].Status != "" {
		t.Fatalf("a join of any with a ended: %+v", end)
	}
	members["b"] = engine.State{Phase: engine.PhaseFired, Status: engine.StatusFailed, Run: &events.Exited{ExitCode: three}}
	end := all.JoinEnd(task)
	if end == nil || *end.Members[1].ExitCode != 3 {
		t.Fatalf("a join of all, both ended: %+v", end)
	}
	f := newFold(t, taskID, all.Spec)
	f.do(engineWriter, engine.Arm{Spec: all.Spec})
	f.do(engineWriter, *end)
	f.do(engineWriter, engine.PersistCompletion{})
	w := f.state.Wakeup
	if w.Status != engine.StatusFailed || len(w.Members) != 2 || w.Prompt != "Group task-1 failed. How its members ended:\na succeeded (exit code 0)\nb failed (exit code 3)\nReason: 1 of 2 members did not succeed: b failed (exit code 3)\n" {
		t.Fatalf("wake-up: %+v\n%q", w, w.Prompt)
	}
	var fe *engine.FieldError
	for raw, field := range map[string]string{
		`{"join":{"mode":"most","members":["a"]}}`:              "join.mode",
		`{"join":{"mode":"all","members":[]}}`:                  "join.members",
		`{"command":"x","join":{"mode":"all","members":["a"]}}`: "join",
		`{"command":"x","wake_on":["none","failed"]}`:           "wake_on",
	} {
		if _, err := engine.ParseSpecAt([]byte(raw), t0); !errors.As(err, &fe) || fe.Field != field {
			t.Errorf("%s: %v, want an error naming %s", raw, err, field)
		}
	}
}

// A group succeeds only if each member that ended succeeded: a caller that waits
// for it and goes on (wait GROUP && deploy) must stop at a failure. Of a group of
// any, the members that had not ended count for neither.
func TestAJoinFailsUnlessItsEndedMembersSucceeded(t *testing.T) {
	t.Parallel()
	code := func(n int) *int { return &n }
	cases := []struct {
		name       string
		mode       string
		members    []events.Member
		wantStatus string
		wantReason string
	}{
		{"all succeeded", engine.JoinAll, []events.Member{
			{ID: "a", Status: engine.StatusSucceeded, ExitCode: code(0)}, {ID: "b", Status: engine.StatusSucceeded, ExitCode: code(0)},
		}, engine.StatusSucceeded, ""},
		{"two of three did not", engine.JoinAll, []events.Member{
			{ID: "a", Status: engine.StatusFailed, ExitCode: code(5)}, {ID: "b", Status: engine.StatusSucceeded, ExitCode: code(0)},
			{ID: "c", Status: engine.StatusTimedOut},
		}, engine.StatusFailed, "2 of 3 members did not succeed: a failed (exit code 5), c timed_out"},
		{"any: the first succeeded", engine.JoinAny, []events.Member{
			{ID: "a", Status: engine.StatusSucceeded, ExitCode: code(0)}, {ID: "b"},
		}, engine.StatusSucceeded, ""},
		{"any: the first was cancelled", engine.JoinAny, []events.Member{
			{ID: "a"}, {ID: "b", Status: engine.StatusCancelled},
		}, engine.StatusFailed, "1 of 2 members did not succeed: b cancelled"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			spec := specAt(t, `{"join":{"mode":"`+tc.mode+`","members":["a","b","c"]},"target":"t"}`)
			f := newFold(t, taskID, spec)
			f.do(engineWriter, engine.Arm{Spec: spec})
			f.do(engineWriter, engine.EndJoin{Members: tc.members})
			f.do(engineWriter, engine.PersistCompletion{})
			if w := f.state.Wakeup; w.Status != tc.wantStatus || w.Reason != tc.wantReason {
				t.Fatalf("wake-up: status %q, reason %q; want %q, %q", w.Status, w.Reason, tc.wantStatus, tc.wantReason)
			}
		})
	}
}
