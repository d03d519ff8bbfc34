package engine

import (
	"fmt"
	"strings"

	"github.com/bgtask/bgtask/events"
)

// Join modes.
const (
	JoinAll = "all" // the group fires once every member has ended
	JoinAny = "any" // the group fires once the first member has ended
)

// MaxJoinMembers bounds a group: its wake-up lists every member.
const MaxJoinMembers = 1000

// Join is the group a task with no command stands for.
type Join struct {
	Mode    string   `json:"mode"`
	Members []string `json:"members"`
}

// validateJoin checks a group's spec.
func (s *Spec) validateJoin() error {
	j := s.Join
	if j == nil {
		return nil
	}
	switch {
	case s.HasCommand() || s.External || s.StartAt != "":
		return fieldErr("join", "only with no command, start_at or external: the group runs nothing")
	case j.Mode != JoinAll && j.Mode != JoinAny:
		return fieldErr("join.mode", "%q: want all or any", j.Mode)
	case len(j.Members) == 0 || len(j.Members) > MaxJoinMembers:
		return fieldErr("join.members", "%d tasks: want 1 to %d", len(j.Members), MaxJoinMembers)
	}
	for _, id := range j.Members {
		if !events.ValidToken(id) {
			return fieldErr("join.members", "%q is not a task id", id)
		}
	}
	return nil
}

// waitsFor are the tasks whose ends an armed task waits for: its dependencies,
// or its group's members.
func (s State) waitsFor() []string {
	if s.Spec.Join != nil {
		return s.Spec.Join.Members
	}
	return s.Spec.After
}

// JoinEnd is what a group's members let it do: wait, or end with the members as
// they are (nil: wait).
func (s State) JoinEnd(task func(id string) (State, bool)) *EndJoin {
	j := s.Spec.Join
	members := make([]events.Member, len(j.Members))
	ended := 0
	for i, id := range j.Members {
		members[i].ID = id
		m, ok := task(id)
		if !ok || !m.Phase.Terminal() {
			if j.Mode == JoinAll {
				return nil // the members after it need not be read
			}
			continue
		}
		members[i].Status, ended = m.Status, ended+1
		if m.Run != nil && m.Run.HasExitCode() {
			code := m.Run.ExitCode
			members[i].ExitCode = &code
		}
	}
	if ended == 0 {
		return nil
	}
	return &EndJoin{Members: members}
}

// EndJoin ends a group's task with how its members ended.
type EndJoin struct{ Members []events.Member }

func (c EndJoin) decide(s State, _ Meta) (events.Payload, uint64, error) {
	if s.Phase != PhaseArmed || s.Spec.Join == nil {
		return nil, 0, phaseError(s)
	}
	return &events.Joined{Members: c.Members}, s.Epoch, nil
}

// joined ends a group: succeeded if every member that ended succeeded, else
// failed, its reason counting and naming those that did not, so that a caller who
// waits for the group and then goes on (wait GROUP && deploy) stops at a failure.
// The members of a group of any that had not ended count for neither.
func (s State) joined(rec events.Record, p *events.Joined) (State, error) {
	at := rec.Time
	if s.Phase != PhaseArmed || s.Spec.Join == nil {
		return s, ErrWrongPhase
	}
	s.Phase, s.Status, s.EndedAt, s.Members = PhaseEnded, StatusSucceeded, &at, p.Members
	var failed []string
	for _, m := range p.Members {
		if m.Status != "" && m.Status != StatusSucceeded {
			failed = append(failed, memberLine(m))
		}
	}
	if len(failed) > 0 {
		s.Status = StatusFailed
		s.Reason = fmt.Sprintf("%d of %d members did not succeed: %s", len(failed), len(p.Members), strings.Join(failed, ", "))
	}
	return s, nil
}

// memberList renders a group's members for a prompt, one a line.
func memberList(members []events.Member) string {
	lines := make([]string, len(members))
	for i, m := range members {
		lines[i] = memberLine(m)
	}
	return strings.Join(lines, "\n")
}

// memberLine says how a member ended: "ID failed (exit code 5)".
func memberLine(m events.Member) string {
	status := m.Status
	if status == "" {
		status = "not ended"
	}
	line := m.ID + " " + status
	if m.ExitCode != nil {
		line += fmt.Sprintf(" (exit code %d)", *m.ExitCode)
	}
	return line
}
