package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/bgtask/bgtask/events"
)

// Meta is who decides, and when.
type Meta struct {
	Writer string
	Now    time.Time
}

// Command is a request to change a task. Decide turns it into the one event it
// produces, or an error that says why it cannot happen in the task's state.
type Command interface {
	decide(s State, m Meta) (events.Payload, uint64, error)
}

// Decide returns the event that command c appends to a task in state s.
func Decide(s State, c Command, m Meta) (events.Event, error) {
	payload, epoch, err := c.decide(s, m)
	if err != nil {
		return events.Event{}, err
	}
	return events.New(s.ID, m.Writer, epoch, m.Now, payload)
}

// Arm registers a task. The spec must be valid; the state is the empty state of its id.
type Arm struct{ Spec Spec }

// Spawn takes the lease of an armed task.
type Spawn struct{ Host string }

// Tick reports that the run is alive.
type Tick struct {
	PID         int
	OutputBytes int64
}

// spawnClockSlack is how far a worker's clock may be behind the engine's that
// offered it a delayed start.
const spawnClockSlack = time.Second

// Exit records how the command ended.
type Exit struct{ Run events.Exited }

// Stall records that the command printed nothing for SilentFor and what the spec's
// on_stall does about it.
type Stall struct {
	SilentFor time.Duration
	Action    string
}

// Fail records that the command could not run.
type Fail struct{ Reason string }

// Lose ends a run that can no longer be followed (its worker is gone past its
// lease, or its shim died without recording the exit): the task fails as lost, or is
// armed again, as its spec's on_lost says. Reason says why; empty: the worker is gone.
type Lose struct{ Reason string }

func (c Lose) decide(s State, _ Meta) (events.Payload, uint64, error) {
	if s.Phase != PhaseRunning {
		return nil, 0, phaseError(s)
	}
	action := OnLostFail
	if s.Spec.OnLost == OnLostRespawn {
		action = OnLostRespawn
	}
	return &events.Lost{Worker: s.Worker, Action: action, Reason: cutStart(c.Reason, MaxReasonBytes)}, s.Epoch, nil
}

// Expire ends a task that is still waiting for a worker when its deadline passes.
type Expire struct{}

// PersistCompletion fixes the outcome and renders the wake-up.
type PersistCompletion struct{}

// Fire records that the wake-up was delivered to the inbox at InboxSeq, or, Quiet,
// that the outcome is one the spec does not wake on and nothing was delivered.
type Fire struct {
	InboxSeq uint64
	Quiet    bool
}

// Cancel ends an armed or running task without a wake-up.
type Cancel struct{ Reason string }

func (c Arm) decide(s State, _ Meta) (events.Payload, uint64, error) {
	if s.Phase != "" {
		return nil, 0, ErrWrongPhase
	}
	raw, err := json.Marshal(c.Spec)
	if err != nil {
		return nil, 0, err
	}
	if limit := maxPayloadBytes - len(`{"spec":}`); len(raw) > limit {
		// A spec's characters may take six bytes each once escaped as JSON.
		return nil, 0, fieldErr("spec", "%d bytes as stored (JSON-escaped) is over the %d an event can carry", len(raw), limit)
	}
	return &events.Armed{Spec: raw}, 0, nil
}

func (c Spawn) decide(s State, m Meta) (events.Payload, uint64, error) {
	if s.Paused {
		return nil, 0, fmt.Errorf("%w: task %s is paused", ErrWrongPhase, s.ID)
	}
	if err := s.canSpawn(m.Writer); errors.Is(err, ErrWrongPhase) {
		return nil, 0, phaseError(s)
	} else if err != nil {
		return nil, 0, err
	}
	switch at := s.NotBefore(); {
	case !s.Spec.HasCommand():
		return nil, 0, fmt.Errorf("%w: task %s has no command", ErrWrongPhase, s.ID)
	case m.Now.Add(spawnClockSlack).Before(at):
		return nil, 0, fmt.Errorf("%w: task %s starts at %s", ErrWrongPhase, s.ID, at.UTC().Format(time.RFC3339Nano))
	}
	return &events.Spawned{Worker: m.Writer, Host: c.Host}, s.Epoch + 1, nil
}

func (c Tick) decide(s State, m Meta) (events.Payload, uint64, error) {
	if err := s.leaseHeldBy(m.Writer); err != nil {
		return nil, 0, err
	}
	return &events.Tick{PID: c.PID, OutputBytes: c.OutputBytes}, s.Epoch, nil
}

func (c Exit) decide(s State, m Meta) (events.Payload, uint64, error) {
	if err := s.leaseHeldBy(m.Writer); err != nil {
		return nil, 0, err
	}
	run := fitExited(c.Run)
	return &run, s.Epoch, nil
}

func (c Stall) decide(s State, m Meta) (events.Payload, uint64, error) {
	if err := s.leaseHeldBy(m.Writer); err != nil {
		return nil, 0, err
	}
	if s.Spec.StallAfter == "" {
		return nil, 0, fmt.Errorf("%w: task %s has no stall rule", ErrWrongPhase, s.ID)
	}
	// A respawn past its limit ends as a kill; otherwise the spec's action.
	if c.Action != s.Spec.OnStall && !(c.Action == OnStallKill && s.Spec.OnStall == OnStallRespawn) {
		return nil, 0, fmt.Errorf("%w: task %s stalls with %s, not %s", ErrWrongPhase, s.ID, s.Spec.OnStall, c.Action)
	}
	switch c.Action {
	case OnStallNotify:
		if s.StallNotified {
			return nil, 0, fmt.Errorf("%w: the caller was already told task %s stalled", ErrWrongPhase, s.ID)
		}
	case OnStallRespawn:
		if s.Respawns >= s.Spec.Respawns() {
			return nil, 0, fmt.Errorf("%w: task %s was respawned %d times, its limit", ErrWrongPhase, s.ID, s.Respawns)
		}
	case OnStallKill:
	default:
		return nil, 0, fmt.Errorf("unknown stall action %q", c.Action)
	}
	return &events.Stalled{SilentFor: c.SilentFor.String(), Action: c.Action}, s.Epoch, nil
}

func (c Fail) decide(s State, m Meta) (events.Payload, uint64, error) {
	if s.Phase != PhaseArmed {
		if err := s.leaseHeldBy(m.Writer); err != nil {
			return nil, 0, err
		}
	}
	return &events.Failed{Reason: cutStart(c.Reason, MaxReasonBytes)}, s.Epoch, nil
}

func (Expire) decide(s State, m Meta) (events.Payload, uint64, error) {
	if s.Phase != PhaseArmed {
		return nil, 0, phaseError(s)
	}
	at := s.Spec.DeadlineTime()
	if at.IsZero() || m.Now.Before(at) {
		return nil, 0, fmt.Errorf("%w: task %s has no deadline that passed", ErrWrongPhase, s.ID)
	}
	reason := "the deadline " + s.Spec.deadlineText() + " passed before a worker took the task"
	if s.Spec.External {
		reason = "the deadline " + s.Spec.deadlineText() + " passed before the task was completed"
	}
	return &events.Failed{
		Reason:    reason,
		StoppedBy: events.StoppedByDeadline,
	}, s.Epoch, nil
}

func (PersistCompletion) decide(s State, _ Meta) (events.Payload, uint64, error) {
	if s.Phase != PhaseEnded {
		return nil, 0, phaseError(s)
	}
	return &events.CompletionPersisted{Wakeup: s.wakeup()}, s.Epoch, nil
}

func (c Fire) decide(s State, _ Meta) (events.Payload, uint64, error) {
	if s.Phase != PhasePersisted {
		return nil, 0, phaseError(s)
	}
	if c.Quiet == s.Wakes() {
		return nil, 0, fmt.Errorf("%w: task %s's outcome %s: quiet %v, want %v", ErrWrongPhase, s.ID, s.Status, c.Quiet, !s.Wakes())
	}
	return &events.Fired{Subject: events.InboxSubject(s.Spec.Target), InboxSeq: c.InboxSeq, Quiet: c.Quiet}, s.Epoch, nil
}

func (c Cancel) decide(s State, _ Meta) (events.Payload, uint64, error) {
	switch s.Phase {
	case PhaseArmed, PhaseRunning:
		return &events.Cancelled{Reason: cutStart(c.Reason, MaxReasonBytes)}, s.Epoch, nil
	case "":
		return nil, 0, ErrNotFound
	case PhaseEnded, PhasePersisted:
		return nil, 0, fmt.Errorf("%w: the command has already ended (%s); its wake-up is being delivered", ErrFinished, s.Status)
	default:
		return nil, 0, fmt.Errorf("%w: it is %s", ErrFinished, s.Phase)
	}
}

func phaseError(s State) error {
	if s.Phase == "" {
		return ErrNotFound
	}
	return fmt.Errorf("%w: task %s is %s", ErrWrongPhase, s.ID, s.Phase)
}

func (s State) leaseHeldBy(writer string) error {
	if s.Phase != PhaseRunning {
		return phaseError(s)
	}
	if s.Worker != writer {
		return fmt.Errorf("%w: %s holds task %s, not %s", ErrNotOwner, s.Worker, s.ID, writer)
	}
	return nil
}

// wakeup builds what the caller will receive for a task whose run has ended.
func (s State) wakeup() events.Wakeup {
	w := events.Wakeup{
		ID:      s.ID,
		Status:  s.Status,
		Reason:  s.Reason,
		Kind:    s.Spec.Kind,
		Command: s.Spec.CommandLine(),
		Target:  s.Spec.Target,
		Origin:  s.Spec.Origin,
		LateBy:  s.LateBy,
	}
	if len(s.Attempts) > 0 {
		w.Attempts = s.Attempts
	}
	w.Probes = s.Probes
	w.Members = s.Members
	if r := s.Run; r != nil {
		started, ended := r.StartedAt, r.EndedAt
		w.Signal, w.Tail, w.MatchedLine = r.Signal, r.Tail, r.MatchedLine
		w.StartedAt, w.EndedAt = &started, &ended
		if r.HasExitCode() {
			code := r.ExitCode
			w.ExitCode = &code
		}
	}
	result, total := s.result()
	return s.fit(w, result, total, s.promptParts)
}

// promptParts are the parts of the spec's prompt template, or of the default
// prompt, for w.
func (s State) promptParts(w events.Wakeup, vars map[string]string) []part {
	switch {
	case s.Spec.Prompt != "":
		return parseTemplate(s.Spec.Prompt)
	case w.Notice != "":
		return noticePrompt(w)
	case s.Spec.External:
		return externalPrompt(w)
	case s.Spec.Join != nil:
		return joinPrompt(w)
	case s.Spec.Process != nil:
		return processPrompt(w, vars)
	}
	return s.defaultPrompt(w, vars)
}

// fit cuts w to the budget of a wake-up, with result (total bytes long before any
// cut) as its result, and renders its prompt from the parts that prompt gives.
// The command, the reason and the matched line are cut to their own bounds; the
// prompt, the result and the tail share what is left, each taking what it needs
// up to a fair share. The prompt is rendered from the result and tail as cut, and
// within what they leave.
func (s State) fit(w events.Wakeup, result string, total int, prompt func(events.Wakeup, map[string]string) []part) events.Wakeup {
	w.Command = cutStart(w.Command, maxCommandShown)
	w.Reason = cutStart(w.Reason, MaxReasonBytes)
	w.MatchedLine = cutStart(w.MatchedLine, maxMatchedBytes)
	tail := w.Tail
	w.Tail, w.Result, w.Prompt = nil, "", ""
	room := MaxWakeupBytes - encodedLen(&w) // the prompt's quotes included
	const tailKey, resultKey = len(`,"tail":`), len(`,"result":`)

	full := w
	full.Tail, full.Result = tail, s.fitResult(result, total, MaxWakeupBytes)
	vars := promptVars(full, s.Spec.Kind)
	parts := prompt(full, vars)
	need := [3]int{promptLen(parts, newValues(vars, s.Spec.Origin)) - 2, 0, 0}
	if full.Result != "" {
		need[1] = resultKey + jsonLen(full.Result)
	}
	if len(tail) > 0 {
		need[2] = tailKey + listLen(tail)
	}
	share := shares(room, need[0], need[1], need[2])
	if w.Result = s.fitResult(result, total, share[1]-resultKey); w.Result != "" {
		room -= resultKey + jsonLen(w.Result)
	}
	if w.Tail = cutLines(tail, share[2]-tailKey); len(w.Tail) > 0 {
		room -= tailKey + listLen(w.Tail)
	}
	vars = promptVars(w, s.Spec.Kind)
	w.Prompt = renderParts(prompt(w, vars), newValues(vars, s.Spec.Origin), room+2)
	return w
}

// result is what the spec's result rule selects for the wake-up's {{result}}, and
// how many bytes it had before the worker kept only its start.
func (s State) result() (string, int) {
	var out string
	r := s.Spec.Result
	switch {
	case s.ExternalResult != nil:
		return *s.ExternalResult, len(*s.ExternalResult)
	case s.Run == nil:
		return "", 0
	case r != nil && r.Type == ResultCommand:
		out = s.Run.Result
		if s.Run.ResultError != "" {
			out = "(result command failed: " + s.Run.ResultError + ")\n" + out
			return out, len(out) + max(0, s.Run.ResultBytes-len(s.Run.Result))
		}
		return out, max(len(out), s.Run.ResultBytes)
	case r != nil && r.Type == ResultMatchedLine:
		out = s.Run.MatchedLine
	default:
		lines := DefaultTailLines
		if r != nil && r.Lines > 0 {
			lines = r.Lines
		}
		tail := s.Run.Tail
		if len(tail) > lines {
			tail = tail[len(tail)-lines:]
		}
		out = strings.Join(tail, "\n")
	}
	return out, len(out)
}

// fitResult cuts a result of total bytes at max_result_bytes, and to limit bytes
// as JSON, with a note that says so.
func (s State) fitResult(out string, total, limit int) string {
	if len(out) > s.Spec.maxResultBytes() {
		out = runeStart(out, s.Spec.maxResultBytes())
	}
	if len(out) == total && jsonLen(out) <= limit {
		return out
	}
	if cut := out + resultNote(len(out), total); jsonLen(cut) <= limit {
		return cut
	}
	room := limit - jsonLen(resultNote(total, total))
	if room < 0 {
		return ""
	}
	out = jsonPrefix(out, room)
	return out + resultNote(len(out), total)
}

func resultNote(kept, total int) string {
	return fmt.Sprintf("\n[result truncated: %d of %d bytes]", kept, total)
}

// runeStart is the first n bytes of s, less the start of a rune they would cut.
func runeStart(s string, n int) string {
	for n > 0 && n < len(s) && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// StallNotice is the wake-up sent when a task stalls and its spec says notify: the
// task goes on, and its final wake-up follows.
func (s State) StallNotice() events.Wakeup {
	w := events.Wakeup{
		ID: s.ID, Status: StatusStalled, Kind: s.Spec.Kind, Command: s.Spec.CommandLine(),
		Target: s.Spec.Target, Origin: s.Spec.Origin, Notice: StatusStalled,
		Reason: "no output for " + s.Spec.StallAfter + "; the command is still running",
	}
	if s.Stall != nil {
		w.Reason = "no output for " + s.Stall.SilentFor + "; the command is still running"
	}
	return s.fit(w, "", 0, s.promptParts)
}

// CancelledWakeup is what `wait` reports for a cancelled task: nothing is delivered,
// but a waiter still learns how it ended.
func (s State) CancelledWakeup() events.Wakeup {
	w := events.Wakeup{
		ID: s.ID, Status: StatusCancelled, Reason: s.Reason, Kind: s.Spec.Kind,
		Command: s.Spec.CommandLine(), Target: s.Spec.Target, Origin: s.Spec.Origin,
	}
	return s.fit(w, "", 0, func(w events.Wakeup, _ map[string]string) []part {
		return []part{lit("Background task %s was cancelled.\nCommand: ", w.ID), placeholder("command"), lit("\n")}
	})
}
