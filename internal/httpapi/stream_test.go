package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/testkit"
)

// A client that reconnects with the last id it got resumes exactly there: the
// events after it, none twice, none missed.
func TestEventsResumeWithLastEventID(t *testing.T) {
	h := start(t)
	first := h.open("/v1/events")
	for range 3 {
		must[api.Registered](t, h.do("POST", "/v1/tasks", `{"start_at":"100ms","prompt":"x"}`), 201)
	}
	var all []sseEvent
	for len(all) < 9 { // each timer: armed, due, completion-persisted, fired (and more)
		ev, rec := first.record()
		if ev.id != strconv.FormatUint(rec.Seq, 10) {
			t.Fatalf("event id %q, its sequence %d", ev.id, rec.Seq)
		}
		all = append(all, ev)
	}
	first.close()
	resumed := h.open("/v1/events", "Last-Event-ID", all[3].id)
	for i := 4; i < len(all); i++ {
		if ev, _ := resumed.record(); ev != all[i] {
			t.Fatalf("resumed event %d: %+v, want %+v", i, ev, all[i])
		}
	}
	byQuery := h.open("/v1/events?after=" + all[7].id)
	if ev, _ := byQuery.record(); ev != all[8] {
		t.Fatalf("after=%s: %+v, want %+v", all[7].id, ev, all[8])
	}
	apiError(t, h.do("GET", "/v1/events", "", "Last-Event-ID", "x"), 400, "Last-Event-ID")
	apiError(t, h.do("GET", "/v1/events?task=nothing", ""), 404, "id")
	apiError(t, h.do("GET", "/v1/events?target=a.b", ""), 400, "name")
	apiError(t, h.do("GET", "/v1/events?task=x&target=y", ""), 400, "target")
}

// A task's stream starts at its first event; a target's has only its tasks'.
func TestEventsOfATaskAndOfATarget(t *testing.T) {
	h := start(t)
	old := must[api.Registered](t, h.do("POST", "/v1/tasks", `{"command":"true","target":"a"}`), 201)
	ofA := h.open("/v1/events?target=a")
	must[api.Registered](t, h.do("POST", "/v1/tasks", `{"command":"true","target":"b"}`), 201)
	newer := must[api.Registered](t, h.do("POST", "/v1/tasks", `{"command":"true","target":"a"}`), 201)
	must[api.TaskView](t, h.do("POST", "/v1/tasks/"+old.ID+"/cancel", ""), 200) // armed before the stream opened
	for _, want := range []struct {
		id  string
		typ events.Type
	}{{newer.ID, events.TypeArmed}, {old.ID, events.TypeCancelled}} {
		if _, rec := ofA.record(); rec.TaskID != want.id || rec.Type != want.typ {
			t.Fatalf("target a's stream: %s of %s, want %s of %s", rec.Type, rec.TaskID, want.typ, want.id)
		}
	}
	// A task is named by its id's end as the dashboard shows it, too.
	ofTask := h.open("/v1/events?task=" + url.QueryEscape("…"+old.ID[len(old.ID)-12:]))
	for _, typ := range []events.Type{events.TypeArmed, events.TypeCancelled} {
		if _, rec := ofTask.record(); rec.TaskID != old.ID || rec.Type != typ {
			t.Fatalf("the task's stream: %s of %s, want %s", rec.Type, rec.TaskID, typ)
		}
	}
	// Made without a key, ids start with the time they were made: the two of
	// target a share a start.
	shared := 0
	for old.ID[shared] == newer.ID[shared] {
		shared++
	}
	apiError(t, h.do("GET", "/v1/events?task="+old.ID[:shared], ""), api.CodeAmbiguous, "id")
}

// An idle stream sends heartbeats; Stop ends the streams that are open.
func TestHeartbeatsAndStop(t *testing.T) {
	h := start(t, func(c *Config) { c.Heartbeat = 20 * time.Millisecond })
	s := h.open("/v1/events")
	done := make(chan bool)
	go func() {
		for s.comments < 3 {
			if _, err := s.lines.ReadString('\n'); err != nil {
				done <- false
				return
			}
			if line, _ := s.lines.Peek(1); len(line) > 0 && line[0] == ':' {
				s.comments++
			}
		}
		h.srv.Stop()
		_, ok := s.next()
		done <- !ok
	}()
	select {
	case ok := <-done:
		if !ok {
			t.Fatal("no heartbeats, or the stream went on after Stop")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no heartbeats, or the stream went on after Stop")
	}
}

// Streams past the limit are refused until one closes.
func TestOpenStreamsAreBounded(t *testing.T) {
	h := start(t, func(c *Config) { c.MaxStreams = 2 })
	// status opens a stream and closes it as soon as its headers came.
	status := func() (int, http.Header) {
		req, _ := http.NewRequest("GET", h.url+"/v1/events", nil)
		req.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header
	}
	a := h.open("/v1/events")
	h.open("/v1/events")
	if code, header := status(); code != 503 || header.Get("Retry-After") == "" {
		t.Fatalf("a third stream: %d", code)
	}
	a.close()
	testkit.Eventually(t, 20*time.Second, "a stream's slot freed", func() bool {
		code, _ := status()
		return code == 200
	})
}

// publishLog writes a chunk of a task's output as a worker does.
func publishLog(t *testing.T, h *harness, id, stream string, offset int, data string, eof bool) uint64 {
	t.Helper()
	msg := &nats.Msg{Subject: events.LogSubject(id, stream), Data: []byte(data), Header: nats.Header{}}
	msg.Header.Set(events.LogOffsetHeader, strconv.Itoa(offset))
	if eof {
		msg.Header.Set(events.LogEOFHeader, "1")
	}
	ack, err := h.nats.JS.PublishMsg(context.Background(), msg)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// A followed log streams chunks with their log sequence as the id until both
// outputs end; a reconnect resumes after the chunk it names.
func TestLogsFollowAndResume(t *testing.T) {
	h := start(t)
	id := must[api.Registered](t, h.do("POST", "/v1/tasks", `{"command":"true"}`), 201).ID
	s1 := publishLog(t, h, id, events.Stdout, 0, "one\n", false)
	follow := h.open("/v1/tasks/" + id + "/logs?follow=1")
	s2 := publishLog(t, h, id, events.Stderr, 0, "oops\n", true)
	s3 := publishLog(t, h, id, events.Stdout, 4, "two\n", true)
	want := []struct {
		id   uint64
		data string
		eof  bool
	}{{s1, "one\n", false}, {s2, "oops\n", false}, {s2, "", true}, {s3, "two\n", false}, {s3, "", true}}
	for i, w := range want {
		ev, _ := follow.next()
		var c logChunk
		_ = json.Unmarshal([]byte(ev.data), &c)
		if ev.id != strconv.FormatUint(w.id, 10) || c.Data != w.data || c.EOF != w.eof {
			t.Fatalf("chunk %d: %+v, want %+v", i, ev, w)
		}
	}
	if ev, _ := follow.next(); ev.event != "end" {
		t.Fatalf("after both ends: %+v, want the end event", ev)
	}
	resumed := h.open("/v1/tasks/"+id+"/logs?follow=1&stream=stdout", "Last-Event-ID", strconv.FormatUint(s1, 10))
	if ev, _ := resumed.next(); ev.id != strconv.FormatUint(s3, 10) || !strings.Contains(ev.data, `"two\n"`) {
		t.Fatalf("resumed after %d: %+v", s1, ev)
	}
	lines := h.do("GET", "/v1/tasks/"+id+"/logs?stream=stdout", "")
	if lines.status != 200 || string(lines.body) != `{"stream":"stdout","offset":0,"data":"one\n"}`+"\n"+`{"stream":"stdout","offset":4,"data":"two\n"}`+"\n"+`{"stream":"stdout","offset":8,"eof":true}`+"\n" {
		t.Fatalf("logs: %d %s", lines.status, lines.body)
	}
	if byStart := h.do("GET", "/v1/tasks/"+id[:8]+"/logs?stream=stdout", ""); byStart.status != 200 || string(byStart.body) != string(lines.body) {
		t.Fatalf("logs by the id's start: %d %s", byStart.status, byStart.body)
	}
	apiError(t, h.do("GET", "/v1/tasks/nope/logs", ""), 400, "id")
	apiError(t, h.do("GET", "/v1/tasks/nothing/logs", ""), 404, "id")
	apiError(t, h.do("GET", "/v1/tasks/"+id+"/logs?stream=both", ""), 400, "stream")
	apiError(t, h.do("GET", "/v1/tasks/"+id+"/logs?follow=yes", ""), 400, "follow")
}

// A log that cannot be read is the error object, not an empty log.
func TestALogThatCannotBeReadIsAnError(t *testing.T) {
	h := start(t)
	id := must[api.Registered](t, h.do("POST", "/v1/tasks", `{"command":"true"}`), 201).ID
	if err := h.nats.JS.DeleteStream(context.Background(), events.LogStreamName); err != nil {
		t.Fatal(err)
	}
	apiError(t, h.do("GET", "/v1/tasks/"+id+"/logs", ""), 500, "")
}

// gatedWriter is a response whose writes after the first wait for the gate: a
// client that stopped reading.
type gatedWriter struct {
	*httptest.ResponseRecorder
	gate   chan struct{}
	mu     sync.Mutex
	writes int
}

func (g *gatedWriter) Write(p []byte) (int, error) {
	g.mu.Lock()
	g.writes++
	first := g.writes == 1
	g.mu.Unlock()
	if !first {
		<-g.gate
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ResponseRecorder.Write(p)
}

func (g *gatedWriter) Flush() {}

// A client that reads too slowly is dropped with an overflow event naming the
// last id it got; the producer is not held up meanwhile.
func TestASlowClientIsDropped(t *testing.T) {
	h := start(t)
	w := &gatedWriter{ResponseRecorder: httptest.NewRecorder(), gate: make(chan struct{})}
	produced := make(chan int, 1)
	r := httptest.NewRequest("GET", "/v1/events", nil)
	served := make(chan struct{})
	go func() {
		defer close(served)
		h.srv.stream(w, r, func(ctx context.Context, push func(sseItem) bool) error {
			n := 0
			for push(sseItem{id: uint64(n + 1), data: []byte(`{}`)}) {
				n++
			}
			produced <- n
			return nil
		})
	}()
	select {
	case n := <-produced:
		if n > streamBuffer+1 {
			t.Fatalf("%d events pushed to a client that read none, over the buffer of %d", n, streamBuffer)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the producer was held up by a client that does not read")
	}
	close(w.gate)
	<-served
	body := w.Body.String()
	if !strings.Contains(body, "event: overflow\ndata: ") || !strings.Contains(body, "reconnect with Last-Event-ID") {
		t.Fatalf("the end of a slow client's stream: %q", body[max(0, len(body)-300):])
	}
	if w.Code != http.StatusOK {
		t.Fatalf("status %d", w.Code)
	}
}
