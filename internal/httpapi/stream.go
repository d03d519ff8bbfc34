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

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/events"
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
	var after uint64
	var resumed bool
	if err == nil {
		after, resumed, err = resumeFrom(r)
	}
	task, target := q.Get("task"), q.Get("target")
	ctx := r.Context()
	var store *events.JetStreamStore
	switch {
	case err != nil:
	case task != "":
		var t api.TaskView
		t, err = s.api.Get(ctx, task) // a 404 now, not an empty stream; and the whole id
		task = t.ID
	case target != "":
		err = checkTarget(target)
	}
	if err == nil {
		store, err = s.store(ctx)
	}
	if err == nil && !resumed && task == "" {
		after, err = store.LastSeq(ctx)
	}
	if err != nil {
		s.fail(w, err)
		return
	}
	match := func(events.Record) bool { return true }
	if target != "" {
		match = s.ofTarget(ctx, target)
	}
	s.stream(w, r, func(ctx context.Context, push func(sseItem) bool) error {
		var pushErr error
		err := store.Follow(ctx, task, after, func(rec events.Record, decodeErr error) bool {
			if decodeErr != nil || !match(rec) {
				return true // a bad event is the audit's to report; a stream goes on
			}
			data, err := json.Marshal(engine.HideEnvIn(rec))
			if err != nil {
				pushErr = err
				return false
			}
			return push(sseItem{id: rec.Seq, data: data})
		})
		if pushErr != nil {
			return pushErr
		}
		if errors.Is(err, context.Canceled) {
			return nil
		}
		return err
	})
}

// maxTargetCache bounds what a target's stream remembers of tasks' targets.
const maxTargetCache = 100_000

// ofTarget matches the events of the tasks for target: a task's target is in
// its armed event, or, for a task armed before the stream started, asked for.
func (s *Server) ofTarget(ctx context.Context, target string) func(events.Record) bool {
	known := map[string]bool{}
	return func(rec events.Record) bool {
		if is, ok := known[rec.TaskID]; ok {
			return is
		}
		if len(known) >= maxTargetCache {
			clear(known)
		}
		var spec engine.Spec
		if p, err := rec.Decode(); err == nil {
			if armed, ok := p.(*events.Armed); ok && json.Unmarshal(armed.Spec, &spec) == nil {
				known[rec.TaskID] = spec.Target == target
				return known[rec.TaskID]
			}
		}
		t, err := s.api.Get(ctx, rec.TaskID)
		if err != nil {
			return false // not cached: asked again at its next event
		}
		known[rec.TaskID] = t.Spec.Target == target
		return known[rec.TaskID]
	}
}
