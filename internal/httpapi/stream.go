package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine/api"
)

// sseItem is one Server-Sent Event: its id (a stream sequence; 0: none), its
// name ("" for a message) and its data, one line of JSON.
type sseItem struct {
	id    uint64
	event string
	data  []byte
}

// producer feeds a stream: push hands it one event and reports false once the
// client has fallen streamBuffer events behind (the producer then stops).
type producer func(ctx context.Context, push func(sseItem) bool) error

// sseWriteTimeout bounds one write to a stream client.
const sseWriteTimeout = 10 * time.Second

// stream serves a producer as Server-Sent Events. A client that reads slower
// than the events come is dropped with an "overflow" event naming the last id it
// got, from which it reconnects (Last-Event-ID) and loses nothing; the buffer
// between the two is bounded, so a slow client never holds up the server.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, produce producer) {
	select {
	case s.streams <- struct{}{}:
		defer func() { <-s.streams }()
	default:
		w.Header().Set("Retry-After", "5")
		s.fail(w, &api.Error{Code: 503, Message: fmt.Sprintf("%d streams are open, the most this server keeps: close one", s.cfg.MaxStreams)})
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	rc := http.NewResponseController(w)
	write := func(text string) error {
		_ = rc.SetWriteDeadline(time.Now().Add(sseWriteTimeout))
		if _, err := w.Write([]byte(text)); err != nil {
			return err
		}
		return rc.Flush()
	}
	w.WriteHeader(http.StatusOK)
	if write("retry: 2000\n: bgtask events\n\n") != nil {
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	items := make(chan sseItem, streamBuffer)
	var overflow atomic.Bool
	var produced error
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(items)
		produced = produce(ctx, func(it sseItem) bool {
			select {
			case items <- it:
				return true
			default:
				overflow.Store(true)
				return false
			}
		})
	})
	defer wg.Wait()
	defer cancel()
	beat := time.NewTicker(s.cfg.Heartbeat)
	defer beat.Stop()
	var last uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-beat.C:
			if write(": keep-alive\n\n") != nil {
				return
			}
		case it, ok := <-items:
			if !ok {
				s.endStream(ctx, write, overflow.Load(), produced, last)
				return
			}
			if write(format(it)) != nil {
				return
			}
			last = max(last, it.id)
		}
	}
}

// endStream writes why a stream ends, unless its client went away: it read too
// slowly, or the reading failed (an "error" event with the API's error object).
// A producer that ended by itself wrote its own last event.
func (s *Server) endStream(ctx context.Context, write func(string) error, overflowed bool, err error, last uint64) {
	switch {
	case ctx.Err() != nil:
	case overflowed:
		data, _ := json.Marshal(errorBody{Error: &api.Error{Code: 503, Message: fmt.Sprintf(
			"the client read too slowly and fell %d events behind: reconnect with Last-Event-ID %d", streamBuffer, last)}})
		_ = write(format(sseItem{event: "overflow", data: data}))
	case err != nil:
		e := asError(err)
		if e.Code >= 500 {
			s.log.Error("event stream failed", "err", err)
		}
		data, _ := json.Marshal(errorBody{Error: e})
		_ = write(format(sseItem{event: "error", data: data}))
	}
}

func format(it sseItem) string {
	text := ""
	if it.id > 0 {
		text += "id: " + strconv.FormatUint(it.id, 10) + "\n"
	}
	if it.event != "" {
		text += "event: " + it.event + "\n"
	}
	return text + "data: " + string(it.data) + "\n\n"
}

// resumeFrom is the sequence a stream starts after: the Last-Event-ID a
// reconnecting EventSource sends, else the after parameter; ok false if neither.
func resumeFrom(r *http.Request) (seq uint64, ok bool, err error) {
	field, v := "Last-Event-ID", r.Header.Get("Last-Event-ID")
	if v == "" {
		field, v = "after", r.URL.Query().Get("after")
	}
	if v == "" {
		return 0, false, nil
	}
	seq, perr := strconv.ParseUint(v, 10, 64)
	if perr != nil {
		return 0, false, badField(field, "%q: want the id of an event of this stream", v)
	}
	return seq, true, nil
}

// eventStream serves GET /v1/events: every event appended after it opened, or
// those of one task (from its first) or of one target's tasks, as Server-Sent
// Events with the stream sequence as the id.
func (s *Server) eventStream(w http.ResponseWriter, r *http.Request) {
	q, err := query(r, "task", "target", "after")
	if err == nil && q.Get("task") != "" && q.Get("target") != "" {
		err = badField("target", "give task or target, not both")
	}
	o := client.EventOptions{Task: q.Get("task"), Target: q.Get("target")}
	var resumed bool
	if err == nil {
		o.After, resumed, err = resumeFrom(r)
	}
	ctx := r.Context()
	switch {
	case err != nil:
	case o.Task != "":
		var t client.Task
		t, err = s.api.Get(ctx, o.Task) // a 404 now, not an empty stream, and at once
		o.Task = t.ID
	case o.Target != "":
		err = checkTarget(o.Target)
	}
	o.FromNow = !resumed && o.Task == ""
	var feed *client.EventFeed
	if err == nil {
		feed, err = s.client.Events(ctx, o)
	}
	if err != nil {
		s.fail(w, err)
		return
	}
	s.stream(w, r, func(ctx context.Context, push func(sseItem) bool) error {
		err := feed.Read(ctx, func(ev client.Event) error {
			data, err := json.Marshal(ev)
			if err != nil {
				return err
			}
			if !push(sseItem{id: ev.Seq, data: data}) {
				return context.Canceled
			}
			return nil
		})
		if errors.Is(err, context.Canceled) {
			return nil
		}
		return err
	})
}
