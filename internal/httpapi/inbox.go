package httpapi

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/events"
)

// The inbox over HTTP reads a target's durable inbox consumer, as `bgtask
// inbox` does, but leaves the acknowledgement to the caller: each wake-up comes
// with an ack token, and one not acknowledged within events.InboxAckWait is
// delivered again. So a caller that dies between reading a wake-up and acting
// on it gets it back, and one that acknowledged never does.
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
	cons, err := events.InboxConsumer(ctx, s.js, name)
	if err != nil {
		return reply{}, err
	}
	var batch jetstream.MessageBatch
	if wait > 0 {
		batch, err = cons.Fetch(n, jetstream.FetchMaxWait(wait))
	} else {
		batch, err = cons.FetchNoWait(n)
	}
	if err != nil {
		return reply{}, fmt.Errorf("read inbox %s: %w", name, err)
	}
	out := struct {
		Wakeups []delivered `json:"wakeups"`
	}{Wakeups: []delivered{}}
	for msg := range batch.Messages() {
		meta, err := msg.Metadata()
		if err != nil {
			return reply{}, err
		}
		out.Wakeups = append(out.Wakeups, delivered{Seq: meta.Sequence.Stream, Ack: ackToken(msg.Reply()), Wakeup: msg.Data()})
	}
	if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && ctx.Err() == nil {
		return reply{}, fmt.Errorf("read inbox %s: %w", name, err)
	}
	return reply{body: out}, nil
}

func ackToken(replySubject string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(replySubject))
}

// ackSubject reads an ack token back, holding it to the target's own consumer:
// a token is a subject to publish to, and may name nothing else.
func ackSubject(token, target string) (string, error) {
	raw, err := base64.RawURLEncoding.DecodeString(token)
	prefix := "$JS.ACK." + events.InboxStreamName + "." + events.InboxConsumerName(target) + "."
	subject := string(raw)
	if err != nil || !strings.HasPrefix(subject, prefix) || strings.ContainsAny(subject, "*> \t\r\n") {
		return "", badField("acks", "%q is not an ack token of target %s's inbox", token, target)
	}
	return subject, nil
}

// ack serves POST /v1/targets/{name}/inbox/ack {"acks": [TOKEN...]}: each
// acknowledgement is confirmed by the server before the reply.
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
	subjects := make([]string, len(req.Acks))
	for i, token := range req.Acks {
		subject, err := ackSubject(token, name)
		if err != nil {
			return reply{}, err
		}
		subjects[i] = subject
	}
	for _, subject := range subjects {
		if _, err := s.cfg.Conn.RequestWithContext(ctx, subject, []byte("+ACK")); err != nil {
			return reply{}, &api.Error{Code: 502, Field: "acks", Message: "acks: the acknowledgement was not confirmed: " + err.Error()}
		}
	}
	return reply{body: struct {
		Acked int `json:"acked"`
	}{len(subjects)}}, nil
}
