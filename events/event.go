package events

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Version is the envelope version written by this code. A reader accepts every
// version up to it; an event with a higher version is reported as unknown.
const Version = 1

// Type names an event on the wire. The names are the stream's vocabulary: they never
// change, whatever the Go types are called.
type Type string

const (
	TypeArmed               Type = "armed"
	TypeSpawned             Type = "spawned"
	TypeTick                Type = "tick"
	TypeStalled             Type = "stalled"
	TypeExited              Type = "exited"
	TypeCompletionPersisted Type = "completion-persisted"
	TypeFired               Type = "fired"
	TypeCancelled           Type = "cancelled"
	TypeLost                Type = "lost"
	TypeFailed              Type = "failed"
	// A timer came due; a failed attempt of a command with retries was armed again.
	TypeDue            Type = "due"
	TypeRetryScheduled Type = "retry-scheduled"
	// A probe that did not meet its rule was armed for its next run.
	TypeProbeScheduled Type = "probe-scheduled"
	// Lines of a running command's output its notify rule sends.
	TypeNotice Type = "notice"
	// A task ended from outside (bgtask complete); one skipped, its dependency
	// having failed.
	TypeCompleted Type = "completed"
	TypeSkipped   Type = "skipped"
	// A group's task ended with its members.
	TypeJoined Type = "joined"
	// A fired task's wake-up was read by a wait and removed from the inbox.
	TypeConsumed Type = "consumed"
	// A task not started yet is held, and let go again.
	TypePaused  Type = "paused"
	TypeResumed Type = "resumed"
	// A push sink's delivery of a fired wake-up: the claim of an attempt, its
	// result, and the give-up after the last failed attempt.
	TypeDeliveryAttempt Type = "delivery-attempt"
	TypeDeliveryResult  Type = "delivery-result"
	TypeDeliveryFailed  Type = "delivery-failed"
	// Pushes that were done are to be made again (bgtask redeliver).
	TypeRedeliveryRequested Type = "redelivery-requested"
)

// Event is the versioned envelope of every lifecycle event.
type Event struct {
	V       int             `json:"v"`
	ID      string          `json:"id"`
	TaskID  string          `json:"task_id"`
	Type    Type            `json:"type"`
	Time    time.Time       `json:"time"`
	Writer  string          `json:"writer"`
	Epoch   uint64          `json:"epoch"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// Record is an event as stored: with its stream sequence.
type Record struct {
	Seq uint64 `json:"seq"`
	Event
	// decoded is the typed payload, when the reader decoded it with the envelope.
	decoded Payload
}

// Decode returns the event's typed payload.
func (r Record) Decode() (Payload, error) {
	if r.decoded != nil {
		return r.decoded, nil
	}
	return r.Event.Decode()
}

// Payload is implemented by every typed event payload.
type Payload interface {
	EventType() Type
}

// New builds an event for task with a fresh time-ordered id.
func New(taskID, writer string, epoch uint64, at time.Time, p Payload) (Event, error) {
	raw, err := json.Marshal(p)
	if err != nil {
		return Event{}, fmt.Errorf("encode %s payload: %w", p.EventType(), err)
	}
	id, err := uuid.NewV7()
	if err != nil {
		return Event{}, err
	}
	return Event{
		V:       Version,
		ID:      id.String(),
		TaskID:  taskID,
		Type:    p.EventType(),
		Time:    at.UTC(),
		Writer:  writer,
		Epoch:   epoch,
		Payload: raw,
	}, nil
}

// Decode returns the event's typed payload.
func (e Event) Decode() (Payload, error) {
	if e.V < 1 || e.V > Version {
		return nil, fmt.Errorf("event %s: unsupported envelope version %d", e.ID, e.V)
	}
	p := newPayload(e.Type)
	if p == nil {
		return nil, fmt.Errorf("event %s: unknown type %q", e.ID, e.Type)
	}
	if len(e.Payload) > 0 {
		if err := json.Unmarshal(e.Payload, p); err != nil {
			return nil, fmt.Errorf("event %s: decode %s payload: %w", e.ID, e.Type, err)
		}
	}
	return p, nil
}

// newPayload returns an empty payload of type t, or nil for a type this version
// does not know.
func newPayload(t Type) Payload {
	switch t {
	case TypeArmed:
		return &Armed{}
	case TypeSpawned:
		return &Spawned{}
	case TypeTick:
		return &Tick{}
	case TypeExited:
		return &Exited{}
	case TypeStalled:
		return &Stalled{}
	case TypeLost:
		return &Lost{}
	case TypeCompletionPersisted:
		return &CompletionPersisted{}
	case TypeFired:
		return &Fired{}
	case TypeCancelled:
		return &Cancelled{}
	case TypeFailed:
		return &Failed{}
	case TypeDeliveryAttempt:
		return &DeliveryAttempt{}
	case TypeDeliveryResult:
		return &DeliveryResult{}
	case TypeDeliveryFailed:
		return &DeliveryFailed{}
	case TypeRedeliveryRequested:
		return &RedeliveryRequested{}
	case TypeArchived:
		return &Archived{}
	case TypeDue:
		return &Due{}
	case TypeRetryScheduled:
		return &RetryScheduled{}
	case TypeProbeScheduled:
		return &ProbeScheduled{}
	case TypeNotice:
		return &Notice{}
	case TypeCompleted:
		return &Completed{}
	case TypeSkipped:
		return &Skipped{}
	case TypeJoined:
		return &Joined{}
	case TypeConsumed:
		return &Consumed{}
	case TypePaused:
		return &Paused{}
	case TypeResumed:
		return &Resumed{}
	}
	return nil
}

// knownType returns the constant of a type name, without allocating, or "" for a
// name this version does not know.
func knownType(name []byte) Type {
	for _, t := range []Type{
		TypeTick, TypeArmed, TypeSpawned, TypeExited, TypeCompletionPersisted, TypeFired,
		TypeStalled, TypeLost, TypeFailed, TypeCancelled,
		TypeDeliveryAttempt, TypeDeliveryResult, TypeDeliveryFailed, TypeRedeliveryRequested, TypeArchived,
		TypeDue, TypeRetryScheduled, TypeProbeScheduled, TypeNotice, TypePaused, TypeResumed, TypeCompleted, TypeSkipped, TypeJoined,
		TypeConsumed,
	} {
		if string(name) == string(t) {
			return t
		}
	}
	return ""
}

// Armed registers a task. The spec is the engine's validated spec with its defaults
// filled in, so every reader sees the same task whatever defaults later versions use.
type Armed struct {
	Spec json.RawMessage `json:"spec"`
}

// Spawned records that a worker took the task and started its command.
type Spawned struct {
	Worker string `json:"worker"`
	Host   string `json:"host,omitempty"`
}

// Tick is a running task's heartbeat. The first one after the start carries the
// command's PID (spawned is appended before the command starts, so that only the
// lease holder ever starts it).
type Tick struct {
	PID         int   `json:"pid,omitempty"`
	OutputBytes int64 `json:"output_bytes"`
}

// Exited records how the run ended: the command's exit, or the watch rule that
// ended it.
type Exited struct {
	ExitCode  int       `json:"exit_code"`
	Signal    string    `json:"signal,omitempty"`
	Tail      []string  `json:"tail,omitempty"`
	StartedAt time.Time `json:"started_at"`
	EndedAt   time.Time `json:"ended_at"`
	// Matched: the completion rule matched MatchedLine.
	Matched     bool   `json:"matched,omitempty"`
	MatchedLine string `json:"matched_line,omitempty"`
	// StoppedBy names what stopped the command: a rule (match, deadline, stall) or
	// its worker shutting down (worker_stopped).
	StoppedBy string `json:"stopped_by,omitempty"`
	// KeptRunning: the rule matched and the command was left running (no exit code).
	KeptRunning bool `json:"kept_running,omitempty"`
	// NotStarted: the command was never started (its deadline had passed).
	NotStarted bool `json:"not_started,omitempty"`
	// Result is the stdout of the spec's result command (ResultBytes long before it
	// was cut to the largest result kept); ResultError says why it has none.
	Result      string `json:"result,omitempty"`
	ResultBytes int    `json:"result_bytes,omitempty"`
	ResultError string `json:"result_error,omitempty"`
	// OutputBytes is the size of the output; OutputDropped how much of it the log
	// could not keep.
	OutputBytes   int64 `json:"output_bytes,omitempty"`
	OutputDropped int64 `json:"output_dropped,omitempty"`
	// WatchedPID is the process a watch followed (spec process), which bgtask did
	// not start: only its parent can read its exit status, so the run has none.
	WatchedPID int `json:"watched_pid,omitempty"`
}

// HasExitCode reports whether the run ended with an exit code of the command: not
// a kept or unstarted command, nor a watched process.
func (e *Exited) HasExitCode() bool { return !e.KeptRunning && !e.NotStarted && e.WatchedPID == 0 }

// Ways a watch rule stops a command.
const (
	StoppedByMatch    = "match"
	StoppedByDeadline = "deadline"
	StoppedByStall    = "stall"
	StoppedByWorker   = "worker_stopped"
)

// Stalled records that the command printed nothing for SilentFor, and what the
// spec's on_stall did about it.
type Stalled struct {
	SilentFor string `json:"silent_for"`
	Action    string `json:"action"`
}

// Lost records that a running task's run can no longer be followed, and what the
// spec's on_lost did: fail (the outcome is lost) or respawn (the task is armed again
// for another worker). Reason says why: the worker holding it is gone past its lease
// (the engine writes it), or the run's shim died without recording the command's
// exit (its worker writes it). Empty in events written before it existed: the
// worker was gone.
type Lost struct {
	Worker string `json:"worker"`
	Action string `json:"action"`
	Reason string `json:"reason,omitempty"`
}

// Failed records that the command could not run. StoppedBy is deadline when the
// task's deadline passed before any worker took it.
type Failed struct {
	Reason    string `json:"reason"`
	StoppedBy string `json:"stopped_by,omitempty"`
}

// CompletionPersisted fixes the task's outcome and the exact wake-up that will be
// delivered, before anything is delivered.
type CompletionPersisted struct {
	Wakeup Wakeup `json:"wakeup"`
}

// Fired records that the wake-up is in the inbox.
type Fired struct {
	Subject  string `json:"subject"`
	InboxSeq uint64 `json:"inbox_seq"`
	// Quiet: the outcome is not one the spec's wake_on names, so nothing was
	// delivered; the task is done all the same.
	Quiet bool `json:"quiet,omitempty"`
}

// Cancelled ends a task without a wake-up.
type Cancelled struct {
	Reason string `json:"reason,omitempty"`
}

// Due records that a timer's time came: the task succeeds, LateBy after the time
// it was set for (a server that was down, or a machine that slept, fires it late).
type Due struct {
	LateBy string `json:"late_by"`
}

// RetryScheduled arms a task again after an attempt that ended in one of its
// retry statuses: the attempt's outcome is kept, and the next one starts at At,
// with Deadline (when the task has one) as its own deadline.
type RetryScheduled struct {
	Attempt  Attempt   `json:"attempt"`
	At       time.Time `json:"at"`
	Deadline string    `json:"deadline,omitempty"`
}

// ProbeScheduled arms a probe again after a run that did not meet its rule: the
// next run starts at At. Probes counts the runs so far.
type ProbeScheduled struct {
	Probes int       `json:"probes"`
	At     time.Time `json:"at"`
}

// Notice is notice N of a running command: output lines its notify rule
// matched (Dropped more that one notice does not carry), the last ending at Upto
// in the run's stdout.
type Notice struct {
	N       int      `json:"n"`
	Lines   []string `json:"lines"`
	Dropped int      `json:"dropped,omitempty"`
	Upto    int64    `json:"upto"`
}

// Attempt is how one run of a task with retries ended.
type Attempt struct {
	Epoch    uint64 `json:"epoch"`
	Status   string `json:"status"`
	ExitCode *int   `json:"exit_code,omitempty"`
	Reason   string `json:"reason,omitempty"`
}

// Paused holds a task that has not started: no worker takes it, and a timer does
// not fire, until Resumed.
type Paused struct{}

// Resumed lets a paused task go on: a start or a timer whose time passed meanwhile
// happens at once.
type Resumed struct{}

// Completed ends a task from outside, with the status and the result the
// completer gave: whichever of it, the command's exit and the deadline comes
// first decides.
type Completed struct {
	Status string `json:"status"`
	Result string `json:"result,omitempty"`
}

// Skipped ends an armed task that never runs: a dependency its after_policy
// needs to succeed did not.
type Skipped struct {
	Dependency string `json:"dependency"`
	Reason     string `json:"reason"`
}

// Joined ends a group's task: all of its members ended (or the first did, for
// a join of any), as Members say.
type Joined struct {
	Members []Member `json:"members"`
}

// Member is how one member of a group ended, as its wake-up lists it; a member
// that has not ended (a join of any) has no status.
type Member struct {
	ID       string `json:"id"`
	Status   string `json:"status,omitempty"`
	ExitCode *int   `json:"exit_code,omitempty"`
}

// Consumed records that the fired wake-up at InboxSeq was read by a wait, which
// asked for it to be removed from the inbox: no reader of the inbox gets it.
type Consumed struct {
	InboxSeq uint64 `json:"inbox_seq"`
}

func (*Consumed) EventType() Type            { return TypeConsumed }
func (*Joined) EventType() Type              { return TypeJoined }
func (*Skipped) EventType() Type             { return TypeSkipped }
func (*Completed) EventType() Type           { return TypeCompleted }
func (*Paused) EventType() Type              { return TypePaused }
func (*Resumed) EventType() Type             { return TypeResumed }
func (*Due) EventType() Type                 { return TypeDue }
func (*RetryScheduled) EventType() Type      { return TypeRetryScheduled }
func (*ProbeScheduled) EventType() Type      { return TypeProbeScheduled }
func (*Notice) EventType() Type              { return TypeNotice }
func (*Armed) EventType() Type               { return TypeArmed }
func (*Spawned) EventType() Type             { return TypeSpawned }
func (*Tick) EventType() Type                { return TypeTick }
func (*Exited) EventType() Type              { return TypeExited }
func (*Stalled) EventType() Type             { return TypeStalled }
func (*Lost) EventType() Type                { return TypeLost }
func (*Failed) EventType() Type              { return TypeFailed }
func (*CompletionPersisted) EventType() Type { return TypeCompletionPersisted }
func (*Fired) EventType() Type               { return TypeFired }
func (*Cancelled) EventType() Type           { return TypeCancelled }

// Wakeup is what the caller receives, exactly once: in the inbox, from `bgtask wait`
// and in the completion-persisted event.
type Wakeup struct {
	ID       string `json:"id"`
	Status   string `json:"status"`
	ExitCode *int   `json:"exit_code"`
	Signal   string `json:"signal,omitempty"`
	Reason   string `json:"reason,omitempty"`
	Prompt   string `json:"prompt"`
	Result   string `json:"result,omitempty"`
	// MatchedLine is the stdout line that completed the task, for completion rules.
	MatchedLine string `json:"matched_line,omitempty"`
	// Notice is set on a wake-up that is not the task's end: "stalled" for on_stall
	// notify. The task goes on, and its final wake-up follows.
	Notice    string          `json:"notice,omitempty"`
	Tail      []string        `json:"tail,omitempty"`
	Kind      string          `json:"kind,omitempty"`
	Command   string          `json:"command"`
	Target    string          `json:"target"`
	Origin    json.RawMessage `json:"origin,omitempty"`
	StartedAt *time.Time      `json:"started_at,omitempty"`
	EndedAt   *time.Time      `json:"ended_at,omitempty"`
	// LateBy is how long after its time a timer fired, or a delayed command started.
	LateBy string `json:"late_by,omitempty"`
	// Attempts are the runs before the last of a task with retries.
	Attempts []Attempt `json:"attempts,omitempty"`
	// Probes counts the runs of a probe before the last, which did not meet its rule.
	Probes int `json:"probes,omitempty"`
	// Members are how the members of a group ended, for a join's wake-up.
	Members []Member `json:"members,omitempty"`
}
