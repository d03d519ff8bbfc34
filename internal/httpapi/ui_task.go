package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
)

// taskView is a task's page: the task, its timeline, and a key for its re-run
// form (a form sent twice registers once).
type taskView struct {
	Nav      string
	Task     api.TaskView
	Timeline []timelineItem
	RerunKey string
	Done     bool // no cancel: the task ended
	// Redeliver: its pushes are done (delivered or gave up), so they can be
	// pushed again.
	Redeliver bool
}

// timelineItem is one event of a task's history, or a run of ticks in one.
type timelineItem struct {
	Seq     uint64
	Type    string
	Time    time.Time
	Writer  string
	Summary string
	Payload string // the payload, indented
	Ticks   int    // a run of this many ticks (Time the first, Last the last)
	Last    time.Time
}

// taskDetail serves a task's page.
func (s *Server) taskDetail(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	id := r.PathValue("id")
	t, err := s.api.Get(ctx, id)
	var h api.HistoryReply
	if err == nil {
		h, err = s.api.History(ctx, id)
	}
	if err != nil {
		s.pageError(w, "tasks", err)
		return
	}
	done := !t.Phase.Runs()
	redeliver := !t.Consumed && (t.Delivery == engine.DeliveryFailed || t.Delivery == engine.DeliveryDelivered)
	s.render(w, r, "task.html", "task-body", taskView{Nav: "tasks", Task: t, Timeline: timeline(h.Events),
		RerunKey: "rerun-" + uuid.NewString(), Done: done, Redeliver: redeliver})
}

// The events the timeline shows in a way of its own, by their names in the
// stream (docs/architecture.md), as the dashboard's script knows them.
const (
	eventArmed = "armed"
	eventTick  = "tick"
)

// timeline is a history as the page shows it: consecutive ticks folded into one
// item, every event with a line of its payload's scalar fields.
func timeline(recs []client.Event) []timelineItem {
	var items []timelineItem
	for _, rec := range recs {
		if n := len(items); rec.Type == eventTick && n > 0 && items[n-1].Ticks > 0 {
			last := &items[n-1]
			last.Ticks++
			last.Last, last.Seq = rec.Time, rec.Seq
			last.Summary = tickSummary(last.Ticks, rec.Payload)
			continue
		}
		it := timelineItem{Seq: rec.Seq, Type: string(rec.Type), Time: rec.Time, Writer: rec.Writer, Summary: summary(rec)}
		if rec.Type == eventTick {
			it.Ticks, it.Last, it.Summary = 1, rec.Time, tickSummary(1, rec.Payload)
		}
		var pretty bytes.Buffer
		if json.Indent(&pretty, rec.Payload, "", "  ") == nil {
			it.Payload = pretty.String()
		}
		items = append(items, it)
	}
	return items
}

func tickSummary(n int, payload json.RawMessage) string {
	var tick struct {
		OutputBytes int64 `json:"output_bytes"`
	}
	_ = json.Unmarshal(payload, &tick)
	return fmt.Sprintf("×%d · %d bytes of output", n, tick.OutputBytes)
}

// summary is an event's payload in one line: its scalar fields as key=value and
// its lists of lines joined; an armed event shows its command.
func summary(rec client.Event) string {
	var fields map[string]any
	if json.Unmarshal(rec.Payload, &fields) != nil {
		return ""
	}
	if rec.Type == eventArmed {
		var armed struct{ Spec engine.Spec }
		if json.Unmarshal(rec.Payload, &armed) == nil {
			return "command=" + armed.Spec.CommandLine() + targetOf(armed.Spec)
		}
	}
	if w, ok := fields["wakeup"].(map[string]any); ok {
		fields = w // completion-persisted: the wake-up's fields
	}
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		switch v := fields[k].(type) {
		case string, float64, bool:
			parts = append(parts, fmt.Sprintf("%s=%v", k, v))
		case []any:
			if lines := stringsOf(v); len(lines) > 0 {
				parts = append(parts, k+"="+strings.Join(lines, " ⏎ "))
			}
		}
	}
	line := strings.Join(parts, " · ")
	if len(line) > 300 {
		line = line[:300] + "…"
	}
	return line
}

func targetOf(spec engine.Spec) string {
	if spec.Target == "" {
		return ""
	}
	return " · target=" + spec.Target
}

func stringsOf(v []any) []string {
	var out []string
	for _, e := range v {
		if s, ok := e.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// cancelForm cancels a task from its page, then shows the page again. Like every
// state-changing request, it passes the guard's origin checks: a form posted
// from another site is refused before it gets here.
func (s *Server) cancelForm(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	r.Body = http.MaxBytesReader(w, r.Body, maxSmallBody)
	if _, err := s.api.Cancel(r.Context(), id, r.PostFormValue("reason")); err != nil {
		s.pageError(w, "tasks", err)
		return
	}
	http.Redirect(w, r, "/tasks/"+id, http.StatusSeeOther)
}

// rerunForm registers a task again (as `bgtask rerun`), with the form's key as
// its idempotency key, and shows the new task.
func (s *Server) rerunForm(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxSmallBody)
	reg, err := s.api.Rerun(r.Context(), r.PathValue("id"), r.PostFormValue("key"))
	if err != nil {
		s.pageError(w, "tasks", err)
		return
	}
	http.Redirect(w, r, "/tasks/"+reg.ID, http.StatusSeeOther)
}

// redeliverForm pushes the task's wake-up again (as `bgtask redeliver`), then
// shows its page.
func (s *Server) redeliverForm(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if _, err := s.api.Redeliver(r.Context(), api.RedeliverRequest{ID: id}); err != nil {
		s.pageError(w, "tasks", err)
		return
	}
	http.Redirect(w, r, "/tasks/"+id, http.StatusSeeOther)
}
