package engine

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/bgtask/bgtask/events"
)

// KindTimer is the kind of a task with no command: it fires at its start_at.
const KindTimer = "timer"

// Retry runs a command again after an attempt that ends in one of On. Each attempt
// is a new run of the same task, a new epoch in its history; the caller is woken
// once, after the last, with the attempts before it listed in the wake-up.
type Retry struct {
	// Max is how many attempts may follow the first: 1 to MaxRetries.
	Max int `json:"max" jsonschema:"how many more attempts, 1 to 100"`
	// Backoff is the wait before the first retry (default 1s); each next one waits
	// twice as long, up to MaxBackoff (default 5m), less a random part of up to half
	// (jitter), so that tasks that failed together do not retry together.
	Backoff    string `json:"backoff,omitempty" jsonschema:"the wait before the first retry (default 1s), doubled for each next"`
	MaxBackoff string `json:"max_backoff,omitempty" jsonschema:"the longest wait (default 5m)"`
	// On are the statuses an attempt is retried on (default: all of RetryStatuses).
	On []string `json:"on,omitempty" jsonschema:"statuses retried (default: failed, timed_out, stalled, lost)"`
	// Deadline bounds each attempt; a spec's deadline given as a duration fills it
	// in, so that every attempt has as long as the first.
	Deadline string `json:"deadline,omitempty" jsonschema:"bound of each attempt (default: the spec's deadline when it is a duration)"`
}

// MaxRetries bounds Retry.Max: a wake-up lists every attempt.
const MaxRetries = 100

// RetryStatuses are the outcomes an attempt may be retried on.
var RetryStatuses = []string{StatusFailed, StatusTimedOut, StatusStalled, StatusLost}

// Retry defaults.
const (
	DefaultRetryBackoff    = time.Second
	DefaultRetryMaxBackoff = 5 * time.Minute
	// maxAttemptReason bounds the reason an attempt keeps: the wake-up lists them all.
	maxAttemptReason = 256
)

// Occurrence is the slot of a schedule a task runs for: a schedule registers one
// task per slot, under an idempotency key made of both, so a slot runs once
// however many engines run the schedule.
type Occurrence struct {
	Schedule string    `json:"schedule"`
	Slot     time.Time `json:"slot"`
}

// IsTimer reports whether the spec has no command: it fires at its start_at.
func (s Spec) IsTimer() bool { return !s.HasCommand() && !s.External && s.Join == nil }

// StartTime is when the command may start, or a timer fires; zero means at once.
func (s Spec) StartTime() time.Time {
	at, _ := time.Parse(time.RFC3339Nano, s.StartAt)
	return at
}

// validateTiming checks start_at, the timer's rules and retry, and stores
// start_at as a time.
func (s *Spec) validateTiming(now time.Time) error {
	if s.StartAt != "" {
		at, err := parseFutureTime(s.StartAt, now, "start_at")
		if err != nil {
			return fieldErr("start_at", "%v", err)
		}
		s.StartAt = at.UTC().Format(time.RFC3339Nano)
	}
	if s.IsTimer() {
		if err := s.validateTimer(); err != nil {
			return err
		}
	}
	if err := s.validateExternal(); err != nil {
		return err
	}
	if err := s.validateWakeOn(); err != nil {
		return err
	}
	if err := s.validateAfter(); err != nil {
		return err
	}
	if err := s.validateJoin(); err != nil {
		return err
	}
	if s.RerunOf != "" && !events.ValidToken(s.RerunOf) {
		return fieldErr("rerun_of", "%q is not a task id", s.RerunOf)
	}
	if o := s.Occurrence; o != nil && (!events.ValidToken(o.Schedule) || o.Slot.IsZero()) {
		return fieldErr("occurrence", "want the name of a schedule and the time of its slot")
	}
	return s.Retry.validate()
}

// validateTimer refuses what only a command has, and names the kind.
func (s *Spec) validateTimer() error {
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"cwd", s.Cwd != ""}, {"env", len(s.Env) > 0}, {"environment", s.Environment != ""}, {"completion", s.Completion != nil},
		{"keep_running", s.KeepRunning}, {"stall_after", s.StallAfter != ""}, {"on_stall", s.OnStall != ""},
		{"max_respawns", s.MaxRespawns != nil}, {"deadline", s.Deadline != ""}, {"result", s.Result != nil},
		{"max_result_bytes", s.MaxResultBytes != 0}, {"on_lost", s.OnLost != ""},
		{"placement", s.Placement != nil}, {"retry", s.Retry != nil},
	} {
		if f.set {
			return fieldErr(f.name, "only with a command: a spec with no command is a timer")
		}
	}
	if s.Kind == "" {
		s.Kind = KindTimer
	}
	return nil
}

func (r *Retry) validate() error {
	if r == nil {
		return nil
	}
	if r.Max < 1 || r.Max > MaxRetries {
		return fieldErr("retry.max", "%d: want 1 to %d", r.Max, MaxRetries)
	}
	for _, d := range []struct {
		name string
		v    *string
		def  time.Duration
	}{{"retry.backoff", &r.Backoff, DefaultRetryBackoff}, {"retry.max_backoff", &r.MaxBackoff, DefaultRetryMaxBackoff}} {
		if *d.v == "" {
			*d.v = d.def.String()
		}
		if _, err := parsePositiveDuration(*d.v); err != nil {
			return fieldErr(d.name, "%v", err)
		}
	}
	if r.backoff() > r.maxBackoff() {
		return fieldErr("retry.max_backoff", "%s is shorter than retry.backoff %s", r.MaxBackoff, r.Backoff)
	}
	if r.Deadline != "" {
		if _, err := parsePositiveDuration(r.Deadline); err != nil {
			return fieldErr("retry.deadline", "%v", err)
		}
	}
	if len(r.On) == 0 {
		r.On = slices.Clone(RetryStatuses)
	}
	for _, st := range r.On {
		if !slices.Contains(RetryStatuses, st) {
			return fieldErr("retry.on", "%q: want some of %s", st, strings.Join(RetryStatuses, ", "))
		}
	}
	return nil
}

func (r *Retry) backoff() time.Duration    { d, _ := time.ParseDuration(r.Backoff); return d }
func (r *Retry) maxBackoff() time.Duration { d, _ := time.ParseDuration(r.MaxBackoff); return d }

// wait is how long retry n (1 for the first) waits: the backoff doubled n-1 times,
// capped, less up to half of it as jitter (in [0, 1)) says.
func (r *Retry) wait(n int, jitter float64) time.Duration {
	d := r.backoff()
	for i := 1; i < n && d < r.maxBackoff(); i++ {
		d *= 2
	}
	d = min(d, r.maxBackoff())
	return d - time.Duration(float64(d/2)*jitter)
}

// NotBefore is when an armed task may start: its start_at before its first run,
// the time of its retry after a failed attempt; zero means now.
func (s State) NotBefore() time.Time {
	switch {
	case s.RetryAt != nil:
		return *s.RetryAt
	case s.Epoch == 0:
		return s.Spec.StartTime()
	}
	return time.Time{}
}

// Retryable reports whether a task whose run ended is armed again instead of
// delivered: its outcome is one its retry rule names, with attempts left.
func (s State) Retryable() bool {
	r := s.Spec.Retry
	return s.Phase == PhaseEnded && r != nil && len(s.Attempts) < r.Max && slices.Contains(r.On, s.Status)
}

// ComeDue fires a timer whose time has come.
type ComeDue struct{}

func (ComeDue) decide(s State, m Meta) (events.Payload, uint64, error) {
	if s.Phase != PhaseArmed || !s.Spec.IsTimer() {
		return nil, 0, phaseError(s)
	}
	if s.Paused {
		return nil, 0, fmt.Errorf("%w: timer %s is paused", ErrWrongPhase, s.ID)
	}
	at := s.Spec.StartTime()
	if m.Now.Before(at) {
		return nil, 0, fmt.Errorf("%w: timer %s is due at %s", ErrWrongPhase, s.ID, s.Spec.StartAt)
	}
	return &events.Due{LateBy: m.Now.Sub(at).Round(time.Millisecond).String()}, s.Epoch, nil
}

// RetryLater arms a task again after an attempt its retry rule names. Jitter, in
// [0, 1), takes its part off the wait.
type RetryLater struct{ Jitter float64 }

func (c RetryLater) decide(s State, m Meta) (events.Payload, uint64, error) {
	if !s.Retryable() {
		return nil, 0, fmt.Errorf("%w: task %s is %s (%s) with %d attempts: no retry", ErrWrongPhase, s.ID, s.Phase, s.Status, len(s.Attempts))
	}
	r := s.Spec.Retry
	at := m.Now.Add(r.wait(len(s.Attempts)+1, c.Jitter))
	p := &events.RetryScheduled{Attempt: s.attempt(), At: at.UTC()}
	if d, err := time.ParseDuration(r.Deadline); err == nil && r.Deadline != "" {
		p.Deadline = at.Add(d).UTC().Format(time.RFC3339Nano)
	}
	return p, s.Epoch, nil
}

// attempt is how the current run ended, as the wake-up lists it.
func (s State) attempt() events.Attempt {
	a := events.Attempt{Epoch: s.Epoch, Status: s.Status, Reason: cutStart(s.Reason, maxAttemptReason)}
	if s.Run != nil && s.Run.HasExitCode() {
		code := s.Run.ExitCode
		a.ExitCode = &code
	}
	return a
}

// due is a timer that fired: it succeeds.
func (s State) due(rec events.Record, p *events.Due) (State, error) {
	at := rec.Time
	if s.Phase != PhaseArmed || !s.Spec.IsTimer() || s.Paused {
		return s, ErrWrongPhase
	}
	s.Phase, s.Status, s.EndedAt, s.LateBy = PhaseEnded, StatusSucceeded, &at, p.LateBy
	return s, nil
}

// retryScheduled arms a task again for its next attempt, keeping how the last
// one ended.
func (s State) retryScheduled(p *events.RetryScheduled) (State, error) {
	if s.Phase != PhaseEnded || s.Spec.Retry == nil {
		return s, ErrWrongPhase
	}
	if len(s.Attempts) >= s.Spec.Retry.Max {
		return s, fmt.Errorf("%w: a retry after %d attempts, past the %d retries of its rule", ErrWrongPhase, len(s.Attempts)+1, s.Spec.Retry.Max)
	}
	at := p.At
	s.Attempts = append(slices.Clip(s.Attempts), p.Attempt)
	s.Phase, s.RetryAt, s.Status, s.Reason = PhaseArmed, &at, "", ""
	s.Run, s.EndedAt, s.Worker, s.Host, s.PID = nil, nil, "", "", 0
	s.Stall, s.StalledAt, s.StallNotified, s.RespawnPending = nil, nil, false, false
	if p.Deadline != "" {
		s.Spec.Deadline = p.Deadline
	}
	return s, nil
}

// RerunSpec is the spec of a new task that runs this one again: the same spec,
// naming this task in rerun_of, with no idempotency key of its own, and its start
// and deadline as far from the new registration as they were from this one's.
func (s State) RerunSpec() Spec {
	spec := s.Spec
	spec.RerunOf, spec.IdempotencyKey = s.ID, ""
	if spec.Retry != nil {
		retry := *spec.Retry
		spec.Retry = &retry
	}
	// A relative start counts from the registration, a relative deadline from the
	// start.
	spec.StartAt = since(s.ArmedAt, spec.StartAt)
	switch {
	case spec.Retry != nil && spec.Retry.Deadline != "":
		spec.Deadline = spec.Retry.Deadline
	case spec.Deadline != "":
		from := s.ArmedAt
		if start := s.Spec.StartTime(); !start.IsZero() {
			from = start
		}
		spec.Deadline = since(from, spec.Deadline)
	}
	return spec
}

// since is how long after from the RFC 3339 time v is, as a duration; "" if it is
// not after it.
func since(from time.Time, v string) string {
	at, err := time.Parse(time.RFC3339Nano, v)
	if err != nil || !at.After(from) {
		return ""
	}
	return at.Sub(from).String()
}

// Pause holds a task that has not started yet: a delayed start, a retry waiting
// for its time, a timer, or a task waiting for a worker.
type Pause struct{}

func (Pause) decide(s State, _ Meta) (events.Payload, uint64, error) {
	switch {
	case s.Phase == "":
		return nil, 0, ErrNotFound
	case s.Phase != PhaseArmed:
		return nil, 0, fmt.Errorf("%w: task %s is %s; only a task that has not started can be paused", ErrWrongPhase, s.ID, s.Phase)
	case s.Paused:
		return nil, 0, fmt.Errorf("%w: task %s is paused already", ErrWrongPhase, s.ID)
	}
	return &events.Paused{}, s.Epoch, nil
}

// Resume lets a paused task go on.
type Resume struct{}

func (Resume) decide(s State, _ Meta) (events.Payload, uint64, error) {
	switch {
	case s.Phase == "":
		return nil, 0, ErrNotFound
	case !s.Paused:
		return nil, 0, fmt.Errorf("%w: task %s is not paused", ErrWrongPhase, s.ID)
	}
	return &events.Resumed{}, s.Epoch, nil
}
