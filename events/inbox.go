package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// InboxConfig is how the inbox stream is created.
type InboxConfig struct {
	Replicas int
	// MaxAge is how long a wake-up is kept after it was delivered, read or not.
	MaxAge time.Duration
	// Duplicates is JetStream's dedupe window; past it, a redelivery is still caught
	// by searching the inbox.
	Duplicates time.Duration
}

// JetStreamInbox is the Inbox over a JetStream stream. The stream keeps wake-ups by
// age, not by acknowledgement, so a wake-up that was read can still be found when a
// delivery whose outcome was unknown is checked.
type JetStreamInbox struct {
	js     jetstream.JetStream
	stream jetstream.Stream
}

var _ Inbox = (*JetStreamInbox)(nil)

// OpenInbox creates or updates the inbox stream.
func OpenInbox(ctx context.Context, js jetstream.JetStream, cfg InboxConfig) (*JetStreamInbox, error) {
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	if cfg.MaxAge == 0 {
		cfg.MaxAge = 30 * 24 * time.Hour
	}
	if cfg.Duplicates == 0 {
		cfg.Duplicates = DefaultDuplicates
	}
	stream, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        InboxStreamName,
		Description: "bgtask wake-ups, one subject per target, message id = task id",
		Subjects:    []string{InboxPrefix + ".>"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Replicas:    cfg.Replicas,
		MaxAge:      cfg.MaxAge,
		Duplicates:  cfg.Duplicates,
		AllowDirect: true,
	})
	if err != nil {
		return nil, fmt.Errorf("create stream %s: %w", InboxStreamName, err)
	}
	return &JetStreamInbox{js: js, stream: stream}, nil
}

// recheckSkew widens the search for an earlier delivery, for clocks that disagree
// between the writer of completion-persisted and the server.
const recheckSkew = time.Minute

// Deliver implements Inbox. recheckSince, when set, is when the completion was
// persisted: a delivery attempt whose result was lost (a crash, a lost ack) can only
// have happened after it, so only that part of the target's inbox is searched.
func (in *JetStreamInbox) Deliver(ctx context.Context, w Wakeup, recheckSince time.Time) (uint64, error) {
	subject, msgID := InboxSubject(w.Target), w.ID
	if w.Notice != "" {
		msgID += "." + w.Notice // a notice does not take the final wake-up's id
	}
	if !recheckSince.IsZero() {
		seq, err := in.find(ctx, subject, msgID, recheckSince.Add(-recheckSkew))
		if err != nil || seq > 0 {
			return seq, err
		}
	}
	data, err := json.Marshal(w)
	if err != nil {
		return 0, err
	}
	ack, err := in.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: data},
		jetstream.WithMsgID(msgID), jetstream.WithExpectStream(InboxStreamName))
	if err != nil {
		return 0, fmt.Errorf("deliver %s to %s: %w", w.ID, subject, err)
	}
	return ack.Sequence, nil
}

// Remove deletes the wake-up with message id msgID at inbox sequence seq, so that no
// reader of the inbox gets it, whatever its consumer has acknowledged: the other
// wake-ups of the target, before and after it, stay as they are. A wake-up gone
// already (removed before, or aged out) is no error; another message at seq is.
func (in *JetStreamInbox) Remove(ctx context.Context, seq uint64, msgID string) error {
	msg, err := in.stream.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read inbox message %d: %w", seq, err)
	}
	if id := msg.Header.Get(jetstream.MsgIDHeader); id != msgID {
		return fmt.Errorf("inbox message %d is %q, not the wake-up of %s", seq, id, msgID)
	}
	if err := in.stream.DeleteMsg(ctx, seq); err != nil {
		if _, gone := in.stream.GetMsg(ctx, seq); errors.Is(gone, jetstream.ErrMsgNotFound) {
			return nil // removed by another call meanwhile
		}
		return fmt.Errorf("remove inbox message %d: %w", seq, err)
	}
	return nil
}

// find returns the sequence of the message with id msgID on subject since a time, or 0.
func (in *JetStreamInbox) find(ctx context.Context, subject, msgID string, since time.Time) (uint64, error) {
	cons, err := readConsumer(ctx, in.stream, jetstream.ConsumerConfig{
		FilterSubjects: []string{subject},
		DeliverPolicy:  jetstream.DeliverByStartTimePolicy,
		OptStartTime:   &since,
	})
	if err != nil {
		return 0, fmt.Errorf("search inbox %s: %w", subject, err)
	}
	defer endRead(in.stream, cons)
	for {
		batch, err := cons.FetchNoWait(256)
		if err != nil {
			return 0, fmt.Errorf("search inbox %s: %w", subject, err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			if msg.Headers().Get(jetstream.MsgIDHeader) == msgID {
				meta, err := msg.Metadata()
				if err != nil {
					return 0, err
				}
				return meta.Sequence.Stream, nil
			}
		}
		if err := batch.Error(); err != nil {
			return 0, fmt.Errorf("search inbox %s: %w", subject, err)
		}
		if n == 0 {
			return 0, nil
		}
	}
}

// InboxAckWait is how long a wake-up read from the inbox consumer may go without an
// ack before it is delivered again: a reader that died holding it gets it back
// this soon. `bgtask inbox` acks as soon as it printed.
const InboxAckWait = 10 * time.Second

// InboxConsumerName is the durable consumer that `bgtask inbox --target T` reads with.
// A runtime that consumes the inbox itself may use it or its own.
func InboxConsumerName(target string) string { return "inbox-" + target }

// InboxConsumer returns the durable consumer of a target's inbox, creating it if needed.
func InboxConsumer(ctx context.Context, js jetstream.JetStream, target string) (jetstream.Consumer, error) {
	if !ValidToken(target) {
		return nil, fmt.Errorf("invalid target %q: use letters, digits, '-' and '_'", target)
	}
	return js.CreateOrUpdateConsumer(ctx, InboxStreamName, jetstream.ConsumerConfig{
		Durable:       InboxConsumerName(target),
		Description:   "bgtask inbox reader for target " + target,
		FilterSubject: InboxSubject(target),
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckWait:       InboxAckWait,
	})
}
