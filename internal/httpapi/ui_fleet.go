package httpapi

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine"
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
// its inbox's readers have not acknowledged, or, before anything read its inbox
// (NoReader), those in the inbox for it.
type targetRow struct {
	Name     string
	State    client.TargetState
	Busy     bool
	Unread   int
	NoReader bool
}

func (s *Server) targetRow(ctx context.Context, name string, st client.TargetState, now time.Time) targetRow {
	row := targetRow{Name: name, State: st, Busy: st.BusyAt(now)}
	u, err := s.client.Unread(ctx, name)
	if err != nil {
		u = client.Unread{NoReader: true} // none shown: a count not known
	}
	row.Unread, row.NoReader = u.Count, u.NoReader
	return row
}

// targetsPage lists the targets that said whether they are busy.
func (s *Server) targetsPage(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	v := struct {
		Nav, Error string
		Targets    []targetRow
	}{Nav: "targets"}
	all, err := s.client.Targets(ctx)
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
		Report     client.AuditReport
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
