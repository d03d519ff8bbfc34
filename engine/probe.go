package engine

import (
	"fmt"
	"time"

	"github.com/bgtask/bgtask/events"
)

// MinProbeEvery is the shortest wait between two probe runs: each run is a spawn,
// an exit and a probe-scheduled event in the task's history.
const MinProbeEvery = time.Second

// ReasonProbeDeadline is the reason of a probe whose deadline passed before a run
// of it met its rule.
const ReasonProbeDeadline = "the deadline passed before a probe met its rule"

// validateProbe checks probe_every: the command is a probe, run again every so
// often until its completion rule (or, with none, exit 0) says the task is done.
func (s *Spec) validateProbe() error {
	if s.ProbeEvery == "" {
		return nil
	}
	d, err := time.ParseDuration(s.ProbeEvery)
	switch {
	case err != nil:
		return fieldErr("probe_every", "%q is not a duration such as 30s or 5m", s.ProbeEvery)
	case d < MinProbeEvery:
		return fieldErr("probe_every", "%s is shorter than %s", d, MinProbeEvery)
	case !s.HasCommand():
		return fieldErr("probe_every", "needs a command: the probe that is run again")
	}
	for _, f := range []struct {
		name, why string
		set       bool
	}{
		{"retry", "a probe is run again until its rule matches", s.Retry != nil},
		{"keep_running", "a probe that matched is done", s.KeepRunning},
		{"on_stall", "a stalled probe is run again at its next time", s.OnStall == OnStallRespawn},
		{"on_lost", "a probe is run again only after it ended", s.OnLost == OnLostRespawn},
	} {
		if f.set {
			return fieldErr(f.name, "not with probe_every: %s", f.why)
		}
	}
	s.ProbeEvery = d.String()
	return nil
}

// IsProbe reports whether the spec's command is a probe.
func (s Spec) IsProbe() bool { return s.ProbeEvery != "" }

func (s Spec) probeEvery() time.Duration { d, _ := time.ParseDuration(s.ProbeEvery); return d }

// Probing reports whether a task whose run ended is armed again for its next
// probe instead of delivered: the run ended on its own without meeting the rule
// (failed: a non-zero exit, or no match; stalled: killed for its silence).
func (s State) Probing() bool {
	if s.Phase != PhaseEnded || !s.Spec.IsProbe() || s.Run == nil || s.Run.NotStarted {
		return false
	}
	return s.Status == StatusFailed && s.Run.StoppedBy == "" || s.Status == StatusStalled
}

// ProbeLater arms a probe again for its next run, every probe_every after the
// last one ended; a next run past the deadline is set for the deadline, where it
// ends timed out without starting.
type ProbeLater struct{}

func (ProbeLater) decide(s State, m Meta) (events.Payload, uint64, error) {
	if !s.Probing() {
		return nil, 0, fmt.Errorf("%w: task %s is %s (%s): no probe to run again", ErrWrongPhase, s.ID, s.Phase, s.Status)
	}
	at := m.Now.Add(s.Spec.probeEvery())
	if deadline := s.Spec.DeadlineTime(); !deadline.IsZero() && deadline.Before(at) {
		at = deadline
	}
	return &events.ProbeScheduled{Probes: s.Probes + 1, At: at.UTC()}, s.Epoch, nil
}

// probeScheduled arms a probe again: its last run's outcome is left to the next.
func (s State) probeScheduled(p *events.ProbeScheduled) (State, error) {
	if !s.Probing() {
		return s, ErrWrongPhase
	}
	if p.Probes != s.Probes+1 {
		return s, fmt.Errorf("probe %d scheduled after %d runs", p.Probes, s.Probes)
	}
	at := p.At
	s.Probes, s.LastProbe = p.Probes, s.Run
	s.Phase, s.RetryAt, s.Status, s.Reason = PhaseArmed, &at, "", ""
	s.Run, s.EndedAt, s.Worker, s.Host, s.PID = nil, nil, "", "", 0
	s.Stall, s.StalledAt, s.StallNotified = nil, nil, false
	return s, nil
}

// probeTimedOut is a probe whose deadline passed before its next run: its
// outcome is the last run's, which the wake-up gives, timed out.
func (s State) probeTimedOut(p *events.Exited) State {
	run := *s.LastProbe
	run.StoppedBy, run.EndedAt = events.StoppedByDeadline, p.EndedAt
	s.Phase, s.Run, s.EndedAt, s.LastProbe = PhaseEnded, &run, &run.EndedAt, nil
	s.Status, s.Reason = StatusTimedOut, ReasonProbeDeadline
	return s
}
