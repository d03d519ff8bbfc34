package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/events"
)

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
	var t api.TaskView
	if err == nil {
		t, err = s.api.Get(ctx, r.PathValue("id")) // a 404 now, not an empty log; and the whole id
	}
	id := t.ID
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
	err := logs.ReadAfter(r.Context(), id, streams, after, func(c events.LogChunk) error {
		return enc.Encode(logChunk{Stream: c.Stream, Offset: c.Offset, Data: string(c.Data), EOF: c.EOF})
	})
	if err != nil && r.Context().Err() == nil {
		s.log.Warn("reading logs over HTTP failed", "task", id, "err", err)
	}
}

// followLogs pushes a task's output until every stream read has its end mark, or
// the task has ended and its output is read, then an "end" event.
func (s *Server) followLogs(ctx context.Context, logs *events.Logs, id string, streams []string, after uint64, push func(sseItem) bool) error {
	store, err := s.store(ctx)
	if err != nil {
		return err
	}
	watchCtx, stopWatching := context.WithCancel(ctx)
	taskEnded := make(chan struct{})
	go func() {
		defer close(taskEnded)
		watchTheEnd(watchCtx, store, id)
	}()
	defer func() { stopWatching(); <-taskEnded }()
	var pushed = true
	err = logs.Follow(ctx, id, streams, after, taskEnded, func(c events.LogChunk) error {
		data, _ := json.Marshal(logChunk{Stream: c.Stream, Offset: c.Offset, Data: string(c.Data), EOF: c.EOF})
		if pushed = push(sseItem{id: c.Seq, data: data}); !pushed {
			return context.Canceled
		}
		return nil
	})
	switch {
	case !pushed || ctx.Err() != nil:
		return nil
	case err != nil:
		return err
	}
	push(sseItem{event: "end", data: []byte(`{}`)})
	return nil
}

// watchTheEnd returns once task id has ended, or can no longer be followed (then
// what its log holds is all there will be to read too).
func watchTheEnd(ctx context.Context, store *events.JetStreamStore, id string) {
	var st engine.State
	_ = store.Follow(ctx, id, 0, func(rec events.Record, decodeErr error) bool {
		if decodeErr == nil {
			st, _ = engine.Apply(st, rec)
		}
		return st.Phase.Runs()
	})
}
