package httpapi

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/projections"
)

// workersPage lists the live workers: their state, labels, and load against
// their capacity, by their last heartbeat.
func (s *Server) workersPage(w http.ResponseWriter, r *http.Request) {
	out, err := s.api.Workers(r.Context())
	v := struct {
		Nav, Error string
		Workers    []engine.WorkerStatus
		Running    int
		Capacity   int
	}{Nav: "workers", Workers: out.Workers}
	if err != nil {
		v.Error = asError(err).Message
	}
	slices.SortFunc(v.Workers, func(a, b engine.WorkerStatus) int { return strings.Compare(a.ID, b.ID) })
	for _, wk := range v.Workers {
		v.Running += wk.Running
		v.Capacity += wk.MaxTasks
	}
	s.render(w, r, "workers.html", "worker-list", v)
}

// targetRow is a target on its page: its state, and its unread wake-ups: those
// its inbox consumer has not delivered yet, or, before anything read its inbox
// (NoReader), those in the inbox for it.
type targetRow struct {
	Name     string
	State    events.TargetState
	Busy     bool
	Unread   int
	NoReader bool
}

func (s *Server) targetRow(ctx context.Context, name string, st events.TargetState, now time.Time) targetRow {
	row := targetRow{Name: name, State: st, Busy: st.BusyAt(now)}
	if c, err := s.js.Consumer(ctx, events.InboxStreamName, events.InboxConsumerName(name)); err == nil {
		if info, err := c.Info(ctx); err == nil {
			row.Unread = int(info.NumPending) + info.NumAckPending
			return row
		}
	}
	row.NoReader = true
	if stream, err := s.js.Stream(ctx, events.InboxStreamName); err == nil {
		subject := events.InboxSubject(name)
		if info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subject)); err == nil {
			row.Unread = int(info.State.Subjects[subject])
		}
	}
	return row
}

// targetsPage lists the targets that said whether they are busy.
func (s *Server) targetsPage(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	v := struct {
		Nav, Error string
		Targets    []targetRow
	}{Nav: "targets"}
	tb, err := s.targetBucket(ctx)
	var all map[string]events.TargetState
	if err == nil {
		all, err = tb.List(ctx)
	}
	if err != nil {
		v.Error = asError(err).Message
	}
	now := time.Now()
	for name, st := range all {
		v.Targets = append(v.Targets, s.targetRow(ctx, name, st, now))
	}
	slices.SortFunc(v.Targets, func(a, b targetRow) int { return strings.Compare(a.Name, b.Name) })
	s.render(w, r, "targets.html", "target-list", v)
}

// auditPage runs the audit when asked (?run=1) and shows its report: the
// violations of the log's invariants, and the tasks not at their end yet.
func (s *Server) auditPage(w http.ResponseWriter, r *http.Request) {
	v := struct {
		Nav, Error string
		Ran, Can   bool
		Report     projections.Report
		Took       time.Duration
	}{Nav: "audit", Can: s.cfg.Audit != nil}
	q, err := query(r, "run")
	if err == nil && q.Get("run") == "1" && v.Can {
		start := time.Now()
		v.Report, err = s.cfg.Audit(r.Context())
		v.Ran, v.Took = err == nil, time.Since(start).Round(time.Millisecond)
	}
	if err != nil {
		v.Error = asError(err).Message
	}
	s.page(w, http.StatusOK, "audit.html", v)
}
