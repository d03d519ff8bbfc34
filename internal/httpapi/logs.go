package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/bgtask/bgtask/client"
)

// logChunk is a piece of output as `bgtask logs --json` prints it.
type logChunk struct {
	Stream string `json:"stream"`
	Offset int64  `json:"offset"`
	Data   string `json:"data,omitempty"`
	EOF    bool   `json:"eof,omitempty"`
}

func newLogChunk(c client.LogChunk) logChunk {
	return logChunk{Stream: c.Stream, Offset: c.Offset, Data: string(c.Data), EOF: c.EOF}
}

// logs serves GET /v1/tasks/{id}/logs: the output so far as JSON lines, or with
// follow=1 as Server-Sent Events until it ends (an "end" event), each chunk with
// its sequence in the log stream as its id.
func (s *Server) logs(w http.ResponseWriter, r *http.Request) {
	q, err := query(r, "follow", "stream", "after")
	o := client.LogOptions{}
	if err == nil {
		switch v := q.Get("stream"); v {
		case "":
		case client.Stdout, client.Stderr:
			o.Streams = []string{v}
		default:
			err = badField("stream", "%q: want stdout or stderr", v)
		}
	}
	if err == nil {
		switch v := q.Get("follow"); v {
		case "", "0", "false":
		case "1", "true":
			o.Follow = true
		default:
			err = badField("follow", "%q: want 1 or 0", v)
		}
	}
	if err == nil {
		o.After, _, err = resumeFrom(r)
	}
	var id string
	if err == nil {
		var t client.Task
		t, err = s.api.Get(r.Context(), r.PathValue("id")) // a 404 now, not an empty log; and the whole id
		id = t.ID
	}
	if err != nil {
		s.fail(w, err)
		return
	}
	if !o.Follow {
		s.logLines(w, r, id, o)
		return
	}
	s.stream(w, r, func(ctx context.Context, push func(sseItem) bool) error {
		return s.followLogs(ctx, id, o, push)
	})
}

// logLines writes the output there is as JSON lines; a read that fails before
// the first line is the error object.
func (s *Server) logLines(w http.ResponseWriter, r *http.Request, id string, o client.LogOptions) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	wrote := false
	err := s.client.Logs(r.Context(), id, o, func(c client.LogChunk) error {
		wrote = true
		return enc.Encode(newLogChunk(c))
	})
	switch {
	case err != nil && !wrote:
		s.fail(w, err)
	case err != nil && r.Context().Err() == nil:
		s.log.Warn("reading logs over HTTP failed", "task", id, "err", err)
	}
}

// followLogs pushes a task's output until every stream read has its end mark, or
// the task has ended and its output is read, then an "end" event.
func (s *Server) followLogs(ctx context.Context, id string, o client.LogOptions, push func(sseItem) bool) error {
	pushed := true
	err := s.client.Logs(ctx, id, o, func(c client.LogChunk) error {
		data, _ := json.Marshal(newLogChunk(c))
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
