package httpapi

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/internal/testkit"
)

// hook is a webhook receiver that answers 503 until it is up, and keeps the
// Idempotency-Key of each request it accepted.
type hook struct {
	mu       sync.Mutex
	up       bool
	accepted []string
}

func newHook(t *testing.T) (*hook, string) {
	h := &hook{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		defer h.mu.Unlock()
		if !h.up {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		h.accepted = append(h.accepted, r.Header.Get("Idempotency-Key"))
	}))
	t.Cleanup(srv.Close)
	return h, srv.URL
}

func (h *hook) keys() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.accepted...)
}

// gaveUp registers a timer whose one push (max_attempts 1) goes to url, and
// waits until it gave up.
func (h *harness) gaveUp(url string) string {
	h.t.Helper()
	reg := must[api.Registered](h.t, h.do("POST", "/v1/tasks",
		`{"start_at":"100ms","prompt":"p","deliver":[{"type":"webhook","url":"`+url+`","max_attempts":1}]}`), 201)
	testkit.Eventually(h.t, 30*time.Second, "the push given up", func() bool {
		return must[api.TaskView](h.t, h.do("GET", "/v1/tasks/"+reg.ID, ""), 200).Delivery == engine.DeliveryFailed
	})
	return reg.ID
}

// POST /v1/tasks/{id}/redeliver pushes a wake-up whose push gave up again, once;
// a sink out of range is a 400 naming it, a task with nothing to push again a
// 409, and the list selects by the state of the pushes.
func TestRedeliverOverHTTP(t *testing.T) {
	h := start(t)
	rcv, url := newHook(t)
	id := h.gaveUp(url)
	if got := must[api.ListReply](t, h.do("GET", "/v1/tasks?delivery=failed", ""), 200); got.Total != 1 || got.Tasks[0].ID != id {
		t.Fatalf("GET /v1/tasks?delivery=failed: %+v", got)
	}
	if r := h.do("POST", "/v1/tasks/"+id+"/redeliver", `{"sink":1}`); r.status != 400 || !strings.Contains(string(r.body), `"field":"sink"`) {
		t.Fatalf("a sink out of range: %d %s", r.status, r.body)
	}
	rcv.mu.Lock()
	rcv.up = true
	rcv.mu.Unlock()
	task := must[api.TaskView](t, h.do("POST", "/v1/tasks/"+id[:8]+"/redeliver", ""), 200)
	if task.ID != id || !task.Deliveries[0].Redelivering {
		t.Fatalf("the reply: %+v", task.Deliveries)
	}
	testkit.Eventually(t, 30*time.Second, "the push delivered", func() bool {
		return must[api.TaskView](t, h.do("GET", "/v1/tasks/"+id, ""), 200).Delivery == engine.DeliveryDelivered
	})
	if keys := rcv.keys(); len(keys) != 1 || keys[0] != id {
		t.Fatalf("the receiver accepted %q, want one request with key %s", keys, id)
	}
	timer := must[api.Registered](t, h.do("POST", "/v1/tasks", `{"start_at":"1h"}`), 201)
	if r := h.do("POST", "/v1/tasks/"+timer.ID+"/redeliver", "{}"); r.status != 409 || !strings.Contains(string(r.body), "has no push sink") {
		t.Fatalf("a task with no push sink: %d %s", r.status, r.body)
	}
}

// The dashboard marks a task whose push gave up in the list, which filters by
// it, and its page has a Redeliver button whose form pushes it again.
func TestTheDashboardShowsAndRedeliversAPushThatGaveUp(t *testing.T) {
	h := start(t)
	rcv, url := newHook(t)
	id := h.gaveUp(url)
	other := must[api.Registered](t, h.do("POST", "/v1/tasks", `{"start_at":"1h"}`), 201)

	list := string(h.page("GET", "/?delivery=failed", "").body)
	if !strings.Contains(list, `data-id="`+id+`"`) || strings.Contains(list, other.ID) || !strings.Contains(list, "push gave up") ||
		!strings.Contains(list, `<option value="failed" selected>gave up</option>`) {
		t.Fatalf("the list of tasks whose push gave up:\n%s", list)
	}
	page := string(h.page("GET", "/tasks/"+id, "").body)
	if !strings.Contains(page, `action="/tasks/`+id+`/redeliver"`) || !strings.Contains(page, "gave up") {
		t.Fatalf("the task's page has no Redeliver button or gave-up mark:\n%s", page)
	}
	if page := string(h.page("GET", "/tasks/"+other.ID, "").body); strings.Contains(page, "/redeliver") {
		t.Fatal("a task with no push has a Redeliver button")
	}

	rcv.mu.Lock()
	rcv.up = true
	rcv.mu.Unlock()
	own := []string{"Origin", h.url, "Sec-Fetch-Site", "same-origin", "Sec-Fetch-Mode", "navigate"}
	if r := h.page("POST", "/tasks/"+id+"/redeliver", "", "Origin", "http://evil.example"); r.status != 403 {
		t.Fatalf("a redeliver form from another site: %d", r.status)
	}
	if r := h.page("POST", "/tasks/"+id+"/redeliver", "", own...); r.status != 303 || r.header.Get("Location") != "/tasks/"+id {
		t.Fatalf("the redeliver form: %d %s", r.status, r.body)
	}
	testkit.Eventually(t, 30*time.Second, "the push delivered", func() bool {
		return must[api.TaskView](t, h.do("GET", "/v1/tasks/"+id, ""), 200).Delivery == engine.DeliveryDelivered
	})
	if keys := rcv.keys(); len(keys) != 1 || keys[0] != id {
		t.Fatalf("the receiver accepted %q, want one request with key %s", keys, id)
	}
	if r := h.page("POST", "/tasks/"+other.ID+"/redeliver", "", own...); r.status != 409 || !strings.Contains(string(r.body), "has no push sink") {
		t.Fatalf("the redeliver form of a task with no push: %d %s", r.status, r.body)
	}
}
