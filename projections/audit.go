package projections

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

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
)

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
	// seen is, per task, the last sequence fed from the archive: the stream's copy
	// of those events, if compaction did not remove it yet, is not counted twice.
	seen map[string]uint64
}

// NewAudit starts an audit.
func NewAudit() *Audit {
	return &Audit{tasks: map[string]engine.State{}, inbox: map[string]int{}, seen: map[string]uint64{}}
}

// AddArchived folds the history of an archived task. Feed the whole archive
// before the event log.
func (a *Audit) AddArchived(h events.ArchivedHistory) {
	for _, rec := range h.Events {
		a.Add(rec, nil)
	}
	if n := len(h.Events); n > 0 {
		a.seen[h.TaskID] = max(a.seen[h.TaskID], h.Events[n-1].Seq)
	}
}

// Add folds one record of the event log, in log order.
func (a *Audit) Add(rec events.Record, decodeErr error) {
	if rec.Seq <= a.seen[rec.TaskID] {
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
	}
	a.violate(Violation{TaskID: rec.TaskID, Seq: rec.Seq, Rule: rule, Detail: err.Error()})
}

// CheckOwners makes the audit check that every running task's worker holds a
// current lease, as alive says.
func (a *Audit) CheckOwners(alive func(worker string) bool) { a.alive = alive }

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
			if delivered == 0 {
				r.Violations = append(r.Violations, Violation{TaskID: id, Rule: RuleInboxMissing,
					Detail: fmt.Sprintf("fired (inbox seq %d) but no wake-up with its id is in the inbox", s.InboxSeq)})
			}
		case engine.PhaseCancelled:
			r.Cancelled++
		case engine.PhaseArchived:
			// Its wake-up may have aged out of the inbox since; what the log shows
			// was checked when its history was fed from the archive.
			r.Archived++
		default:
			r.Open = append(r.Open, OpenTask{TaskID: id, Phase: s.Phase, Worker: s.Worker})
			if s.Phase == engine.PhaseRunning && a.alive != nil && !a.alive(s.Worker) {
				r.Violations = append(r.Violations, Violation{TaskID: id, Rule: RuleOwnerGone,
					Detail: fmt.Sprintf("running, but its worker %s has no current lease", s.Worker)})
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
