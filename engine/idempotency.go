package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/bgtask/bgtask/events"
)

// ErrKeyConflict: the idempotency key already names a task with another spec.
var ErrKeyConflict = errors.New("idempotency key already names a task with another spec")

// KeyConflictError is a registration refused because its idempotency key names a
// task registered with another spec: which task, and which fields differ.
type KeyConflictError struct {
	Key    string
	ID     string
	Fields []string
}

func (e *KeyConflictError) Error() string {
	return fmt.Sprintf("idempotency_key: %q already names task %s, registered with another %s; use another key for another command",
		e.Key, e.ID, strings.Join(e.Fields, ", "))
}

func (e *KeyConflictError) Unwrap() error { return ErrKeyConflict }

// ArchiveReader reads an archived task's history.
type ArchiveReader interface {
	Get(ctx context.Context, seq uint64) (events.ArchivedHistory, error)
}

// specFieldNames are the spec's wire names in the order of its fields.
var specFieldNames = func() []string {
	t := reflect.TypeFor[Spec]()
	names := make([]string, t.NumField())
	for i := range t.NumField() {
		names[i], _, _ = strings.Cut(t.Field(i).Tag.Get("json"), ",")
	}
	return names
}()

// SpecDiff names the fields in which two validated specs differ, in the order of
// the spec's fields; none if they are the same. Both are compared in the form an
// armed event stores, so that what the encoding does not keep (an empty map
// against none, the spacing of an origin) makes no difference. The env of two
// specs with environment caller is not compared: it is whatever shell each was
// registered from, and the same key given again from another one (a new
// terminal, the next turn of an agent) names the same task.
func SpecDiff(a, b Spec) ([]string, error) {
	fa, err := storedFields(a)
	if err != nil {
		return nil, err
	}
	fb, err := storedFields(b)
	if err != nil {
		return nil, err
	}
	var diff []string
	callers := a.Environment == EnvironmentCaller && b.Environment == EnvironmentCaller
	for _, name := range specFieldNames {
		if name == "env" && callers {
			continue
		}
		if !bytes.Equal(fa[name], fb[name]) {
			diff = append(diff, name)
		}
	}
	return diff, nil
}

// storedFields is a spec as an armed event stores it and a replay reads it back,
// by field.
func storedFields(s Spec) (map[string]json.RawMessage, error) {
	raw, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	if s, err = decodeSpec(raw); err != nil {
		return nil, err
	}
	if raw, err = json.Marshal(s); err != nil {
		return nil, err
	}
	var fields map[string]json.RawMessage
	return fields, json.Unmarshal(raw, &fields)
}

// armedState is the state a task had when it was armed: its spec and armed time.
// An archived task's spec is read from the archive; without one, the state is its
// summary, which keeps the command, kind and target of the spec.
func (s *Service) armedState(ctx context.Context, id string) (State, error) {
	history, err := s.store.History(ctx, id)
	if err != nil {
		return State{}, err
	}
	if first := history[0]; first.Type == events.TypeArchived {
		state, _ := Replay(history)
		if s.archive == nil {
			return state, nil
		}
		h, err := s.archive.Get(ctx, state.ArchiveSeq)
		if err != nil {
			return State{}, fmt.Errorf("task %s is archived: %w", id, err)
		}
		if h.TaskID != id || len(h.Events) == 0 {
			return State{}, fmt.Errorf("task %s is archived at seq %d, which holds task %s", id, state.ArchiveSeq, h.TaskID)
		}
		history = h.Events
	}
	armed, err := Apply(State{}, history[0])
	if err != nil {
		return State{}, fmt.Errorf("task %s: its first event: %w", id, err)
	}
	return armed, nil
}

// checkKeyedRetry accepts a registration whose key names a task armed with the
// same spec, and refuses one with another spec: that command would silently not run.
func (s *Service) checkKeyedRetry(ctx context.Context, id string, raw []byte, spec Spec) error {
	first, err := s.armedState(ctx, id)
	if err != nil {
		return err
	}
	var diff []string
	if first.Phase == PhaseArchived {
		diff = summaryDiff(first.Spec, spec)
	} else {
		// A relative deadline counts from the registration that armed the task,
		// so that a retry of the same request names the same time.
		if again, err := ParseSpecAt(raw, first.ArmedAt); err == nil {
			spec = again
		}
		if diff, err = SpecDiff(first.Spec, spec); err != nil {
			return fmt.Errorf("task %s: compare its spec: %w", id, err)
		}
	}
	if len(diff) > 0 {
		return &KeyConflictError{Key: spec.IdempotencyKey, ID: id, Fields: diff}
	}
	return nil
}

// summaryDiff compares a spec with the fields an archived task's summary keeps.
func summaryDiff(summary, spec Spec) []string {
	var diff []string
	if spec.CommandLine() != summary.Command {
		diff = append(diff, "command")
	}
	if spec.Kind != summary.Kind {
		diff = append(diff, "kind")
	}
	if spec.Target != summary.Target {
		diff = append(diff, "target")
	}
	return diff
}
