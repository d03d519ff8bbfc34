package httpapi

import (
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/internal/testkit"
)

// Each filter of GET /v1/tasks selects the tasks it names, from the running
// ones and from the settled ones (kept as summaries) alike, and they combine;
// a bad value is refused naming its parameter.
func TestListFilters(t *testing.T) {
	h := start(t)
	reg := func(spec string) string {
		t.Helper()
		id := must[api.Registered](t, h.do("POST", "/v1/tasks", spec), 201).ID
		must[api.TaskView](t, h.do("GET", "/v1/tasks/"+id, ""), 200) // a get waits for the projection
		return id
	}
	// No worker: the commands stay armed.
	build := reg(`{"command":"make","target":"agent-1","kind":"build","placement":{"labels":{"pool":"blue"}}}`)
	test := reg(`{"command":"make test","target":"agent-2","kind":"test","placement":{"labels":{"pool":"green","zone":"eu"}}}`)
	between := time.Now()
	cancelled := reg(`{"command":"make lint","target":"agent-1","kind":"build","placement":{"labels":{"pool":"green"}}}`)
	must[api.TaskView](t, h.do("POST", "/v1/tasks/"+cancelled+"/cancel", ""), 200)
	timer := reg(`{"start_at":"100ms","prompt":"rang"}`)
	testkit.Eventually(t, 20*time.Second, "the timer fired", func() bool {
		return must[api.TaskView](t, h.do("GET", "/v1/tasks/"+timer, ""), 200).Phase == engine.PhaseFired
	})
	for _, tc := range []struct {
		query string
		want  []string // newest first
	}{
		{"", []string{timer, cancelled, test, build}},
		{"status=cancelled", []string{cancelled}},
		{"status=succeeded", []string{timer}},
		{"target=agent-1", []string{cancelled, build}},
		{"target=default", []string{timer}},
		{"kind=build", []string{cancelled, build}},
		{"label=pool=green", []string{cancelled, test}},
		{"label=zone=eu,pool=green", []string{test}},
		{"label=pool=red", nil},
		{"since=" + url.QueryEscape(between.Format(time.RFC3339Nano)), []string{timer, cancelled}},
		{"until=" + url.QueryEscape(between.Format(time.RFC3339Nano)), []string{test, build}},
		{"kind=build&state=armed", []string{build}},
		{"target=agent-1&label=pool=green&since=" + url.QueryEscape(between.Format(time.RFC3339Nano)), []string{cancelled}},
	} {
		page := must[api.ListReply](t, h.do("GET", "/v1/tasks?"+tc.query, ""), 200)
		var got []string
		for _, task := range page.Tasks {
			got = append(got, task.ID)
		}
		if !slices.Equal(got, tc.want) || page.Total != len(tc.want) {
			t.Errorf("?%s: %v (total %d), want %v", tc.query, got, page.Total, tc.want)
		}
	}
	for _, tc := range []struct{ query, field string }{
		{"status=finished", "status"},
		{"target=a.b", "target"},
		{"kind=a%0Ab", "kind"},
		{"label=pool", "label"},
		{"label=pool=a%20b", "label"},
		{"label==blue", "label"},
		{"since=yesterday", "since"},
		{"until=2026-12-01", "until"},
		{"since=2026-12-01T10:00:00Z&until=2026-12-01T09:00:00Z", "until"},
	} {
		apiError(t, h.do("GET", "/v1/tasks?"+tc.query, ""), 400, tc.field)
	}
}

// The dashboard's list takes the same filters, shows them in its form and keeps
// them in its links; a bad one is said on the page, naming it.
func TestTheTaskListKeepsItsFilters(t *testing.T) {
	h := start(t)
	var builds []string
	for range 3 {
		id := must[api.Registered](t, h.do("POST", "/v1/tasks", `{"command":"make","kind":"build","placement":{"labels":{"pool":"blue"}}}`), 201).ID
		builds = append(builds, id)
		must[api.Registered](t, h.do("POST", "/v1/tasks", `{"command":"make test","kind":"test"}`), 201)
	}
	testkit.Eventually(t, 20*time.Second, "the list has the 6 tasks", func() bool {
		return must[api.ListReply](t, h.do("GET", "/v1/tasks", ""), 200).Total == 6
	})
	first := string(h.page("GET", "/?kind=build&label=pool%3Dblue&limit=2", "").body)
	rows := regexp.MustCompile(`<tr data-id="([^"]+)"`)
	if got := rows.FindAllStringSubmatch(first, -1); len(got) != 2 || got[0][1] != builds[2] || got[1][1] != builds[1] {
		t.Fatalf("first page of builds: %v\n%s", got, first)
	}
	for _, want := range []string{`value="build"`, `value="pool=blue"`, `class="total">3<`} {
		if !strings.Contains(first, want) {
			t.Errorf("the page has no %s", want)
		}
	}
	next := regexp.MustCompile(`href="(/\?[^"]*cursor=[^"]+)" rel="next"`).FindStringSubmatch(first)
	if next == nil {
		t.Fatalf("no next page:\n%s", first)
	}
	link := strings.ReplaceAll(next[1], "&amp;", "&")
	if !strings.Contains(link, "kind=build") || !strings.Contains(link, "label=pool%3Dblue") {
		t.Fatalf("the next page's link drops the filters: %s", link)
	}
	second := string(h.page("GET", link, "").body)
	if got := rows.FindAllStringSubmatch(second, -1); len(got) != 1 || got[0][1] != builds[0] {
		t.Fatalf("second page of builds: %v", got)
	}
	if bad := string(h.page("GET", "/?since=yesterday", "").body); !strings.Contains(bad, `class="error">since: `) {
		t.Fatalf("a bad filter: %s", bad)
	}
}
