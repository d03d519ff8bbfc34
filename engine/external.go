package engine

import (
	"fmt"
	"slices"
	"strings"

	"github.com/bgtask/bgtask/events"
)

// MaxExternalResultBytes bounds the result an external completion gives.
const MaxExternalResultBytes = 32 << 10

// CompleteStatuses are the outcomes an external completion may give.
var CompleteStatuses = []string{StatusSucceeded, StatusFailed}

// WakeOnStatuses are the outcomes a spec's wake_on may name.
var WakeOnStatuses = []string{StatusSucceeded, StatusFailed, StatusStalled, StatusTimedOut, StatusLost, StatusSkipped}

// HasCommand reports whether the spec runs something on a worker: a command, or
// the watch of a process.
func (s Spec) HasCommand() bool { return s.Command != "" || len(s.Argv) > 0 || s.Process != nil }

// validateExternal checks a spec that waits only for an external completion.
func (s *Spec) validateExternal() error {
	if !s.External {
		return nil
	}
	if s.HasCommand() {
		return fieldErr("external", "only with no command: any task with one can be completed from outside")
	}
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"start_at", s.StartAt != ""}, {"cwd", s.Cwd != ""}, {"env", len(s.Env) > 0}, {"environment", s.Environment != ""},
		{"completion", s.Completion != nil}, {"stall_after", s.StallAfter != ""}, {"result", s.Result != nil},
		{"on_lost", s.OnLost != ""}, {"placement", s.Placement != nil}, {"retry", s.Retry != nil},
	} {
		if f.set {
			return fieldErr(f.name, "not with external: the task runs nothing, it waits for 'bgtask complete'")
		}
	}
	return nil
}

// validateWakeOn checks wake_on.
func (s *Spec) validateWakeOn() error {
	if slices.Contains(s.WakeOn, WakeOnNone) {
		if len(s.WakeOn) > 1 {
			return fieldErr("wake_on", "none goes alone")
		}
		return nil
	}
	for _, st := range s.WakeOn {
		if !slices.Contains(WakeOnStatuses, st) {
			return fieldErr("wake_on", "%q: want some of %s", st, strings.Join(WakeOnStatuses, ", "))
		}
	}
	return nil
}

// WakeOnNone in wake_on wakes the caller on no outcome: a member of a group
// whose join wakes it instead.
const WakeOnNone = "none"

// Wakes reports whether the task's outcome is one its spec wakes the caller on.
func (s State) Wakes() bool {
	return len(s.Spec.WakeOn) == 0 || slices.Contains(s.Spec.WakeOn, s.Status)
}

// Complete ends a task from outside, with Status (succeeded or failed) and
// Result: a task not started yet never runs, a running one's command is stopped.
type Complete struct {
	Status string
	Result string
}

func (c Complete) decide(s State, _ Meta) (events.Payload, uint64, error) {
	status := c.Status
	if status == "" {
		status = StatusSucceeded
	}
	switch {
	case !slices.Contains(CompleteStatuses, status):
		return nil, 0, fieldErr("status", "%q: want succeeded or failed", c.Status)
	case len(c.Result) > MaxExternalResultBytes:
		return nil, 0, fieldErr("result", "%d bytes is over the limit of %d", len(c.Result), MaxExternalResultBytes)
	case s.Phase == "":
		return nil, 0, ErrNotFound
	case !s.Phase.Runs():
		return nil, 0, fmt.Errorf("%w: it is %s (%s)", ErrFinished, s.Phase, s.Status)
	}
	return &events.Completed{Status: status, Result: c.Result}, s.Epoch, nil
}

// completed is a task ended from outside.
func (s State) completed(rec events.Record, p *events.Completed) (State, error) {
	at := rec.Time
	if !s.Phase.Runs() {
		return s, ErrWrongPhase
	}
	result := p.Result
	s.Reason = s.completedReason()
	s.Phase, s.Status, s.EndedAt, s.ExternalResult = PhaseEnded, p.Status, &at, &result
	return s, nil
}

// completedReason says what completing a task from outside in its state does to
// its command: a running one is stopped (a watched process, not bgtask's, is left
// alone).
func (s State) completedReason() string {
	const reason = "completed from outside"
	switch {
	case s.Phase != PhaseRunning:
		return reason
	case s.Spec.Process != nil:
		return reason + "; bgtask stopped watching the process"
	}
	return reason + "; bgtask stopped the command"
}
