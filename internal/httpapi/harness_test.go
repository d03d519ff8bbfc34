package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/bgtask/bgtask/engine/node"
	"github.com/bgtask/bgtask/engine/sinks"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/events/eventstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testToken = "a-test-token-of-at-least-thirty-two-bytes"

// harness is an engine on embedded JetStream (no worker: commands stay armed,
// timers fire) and the HTTP API over it.
type harness struct {
	t    testing.TB
	srv  *Server
	url  string
	nats *eventstest.Server
}

func start(t testing.TB, configure ...func(*Config)) *harness {
	t.Helper()
	ns := eventstest.Run(t)
	n, err := node.New(node.Config{Conn: ns.Conn, Writer: "engine", LeaseTTL: time.Minute, Replicas: 1,
		Sinks: sinks.New([]byte("a test secret of enough bytes")), Version: "0.0.0-test"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Stop)
	if _, err := events.OpenLogs(ctx, ns.JS, events.LogConfig{}); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Conn: ns.Conn, Addr: "127.0.0.1:0", Token: testToken}
	for _, c := range configure {
		c(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return &harness{t: t, srv: s, url: s.URL(), nats: ns}
}

// response is a finished request: status, headers, body.
type response struct {
	status int
	header http.Header
	body   []byte
}

// do makes a request with the token (headers may override it: "" removes one).
func (h *harness) do(method, path, body string, headers ...string) response {
	h.t.Helper()
	req, err := http.NewRequest(method, h.url+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testToken)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	setHeaders(req, headers)
	resp, err := noRedirects.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header, data}
}

func setHeaders(req *http.Request, kv []string) {
	for i := 0; i+1 < len(kv); i += 2 {
		switch {
		case kv[i] == "Host":
			req.Host = kv[i+1]
		case kv[i+1] == "":
			req.Header.Del(kv[i])
		default:
			req.Header.Set(kv[i], kv[i+1])
		}
	}
}

var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// must checks a response's status and decodes its body into a T.
func must[T any](t testing.TB, r response, status int) T {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d: %s", r.status, status, r.body)
	}
	var v T
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
	return v
}

// apiError checks that a response is the error object with a status and field.
func apiError(t testing.TB, r response, status int, field string) {
	t.Helper()
	e := must[errorBody](t, r, status)
	if e.Error == nil || e.Error.Code != status || e.Error.Field != field || e.Error.Message == "" {
		t.Fatalf("error %s, want code %d naming field %q", r.body, status, field)
	}
}

// sseEvent is one event read from a stream ("" id: none).
type sseEvent struct {
	id, event, data string
}

// sseStream is an open stream of Server-Sent Events.
type sseStream struct {
	t      testing.TB
	body   io.ReadCloser
	lines  *bufio.Reader
	cancel context.CancelFunc
	// comments counts the comment lines read (heartbeats).
	comments int
}

// open starts a stream with the token; headers as in do.
func (h *harness) open(path string, headers ...string) *sseStream {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, h.url+path, nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	setHeaders(req, headers)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		h.t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		h.t.Fatalf("open %s: %d %s", path, resp.StatusCode, data)
	}
	s := &sseStream{t: h.t, body: resp.Body, lines: bufio.NewReader(resp.Body), cancel: cancel}
	h.t.Cleanup(s.close)
	return s
}

func (s *sseStream) close() {
	s.cancel()
	s.body.Close()
}

// next reads the next event; ok false at the end of the stream.
func (s *sseStream) next() (ev sseEvent, ok bool) {
	s.t.Helper()
	seen := false
	for {
		line, err := s.lines.ReadString('\n')
		if err != nil {
			return ev, false
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "":
			if seen {
				return ev, true
			}
		case strings.HasPrefix(line, ":"):
			s.comments++
		case strings.HasPrefix(line, "id: "):
			ev.id, seen = line[4:], true
		case strings.HasPrefix(line, "event: "):
			ev.event, seen = line[7:], true
		case strings.HasPrefix(line, "data: "):
			ev.data, seen = line[6:], true
		case strings.HasPrefix(line, "retry: "):
		default:
			s.t.Fatalf("not a line of Server-Sent Events: %q", line)
		}
	}
}

// record reads the next event as an event record.
func (s *sseStream) record() (sseEvent, events.Record) {
	s.t.Helper()
	ev, ok := s.next()
	if !ok {
		s.t.Fatal("the stream ended")
	}
	var rec events.Record
	if err := json.Unmarshal([]byte(ev.data), &rec); err != nil {
		s.t.Fatalf("event %+v: %v", ev, err)
	}
	return ev, rec
}
