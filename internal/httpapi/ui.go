package httpapi

import (
	"bytes"
	"embed"
	"html/template"
	"io/fs"
	"net/http"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
)

// The dashboard is server-rendered: templates/ holds one template per page
// (and layout.html around them), ui/ the static files served under /ui/. Both
// are in the binary, so `go install` is all it takes.
var (
	//go:embed templates/*.html
	templateFiles embed.FS
	//go:embed ui
	uiFiles embed.FS

	assets, _ = fs.Sub(uiFiles, "ui")
	pages     = template.Must(template.New("").Funcs(template.FuncMap{
		"short": func(id string) string { return id[:min(len(id), 8)] },
		"when":  when,
	}).ParseFS(templateFiles, "templates/*.html"))
)

// pageLimit is how many tasks the list page shows.
const pageLimit = 100

// when shows a time of a task (a time or a pointer to one, nil for none).
func when(v any) string {
	var t time.Time
	switch v := v.(type) {
	case time.Time:
		t = v
	case *time.Time:
		if v != nil {
			t = *v
		}
	}
	if t.IsZero() {
		return ""
	}
	return t.Local().Format("2006-01-02 15:04:05")
}

// page renders a page into the response, whole or not at all.
func (s *Server) page(w http.ResponseWriter, status int, name string, data any) {
	var buf bytes.Buffer
	if err := pages.ExecuteTemplate(&buf, name, data); err != nil {
		s.log.Error("render page", "page", name, "err", err)
		http.Error(w, "the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// taskPage is the task list, newest first.
func (s *Server) taskPage(w http.ResponseWriter, r *http.Request) {
	page, err := s.api.ListPage(r.Context(), api.ListRequest{ListQuery: engine.ListQuery{Limit: pageLimit}})
	data := struct {
		Tasks []api.TaskView
		Total int
		Error string
	}{Tasks: page.Tasks, Total: page.Total}
	if err != nil {
		data.Error = asError(err).Message
	}
	s.page(w, http.StatusOK, "tasks.html", data)
}
