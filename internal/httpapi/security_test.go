package httpapi

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine/api"
)

// Each attack is refused before it reaches the API, and changes nothing.
func TestAttacksAreRefused(t *testing.T) {
	h := start(t)
	port := h.url[strings.LastIndex(h.url, ":")+1:]
	spec := `{"command":"touch /tmp/pwned"}`
	for _, c := range []struct {
		name, method, path string
		headers            []string
		status             int
		field              string
	}{
		{"no token", "POST", "/v1/tasks", []string{"Authorization", ""}, 401, "Authorization"},
		{"a wrong token", "POST", "/v1/tasks", []string{"Authorization", "Bearer " + strings.Repeat("x", len(testToken))}, 401, "Authorization"},
		{"the token's prefix", "POST", "/v1/tasks", []string{"Authorization", "Bearer " + testToken[:len(testToken)-1]}, 401, "Authorization"},
		{"the token and more", "POST", "/v1/tasks", []string{"Authorization", "Bearer " + testToken + "x"}, 401, "Authorization"},
		{"the token as basic auth", "GET", "/v1/tasks", []string{"Authorization", "Basic " + testToken}, 401, "Authorization"},
		{"DNS rebinding: a foreign Host", "GET", "/v1/tasks", []string{"Host", "evil.example:" + port}, 403, "Host"},
		{"a foreign Host on POST", "POST", "/v1/tasks", []string{"Host", "evil.example"}, 403, "Host"},
		{"another port's Host", "GET", "/v1/tasks", []string{"Host", "127.0.0.1:1"}, 403, "Host"},
		{"a foreign Origin", "POST", "/v1/tasks", []string{"Origin", "http://evil.example"}, 403, "Origin"},
		{"another local origin", "POST", "/v1/tasks", []string{"Origin", "http://127.0.0.1:1"}, 403, "Origin"},
		{"a foreign Origin reading", "GET", "/v1/tasks", []string{"Origin", "http://evil.example"}, 403, "Origin"},
		{"an opaque Origin", "POST", "/v1/tasks", []string{"Origin", "null"}, 403, "Origin"},
		{"a cross-site fetch", "GET", "/v1/tasks", []string{"Sec-Fetch-Site", "cross-site", "Sec-Fetch-Mode", "no-cors"}, 403, "Sec-Fetch-Site"},
		{"a same-site page on another port", "POST", "/v1/tasks", []string{"Sec-Fetch-Site", "same-site", "Sec-Fetch-Mode", "cors"}, 403, "Sec-Fetch-Site"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := h.do(c.method, c.path, spec, c.headers...)
			apiError(t, r, c.status, c.field)
			if c.status == 401 && r.header.Get("WWW-Authenticate") == "" {
				t.Error("a 401 without WWW-Authenticate")
			}
		})
	}
	if n := must[api.ListReply](t, h.do("GET", "/v1/tasks", ""), 200).Total; n != 0 {
		t.Fatalf("%d tasks registered by refused requests", n)
	}
	// The server's own names pass, localhost included.
	must[api.ListReply](t, h.do("GET", "/v1/tasks", "", "Host", "localhost:"+port), 200)
	must[api.ListReply](t, h.do("POST", "/v1/tasks", `{"command":"true"}`, "Origin", h.url, "Sec-Fetch-Site", "same-origin"), 201)
}

// The login link works once, within its time; it becomes an HttpOnly,
// SameSite=Strict session cookie and a page that opens the dashboard, and a cross-origin
// request carrying the cookie still cannot change anything.
func TestLoginThroughAOneTimeLink(t *testing.T) {
	h := start(t)
	reg := must[api.Registered](t, h.do("POST", "/v1/tasks", `{"command":"echo on-the-page"}`), 201)
	must[api.TaskView](t, h.do("GET", "/v1/tasks/"+reg.ID, ""), 200) // a get waits for the projection; a list does not
	apiError(t, h.do("POST", "/v1/login", "", "Authorization", ""), 401, "Authorization")
	link := must[struct{ URL string }](t, h.do("POST", "/v1/login", ""), 201).URL
	if !strings.HasPrefix(link, h.url+"/login?token=") {
		t.Fatalf("link %q", link)
	}
	path := strings.TrimPrefix(link, h.url)
	if r := h.do("GET", "/", "", "Authorization", ""); r.status != 401 || !strings.Contains(string(r.body), "bgtask ui") {
		t.Fatalf("the dashboard without a session: %d %s", r.status, r.body)
	}
	// A page that goes on to the dashboard itself: along a redirect that a file's
	// page started, a browser would not send the SameSite=Strict cookie.
	login := h.do("GET", path, "", "Authorization", "")
	if login.status != http.StatusOK || !strings.Contains(string(login.body), `http-equiv="refresh" content="0;url=/"`) {
		t.Fatalf("login: %d %s", login.status, login.body)
	}
	cookies, err := http.ParseSetCookie(login.header.Get("Set-Cookie"))
	if err != nil || !cookies.HttpOnly || cookies.SameSite != http.SameSiteStrictMode || cookies.Path != "/" || len(cookies.Value) < 40 {
		t.Fatalf("session cookie %+v (%v)", cookies, err)
	}
	session := cookies.Name + "=" + cookies.Value
	if again := h.do("GET", path, "", "Authorization", ""); again.status != 401 || again.header.Get("Set-Cookie") != "" {
		t.Fatalf("the link used twice: %d", again.status)
	}
	page := h.do("GET", "/", "", "Authorization", "", "Cookie", session)
	if page.status != 200 || !strings.Contains(string(page.body), reg.ID[:8]) || !strings.Contains(string(page.body), "echo on-the-page") {
		t.Fatalf("the dashboard: %d %s", page.status, page.body)
	}
	must[api.ListReply](t, h.do("GET", "/v1/tasks", "", "Authorization", "", "Cookie", session), 200)
	apiError(t, h.do("POST", "/v1/tasks", `{"command":"true"}`, "Authorization", "", "Cookie", session, "Sec-Fetch-Site", "cross-site", "Sec-Fetch-Mode", "navigate"), 403, "Origin")
	apiError(t, h.do("GET", "/v1/tasks", "", "Authorization", "", "Cookie", cookies.Name+"=forged"), 401, "Authorization")

	// A link not used in time is dead; so is a session past its time.
	late := strings.TrimPrefix(must[struct{ URL string }](t, h.do("POST", "/v1/login", ""), 201).URL, h.url)
	h.srv.sessions.mu.Lock()
	h.srv.sessions.now = func() time.Time { return time.Now().Add(loginTTL) }
	h.srv.sessions.mu.Unlock()
	if r := h.do("GET", late, "", "Authorization", ""); r.status != 401 {
		t.Fatalf("an expired link: %d", r.status)
	}
	h.srv.sessions.mu.Lock()
	h.srv.sessions.now = func() time.Time { return time.Now().Add(sessionTTL) }
	h.srv.sessions.mu.Unlock()
	apiError(t, h.do("GET", "/v1/tasks", "", "Authorization", "", "Cookie", session), 401, "Authorization")
	if r := h.do("GET", "/login?token="+url.QueryEscape("made-up"), "", "Authorization", ""); r.status != 401 {
		t.Fatalf("a made-up link: %d", r.status)
	}
}

func TestNonLoopbackAddressesNeedToBeMeant(t *testing.T) {
	for addr, ok := range map[string]bool{"127.0.0.1:0": true, "[::1]:8080": true, "localhost:0": true,
		"192.0.2.1:80": false, "0.0.0.0:80": false, "example.com:80": false, "127.0.0.1": false, "127.0.0.1:99999": false} {
		if err := CheckAddr(addr, false); (err == nil) != ok {
			t.Errorf("CheckAddr(%s) = %v", addr, err)
		}
	}
	if err := CheckAddr("192.0.2.1:80", true); err != nil {
		t.Errorf("a remote address with Remote: %v", err)
	}
	if err := CheckAddr("0.0.0.0:80", true); err == nil {
		t.Error("the unspecified address with Remote: no Host could be checked")
	}
}

// The metrics token reads GET /metrics and nothing else: a scraper that holds
// it runs no command and reads no task.
func TestTheMetricsTokenReadsTheMetricsOnly(t *testing.T) {
	const metricsToken = "a-metrics-token-of-at-least-thirty-two-bytes"
	h := start(t, func(c *Config) {
		c.Metrics = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("bgtask_up 1\n")) })
		c.MetricsToken = metricsToken
	})
	bearer := []string{"Authorization", "Bearer " + metricsToken}
	if r := h.do("GET", "/metrics", "", bearer...); r.status != 200 || string(r.body) != "bgtask_up 1\n" {
		t.Fatalf("GET /metrics with the metrics token: %d %s", r.status, r.body)
	}
	if r := h.do("GET", "/metrics", ""); r.status != 200 {
		t.Fatalf("GET /metrics with the API's token: %d %s", r.status, r.body)
	}
	apiError(t, h.do("GET", "/metrics", "", "Authorization", "Bearer "+metricsToken[1:]), 401, "Authorization")
	apiError(t, h.do("POST", "/v1/tasks", `{"command":"touch /tmp/pwned"}`, bearer...), 401, "Authorization")
	apiError(t, h.do("GET", "/v1/tasks", "", bearer...), 401, "Authorization")
	apiError(t, h.do("POST", "/v1/login", "", bearer...), 401, "Authorization")
	if r := h.do("GET", "/", "", bearer...); r.status != 401 {
		t.Fatalf("the dashboard with the metrics token: %d", r.status)
	}

	// A short one is refused.
	cfg := h.srv.cfg
	cfg.MetricsToken = "short"
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "MetricsToken") {
		t.Fatalf("a short metrics token: %v", err)
	}
}
