package engine

import (
	"encoding/json"

	"github.com/bgtask/bgtask/events"
)

// The environments a command may start from (Spec.Environment).
const (
	// EnvironmentLogin (the default, written as none): the worker's login
	// environment, with the spec's env set over it.
	EnvironmentLogin = "login"
	// EnvironmentCaller: the spec's env is the whole environment, the one its
	// registrant ran in (`bgtask add` sends its shell's); the worker adds nothing
	// of its own but the task's BGTASK_TASK_ID.
	EnvironmentCaller = "caller"
)

// MaxEnvBytes is the most a spec's env takes as JSON, besides the MaxSpecBytes of
// the rest of the spec: with environment caller it is a whole environment, which
// a developer's shell fills with a few KiB and a CI runner's with tens.
const MaxEnvBytes = 128 << 10

// MaxSpecWithEnvBytes is the most a spec takes as JSON, its env included.
const MaxSpecWithEnvBytes = MaxSpecBytes + MaxEnvBytes

// HiddenValue stands for each value of a spec's env wherever a task is read.
const HiddenValue = "(hidden)"

// validateEnvironment checks environment; login, the default, is written as none.
func (s *Spec) validateEnvironment() error {
	switch s.Environment {
	case "", EnvironmentCaller:
	case EnvironmentLogin:
		s.Environment = ""
	default:
		return fieldErr("environment", "%q: want login (the worker's login environment, the default) or caller (env is the whole environment)", s.Environment)
	}
	return nil
}

// checkSizes holds a spec over MaxSpecBytes to its two budgets: MaxEnvBytes for
// its env, MaxSpecBytes for the rest.
func checkSizes(data []byte) error {
	var fields struct {
		Env json.RawMessage `json:"env"`
	}
	_ = json.Unmarshal(data, &fields) // a spec that does not decode: the decoder says why
	if len(fields.Env) > MaxEnvBytes {
		return fieldErr("env", "%d bytes is over the limit of %d (with environment caller it is the whole environment: pass fewer variables, or use environment login)", len(fields.Env), MaxEnvBytes)
	}
	if rest := len(data) - len(fields.Env); rest > MaxSpecBytes {
		return fieldErr("spec", "%d bytes besides its env is over the limit of %d", rest, MaxSpecBytes)
	}
	return nil
}

// HideEnv is s as every reader of a task sees it: the names of its env, each
// value replaced by HiddenValue. An environment holds secrets (tokens, keys) that
// its registrant meant for the command alone.
func (s Spec) HideEnv() Spec {
	if len(s.Env) == 0 {
		return s
	}
	hidden := make(map[string]string, len(s.Env))
	for name := range s.Env {
		hidden[name] = HiddenValue
	}
	s.Env = hidden
	return s
}

// HideEnvJSON is HideEnv of a spec as JSON (an armed event's, a schedule's). What
// does not decode as a spec is returned as it is.
func HideEnvJSON(raw json.RawMessage) json.RawMessage {
	hidden, _ := hideEnvJSON(raw)
	return hidden
}

// hideEnvJSON is HideEnvJSON, and whether raw had values to hide.
func hideEnvJSON(raw json.RawMessage) (json.RawMessage, bool) {
	s, err := decodeSpec(raw)
	if err != nil || len(s.Env) == 0 {
		return raw, false
	}
	hidden, err := json.Marshal(s.HideEnv())
	if err != nil {
		return raw, false
	}
	return hidden, true
}

// HideEnvIn is rec as every reader of a task's history sees it: an armed event
// with HideEnv of its spec; any other event as it is.
func HideEnvIn(rec events.Record) events.Record {
	if rec.Type != events.TypeArmed {
		return rec
	}
	var armed events.Armed
	if json.Unmarshal(rec.Payload, &armed) != nil {
		return rec
	}
	spec, hidden := hideEnvJSON(armed.Spec)
	if !hidden {
		return rec
	}
	ev := rec.Event
	ev.Payload, _ = json.Marshal(events.Armed{Spec: spec}) // a spec just encoded: it encodes
	return events.Record{Seq: rec.Seq, Event: ev}
}
