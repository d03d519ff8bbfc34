package projections

import (
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// settled reports whether nothing can happen to a task any more but its archiving:
// it fired and its push sinks are done, or it was cancelled, or archived. Such a
// task is kept as a summary: a long stream holds mostly these, and their whole
// states (spec, output tail, wake-up) were most of the projector's memory.
func settled(s *engine.State) bool {
	return s.Phase.Terminal() && (s.Phase != engine.PhaseFired || s.Acknowledged())
}

// summary is what the projector keeps of a settled task: what a list shows and
// what the engine decides by (its phase and outcome, when it ran and ended, the
// condition of its next append). The rest is read from its history when the task
// is asked for by id. Every field of an archived task's state is here: for it,
// the summary is the whole state.
type summary struct {
	ArmedAt time.Time `json:"armed_at"`
	// EndedAt and FiredAt are zero when the state has none.
	EndedAt time.Time `json:"ended_at,omitzero"`
	FiredAt time.Time `json:"fired_at,omitzero"`

	ID      string `json:"id"`
	Command string `json:"command"`
	Kind    string `json:"kind,omitempty"`
	Target  string `json:"target,omitempty"`
	Status  string `json:"status,omitempty"`
	// Placement is the spec's, one copy shared by the summaries with its labels:
	// a list selects by them.
	Placement *engine.Placement `json:"placement,omitempty"`

	Phase        engine.Phase `json:"state"`
	ArchivedFrom engine.Phase `json:"archived_from,omitempty"`
	LastType     events.Type  `json:"last_event"`

	Seq        uint64 `json:"seq"`
	Epoch      uint64 `json:"epoch,omitempty"`
	ArchiveSeq uint64 `json:"archive_seq,omitempty"`
	Events     int    `json:"events"`
	// Run is how the command ended, if it ran: a list shows its exit code.
	Run runEnd `json:"run,omitempty"`
	// Pushes is how its push sinks ended: a list selects by it.
	Pushes   pushEnd `json:"pushes,omitempty"`
	ExitCode int     `json:"exit_code,omitempty"` // runWatched: the watched PID

	// Occurrence is the schedule slot the task ran for: a schedule's show lists them.
	Occurrence *engine.Occurrence `json:"occurrence,omitempty"`
}

// runEnd is how a settled task's run ended, as far as its list entry shows.
type runEnd uint8

const (
	runNone runEnd = iota
	runExited
	runKeptRunning
	runNotStarted
	runWatched // a process bgtask did not start: no exit code
)

// pushEnd is how a settled task's push sinks ended (engine.State.Delivery): a
// settled task has none pending.
type pushEnd uint8

const (
	pushNone pushEnd = iota
	pushDelivered
	pushFailed
)

var pushEnds = map[string]pushEnd{engine.DeliveryDelivered: pushDelivered, engine.DeliveryFailed: pushFailed}

func (e pushEnd) String() string {
	switch e {
	case pushDelivered:
		return engine.DeliveryDelivered
	case pushFailed:
		return engine.DeliveryFailed
	}
	return ""
}

// summarize makes the summary of a settled state; in interns its repeated
// strings.
func summarize(s *engine.State, in *interner) summary {
	sum := summary{
		ArmedAt: s.ArmedAt, ID: s.ID, Command: s.Spec.CommandLine(),
		Kind: in.get(s.Spec.Kind), Target: in.get(s.Spec.Target), Status: in.get(s.Status), Placement: in.placement(s.Spec.Placement),
		Phase: s.Phase, ArchivedFrom: s.ArchivedFrom, LastType: s.LastType,
		Seq: s.Seq, Epoch: s.Epoch, ArchiveSeq: s.ArchiveSeq, Events: s.Events,
		Occurrence: s.Spec.Occurrence, Pushes: pushEnds[s.Delivery],
	}
	if s.EndedAt != nil {
		sum.EndedAt = *s.EndedAt
	}
	if s.FiredAt != nil {
		sum.FiredAt = *s.FiredAt
	}
	if r := s.Run; r != nil {
		switch {
		case r.KeptRunning:
			sum.Run = runKeptRunning
		case r.NotStarted:
			sum.Run = runNotStarted
		case r.WatchedPID != 0:
			sum.Run, sum.ExitCode = runWatched, r.WatchedPID
		default:
			sum.Run, sum.ExitCode = runExited, r.ExitCode
		}
	}
	return sum
}

// state is the summary as a state: the whole state of an archived task, the
// list entry of any other.
// finishedAt is when the task's last step happened, as engine.State says.
func (sum *summary) finishedAt() time.Time {
	switch {
	case !sum.FiredAt.IsZero():
		return sum.FiredAt
	case !sum.EndedAt.IsZero():
		return sum.EndedAt
	}
	return sum.ArmedAt
}

// listed is what a list query selects the summary's task by.
func (sum *summary) listed() engine.Listed {
	return engine.Listed{Phase: sum.Phase, Status: sum.Status, Target: sum.Target, Kind: sum.Kind,
		Delivery: sum.Pushes.String(), Placement: sum.Placement, ArmedAt: sum.ArmedAt}
}

func (sum *summary) state() engine.State {
	s := engine.State{
		ID: sum.ID, Phase: sum.Phase, Status: sum.Status, Seq: sum.Seq, Epoch: sum.Epoch,
		Spec: engine.Spec{Command: sum.Command, Kind: sum.Kind, Target: sum.Target, Placement: sum.Placement,
			Occurrence: sum.Occurrence},
		ArmedAt: sum.ArmedAt, ArchiveSeq: sum.ArchiveSeq, ArchivedFrom: sum.ArchivedFrom,
		LastType: sum.LastType, Events: sum.Events, Delivery: sum.Pushes.String(),
	}
	if !sum.EndedAt.IsZero() {
		at := sum.EndedAt
		s.EndedAt = &at
	}
	if !sum.FiredAt.IsZero() {
		at := sum.FiredAt
		s.FiredAt = &at
	}
	switch sum.Run {
	case runExited:
		s.Run = &events.Exited{ExitCode: sum.ExitCode}
	case runKeptRunning:
		s.Run = &events.Exited{KeptRunning: true}
	case runNotStarted:
		s.Run = &events.Exited{NotStarted: true}
	case runWatched:
		s.Run = &events.Exited{WatchedPID: sum.ExitCode}
	}
	return s
}

// interner keeps one copy of what many summaries share: a status, a kind, a
// target, a placement.
type interner struct {
	strings    map[string]string
	placements map[string]*engine.Placement
}

func (in *interner) get(s string) string {
	if s == "" {
		return ""
	}
	if c, ok := in.strings[s]; ok {
		return c
	}
	if len(in.strings) >= maxInterned {
		return s
	}
	if in.strings == nil {
		in.strings = map[string]string{}
	}
	in.strings[s] = s
	return s
}

// placement is p, or the one kept of the placements with its labels.
func (in *interner) placement(p *engine.Placement) *engine.Placement {
	if p == nil {
		return nil
	}
	key := p.String()
	if c, ok := in.placements[key]; ok {
		return c
	}
	if len(in.placements) >= maxInterned {
		return p
	}
	if in.placements == nil {
		in.placements = map[string]*engine.Placement{}
	}
	in.placements[key] = p
	return p
}

// maxInterned bounds the strings, and the placements, interned: kinds, targets
// and labels are free, and one per task would only add a map entry to each.
const maxInterned = 4096
