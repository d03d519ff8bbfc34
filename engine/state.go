package engine

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/bgtask/bgtask/events"
)

// Phase is where a task is in its lifecycle.
type Phase string

const (
	PhaseArmed     Phase = "armed"     // registered, waiting for a worker
	PhaseRunning   Phase = "running"   // a worker holds it and runs the command
	PhaseEnded     Phase = "ended"     // the run is over (exited or failed); outcome not yet persisted
	PhasePersisted Phase = "persisted" // completion persisted; wake-up not yet fired
	PhaseFired     Phase = "fired"     // the wake-up is in the inbox: done
	PhaseCancelled Phase = "cancelled" // cancelled: done, nothing delivered
	PhaseArchived  Phase = "archived"  // done long ago: its history is in the archive
)

// Phases are all the phases, in the order a task goes through them.
var Phases = []Phase{PhaseArmed, PhaseRunning, PhaseEnded, PhasePersisted, PhaseFired, PhaseCancelled, PhaseArchived}

// PhaseNames are the names of Phases, for messages and help.
func PhaseNames() string {
	names := make([]string, len(Phases))
	for i, p := range Phases {
		names[i] = string(p)
	}
	return strings.Join(names, ", ")
}

// Terminal reports whether nothing more will happen to a task in this phase.
func (p Phase) Terminal() bool { return p == PhaseFired || p == PhaseCancelled || p == PhaseArchived }

// Runs reports whether a task in this phase has a command that may still write
// output: it waits for a worker, or one runs it. A task past them has all its
// output in the log (events.LogEOFHeader says why).
func (p Phase) Runs() bool { return p == PhaseArmed || p == PhaseRunning }

// Outcomes: the status of a finished task.
const (
	StatusSucceeded = "succeeded"
	StatusFailed    = "failed"
	StatusStalled   = "stalled"
	StatusTimedOut  = "timed_out"
	StatusCancelled = "cancelled"
	StatusLost      = "lost"
)

// ReasonNoMatch is the reason of a task whose command exited before its
// completion rule matched.
const ReasonNoMatch = "exited before the completion rule matched"

// State is a task's current state, folded from its events.
type State struct {
	ID    string `json:"id"`
	Spec  Spec   `json:"spec"`
	Phase Phase  `json:"state"`
	// Status is the outcome, once known.
	Status string `json:"status,omitempty"`
	// Seq is the stream sequence of the task's last event: the condition of its next append.
	Seq uint64 `json:"seq"`
	// Epoch counts spawns; a worker's appends carry the epoch of its spawn.
	Epoch       uint64         `json:"epoch"`
	Worker      string         `json:"worker,omitempty"`
	Host        string         `json:"host,omitempty"`
	PID         int            `json:"pid,omitempty"`
	ArmedAt     time.Time      `json:"armed_at"`
	SpawnedAt   *time.Time     `json:"spawned_at,omitempty"`
	LastTickAt  *time.Time     `json:"last_tick_at,omitempty"`
	OutputBytes int64          `json:"output_bytes,omitempty"`
	Run         *events.Exited `json:"run,omitempty"`
	Reason      string         `json:"reason,omitempty"`
	Wakeup      *events.Wakeup `json:"wakeup,omitempty"`
	PersistedAt *time.Time     `json:"persisted_at,omitempty"`
	FiredAt     *time.Time     `json:"fired_at,omitempty"`
	InboxSeq    uint64         `json:"inbox_seq,omitempty"`
	// FiredSeq orders the wake-ups of a target; Deliveries are the spec's push
	// sinks, after the task fired.
	FiredSeq   uint64      `json:"fired_seq,omitempty"`
	Deliveries []SinkState `json:"deliveries,omitempty"`
	// Delivery sums up Deliveries (DeliveryPending, DeliveryDelivered,
	// DeliveryFailed); none for a task with no push made or to make.
	Delivery string     `json:"delivery,omitempty"`
	EndedAt  *time.Time `json:"ended_at,omitempty"`
	// Stall is the last stall of the current run; StallNotified: the caller was told.
	Stall         *events.Stalled `json:"stall,omitempty"`
	StalledAt     *time.Time      `json:"stalled_at,omitempty"`
	StallNotified bool            `json:"stall_notified,omitempty"`
	// Respawns counts runs started again after a stall; RespawnPending: a stall
	// stopped the run and its worker is to start the next one.
	Respawns       int  `json:"respawns,omitempty"`
	RespawnPending bool `json:"respawn_pending,omitempty"`
	// ArchiveSeq is where an archived task's history is in the archive, and
	// ArchivedFrom the phase it was archived in.
	ArchiveSeq   uint64 `json:"archive_seq,omitempty"`
	ArchivedFrom Phase  `json:"archived_from,omitempty"`
	// LateBy is how long after its time a timer fired or a delayed command started.
	LateBy string `json:"late_by,omitempty"`
	// Attempts are the ended runs of a task with retries, and RetryAt the time of
	// the next, while it waits for it.
	Attempts []events.Attempt `json:"attempts,omitempty"`
	RetryAt  *time.Time       `json:"retry_at,omitempty"`
	// Probes counts the runs of a probe that did not meet its rule, and LastProbe
	// is how the last of them ended, while the next waits.
	Probes    int            `json:"probes,omitempty"`
	LastProbe *events.Exited `json:"last_probe,omitempty"`
	// Notices counts the notices of the notify rule; LastNotice is the last, at
	// LastNoticeAt.
	Notices      int            `json:"notices,omitempty"`
	LastNotice   *events.Notice `json:"last_notice,omitempty"`
	LastNoticeAt *time.Time     `json:"last_notice_at,omitempty"`
	NoticeEpoch  uint64         `json:"notice_epoch,omitempty"`
	// Paused: an armed task held until it is resumed.
	Paused bool `json:"paused,omitempty"`
	// ExternalResult is the result a task completed from outside was given.
	ExternalResult *string `json:"external_result,omitempty"`
	// Quiet: fired without a delivery, its outcome not one wake_on names.
	Quiet bool `json:"quiet,omitempty"`
	// Consumed: a wait read its wake-up and had it removed from the inbox.
	Consumed bool `json:"consumed,omitempty"`
	// Members are how a group's members ended, once it did.
	Members  []events.Member `json:"members,omitempty"`
	LastType events.Type     `json:"last_event"`
	Events   int             `json:"events"`
}

// TransitionError is an event that does not fit the task's state. It is reported,
// never fatal: the state is left as it was, apart from the sequence.
type TransitionError struct {
	Seq   uint64
	Type  events.Type
	Phase Phase
	Err   error
}

func (e *TransitionError) Error() string {
	phase := e.Phase
	if phase == "" {
		phase = "new"
	}
	return fmt.Sprintf("event %s at seq %d in phase %s: %v", e.Type, e.Seq, phase, e.Err)
}

func (e *TransitionError) Unwrap() error { return e.Err }

// Apply folds one event into a task's state. It never fails the fold: an event that
// does not fit is returned as an error with the state unchanged except for Seq, which
// always follows the stream, so the next conditional append is made against the real
// last event.
func Apply(s State, rec events.Record) (State, error) {
	next, err := apply(s, rec)
	if err != nil {
		s.Seq = rec.Seq
		return s, &TransitionError{Seq: rec.Seq, Type: rec.Type, Phase: s.Phase, Err: err}
	}
	next.Seq = rec.Seq
	next.LastType = rec.Type
	next.Events++
	next.Delivery = next.deliveryState()
	return next, nil
}

func apply(s State, rec events.Record) (State, error) {
	at := rec.Time // its own copy: a pointer into rec would keep the whole record alive
	payload, err := rec.Decode()
	if err != nil {
		return s, err
	}
	switch p := payload.(type) {
	case *events.Armed:
		return s.armed(rec, p)
	case *events.Spawned:
		return s.spawned(rec, p)
	case *events.Tick:
		return s.ticked(rec, p)
	case *events.Exited:
		return s.exited(rec, p)
	case *events.Stalled:
		return s.stalled(rec, p)
	case *events.Failed:
		return s.failed(rec, p)
	case *events.CompletionPersisted:
		return s.completionPersisted(rec, p)
	case *events.Fired:
		return s.fired(rec, p)
	case *events.DeliveryAttempt, *events.DeliveryResult, *events.DeliveryFailed:
		return s.applyDelivery(payload, rec)
	case *events.RedeliveryRequested:
		return s.redeliveryRequested(p)
	case *events.Archived:
		// The history before it may be gone from the stream: the state is the
		// summary alone, whether or not the history was seen first, so a replay
		// after the compaction equals the state built live.
		if s.Phase != "" && !s.archivable() {
			return s, ErrWrongPhase
		}
		return archivedState(rec.TaskID, p), nil
	case *events.Lost:
		return s.lost(rec, p)
	case *events.Due:
		return s.due(rec, p)
	case *events.RetryScheduled:
		return s.retryScheduled(p)
	case *events.ProbeScheduled:
		return s.probeScheduled(p)
	case *events.Notice:
		return s.noticed(rec, p)
	case *events.Completed:
		return s.completed(rec, p)
	case *events.Skipped:
		return s.skipped(rec, p)
	case *events.Joined:
		return s.joined(rec, p)
	case *events.Consumed:
		return s.consumed(p)
	case *events.Paused, *events.Resumed:
		pause := rec.Type == events.TypePaused
		if s.Phase != PhaseArmed || s.Paused == pause {
			return s, ErrWrongPhase
		}
		s.Paused = pause
		return s, nil
	case *events.Cancelled:
		if !s.Phase.Runs() {
			return s, ErrWrongPhase
		}
		s.Phase, s.Status, s.Reason, s.EndedAt = PhaseCancelled, StatusCancelled, p.Reason, &at
		return s, nil
	}
	return s, fmt.Errorf("no transition for %s", rec.Type)
}

func (s State) armed(rec events.Record, p *events.Armed) (State, error) {
	if s.Phase != "" {
		return s, ErrWrongPhase
	}
	spec, err := decodeSpec(p.Spec)
	if err != nil {
		return s, err
	}
	s.ID, s.Spec, s.Phase, s.ArmedAt = rec.TaskID, spec, PhaseArmed, rec.Time
	return s, nil
}

func (s State) spawned(rec events.Record, p *events.Spawned) (State, error) {
	at := rec.Time
	if err := s.canSpawn(rec.Writer); err != nil {
		return s, err
	}
	if rec.Epoch != s.Epoch+1 {
		return s, fmt.Errorf("spawn epoch %d after epoch %d", rec.Epoch, s.Epoch)
	}
	if start := s.Spec.StartTime(); s.Epoch == 0 && !start.IsZero() {
		s.LateBy = max(at.Sub(start), 0).Round(time.Millisecond).String()
	}
	s.Phase, s.Epoch, s.Worker, s.Host, s.SpawnedAt = PhaseRunning, rec.Epoch, rec.Writer, p.Host, &at
	s.RespawnPending, s.Stall, s.RetryAt = false, nil, nil
	return s, nil
}

func (s State) ticked(rec events.Record, p *events.Tick) (State, error) {
	at := rec.Time
	if err := s.ownedBy(rec); err != nil {
		return s, err
	}
	if p.PID != 0 {
		s.PID = p.PID
	}
	s.LastTickAt, s.OutputBytes = &at, p.OutputBytes
	return s, nil
}

func (s State) exited(rec events.Record, p *events.Exited) (State, error) {
	if err := s.ownedBy(rec); err != nil {
		return s, err
	}
	if p.NotStarted && s.LastProbe != nil {
		return s.probeTimedOut(p), nil
	}
	run := *p
	s.Phase, s.Run, s.EndedAt = PhaseEnded, &run, &run.EndedAt
	s.Status, s.Reason = outcome(s, p)
	return s, nil
}

func (s State) stalled(rec events.Record, p *events.Stalled) (State, error) {
	at := rec.Time
	if err := s.ownedBy(rec); err != nil {
		return s, err
	}
	stall := *p
	s.Stall, s.StalledAt = &stall, &at
	switch p.Action {
	case OnStallNotify:
		s.StallNotified = true
	case OnStallRespawn:
		// The same worker starts the command again with the next spawn; the task
		// stays its own meanwhile, so no one else can take it.
		s.RespawnPending = true
		s.Respawns++
	}
	return s, nil
}

// failed is a command that could not start (armed) or whose run failed outside the
// command (running).
func (s State) failed(rec events.Record, p *events.Failed) (State, error) {
	at := rec.Time
	if s.Phase == PhaseRunning {
		if err := s.ownedBy(rec); err != nil {
			return s, err
		}
	} else if s.Phase != PhaseArmed {
		return s, ErrWrongPhase
	}
	s.Phase, s.Status, s.Reason, s.EndedAt = PhaseEnded, StatusFailed, p.Reason, &at
	if p.StoppedBy == events.StoppedByDeadline {
		s.Status = StatusTimedOut
	}
	return s, nil
}

func (s State) completionPersisted(rec events.Record, p *events.CompletionPersisted) (State, error) {
	at := rec.Time
	if s.Phase != PhaseEnded {
		return s, ErrWrongPhase
	}
	w := p.Wakeup
	if s.Run != nil && len(w.Tail) > 0 && slices.Equal(w.Tail, s.Run.Tail) {
		// The wake-up repeats the run's tail: a projection of many finished
		// tasks keeps one copy of each.
		w.Tail = s.Run.Tail
	}
	s.Phase, s.Status, s.Wakeup, s.PersistedAt = PhasePersisted, w.Status, &w, &at
	return s, nil
}

func (s State) fired(rec events.Record, p *events.Fired) (State, error) {
	at := rec.Time
	if s.Phase != PhasePersisted {
		return s, ErrWrongPhase
	}
	s.Phase, s.FiredAt, s.InboxSeq, s.FiredSeq, s.Quiet = PhaseFired, &at, p.InboxSeq, rec.Seq, p.Quiet
	if n := len(s.Spec.Deliver); n > 0 && !p.Quiet {
		s.Deliveries = make([]SinkState, n)
		for i, k := range s.Spec.Deliver {
			s.Deliveries[i].Type = k.Type
		}
	}
	return s, nil
}

// lost is a run whose worker was gone past its lease: armed again for another
// worker (on_lost respawn), or ended with status lost.
func (s State) lost(rec events.Record, p *events.Lost) (State, error) {
	at := rec.Time
	if s.Phase != PhaseRunning {
		return s, ErrWrongPhase
	}
	if p.Worker != s.Worker {
		return s, fmt.Errorf("%w: lost names %s, the lease is %s's", ErrNotOwner, p.Worker, s.Worker)
	}
	if p.Action == OnLostRespawn {
		s.Phase, s.Worker, s.Host, s.PID, s.RespawnPending = PhaseArmed, "", "", 0, false
		s.Respawns++
		return s, nil
	}
	s.Phase, s.Status, s.EndedAt, s.Reason = PhaseEnded, StatusLost, &at, p.Reason
	if s.Reason == "" {
		s.Reason = "its worker " + p.Worker + " was gone past its lease"
	}
	return s, nil
}

// outcome is the status of a run that ended, from the facts the worker recorded
// and the rules of the spec.
func outcome(s State, run *events.Exited) (status, reason string) {
	switch {
	case run.Matched:
		return StatusSucceeded, matchReason(s.Spec.Completion, run)
	case run.StoppedBy == events.StoppedByDeadline && run.NotStarted:
		return StatusTimedOut, "the deadline " + s.Spec.deadlineText() + " passed before the command started"
	case run.StoppedBy == events.StoppedByDeadline:
		return StatusTimedOut, "the deadline " + s.Spec.deadlineText() + " passed"
	case run.StoppedBy == events.StoppedByWorker:
		return StatusFailed, "stopped when its worker shut down"
	case run.StoppedBy == events.StoppedByStall:
		silent := s.Spec.StallAfter
		if s.Stall != nil {
			silent = s.Stall.SilentFor
		}
		return StatusStalled, "no output for " + silent
	case run.WatchedPID != 0:
		return StatusSucceeded, ReasonProcessEnded(run.WatchedPID)
	case s.Spec.Completion != nil:
		return StatusFailed, ReasonNoMatch
	case run.ExitCode == 0 && run.Signal == "":
		return StatusSucceeded, ""
	}
	return StatusFailed, ""
}

// maxQuotedBytes bounds, as JSON, the rule and the line a match's reason quotes:
// the reason must keep its end, which says what became of the command.
const maxQuotedBytes = 1 << 10

// matchReason says which completion rule matched which line, and what became of
// the command then: the exit code of a run a rule ended is bgtask's stop, not
// the command's own outcome.
func matchReason(c *Completion, run *events.Exited) string {
	rule := "its completion rule"
	if c != nil {
		rule += " (" + c.describe() + ")"
	}
	var then string
	switch {
	case run.KeptRunning:
		then = "the command was left running (keep_running)"
	case run.Signal != "":
		then = fmt.Sprintf("bgtask then stopped the command (exit code %d, signal %s)", run.ExitCode, run.Signal)
	default:
		then = fmt.Sprintf("the command then ended (exit code %d)", run.ExitCode)
	}
	return fmt.Sprintf("%s matched the line %s; %s", rule, quoted(run.MatchedLine), then)
}

// quoted is s cut to maxQuotedBytes, in backquotes where it can be.
func quoted(s string) string { return fmt.Sprintf("%#q", cutStart(s, maxQuotedBytes)) }

// canSpawn checks that writer may start a run: a task waiting for a worker, or a
// stalled run its own worker starts again.
func (s State) canSpawn(writer string) error {
	switch {
	case s.Phase == PhaseArmed && s.Paused:
		return ErrWrongPhase
	case s.Phase == PhaseArmed:
		return nil
	case s.Phase == PhaseRunning && s.RespawnPending && s.Worker == writer:
		return nil
	case s.Phase == PhaseRunning && s.RespawnPending:
		return fmt.Errorf("%w: %s respawns task %s, not %s", ErrNotOwner, s.Worker, s.ID, writer)
	}
	return ErrWrongPhase
}

// ownedBy checks that a run event comes from the spawn that holds the task.
func (s State) ownedBy(rec events.Record) error {
	if s.Phase != PhaseRunning {
		return ErrWrongPhase
	}
	if rec.Epoch != s.Epoch || rec.Writer != s.Worker {
		return fmt.Errorf("%w: %s at epoch %d, lease is %s at epoch %d", ErrNotOwner, rec.Writer, rec.Epoch, s.Worker, s.Epoch)
	}
	return nil
}

// Replay folds a whole history. Events that do not fit are skipped and returned.
func Replay(history []events.Record) (State, []error) {
	var s State
	var problems []error
	for _, rec := range history {
		var err error
		if s, err = Apply(s, rec); err != nil {
			problems = append(problems, err)
		}
	}
	return s, problems
}
