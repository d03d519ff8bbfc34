package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine/api"
)

// The inbox over HTTP reads a target's inbox (client.Inbox), as `bgtask inbox`
// does, but leaves the acknowledgement to the caller: each wake-up comes with an
// ack token, and one not acknowledged within 10 seconds is delivered again. So
// a caller that dies between reading a wake-up and acting on it gets it back,
// and one that acknowledged never does.
const (
	maxInboxBatch = 100
	maxInboxWait  = 25 * time.Second
)

// delivered is one wake-up read from the inbox.
type delivered struct {
	// Seq is the wake-up's sequence in the inbox stream.
	Seq uint64 `json:"seq"`
	// Ack acknowledges it (POST .../inbox/ack).
	Ack    string          `json:"ack"`
	Wakeup json.RawMessage `json:"wakeup"`
}

// inbox serves GET /v1/targets/{name}/inbox?max=N&wait=D.
func (s *Server) inbox(ctx context.Context, r *http.Request) (reply, error) {
	name := r.PathValue("name")
	if err := checkTarget(name); err != nil {
		return reply{}, err
	}
	q, err := query(r, "max", "wait")
	if err != nil {
		return reply{}, err
	}
	n, err := intParam(q, "max", 10, 1)
	if err != nil {
		return reply{}, err
	}
	if n > maxInboxBatch {
		return reply{}, badField("max", "%d: at most %d", n, maxInboxBatch)
	}
	wait := time.Duration(0)
	if v := q.Get("wait"); v != "" {
		if wait, err = time.ParseDuration(v); err != nil || wait < 0 || wait > maxInboxWait {
			return reply{}, badField("wait", "%q: want a duration from 0 to %s", v, maxInboxWait)
		}
	}
	inbox, err := s.client.Inbox(ctx, name)
	if err != nil {
		return reply{}, err
	}
	got, err := inbox.Fetch(ctx, n, wait)
	if err != nil {
		return reply{}, err
	}
	out := struct {
		Wakeups []delivered `json:"wakeups"`
	}{Wakeups: []delivered{}}
	for _, d := range got {
		// A message that is no wake-up goes as it is: the caller acknowledges it.
		out.Wakeups = append(out.Wakeups, delivered{Seq: d.Seq, Ack: d.Token(), Wakeup: d.Raw})
	}
	return reply{body: out}, nil
}

// ack serves POST /v1/targets/{name}/inbox/ack {"acks": [TOKEN...]}: each
// acknowledgement is confirmed by the server before the reply. A token names a
// wake-up of the target's own inbox, or none is acknowledged.
func (s *Server) ack(ctx context.Context, r *http.Request) (reply, error) {
	name := r.PathValue("name")
	if err := checkTarget(name); err != nil {
		return reply{}, err
	}
	var req struct {
		Acks []string `json:"acks"`
	}
	if err := decodeBody(r, &req); err != nil {
		return reply{}, err
	}
	if len(req.Acks) == 0 || len(req.Acks) > maxInboxBatch {
		return reply{}, badField("acks", "give 1 to %d ack tokens", maxInboxBatch)
	}
	if err := s.client.AckTokens(ctx, name, req.Acks...); err != nil {
		if errors.As(err, new(*client.Error)) {
			return reply{}, err // a token not of this inbox
		}
		return reply{}, &api.Error{Code: 502, Field: "acks", Message: "acks: " + err.Error()}
	}
	return reply{body: struct {
		Acked int `json:"acked"`
	}{len(req.Acks)}}, nil
}
