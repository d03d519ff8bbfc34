package client

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/events"
)

// Inbox is a target's inbox: the wake-ups delivered to it, each kept until a
// reader acknowledges it. A wake-up read and not acknowledged within
// events.InboxAckWait (10 s; InProgress extends it) is delivered again, so a
// reader that dies between reading a wake-up and acting on it gets it back, and
// one that acknowledged never does. Readers of one target share its place.
type Inbox struct {
	c      *Client
	target string
	cons   jetstream.Consumer
}

// Inbox opens the inbox of target.
func (c *Client) Inbox(ctx context.Context, target string) (*Inbox, error) {
	if err := checkName("target", target); err != nil {
		return nil, err
	}
	js, err := c.jetstream()
	if err != nil {
		return nil, err
	}
	var cons jetstream.Consumer
	err = c.do(ctx, true, func(ctx context.Context) (err error) {
		cons, err = events.InboxConsumer(ctx, js, target)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &Inbox{c: c, target: target, cons: cons}, nil
}

// CheckTarget says why name cannot name a target, if it cannot: an *Error
// naming the field target.
func CheckTarget(name string) error { return checkName("target", name) }

// Target is the inbox's target.
func (i *Inbox) Target() string { return i.target }

// Unread is how many wake-ups the inbox holds that no reader acknowledged: not
// read yet, or read and not acknowledged.
func (i *Inbox) Unread(ctx context.Context) (int, error) {
	var n int
	return n, i.c.do(ctx, true, func(ctx context.Context) error {
		info, err := i.cons.Info(ctx)
		if err == nil {
			n = int(info.NumPending) + info.NumAckPending
		}
		return err
	})
}

// Delivery is one wake-up read from an inbox, to be acknowledged once acted on.
type Delivery struct {
	Wakeup Wakeup
	// Seq is its sequence in the inbox stream.
	Seq uint64
	// Err says the message is no wake-up (Raw holds it): it will never be one, and
	// left there it would come back for ever; Drop it.
	Err error
	Raw []byte
	msg jetstream.Msg
}

// Fetch returns up to max wake-ups not acknowledged yet, oldest first, waiting
// up to wait for the first (0: answer at once). None is no error.
func (i *Inbox) Fetch(ctx context.Context, max int, wait time.Duration) ([]*Delivery, error) {
	for {
		out, err := i.fetch(ctx, max, wait)
		// A consumer a server restarted has not placed yet answers nothing for a
		// moment.
		if errors.Is(err, nats.ErrNoResponders) && ctx.Err() == nil && len(out) == 0 {
			if !pause(ctx, 100*time.Millisecond) {
				return nil, ctx.Err()
			}
			continue
		}
		return out, i.c.goneOr(err)
	}
}

func (i *Inbox) fetch(ctx context.Context, max int, wait time.Duration) ([]*Delivery, error) {
	if wait <= 0 {
		batch, err := i.cons.FetchNoWait(max)
		return i.read(ctx, batch, err)
	}
	// A fetch of more than one waits for all of them or to the end of its wait:
	// the first is awaited alone, and the others are those there then.
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	batch, err := i.cons.Fetch(1, jetstream.FetchContext(wctx))
	out, err := i.read(ctx, batch, err)
	if err != nil || len(out) == 0 || max == 1 {
		return out, err
	}
	batch, err = i.cons.FetchNoWait(max - 1)
	rest, err := i.read(ctx, batch, err)
	if err != nil {
		return out, nil // what came is answered; the next fetch meets the error
	}
	return append(out, rest...), nil
}

// read collects what a fetch of the inbox delivers; none is no error.
func (i *Inbox) read(ctx context.Context, batch jetstream.MessageBatch, err error) ([]*Delivery, error) {
	if err != nil {
		return nil, fmt.Errorf("read inbox %s: %w", i.target, err)
	}
	var out []*Delivery
	for msg := range batch.Messages() {
		out = append(out, newDelivery(msg))
	}
	err = batch.Error()
	switch {
	case err == nil, errors.Is(err, jetstream.ErrNoMessages), errors.Is(err, nats.ErrTimeout):
		return out, nil
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		return out, nil // the wait passed
	}
	return out, fmt.Errorf("read inbox %s: %w", i.target, err)
}

func newDelivery(msg jetstream.Msg) *Delivery {
	d := &Delivery{Raw: msg.Data(), msg: msg}
	if meta, err := msg.Metadata(); err == nil {
		d.Seq = meta.Sequence.Stream
	}
	if err := json.Unmarshal(msg.Data(), &d.Wakeup); err != nil || d.Wakeup.ID == "" {
		d.Err = fmt.Errorf("an unreadable wake-up: %v", err)
		d.Wakeup = Wakeup{}
	}
	return d
}

// Ack acknowledges the wake-up, and returns once the server has recorded it: it
// is never delivered again.
func (d *Delivery) Ack(ctx context.Context) error { return d.msg.DoubleAck(ctx) }

// Nak gives the wake-up back, to be delivered again at once.
func (d *Delivery) Nak() error { return d.msg.Nak() }

// InProgress says the wake-up is being acted on: its ack wait starts again.
func (d *Delivery) InProgress() error { return d.msg.InProgress() }

// Drop takes out a message that is no wake-up, so it comes back no more.
func (d *Delivery) Drop() error { return d.msg.Term() }

// Token names the delivery for AckTokens, for a reader that acknowledges it
// from elsewhere (the HTTP API's client).
func (d *Delivery) Token() string {
	return base64.RawURLEncoding.EncodeToString([]byte(d.msg.Reply()))
}

// AckTokens acknowledges the wake-ups of target's inbox that the tokens name
// (Delivery.Token), one after the other, and returns once the server has
// recorded each; it needs no Inbox open. It checks them all first: a token of
// another target's inbox is an *Error (400, field acks), and none is
// acknowledged then.
func (c *Client) AckTokens(ctx context.Context, target string, tokens ...string) error {
	if err := checkName("target", target); err != nil {
		return err
	}
	prefix := "$JS.ACK." + events.InboxStreamName + "." + events.InboxConsumerName(target) + "."
	subjects := make([]string, len(tokens))
	for k, token := range tokens {
		raw, err := base64.RawURLEncoding.DecodeString(token)
		subject := string(raw)
		if err != nil || !strings.HasPrefix(subject, prefix) || strings.ContainsAny(subject, "*> \t\r\n") {
			return &Error{Code: 400, Field: "acks", Message: fmt.Sprintf("acks: %q is not an ack token of target %s's inbox", token, target)}
		}
		subjects[k] = subject
	}
	for _, subject := range subjects {
		if _, err := c.nc.RequestWithContext(ctx, subject, []byte("+ACK")); err != nil {
			return fmt.Errorf("the acknowledgement was not confirmed: %w", c.goneOr(err))
		}
	}
	return nil
}

// Unread is what a target's inbox holds that no reader has acknowledged.
type Unread struct {
	// Count is how many wake-ups: not read yet, or read and not acknowledged.
	Count int
	// NoReader: nothing has opened the inbox yet, and Count is every wake-up in it.
	NoReader bool
}

// Unread counts the wake-ups of a target's inbox that no reader has
// acknowledged, without reading any, and without opening the inbox.
func (c *Client) Unread(ctx context.Context, target string) (Unread, error) {
	if err := checkName("target", target); err != nil {
		return Unread{}, err
	}
	js, err := c.jetstream()
	if err != nil {
		return Unread{}, err
	}
	var out Unread
	return out, c.do(ctx, true, func(ctx context.Context) error {
		cons, err := js.Consumer(ctx, events.InboxStreamName, events.InboxConsumerName(target))
		if err == nil {
			ci, err := cons.Info(ctx)
			if err != nil {
				return err
			}
			out = Unread{Count: int(ci.NumPending) + ci.NumAckPending}
			return nil
		}
		if !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return err
		}
		stream, err := js.Stream(ctx, events.InboxStreamName)
		if err != nil {
			return err
		}
		subject := events.InboxSubject(target)
		si, err := stream.Info(ctx, jetstream.WithSubjectFilter(subject))
		if err != nil {
			return err
		}
		out = Unread{Count: int(si.State.Subjects[subject]), NoReader: true}
		return nil
	})
}
