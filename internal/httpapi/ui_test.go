package httpapi

import (
	"context"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/testkit"
	"github.com/bgtask/bgtask/projections"
)

// session logs in through a one-time link and returns the Cookie header value.
func (h *harness) session() string {
	h.t.Helper()
	link := must[struct{ URL string }](h.t, h.do("POST", "/v1/login", ""), 201).URL
	login := h.do("GET", strings.TrimPrefix(link, h.url), "", "Authorization", "")
	c, err := http.ParseSetCookie(login.header.Get("Set-Cookie"))
	if err != nil {
		h.t.Fatal(err)
	}
	return c.Name + "=" + c.Value
}

// page is a dashboard request as the browser makes it: the cookie, no token.
func (h *harness) page(method, path, body string, headers ...string) response {
	h.t.Helper()
	return h.do(method, path, body, append([]string{"Authorization", "", "Cookie", h.session(),
		"Content-Type", "application/x-www-form-urlencoded"}, headers...)...)
}

// The cancel and re-run buttons are forms posted with the session cookie: one
// from another site (its Origin, an opaque one, or only what the browser says
// in Sec-Fetch-Site) is refused and changes nothing; the page's own is taken.
func TestTheDashboardsFormsRefuseOtherSites(t *testing.T) {
	h := start(t)
	reg := must[api.Registered](t, h.do("POST", "/v1/tasks", `{"command":"sleep 100","start_at":"1h"}`), 201)
	for _, action := range []string{"cancel", "rerun"} {
		for name, headers := range map[string][]string{
			"a foreign Origin":     {"Origin", "http://evil.example", "Sec-Fetch-Site", "cross-site", "Sec-Fetch-Mode", "navigate"},
			"an opaque Origin":     {"Origin", "null"},
			"a cross-site form":    {"Sec-Fetch-Site", "cross-site", "Sec-Fetch-Mode", "navigate"},
			"another local origin": {"Origin", "http://127.0.0.1:1", "Sec-Fetch-Site", "same-site", "Sec-Fetch-Mode", "navigate"},
		} {
			if r := h.page("POST", "/tasks/"+reg.ID+"/"+action, "reason=x&key=k", headers...); r.status != 403 {
				t.Errorf("%s %s: %d %s", action, name, r.status, r.body)
			}
		}
	}
	if tasks := must[api.ListReply](t, h.do("GET", "/v1/tasks", ""), 200); tasks.Total != 1 || tasks.Tasks[0].Phase != engine.PhaseArmed {
		t.Fatalf("after refused forms: %+v", tasks)
	}
	own := []string{"Origin", h.url, "Sec-Fetch-Site", "same-origin", "Sec-Fetch-Mode", "navigate"}
	rerun := h.page("POST", "/tasks/"+reg.ID+"/rerun", "key=rerun-once", own...)
	again := h.page("POST", "/tasks/"+reg.ID+"/rerun", "key=rerun-once", own...)
	newID := strings.TrimPrefix(rerun.header.Get("Location"), "/tasks/")
	if rerun.status != 303 || newID == reg.ID || newID == "" || again.header.Get("Location") != rerun.header.Get("Location") {
		t.Fatalf("re-run: %d to %q, again to %q", rerun.status, rerun.header.Get("Location"), again.header.Get("Location"))
	}
	if r := h.page("POST", "/tasks/"+reg.ID+"/cancel", "reason=from+the+page", own...); r.status != 303 || r.header.Get("Location") != "/tasks/"+reg.ID {
		t.Fatalf("cancel: %d %s", r.status, r.body)
	}
	testkit.Eventually(t, 20*time.Second, "the task cancelled from the page", func() bool {
		got := must[api.TaskView](t, h.do("GET", "/v1/tasks/"+reg.ID, ""), 200)
		return got.Phase == engine.PhaseCancelled && got.Reason == "from the page"
	})
	if r := h.page("POST", "/tasks/"+reg.ID+"/cancel", "", own...); r.status != 409 || !strings.Contains(string(r.body), "<html") {
		t.Fatalf("cancelling twice: %d %s", r.status, r.body)
	}
}

// The list is a page at a time, filtered by state, through the engine's cursor,
// with the filter kept in its links; htmx's refresh gets the list alone.
func TestTheTaskListPages(t *testing.T) {
	h := start(t)
	var ids []string
	for range 5 {
		ids = append(ids, must[api.Registered](t, h.do("POST", "/v1/tasks", `{"command":"true","start_at":"1h"}`), 201).ID)
	}
	must[api.TaskView](t, h.do("POST", "/v1/tasks/"+ids[0]+"/cancel", ""), 200)
	testkit.Eventually(t, 20*time.Second, "the list has the 5 tasks", func() bool {
		return must[api.ListReply](t, h.do("GET", "/v1/tasks", ""), 200).Total == 5
	})
	first := string(h.page("GET", "/?state=armed&limit=2", "").body)
	rows := regexp.MustCompile(`<tr data-id="([^"]+)"`)
	next := regexp.MustCompile(`href="(/\?[^"]*cursor=[^"]+)" rel="next"`).FindStringSubmatch(first)
	if got := rows.FindAllStringSubmatch(first, -1); len(got) != 2 || got[0][1] != ids[4] || got[1][1] != ids[3] || next == nil {
		t.Fatalf("first page of armed tasks: %v, next %v\n%s", got, next, first)
	}
	link := strings.ReplaceAll(next[1], "&amp;", "&")
	if !strings.Contains(link, "state=armed") || !strings.Contains(link, "limit=2") {
		t.Fatalf("the next page's link drops the filter: %s", link)
	}
	second := h.page("GET", link, "", "HX-Request", "true")
	if got := rows.FindAllStringSubmatch(string(second.body), -1); len(got) != 2 || got[0][1] != ids[2] || got[1][1] != ids[1] {
		t.Fatalf("second page: %v", got)
	}
	if strings.Contains(string(second.body), "<html") || !strings.Contains(string(second.body), `class="total">4<`) {
		t.Fatalf("htmx's refresh is not the list alone:\n%s", second.body)
	}
	if r := h.page("GET", "/tasks/no-such-task", ""); r.status != 404 || !strings.Contains(string(r.body), "<html") {
		t.Fatalf("an unknown task's page: %d %s", r.status, r.body)
	}
	if r := h.page("GET", "/?state=sleeping", ""); !strings.Contains(string(r.body), "state: &#34;sleeping&#34;") {
		t.Fatalf("a bad state: %d %s", r.status, r.body)
	}
}

// The pages load nothing from elsewhere: every script, stylesheet and link is
// the server's own, under a policy that allows no other.
func TestThePagesAreSelfContained(t *testing.T) {
	h := start(t)
	reg := must[api.Registered](t, h.do("POST", "/v1/tasks", `{"command":"echo hi","start_at":"1h"}`), 201)
	must[api.TaskView](t, h.do("GET", "/v1/tasks/"+reg.ID, ""), 200)
	ref := regexp.MustCompile(`(?:src|href|sse-connect|hx-get|data-logs|action)="([^"]*)"`)
	for _, path := range []string{"/", "/tasks/" + reg.ID, "/workers", "/targets"} {
		r := h.page("GET", path, "")
		if r.status != 200 || !strings.HasPrefix(r.header.Get("Content-Security-Policy"), "default-src 'self';") {
			t.Fatalf("%s: %d, CSP %q", path, r.status, r.header.Get("Content-Security-Policy"))
		}
		for _, m := range ref.FindAllStringSubmatch(string(r.body), -1) {
			if !strings.HasPrefix(m[1], "/") || strings.HasPrefix(m[1], "//") {
				t.Errorf("%s refers to %q", path, m[1])
			} else if strings.HasPrefix(m[1], "/ui/") && h.page("GET", m[1], "").status != 200 {
				t.Errorf("%s: %s is not served", path, m[1])
			}
		}
	}
}

// A history's ticks fold into one entry; the other events keep theirs, with a
// line of their payloads.
func TestTheTimelineFoldsTicks(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rec := func(seq uint64, typ events.Type, payload string) events.Record {
		return events.Record{Seq: seq, Event: events.Event{Type: typ, Time: at.Add(time.Duration(seq) * time.Second), Payload: []byte(payload)}}
	}
	got := timeline([]events.Record{
		rec(1, events.TypeArmed, `{"spec":{"command":"make"}}`),
		rec(2, events.TypeSpawned, `{"worker":"w1","host":"vm"}`),
		rec(3, events.TypeTick, `{"output_bytes":10}`),
		rec(4, events.TypeTick, `{"output_bytes":20}`),
		rec(5, events.TypeTick, `{"output_bytes":30}`),
		rec(6, events.TypeNotice, `{"n":1,"lines":["error: x"],"upto":30}`),
		rec(7, events.TypeTick, `{"output_bytes":40}`),
		rec(8, events.TypeExited, `{"exit_code":2}`),
	})
	var types []string
	for _, it := range got {
		types = append(types, string(it.Type)+":"+it.Summary)
	}
	want := []string{"armed:command=make", "spawned:host=vm · worker=w1", "tick:×3 · 30 bytes of output",
		"notice:lines=error: x · n=1 · upto=30", "tick:×1 · 40 bytes of output", "exited:exit_code=2"}
	if strings.Join(types, "\n") != strings.Join(want, "\n") {
		t.Fatalf("timeline:\n%s\nwant\n%s", strings.Join(types, "\n"), strings.Join(want, "\n"))
	}
	if got[2].Seq != 5 || !got[2].Last.Equal(at.Add(5*time.Second)) {
		t.Fatalf("folded ticks: %+v", got[2])
	}
}

// The audit page runs the audit only when asked, and shows its violations.
func TestTheAuditPageRunsWhenAsked(t *testing.T) {
	runs := 0
	h := start(t, func(c *Config) {
		c.Audit = func(context.Context) (projections.Report, error) {
			runs++
			return projections.Report{Events: 7, Tasks: 2, Violations: []projections.Violation{{TaskID: "t-1", Seq: 5, Rule: "fired-twice", Detail: "a second fired"}}}, nil
		}
	})
	if r := h.page("GET", "/audit", ""); r.status != 200 || runs != 0 || !strings.Contains(string(r.body), `id="run-audit"`) {
		t.Fatalf("the audit page before a run: %d, %d runs\n%s", r.status, runs, r.body)
	}
	r := h.page("GET", "/audit?run=1", "")
	if body := string(r.body); runs != 1 || !strings.Contains(body, "fired-twice") || !strings.Contains(body, "a second fired") || !strings.Contains(body, "<b>7</b> events") {
		t.Fatalf("the audit page after a run: %d runs\n%s", runs, body)
	}
}

// The list's rows say each task's exit code and kind, and what a task that runs
// no command is, instead of an empty command.
func TestTheTaskListSaysExitKindAndWhatRunsNoCommand(t *testing.T) {
	five := 5
	tasks := []api.TaskView{
		{Command: "make test", ExitCode: &five, State: engine.State{ID: "t-failed", Spec: engine.Spec{Command: "make test", Kind: "build"}}},
		{State: engine.State{ID: "t-timer", Spec: engine.Spec{Kind: engine.KindTimer}}},
		{State: engine.State{ID: "t-join", Spec: engine.Spec{Join: &engine.Join{Mode: "all", Members: []string{"a", "b"}}}}},
	}
	var page strings.Builder
	if err := pages().ExecuteTemplate(&page, "task-list", listView{Tasks: tasks}); err != nil {
		t.Fatal(err)
	}
	cells := regexp.MustCompile(`(?s)<tr data-id="([^"]+)">(.*?)</tr>`)
	text := regexp.MustCompile(`<[^>]+>`)
	want := map[string][]string{
		"t-failed": {"5", "make test", "build"},
		"t-timer":  {"timer"},
		"t-join":   {"join of 2 tasks (all)"},
	}
	rows := cells.FindAllStringSubmatch(page.String(), -1)
	if len(rows) != len(tasks) {
		t.Fatalf("%d rows, want %d:\n%s", len(rows), len(tasks), page.String())
	}
	for _, row := range rows {
		var cols []string
		for _, td := range strings.Split(row[2], "<td")[1:] {
			cols = append(cols, strings.TrimSpace(text.ReplaceAllString("<td"+td, "")))
		}
		for _, w := range want[row[1]] {
			if !slices.Contains(cols, w) {
				t.Errorf("row %s has no cell %q: %q", row[1], w, cols)
			}
		}
	}
}
