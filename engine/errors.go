package engine

import (
	"errors"
	"fmt"
)

var (
	// ErrNotFound: no task has this id.
	ErrNotFound = errors.New("no such task")
	// ErrFinished: the task has already ended; the command changes nothing.
	ErrFinished = errors.New("task already finished")
	// ErrNotOwner: the writer does not hold the task's current lease.
	ErrNotOwner = errors.New("writer does not own the task")
	// ErrWrongPhase: the event or command does not fit the task's lifecycle phase.
	ErrWrongPhase = errors.New("not allowed in the task's phase")
)

// FieldError is a rejected spec: which field, and why.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return fmt.Sprintf("%s: %s", e.Field, e.Reason) }

func fieldErr(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// StateError is a request the task's state refuses (ErrWrongPhase), naming the
// request's field that chose what does not fit: the task's id, or a part of it.
type StateError struct {
	Field  string
	Reason string
}

func (e *StateError) Error() string { return fmt.Sprintf("%s: %s", e.Field, e.Reason) }

func (e *StateError) Unwrap() error { return ErrWrongPhase }

func stateErr(field, format string, args ...any) *StateError {
	return &StateError{Field: field, Reason: fmt.Sprintf(format, args...)}
}
