package projections

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// Rules the audit checks, as named in its report.
const (
	RuleCorruptEvent   = "corrupt-event"          // an event that does not decode
	RuleNotLeaseHolder = "not-lease-holder"       // a run event from a writer without the lease
	RuleFiredTwice     = "fired-twice"            // a second fired
	RuleFiredEarly     = "fired-before-persisted" // fired without completion-persisted before it
	RuleOutOfOrder     = "out-of-order"           // any other event that does not fit its task
	RuleInboxMissing   = "inbox-missing"          // a fired task with no wake-up in its inbox
	RuleInboxDuplicate = "inbox-duplicate"        // more than one wake-up for one task
	RuleInboxUnfired   = "inbox-without-fire"     // a wake-up for a task that can never fire
	RuleOwnerGone      = "owner-gone"             // a running task whose worker's lease expired
	RuleStuck          = "stuck"                  // a task in a phase for longer than the engine allows
	RuleTimerTwice     = "timer-due-twice"        // a timer that came due again
	RuleRetryPastCount = "retry-past-count"       // a retry its rule's count does not allow
	RuleSlotTwice      = "schedule-slot-twice"    // two tasks for one slot of a schedule
	RuleProbeAfterDone = "probe-after-done"       // a probe run again after it met its rule
	RuleNoticeMissing  = "notice-missing"         // a fired task with a notice not in the inbox
)

// DefaultStuckAfter is the slack past what the engine promises before a task is
// stuck: longer than a worker's default tick (10s) and kill grace (10s), and
// than the dispatcher's retries of a persist or a fire (every 5s), many times.
const DefaultStuckAfter = 2 * time.Minute

// StuckBounds say when a task that is not at its end is stuck. The engine
// persists an ended task's completion and fires a persisted one within seconds;
// a running task's worker appends a tick every tick interval and stops it at its
// deadline, or, gone, has it lost once its lease expires. So a task is stuck
//   - ended or persisted for longer than After;
//   - running with no event of its run (spawned, tick, stalled) for longer than
//     LeaseTTL + After;
//   - running more than LeaseTTL + After past its deadline.
//
// An armed task is never stuck: it waits for a worker with a free slot that its
// placement allows, which may rightly take any time.
type StuckBounds struct {
	Now      time.Time
	After    time.Duration
	LeaseTTL time.Duration
}

// Violation is one broken invariant.
type Violation struct {
	TaskID string `json:"task_id,omitempty"`
	Seq    uint64 `json:"seq,omitempty"`
	Rule   string `json:"rule"`
	Detail string `json:"detail"`
}

// OpenTask is a task that has not reached its end: armed, running, or between its
// end and its wake-up.
type OpenTask struct {
	TaskID string       `json:"task_id"`
	Phase  engine.Phase `json:"state"`
	Worker string       `json:"worker,omitempty"`
	// Since is when the event that put it in its phase was appended.
	Since time.Time `json:"since"`
}

// Report is the result of an audit.
type Report struct {
	Events     int         `json:"events"`
	Tasks      int         `json:"tasks"`
	Fired      int         `json:"fired"`
	Cancelled  int         `json:"cancelled"`
	Archived   int         `json:"archived"`
	Open       []OpenTask  `json:"open"`
	Violations []Violation `json:"violations"`
}

// Audit replays a whole event log and checks the invariants of DESIGN.md that the
// log itself can show. Feed it every record in order, then the inbox, then call
// Report.
type Audit struct {
	tasks      map[string]engine.State
	events     int
	violations []Violation
	inbox      map[string]int // wake-ups per message id
	alive      func(worker string) bool
	// archived holds the ids of the events fed from the archive: the stream's copy
	// of one, left until the task's compaction, is the same event. Ids, not
	// sequences: an upgraded stream numbers its events anew, the archive keeps
	// the numbers they had.
	archived map[string]bool
	// since is, per task, the time of the event that put it in its phase, and
	// lastRun the time of the last event of its current run.
	since   map[string]time.Time
	lastRun map[string]time.Time
	stuck   *StuckBounds
	// slots are the tasks armed for each schedule slot, by schedule and slot.
	slots map[string][]string
}

// NewAudit starts an audit.
func NewAudit() *Audit {
	return &Audit{tasks: map[string]engine.State{}, inbox: map[string]int{}, archived: map[string]bool{},
		since: map[string]time.Time{}, lastRun: map[string]time.Time{}, slots: map[string][]string{}}
}

// AddArchived folds the history of an archived task. Feed the whole archive
// before the event log.
func (a *Audit) AddArchived(h events.ArchivedHistory) {
	for _, rec := range h.Events {
		a.Add(rec, nil)
		a.archived[rec.ID] = true
	}
}

// Add folds one record of the event log, in log order.
func (a *Audit) Add(rec events.Record, decodeErr error) {
	if a.archived[rec.ID] {
		return // read from the archive already
	}
	a.events++
	if decodeErr != nil {
		a.violate(Violation{Seq: rec.Seq, Rule: RuleCorruptEvent, Detail: decodeErr.Error()})
		return
	}
	prev := a.tasks[rec.TaskID]
	next, err := engine.Apply(prev, rec)
	if next.ID != "" {
		a.tasks[rec.TaskID] = next
	}
	if err == nil {
		if o := next.Spec.Occurrence; rec.Type == events.TypeArmed && o != nil {
			slot := o.Schedule + " at " + o.Slot.UTC().Format(time.RFC3339Nano)
			a.slots[slot] = append(a.slots[slot], rec.TaskID)
		}
		if next.Phase != prev.Phase {
			a.since[rec.TaskID] = rec.Time
		}
		if next.Phase == engine.PhaseRunning {
			a.lastRun[rec.TaskID] = rec.Time
		}
		return
	}
	rule := RuleOutOfOrder
	switch {
	case errors.Is(err, engine.ErrNotOwner):
		rule = RuleNotLeaseHolder
	case rec.Type == events.TypeFired && prev.Phase == engine.PhaseFired:
		rule = RuleFiredTwice
	case rec.Type == events.TypeFired:
		rule = RuleFiredEarly
	case rec.Type == events.TypeDue && prev.Phase != engine.PhaseArmed:
		rule = RuleTimerTwice
	case rec.Type == events.TypeRetryScheduled && prev.Spec.Retry != nil && len(prev.Attempts) >= prev.Spec.Retry.Max:
		rule = RuleRetryPastCount
	case rec.Type == events.TypeProbeScheduled && prev.Status == engine.StatusSucceeded:
		rule = RuleProbeAfterDone
	}
	a.violate(Violation{TaskID: rec.TaskID, Seq: rec.Seq, Rule: rule, Detail: err.Error()})
}

// CheckOwners makes the audit check that every running task's worker holds a
// current lease, as alive says.
func (a *Audit) CheckOwners(alive func(worker string) bool) { a.alive = alive }

// CheckStuck makes the audit report each task stuck in its phase past b.
func (a *Audit) CheckStuck(b StuckBounds) { a.stuck = &b }

// AddDelivery counts one message of the inbox by its message id.
func (a *Audit) AddDelivery(msgID string) { a.inbox[msgID]++ }

func (a *Audit) violate(v Violation) { a.violations = append(a.violations, v) }

// Report checks what needs the whole log and the inbox, and returns the findings.
func (a *Audit) Report() Report {
	r := Report{Events: a.events, Tasks: len(a.tasks), Open: []OpenTask{}, Violations: append([]Violation{}, a.violations...)}
	for id, s := range a.tasks {
		delivered := a.inbox[id]
		switch s.Phase {
		case engine.PhaseFired:
			r.Fired++
			// A consumed wake-up was removed from the inbox by the wait that read it.
			if delivered == 0 && !s.Quiet && !s.Consumed {
				r.Violations = append(r.Violations, Violation{TaskID: id, Rule: RuleInboxMissing,
					Detail: fmt.Sprintf("fired (inbox seq %d) but no wake-up with its id is in the inbox", s.InboxSeq)})
			}
			for k := 1; k <= s.Notices; k++ {
				if a.inbox[id+"."+engine.NoticeID(k)] == 0 {
					r.Violations = append(r.Violations, Violation{TaskID: id, Rule: RuleNoticeMissing,
						Detail: fmt.Sprintf("fired, but notice %d of its %d is not in the inbox", k, s.Notices)})
				}
			}
		case engine.PhaseCancelled:
			r.Cancelled++
		case engine.PhaseArchived:
			// Its wake-up may have aged out of the inbox since; what the log shows
			// was checked when its history was fed from the archive.
			r.Archived++
		default:
			r.Open = append(r.Open, OpenTask{TaskID: id, Phase: s.Phase, Worker: s.Worker, Since: a.since[id]})
			if s.Phase == engine.PhaseRunning && a.alive != nil && !a.alive(s.Worker) {
				r.Violations = append(r.Violations, Violation{TaskID: id, Rule: RuleOwnerGone,
					Detail: fmt.Sprintf("running, but its worker %s has no current lease", s.Worker)})
			}
			if a.stuck != nil {
				if why := a.stuck.why(s, a.since[id], a.lastRun[id]); why != "" {
					r.Violations = append(r.Violations, Violation{TaskID: id, Seq: s.Seq, Rule: RuleStuck, Detail: why})
				}
			}
		}
		switch {
		case delivered > 1:
			r.Violations = append(r.Violations, Violation{TaskID: id, Rule: RuleInboxDuplicate,
				Detail: fmt.Sprintf("%d wake-ups in the inbox", delivered)})
		case delivered == 1 && s.Phase != engine.PhaseFired && s.Phase != engine.PhasePersisted && s.ArchivedFrom != engine.PhaseFired:
			// A persisted task may have been delivered just before a crash; any other
			// phase can never have a wake-up.
			r.Violations = append(r.Violations, Violation{TaskID: id, Rule: RuleInboxUnfired,
				Detail: fmt.Sprintf("a wake-up is in the inbox but the task is %s", s.Phase)})
		}
	}
	for slot, ids := range a.slots {
		if len(ids) > 1 {
			r.Violations = append(r.Violations, Violation{TaskID: ids[1], Rule: RuleSlotTwice,
				Detail: fmt.Sprintf("schedule %s: tasks %s", slot, strings.Join(ids, ", "))})
		}
	}
	for msgID, n := range a.inbox {
		if id, notice, ok := strings.Cut(msgID, "."); ok && n > 1 {
			r.Violations = append(r.Violations, Violation{TaskID: id, Rule: RuleInboxDuplicate,
				Detail: fmt.Sprintf("%d %s notices in the inbox", n, notice)})
		}
	}
	slices.SortFunc(r.Violations, func(a, b Violation) int {
		if c := strings.Compare(a.TaskID, b.TaskID); c != 0 {
			return c
		}
		return cmp.Compare(a.Seq, b.Seq)
	})
	slices.SortFunc(r.Open, func(a, b OpenTask) int { return strings.Compare(a.TaskID, b.TaskID) })
	return r
}

// why says why a task is stuck: its phase, since when, and what it waits for;
// "" if it is not.
func (b StuckBounds) why(s engine.State, since, lastRun time.Time) string {
	ago := func(t time.Time) string {
		return fmt.Sprintf("%s (%s ago)", t.UTC().Format(time.RFC3339), b.Now.Sub(t).Round(time.Second))
	}
	switch s.Phase {
	case engine.PhaseEnded:
		if b.Now.Sub(since) > b.After {
			return fmt.Sprintf("ended (%s) since %s, over %s: waits for its completion to be persisted", s.Status, ago(since), b.After)
		}
	case engine.PhasePersisted:
		if b.Now.Sub(since) > b.After {
			return fmt.Sprintf("persisted (%s) since %s, over %s: waits for its wake-up to be fired", s.Status, ago(since), b.After)
		}
	case engine.PhaseRunning:
		bound := b.LeaseTTL + b.After
		if at := s.Spec.DeadlineTime(); !at.IsZero() && b.Now.Sub(at) > bound {
			return fmt.Sprintf("running on worker %s past its deadline %s, over the lease TTL %s + %s: waits for its worker to stop it",
				s.Worker, ago(at), b.LeaseTTL, b.After)
		}
		if b.Now.Sub(lastRun) > bound {
			return fmt.Sprintf("running on worker %s with no event of its run since %s, over the lease TTL %s + %s: waits for a tick, its end or its loss",
				s.Worker, ago(lastRun), b.LeaseTTL, b.After)
		}
	}
	return ""
}
