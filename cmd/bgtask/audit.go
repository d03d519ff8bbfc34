package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/projections"
)

func auditCmd(g *globals) *cobra.Command {
	var asJSON bool
	var stuckAfter time.Duration
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Replay the whole event stream and check bgtask's invariants",
		Long: `Replay every event in the stream and every wake-up in the inbox, and check the
invariants: events that decode, only the lease holder's run events, completion
persisted before fired, at most one fired per task, exactly one inbox message per
fired task and none for a task that cannot fire, every running task owned by a
worker whose lease is current, and no task stuck in its phase. Tasks not yet at their end are
listed as open, with the time they entered their phase.

A task is stuck (rule "stuck") when it stays in a phase past what the engine
promises by more than --stuck-after: ended or persisted for longer than
--stuck-after (the engine persists and fires within seconds); running with no
event of its run (spawned, tick, stalled) for longer than the lease TTL plus
--stuck-after, or running more than the lease TTL plus --stuck-after past its
deadline. An armed task is never stuck: it may wait for a worker for any time.
--stuck-after must be longer than the workers' --tick and --kill-grace.

Each violation is printed with its task id; the exit status is 1 if there is any.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if stuckAfter <= 0 {
				return usageErr("--stuck-after %s: must be positive", stuckAfter)
			}
			ctx := cmd.Context()
			c, js, err := g.streamClient()
			if err != nil {
				return err
			}
			defer c.Close()
			report, err := audit(ctx, js, stuckAfter)
			if err != nil {
				return err
			}
			if asJSON {
				if err := printJSON(g.stdout, report); err != nil {
					return err
				}
			} else {
				for _, v := range report.Violations {
					fmt.Fprintf(g.stdout, "VIOLATION %s task %s seq %d: %s\n", v.Rule, v.TaskID, v.Seq, v.Detail)
				}
				for _, o := range report.Open {
					fmt.Fprintf(g.stdout, "open %s %s %s since %s\n", o.TaskID, o.Phase, o.Worker, o.Since.UTC().Format(time.RFC3339))
				}
				fmt.Fprintf(g.stdout, "audit: %d events, %d tasks (%d fired, %d cancelled, %d archived, %d open), %d violations\n",
					report.Events, report.Tasks, report.Fired, report.Cancelled, report.Archived, len(report.Open), len(report.Violations))
			}
			if len(report.Violations) > 0 {
				return &exitError{code: 1}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	cmd.Flags().DurationVar(&stuckAfter, "stuck-after", projections.DefaultStuckAfter, "how far past what the engine promises a task may stay in its phase before it is stuck")
	return cmd
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
	time.Sleep(100 * time.Millisecond)
	return true
}
