package engine

import (
	"slices"
	"strings"
	"time"

	"github.com/bgtask/bgtask/events"
)

// ListQuery selects tasks: every filter given must hold (none: all tasks).
type ListQuery struct {
	Phase  Phase  `json:"state,omitempty"`
	Status string `json:"status,omitempty"`
	Target string `json:"target,omitempty"`
	Kind   string `json:"kind,omitempty"`
	// Delivery selects by the state of the task's pushes (State.Delivery).
	Delivery string `json:"delivery,omitempty"`
	// Labels are labels the task's placement must require, each with its value.
	Labels map[string]string `json:"labels,omitempty"`
	// Since and Until bound the time the task was armed (registered): Since
	// itself is in, Until is not.
	Since time.Time `json:"since,omitzero"`
	Until time.Time `json:"until,omitzero"`
	// Limit caps the answer; 0 means all.
	Limit int `json:"limit,omitempty"`
}

// Statuses are the outcomes a finished task may have.
var Statuses = []string{StatusSucceeded, StatusFailed, StatusStalled, StatusTimedOut, StatusCancelled, StatusLost, StatusSkipped}

// Check refuses a query that could only answer nothing, so that a misspelt
// filter is an error naming it rather than an empty list.
func (q ListQuery) Check() error {
	switch {
	case q.Phase != "" && !slices.Contains(Phases, q.Phase):
		return fieldErr("state", "%q is no state; the states are %s", q.Phase, PhaseNames())
	case q.Status != "" && !slices.Contains(Statuses, q.Status):
		return fieldErr("status", "%q is no status; the statuses are %s", q.Status, strings.Join(Statuses, ", "))
	case q.Delivery != "" && !slices.Contains(DeliveryStates, q.Delivery):
		return fieldErr("delivery", "%q is no delivery state; they are %s", q.Delivery, strings.Join(DeliveryStates, ", "))
	case q.Target != "" && !events.ValidToken(q.Target):
		return fieldErr("target", "%q is no target's name: use 1-128 letters, digits, '-' or '_'", q.Target)
	case len(q.Kind) > 64 || strings.ContainsAny(q.Kind, "\x00\n\r"):
		return fieldErr("kind", "a kind is one line of at most 64 bytes")
	case !q.Since.IsZero() && !q.Until.IsZero() && !q.Until.After(q.Since):
		return fieldErr("until", "%s is not after since (%s)", q.Until.Format(time.RFC3339Nano), q.Since.Format(time.RFC3339Nano))
	case q.Limit < 0:
		return fieldErr("limit", "%d is negative; 0 means all", q.Limit)
	}
	return ValidateLabels("labels", q.Labels)
}

// Listed is what a list query selects a task by.
type Listed struct {
	Phase        Phase
	Status       string
	Target, Kind string
	Delivery     string
	Placement    *Placement
	ArmedAt      time.Time
}

// Listed is the state's fields a list query selects by.
func (s *State) Listed() Listed {
	return Listed{Phase: s.Phase, Status: s.Status, Target: s.Spec.Target, Kind: s.Spec.Kind,
		Delivery: s.Delivery, Placement: s.Spec.Placement, ArmedAt: s.ArmedAt}
}

// Selects reports whether the query selects a task (its limit aside).
func (q ListQuery) Selects(t Listed) bool {
	switch {
	case q.Phase != "" && t.Phase != q.Phase, q.Status != "" && t.Status != q.Status,
		q.Target != "" && t.Target != q.Target, q.Kind != "" && t.Kind != q.Kind,
		q.Delivery != "" && t.Delivery != q.Delivery,
		!q.Since.IsZero() && t.ArmedAt.Before(q.Since), !q.Until.IsZero() && !t.ArmedAt.Before(q.Until):
		return false
	case len(q.Labels) == 0:
		return true
	case t.Placement == nil:
		return false
	}
	// The task's placement has every label asked for, as a worker's labels
	// would have to.
	return (&Placement{Labels: q.Labels}).Matches(t.Placement.Labels)
}
