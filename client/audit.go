package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/projections"
)

// AuditReport is what an audit found: the invariants a task broke, the tasks
// not at their end yet, and counts.
type AuditReport = projections.Report

// DefaultStuckAfter is how far past what the engine promises a task may stay in
// its phase before an audit calls it stuck.
const DefaultStuckAfter = projections.DefaultStuckAfter

// Audit replays the whole event stream and the inbox and checks bgtask's
// invariants over them (docs/cli.md, audit); a task is stuck stuckAfter past what
// the engine promises.
func (c *Client) Audit(ctx context.Context, stuckAfter time.Duration) (AuditReport, error) {
	js, err := c.jetstream()
	if err != nil {
		return AuditReport{}, err
	}
	r, err := audit(ctx, js, stuckAfter)
	return r, c.goneOr(err)
}

// audit reads the event log up to its current end, then the inbox; a task is
// stuck stuckAfter past what the engine promises.
func audit(ctx context.Context, js jetstream.JetStream, stuckAfter time.Duration) (projections.Report, error) {
	a := projections.NewAudit()
	if err := auditHistories(ctx, js, a); err != nil {
		return projections.Report{}, err
	}
	liveness, err := events.ConnectLiveness(ctx, js)
	if err != nil {
		return projections.Report{}, err
	}
	a.CheckStuck(projections.StuckBounds{Now: time.Now(), After: stuckAfter, LeaseTTL: liveness.TTL()})
	var livenessErr error
	a.CheckOwners(func(worker string) bool {
		ok, err := liveness.Alive(ctx, worker)
		if err != nil {
			livenessErr = err
			return true // unknown is not gone
		}
		return ok
	})
	if err := auditInbox(ctx, js, a); err != nil {
		return projections.Report{}, err
	}
	return a.Report(), livenessErr
}

// auditHistories feeds a every task's history: the archived ones first, then the
// event stream up to its last event now.
func auditHistories(ctx context.Context, js jetstream.JetStream, a *projections.Audit) error {
	archive, err := events.ConnectArchive(ctx, js)
	if err != nil {
		return err
	}
	err = archive.Each(ctx, func(seq uint64, h events.ArchivedHistory, err error) bool {
		if err != nil {
			a.Add(events.Record{Seq: seq}, fmt.Errorf("archive seq %d: %w", seq, err))
			return true
		}
		a.AddArchived(h)
		return true
	})
	if err != nil {
		return fmt.Errorf("read archive: %w", err)
	}
	store, err := events.ConnectStore(ctx, js)
	if err != nil {
		return err
	}
	last, err := store.LastSeq(ctx)
	if err != nil || last == 0 {
		return err
	}
	err = store.Follow(ctx, "", 0, func(rec events.Record, decodeErr error) bool {
		a.Add(rec, decodeErr)
		return rec.Seq < last
	})
	if err != nil {
		return fmt.Errorf("read events: %w", err)
	}
	return nil
}

// auditInbox feeds a every wake-up in the inbox.
func auditInbox(ctx context.Context, js jetstream.JetStream, a *projections.Audit) error {
	inbox, err := js.Stream(ctx, events.InboxStreamName)
	if err != nil {
		return err
	}
	cons, err := inbox.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return err
	}
	for {
		batch, err := cons.FetchNoWait(1024)
		if consumerNotPlacedYet(ctx, err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("read inbox: %w", err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			a.AddDelivery(deliveryKey(msg))
		}
		err = batch.Error()
		if n == 0 && consumerNotPlacedYet(ctx, err) {
			continue
		}
		if err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return fmt.Errorf("read inbox: %w", err)
		}
		if n == 0 {
			return nil
		}
	}
}

// deliveryKey is what an inbox message is counted by: the wake-up's own id (and its
// notice), not the message id, so a copy published around the dispatcher's dedupe
// counts too.
func deliveryKey(msg jetstream.Msg) string {
	var w events.Wakeup
	if json.Unmarshal(msg.Data(), &w) != nil || w.ID == "" {
		return msg.Headers().Get(jetstream.MsgIDHeader)
	}
	if w.Notice != "" {
		return w.ID + "." + w.Notice
	}
	return w.ID
}

// consumerNotPlacedYet says whether a fetch found no consumer to answer it, as
// happens on a cluster just after the consumer was created; it waits a moment
// before the caller asks again.
func consumerNotPlacedYet(ctx context.Context, err error) bool {
	if !errors.Is(err, nats.ErrNoResponders) || ctx.Err() != nil {
		return false
	}
	pause(ctx, 100*time.Millisecond)
	return true
}
