package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// logsGrace is how long a followed log waits for its end marks after the task
// ended: a worker that died writes none.
const logsGrace = 2 * time.Second

// logChunk is a piece of output as `bgtask logs --json` prints it.
type logChunk struct {
	Stream string `json:"stream"`
	Offset int64  `json:"offset"`
	Data   string `json:"data,omitempty"`
	EOF    bool   `json:"eof,omitempty"`
}

// logs serves GET /v1/tasks/{id}/logs: the output so far as JSON lines, or with
// follow=1 as Server-Sent Events until it ends (an "end" event), each chunk with
// its sequence in the log stream as its id.
func (s *Server) logs(w http.ResponseWriter, r *http.Request) {
	q, err := query(r, "follow", "stream", "after")
	var streams []string
	following := false
	if err == nil {
		switch v := q.Get("stream"); v {
		case "":
		case events.Stdout, events.Stderr:
			streams = []string{v}
		default:
			err = badField("stream", "%q: want stdout or stderr", v)
		}
	}
	if err == nil {
		switch v := q.Get("follow"); v {
		case "", "0", "false":
		case "1", "true":
			following = true
		default:
			err = badField("follow", "%q: want 1 or 0", v)
		}
	}
	var after uint64
	if err == nil {
		after, _, err = resumeFrom(r)
	}
	ctx := r.Context()
	id := r.PathValue("id")
	if err == nil {
		_, err = s.api.Get(ctx, id) // a 404 now, not an empty log
	}
	var logs *events.Logs
	if err == nil {
		logs, err = events.ConnectLogs(ctx, s.js)
	}
	if err != nil {
		s.fail(w, err)
		return
	}
	if !following {
		s.logLines(w, r, logs, id, streams, after)
		return
	}
	s.stream(w, r, func(ctx context.Context, push func(sseItem) bool) error {
		return s.followLogs(ctx, logs, id, streams, after, push)
	})
}

// logLines writes the output there is as JSON lines.
func (s *Server) logLines(w http.ResponseWriter, r *http.Request, logs *events.Logs, id string, streams []string, after uint64) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	err := logs.ReadAfter(r.Context(), id, streams, false, after, func(c events.LogChunk) error {
		return enc.Encode(logChunk{Stream: c.Stream, Offset: c.Offset, Data: string(c.Data), EOF: c.EOF})
	})
	if err != nil && r.Context().Err() == nil {
		s.log.Warn("reading logs over HTTP failed", "task", id, "err", err)
	}
}

// followLogs pushes a task's output until every stream read has its end mark,
// or a little after the task ended (a run whose worker died writes none), then
// an "end" event.
func (s *Server) followLogs(ctx context.Context, logs *events.Logs, id string, streams []string, after uint64, push func(sseItem) bool) error {
	readCtx, stopReading := context.WithCancel(ctx)
	defer stopReading()
	store, err := s.store(ctx)
	if err != nil {
		return err
	}
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		s.stopAfterTheEnd(readCtx, store, id, stopReading)
	}()
	defer func() { <-watched }()
	var pushed = true
	err = logs.ReadAfter(readCtx, id, streams, true, after, func(c events.LogChunk) error {
		data, _ := json.Marshal(logChunk{Stream: c.Stream, Offset: c.Offset, Data: string(c.Data), EOF: c.EOF})
		if pushed = push(sseItem{id: c.Seq, data: data}); !pushed {
			return context.Canceled
		}
		return nil
	})
	stopReading()
	switch {
	case !pushed || ctx.Err() != nil:
		return nil
	case err != nil && !errors.Is(err, context.Canceled):
		return err
	}
	push(sseItem{event: "end", data: []byte(`{}`)})
	return nil
}

// stopAfterTheEnd calls stop logsGrace after task id has ended, or when it can
// no longer be followed.
func (s *Server) stopAfterTheEnd(ctx context.Context, store *events.JetStreamStore, id string, stop func()) {
	var st engine.State
	err := store.Follow(ctx, id, 0, func(rec events.Record, decodeErr error) bool {
		if decodeErr == nil {
			st, _ = engine.Apply(st, rec)
		}
		return st.Phase == engine.PhaseArmed || st.Phase == engine.PhaseRunning
	})
	if err == nil {
		select {
		case <-ctx.Done():
		case <-time.After(logsGrace):
		}
	}
	stop()
}
