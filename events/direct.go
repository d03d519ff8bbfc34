package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// errNoDirectAnswer: no server answered a direct get in time.
var errNoDirectAnswer = errors.New("no server answered the direct get")

// directBatch reads up to batch messages stored on subject from sequence from on,
// in order, with one batched direct get: no consumer, one request. A subject with
// nothing at or after from gives none and no error. more reports that the server
// has more of them than it sent; next is the sequence after the last message sent.
// A message that does not decode is an error, or, with bad set, passed to bad.
func directBatch(ctx context.Context, nc *nats.Conn, stream, subject string, from uint64, batch int, bad func(uint64, error)) (recs []Record, next uint64, more bool, err error) {
	req, err := json.Marshal(struct {
		Seq     uint64 `json:"seq"`
		NextFor string `json:"next_by_subj"`
		Batch   int    `json:"batch"`
	}{from, subject, batch})
	if err != nil {
		return nil, from, false, err
	}
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, from, false, err
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest("$JS.API.DIRECT.GET."+stream, inbox, req); err != nil {
		return nil, from, false, err
	}
	ctx, cancel := context.WithTimeout(ctx, directGetTimeout)
	defer cancel()
	next = from
	for {
		msg, err := sub.NextMsgWithContext(ctx)
		switch {
		case errors.Is(err, context.DeadlineExceeded) && next == from:
			return nil, from, false, errNoDirectAnswer
		case err != nil:
			return nil, from, false, err
		}
		if len(msg.Data) == 0 && msg.Header.Get("Status") != "" {
			switch status := msg.Header.Get("Status"); status {
			case "404":
				return recs, next, false, nil
			case "204": // the end of the batch
				pending, _ := strconv.ParseUint(msg.Header.Get("Nats-Num-Pending"), 10, 64)
				return recs, next, pending > 0, nil
			case "503":
				return nil, from, false, nats.ErrNoResponders
			default:
				return nil, from, false, fmt.Errorf("direct get of %s: %s %s", subject, status, msg.Header.Get("Description"))
			}
		}
		seq, err := strconv.ParseUint(msg.Header.Get("Nats-Sequence"), 10, 64)
		if err != nil {
			return nil, from, false, fmt.Errorf("direct get of %s: a message without its sequence", subject)
		}
		next = seq + 1
		rec, err := DecodeRecord(seq, msg.Data)
		switch {
		case err != nil && bad == nil:
			return nil, from, false, err
		case err != nil:
			bad(seq, err)
		default:
			recs = append(recs, rec)
		}
	}
}

// ReadHistory calls fn with every event of a task in order, as HistoryOf reads
// them for a task known to have n events; an event that does not decode is passed
// with its error, as Follow passes it, so that a reader can fold the history as
// the projector folded it.
func (s *JetStreamStore) ReadHistory(ctx context.Context, taskID string, n int, fn func(Record, error)) error {
	recs, err := s.readHistory(ctx, taskID, n, func(seq uint64, err error) {
		fn(Record{Seq: seq}, err)
	})
	if err != nil {
		return err
	}
	for _, rec := range recs {
		fn(rec, nil)
	}
	return nil
}

// readHistory reads a task's history with batched direct gets on the task's
// subject, no consumer; n (0: not known) sizes the first read. On a replicated
// stream the gets may be answered by a replica that is behind the leader, so the
// history is read up to at least the last event the leader has (Last), asking for
// the rest again for up to historyCatchUp before it fails with ErrIncomplete. On
// one server, the server that answers has every event it acknowledged: the
// history is the batch. bad, if set, takes the events that do not decode, which
// are otherwise an error (and then not passed in order with the others).
func (s *JetStreamStore) readHistory(ctx context.Context, taskID string, n int, bad func(uint64, error)) ([]Record, error) {
	if !ValidToken(taskID) {
		return nil, ErrNotFound
	}
	batch := historyBatch
	if n > 0 {
		batch = min(n, historyBatch)
	}
	var lastSeq uint64
	if s.replicated() {
		last, err := s.lastRaw(ctx, taskID)
		if err != nil {
			return nil, err
		}
		if rec, err := DecodeRecord(last.Sequence, last.Data); err == nil && rec.Type == TypeArchived {
			// The task's history is in the archive and the stream keeps this
			// event alone once compacted; a replica may not have applied the
			// compaction yet.
			return []Record{rec}, nil
		}
		lastSeq = last.Sequence
	}
	subject := StoredSubject(taskID)
	var out []Record
	from := uint64(1)
	deadline := time.Now().Add(historyCatchUp)
	for {
		var recs []Record
		var more bool
		_, err := directGet(ctx, func() (*jetstream.RawStreamMsg, error) {
			var err error
			recs, from, more, err = directBatch(ctx, s.js.Conn(), StreamName, subject, from, batch, bad)
			return nil, err
		})
		if err != nil {
			return nil, fmt.Errorf("read history of task %s: %w", taskID, err)
		}
		out = append(out, recs...)
		switch {
		case more:
			continue
		case from > 1 && from > lastSeq:
			if last := len(out) - 1; last > 0 && out[last].Type == TypeArchived {
				return out[last:], nil // compacted since the read began
			}
			return out, nil
		case lastSeq == 0:
			return nil, ErrNotFound
		case time.Now().After(deadline):
			return nil, fmt.Errorf("%w: task %s, read up to seq %d of %d", ErrIncomplete, taskID, from-1, lastSeq)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(noDirectGetPause):
		}
	}
}

// lastRaw is the last message stored on a task's subject, read as Last reads it.
func (s *JetStreamStore) lastRaw(ctx context.Context, taskID string) (*jetstream.RawStreamMsg, error) {
	raw, err := directGet(ctx, func() (*jetstream.RawStreamMsg, error) {
		if s.replicated() {
			return leaderLast(ctx, s.js.Conn(), StreamName, StoredSubject(taskID))
		}
		return s.stream.GetLastMsgForSubject(ctx, StoredSubject(taskID))
	})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("read last event of task %s: %w", taskID, err)
	}
	return raw, nil
}

// leaderLast reads the last message on subject from the stream's leader, which
// has applied every append it acknowledged.
func leaderLast(ctx context.Context, nc *nats.Conn, stream, subject string) (*jetstream.RawStreamMsg, error) {
	req, err := json.Marshal(struct {
		LastFor string `json:"last_by_subj"`
	}{subject})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, directGetTimeout)
	defer cancel()
	msg, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, req)
	if err != nil {
		return nil, err
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error"`
		Message *struct {
			Subject string `json:"subject"`
			Seq     uint64 `json:"seq"`
			Data    []byte `json:"data"`
		} `json:"message"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return nil, fmt.Errorf("get of %s: %w", subject, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, jetstream.ErrMsgNotFound
	case resp.Error != nil:
		return nil, resp.Error
	case resp.Message == nil:
		return nil, fmt.Errorf("get of %s: an answer without a message", subject)
	}
	return &jetstream.RawStreamMsg{Subject: resp.Message.Subject, Sequence: resp.Message.Seq, Data: resp.Message.Data}, nil
}

// directGetTimeout bounds one direct get request.
const directGetTimeout = 5 * time.Second
