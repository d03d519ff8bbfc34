package engine_test

import (
	"encoding/json"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// A reader of a task gets the names of its env, never the values, and nothing
// else of the spec changes; the spec itself keeps its values.
func TestHideEnvKeepsTheNamesAlone(t *testing.T) {
	t.Parallel()
	spec := engine.Spec{Command: "make", Env: map[string]string{"TOKEN": "s3cr3t", "EMPTY": ""}, Environment: engine.EnvironmentCaller}
	hidden := spec.HideEnv()
	if want := map[string]string{"TOKEN": engine.HiddenValue, "EMPTY": engine.HiddenValue}; !maps.Equal(hidden.Env, want) {
		t.Errorf("HideEnv().Env = %q, want %q", hidden.Env, want)
	}
	if hidden.Command != "make" || hidden.Environment != engine.EnvironmentCaller {
		t.Errorf("HideEnv changed the rest of the spec: %+v", hidden)
	}
	if spec.Env["TOKEN"] != "s3cr3t" {
		t.Error("HideEnv changed the spec it was given")
	}
	if got := (engine.Spec{Command: "make"}).HideEnv(); got.Env != nil {
		t.Errorf("a spec without env got %q", got.Env)
	}
}

// An armed event's spec is read with its env hidden; every other event, and an
// armed one without env, as it is.
func TestHideEnvInAHistory(t *testing.T) {
	t.Parallel()
	armed := func(spec string) events.Record {
		payload, err := json.Marshal(events.Armed{Spec: json.RawMessage(spec)})
		if err != nil {
			t.Fatal(err)
		}
		return events.Record{Seq: 7, Event: events.Event{V: 1, ID: "e1", TaskID: "t1", Type: events.TypeArmed, Time: time.Unix(1, 0).UTC(), Writer: "engine", Payload: payload}}
	}
	rec := engine.HideEnvIn(armed(`{"command":"make","env":{"TOKEN":"s3cr3t"},"environment":"caller","target":"default"}`))
	if strings.Contains(string(rec.Payload), "s3cr3t") || !strings.Contains(string(rec.Payload), `"TOKEN":"`+engine.HiddenValue+`"`) {
		t.Errorf("armed payload %s", rec.Payload)
	}
	p, err := rec.Decode()
	if err != nil {
		t.Fatal(err)
	}
	var spec engine.Spec
	if err := json.Unmarshal(p.(*events.Armed).Spec, &spec); err != nil || spec.Command != "make" || spec.Environment != engine.EnvironmentCaller {
		t.Errorf("the hidden spec reads back as %+v (%v)", spec, err)
	}
	if rec.Seq != 7 || rec.ID != "e1" || rec.TaskID != "t1" || rec.Writer != "engine" {
		t.Errorf("the envelope changed: %+v", rec)
	}
	for _, r := range []events.Record{
		armed(`{"command":"make","target":"default"}`),
		{Seq: 8, Event: events.Event{Type: events.TypeExited, Payload: json.RawMessage(`{"exit_code":0,"tail":["TOKEN=s3cr3t"]}`)}},
	} {
		if got := engine.HideEnvIn(r); string(got.Payload) != string(r.Payload) {
			t.Errorf("%s changed: %s", r.Type, got.Payload)
		}
	}
}
