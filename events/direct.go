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
// has more of them than it sent.
func directBatch(ctx context.Context, nc *nats.Conn, stream, subject string, from uint64, batch int) (recs []Record, more bool, err error) {
	req, err := json.Marshal(struct {
		Seq     uint64 `json:"seq"`
		NextFor string `json:"next_by_subj"`
		Batch   int    `json:"batch"`
	}{from, subject, batch})
	if err != nil {
		return nil, false, err
	}
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, false, err
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest("$JS.API.DIRECT.GET."+stream, inbox, req); err != nil {
		return nil, false, err
	}
	ctx, cancel := context.WithTimeout(ctx, directGetTimeout)
	defer cancel()
	for {
		msg, err := sub.NextMsgWithContext(ctx)
		switch {
		case errors.Is(err, context.DeadlineExceeded) && len(recs) == 0:
			return nil, false, errNoDirectAnswer
		case err != nil:
			return nil, false, err
		}
		if len(msg.Data) == 0 && msg.Header.Get("Status") != "" {
			switch status := msg.Header.Get("Status"); status {
			case "404":
				return recs, false, nil
			case "204": // the end of the batch
				pending, _ := strconv.ParseUint(msg.Header.Get("Nats-Num-Pending"), 10, 64)
				return recs, pending > 0, nil
			case "503":
				return nil, false, nats.ErrNoResponders
			default:
				return nil, false, fmt.Errorf("direct get of %s: %s %s", subject, status, msg.Header.Get("Description"))
			}
		}
		seq, err := strconv.ParseUint(msg.Header.Get("Nats-Sequence"), 10, 64)
		if err != nil {
			return nil, false, fmt.Errorf("direct get of %s: a message without its sequence", subject)
		}
		rec, err := DecodeRecord(seq, msg.Data)
		if err != nil {
			return nil, false, err
		}
		recs = append(recs, rec)
	}
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
