package engine

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/bgtask/bgtask/events"
)

// Notify sends a notice for stdout lines that match its rule while the command
// runs: each notice is a notice event before it is an inbox message
// (<task id>.n<k>), so a restart neither loses nor repeats one. Batch gathers the
// lines of that long into one notice; MinInterval and Max bound how often and how
// many. The final wake-up comes once, as always.
type Notify struct {
	// Type is json_line or line_pattern, with Match or Regex as for a completion rule.
	Type        string         `json:"type" jsonschema:"json_line: a JSON line with the fields of match; line_pattern: a line matching regex"`
	Match       map[string]any `json:"match,omitempty" jsonschema:"json_line: fields the line's object must have"`
	Regex       string         `json:"regex,omitempty" jsonschema:"line_pattern: a Go RE2 regular expression"`
	Batch       string         `json:"batch,omitempty" jsonschema:"gather the lines of this long after the first into one notice"`
	MinInterval string         `json:"min_interval,omitempty" jsonschema:"at least this long between two notices"`
	Max         int            `json:"max,omitempty" jsonschema:"at most this many notices (default 100)"`
}

// Notice bounds.
const (
	DefaultNoticesMax = 100
	MaxNoticesLimit   = 1000
	// MaxNoticeLines is the most lines one notice carries; the rest of its batch
	// is counted, not kept.
	MaxNoticeLines = 20
)

func (s *Spec) validateNotify() error {
	n := s.Notify
	if n == nil {
		return nil
	}
	if !s.HasCommand() {
		return fieldErr("notify", "needs a command whose output is watched")
	}
	switch n.Type {
	case CompleteOnJSON:
		if len(n.Match) == 0 {
			return fieldErr("notify.match", "json_line needs at least one field to match")
		}
		if n.Regex != "" {
			return fieldErr("notify.regex", "only with type line_pattern")
		}
	case CompleteOnPattern:
		if _, err := regexp.Compile(n.Regex); err != nil || n.Regex == "" {
			return fieldErr("notify.regex", "line_pattern needs a valid regex: %v", err)
		}
		if len(n.Match) > 0 {
			return fieldErr("notify.match", "only with type json_line")
		}
	default:
		return fieldErr("notify.type", "%q: want json_line or line_pattern", n.Type)
	}
	for _, f := range []struct {
		name string
		v    *string
	}{{"notify.batch", &n.Batch}, {"notify.min_interval", &n.MinInterval}} {
		if *f.v == "" {
			continue
		}
		d, err := time.ParseDuration(*f.v)
		if err != nil || d < 0 {
			return fieldErr(f.name, "%q is not a duration such as 5s or 1m", *f.v)
		}
		*f.v = d.String()
	}
	switch {
	case n.Max == 0:
		n.Max = DefaultNoticesMax
	case n.Max < 0 || n.Max > MaxNoticesLimit:
		return fieldErr("notify.max", "%d: want 1 to %d", n.Max, MaxNoticesLimit)
	}
	return nil
}

// NoticeMatcher returns the notify rule as a line matcher, or nil without one.
func (s Spec) NoticeMatcher() LineMatcher {
	n := s.Notify
	if n == nil {
		return nil
	}
	return Completion{Type: n.Type, Match: n.Match, Regex: n.Regex}.matcher()
}

// NoticeBatch and NoticeMinInterval are the notify rule's durations (0 without).
func (n *Notify) NoticeBatch() time.Duration { d, _ := time.ParseDuration(n.Batch); return d }
func (n *Notify) NoticeMinInterval() time.Duration {
	d, _ := time.ParseDuration(n.MinInterval)
	return d
}

// Notice records the lines of one notice: the worker holding the run decides it.
// Upto is where the last of them ends in the run's stdout, so a worker that
// watches the run again after a restart looks for the next lines after it.
type Notice struct {
	Lines   []string
	Dropped int
	Upto    int64
}

func (c Notice) decide(s State, m Meta) (events.Payload, uint64, error) {
	if err := s.leaseHeldBy(m.Writer); err != nil {
		return nil, 0, err
	}
	switch {
	case s.Spec.Notify == nil:
		return nil, 0, fmt.Errorf("%w: task %s has no notify rule", ErrWrongPhase, s.ID)
	case s.Notices >= s.Spec.Notify.Max:
		return nil, 0, fmt.Errorf("%w: task %s sent its %d notices", ErrWrongPhase, s.ID, s.Notices)
	case len(c.Lines) == 0 || len(c.Lines) > MaxNoticeLines:
		return nil, 0, fmt.Errorf("a notice of %d lines: want 1 to %d", len(c.Lines), MaxNoticeLines)
	}
	return &events.Notice{N: s.Notices + 1, Lines: c.Lines, Dropped: c.Dropped, Upto: c.Upto}, s.Epoch, nil
}

func (s State) noticed(rec events.Record, p *events.Notice) (State, error) {
	if err := s.ownedBy(rec); err != nil {
		return s, err
	}
	if s.Spec.Notify == nil || p.N != s.Notices+1 || p.N > s.Spec.Notify.Max {
		return s, fmt.Errorf("notice %d after %d notices", p.N, s.Notices)
	}
	at := rec.Time
	s.Notices, s.LastNotice, s.LastNoticeAt, s.NoticeEpoch = p.N, p, &at, rec.Epoch
	return s, nil
}

// NoticeID is the inbox message id suffix of notice k.
func NoticeID(k int) string { return "n" + strconv.Itoa(k) }

// NoticeWakeup is the inbox message of a notice: the task is still running, and
// its lines are the tail.
func (s State) NoticeWakeup(p *events.Notice) events.Wakeup {
	w := events.Wakeup{
		ID: s.ID, Status: "running", Kind: s.Spec.Kind, Command: s.Spec.CommandLine(),
		Target: s.Spec.Target, Origin: s.Spec.Origin, Notice: NoticeID(p.N), Tail: p.Lines,
	}
	if p.Dropped > 0 {
		w.Reason = fmt.Sprintf("%d more matching lines are not shown", p.Dropped)
	}
	return s.fit(w, "", 0, func(w events.Wakeup, _ map[string]string) []part {
		parts := []part{lit("Background task %s is still running; notice %d of its output:\n", w.ID, p.N), placeholder("tail"), lit("\n")}
		if w.Reason != "" {
			parts = append(parts, lit("("), placeholder("reason"), lit(")\n"))
		}
		return append(parts, lit("Command: "), placeholder("command"), lit("\n"))
	})
}

// noticeRecheckAfter is how old a notice may be before its delivery searches the
// inbox for an earlier one: a second attempt sooner is caught by the inbox's
// dedupe window, which is keyed by message id.
const noticeRecheckAfter = events.DefaultDuplicates / 2

// deliverNotices delivers, in order, the notices of a task not known to be in
// its inbox. A task this process has not delivered notices of (after a restart)
// has each searched for first, since an earlier process may have delivered it.
func (d *Dispatcher) deliverNotices(ctx context.Context, s State) error {
	if s.Notices == 0 || s.Phase.Terminal() || s.Phase == PhaseCancelled {
		return nil
	}
	d.mu.Lock()
	sent, known := d.sent[s.ID]
	d.mu.Unlock()
	if sent >= s.Notices {
		return nil
	}
	notices, err := d.noticesFrom(ctx, s, sent+1)
	if err != nil {
		return err
	}
	for _, n := range notices {
		var since time.Time
		if !known || d.base.Now().Sub(n.at) > noticeRecheckAfter {
			since = n.at
		}
		if _, err := d.inbox.Deliver(ctx, s.NoticeWakeup(n.notice), since); err != nil {
			return err
		}
		d.mu.Lock()
		d.sent[s.ID] = n.notice.N
		d.mu.Unlock()
	}
	return nil
}

type timedNotice struct {
	notice *events.Notice
	at     time.Time
}

// noticesFrom returns a task's notices from the k-th on: the last from its state,
// earlier ones from its history.
func (d *Dispatcher) noticesFrom(ctx context.Context, s State, k int) ([]timedNotice, error) {
	if k == s.Notices && s.LastNotice != nil && s.LastNoticeAt != nil {
		return []timedNotice{{s.LastNotice, *s.LastNoticeAt}}, nil
	}
	history, err := d.store.History(ctx, s.ID)
	if err != nil {
		return nil, err
	}
	var out []timedNotice
	for _, rec := range history {
		if rec.Type != events.TypeNotice {
			continue
		}
		p, err := rec.Decode()
		if n, ok := p.(*events.Notice); err == nil && ok && n.N >= k && n.N <= s.Notices {
			out = append(out, timedNotice{n, rec.Time})
		}
	}
	return out, nil
}
