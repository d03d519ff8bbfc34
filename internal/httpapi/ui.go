package httpapi

import (
	"bytes"
	"embed"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
)

// The dashboard is server-rendered: templates/ holds one template per page
// (and layout.html around them), ui/ the static files served under /ui/: the
// stylesheet, dash.js and htmx with its SSE extension, vendored (ui/vendor), so
// nothing is loaded from elsewhere. Both are in the binary, so `go install` is
// all it takes. A page's live parts are fragments of the same template that
// htmx fetches again (an HX-Request) when the event stream says something
// changed.
var (
	//go:embed templates/*.html
	templateFiles embed.FS
	//go:embed ui
	uiFiles embed.FS

	assets, _ = fs.Sub(uiFiles, "ui")
	// pages are parsed at the first page served, not at every start of the
	// binary, a client command's too.
	pages = sync.OnceValue(func() *template.Template {
		return template.Must(template.New("").Funcs(template.FuncMap{
			"short": short,
			"what":  what,
			"when":  when,
			"ago":   ago,
			"title": func(title, nav string) headView { return headView{title, nav} },
		}).ParseFS(templateFiles, "templates/*.html"))
	})
)

// headView is what the layout needs: the page's title, and its tab in the navigation.
type headView struct{ Title, Nav string }

// The list's page sizes: the default first.
var pageSizes = []int{50, 25, 100, 200}

// phases are the states the list filters by, in the order a task goes through them.
var phases = []engine.Phase{engine.PhaseArmed, engine.PhaseRunning, engine.PhaseEnded, engine.PhasePersisted,
	engine.PhaseFired, engine.PhaseCancelled, engine.PhaseArchived}

// short is the end of a task id, which tells tasks apart: its start is the
// time it was made (a UUIDv7), the same for tasks made together.
func short(id string) string {
	if len(id) <= 12 {
		return id
	}
	return "…" + id[len(id)-12:]
}

// what names what a task runs: its command line, or, for a task that runs none,
// what it is instead.
func what(t api.TaskView) string {
	switch s := t.Spec; {
	case t.Command != "":
		return t.Command
	case s.Join != nil:
		return "join of " + strconv.Itoa(len(s.Join.Members)) + " tasks (" + s.Join.Mode + ")"
	case s.External:
		return "completed from outside"
	case s.Kind != "":
		return s.Kind
	}
	return "(no command)"
}

// when shows a time of a task (a time or a pointer to one, nil for none).
func when(v any) string {
	t := timeOf(v)
	if t.IsZero() {
		return ""
	}
	return t.Local().Format("2006-01-02 15:04:05")
}

// ago shows how long ago a time was, to the second under a minute.
func ago(v any) string {
	t := timeOf(v)
	if t.IsZero() {
		return ""
	}
	d := time.Since(t)
	switch {
	case d < 0:
		return "in " + (-d).Round(time.Second).String()
	case d < time.Minute:
		return strconv.Itoa(int(d.Seconds())) + "s ago"
	case d < time.Hour:
		return strconv.Itoa(int(d.Minutes())) + "m ago"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d.Hours())) + "h ago"
	}
	return strconv.Itoa(int(d.Hours()/24)) + "d ago"
}

func timeOf(v any) time.Time {
	switch v := v.(type) {
	case time.Time:
		return v
	case *time.Time:
		if v != nil {
			return *v
		}
	}
	return time.Time{}
}

// page renders a page into the response, whole or not at all. A request htmx
// makes (HX-Request) for a page's live part gets that fragment only: the
// template named fragment.
func (s *Server) page(w http.ResponseWriter, status int, name string, data any) {
	var buf bytes.Buffer
	if err := pages().ExecuteTemplate(&buf, name, data); err != nil {
		s.log.Error("render page", "page", name, "err", err)
		http.Error(w, "the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Vary", "HX-Request")
	// A form's POST carries the page's origin only if its policy lets the
	// referrer go to the same origin (under no-referrer a browser sends
	// Origin: null, which the guard refuses); no other site gets it.
	w.Header().Set("Referrer-Policy", "same-origin")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// render is page, or its fragment for htmx.
func (s *Server) render(w http.ResponseWriter, r *http.Request, name, fragment string, data any) {
	if r.Header.Get("HX-Request") == "true" {
		name = fragment
	}
	s.page(w, http.StatusOK, name, data)
}

// listView is the task list page: one page of tasks and the filters that chose them.
type listView struct {
	Nav, Error   string
	Tasks        []api.TaskView
	Total        int
	Filter       url.Values // the filters given: the list's own parameters
	State        string
	Limit        int
	Cursor, Next string
	Phases       []engine.Phase
	Statuses     []string
	Deliveries   []string
	Sizes        []int
	Self         string // this page's URL, which the live part fetches again
}

// Filtered reports whether a filter is given.
func (v listView) Filtered() bool { return len(v.Filter) > 0 }

// Link is the list's URL with cursor (and the filters kept).
func (v listView) Link(cursor string) string {
	q := url.Values{}
	for name, values := range v.Filter {
		q[name] = values
	}
	if v.Limit != pageSizes[0] {
		q.Set("limit", strconv.Itoa(v.Limit))
	}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	if len(q) == 0 {
		return "/"
	}
	return "/?" + q.Encode()
}

// taskPage is the task list, newest first, a page at a time: the engine pages
// it (ListAfter), so a home of 100,000 tasks costs what one page does.
func (s *Server) taskPage(w http.ResponseWriter, r *http.Request) {
	v := listView{Nav: "tasks", Phases: phases, Statuses: engine.Statuses, Deliveries: engine.DeliveryStates, Sizes: pageSizes, Limit: pageSizes[0],
		Filter: url.Values{}}
	q, err := query(r, listParams...)
	var lq engine.ListQuery
	if err == nil {
		v.State, v.Cursor = q.Get("state"), q.Get("cursor")
		for _, name := range listFilters {
			if q.Get(name) != "" {
				v.Filter.Set(name, q.Get(name))
			}
		}
		if v.State != "" && !slices.Contains(phases, engine.Phase(v.State)) {
			err = badField("state", "%q: want one of %v", v.State, phases)
		}
	}
	if err == nil {
		v.Limit, err = intParam(q, "limit", pageSizes[0], 1)
		v.Limit = min(v.Limit, 500)
	}
	if err == nil {
		lq, err = listQuery(q)
	}
	if err == nil {
		var page api.ListReply
		lq.Limit = v.Limit
		page, err = s.api.ListPage(r.Context(), api.ListRequest{ListQuery: lq, Cursor: v.Cursor})
		v.Tasks, v.Total, v.Next = page.Tasks, page.Total, page.NextCursor
	}
	if err != nil {
		v.Error = asError(err).Message
	}
	v.Self = v.Link(v.Cursor)
	s.render(w, r, "tasks.html", "task-list", v)
}

// pageError is a page that says what went wrong, with the error's status.
func (s *Server) pageError(w http.ResponseWriter, nav string, err error) {
	e := asError(err)
	s.page(w, httpStatus(e.Code), "error.html", struct{ Nav, Error string }{nav, e.Message})
}
