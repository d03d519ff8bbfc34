package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

const inboxLong = `Print the wake-ups in a target's inbox that have not been acknowledged yet, and
acknowledge each one after it was printed (a reader killed mid-read gets the
message again; one that acknowledged never does). Without --follow it stops when
the inbox is read; with --follow it waits for new wake-ups until interrupted.

The inbox is the JetStream stream BGTASK_INBOX, subject bgtask.deliver.TARGET,
read with the durable consumer inbox-TARGET; a runtime may consume it itself.`

func inboxCmd(g *globals) *cobra.Command {
	var (
		target string
		follow bool
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "inbox",
		Short: "Print the wake-ups delivered to a target and acknowledge them",
		Long:  inboxLong,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			c, js, err := g.streamClient()
			if err != nil {
				return err
			}
			defer c.Close()
			cons, err := events.InboxConsumer(ctx, js, target)
			if err != nil {
				return err
			}
			for {
				var batch jetstream.MessageBatch
				if follow {
					batch, err = cons.Fetch(64, jetstream.FetchContext(ctx))
				} else {
					batch, err = cons.FetchNoWait(64)
				}
				if consumerNotPlacedYet(ctx, err) {
					continue
				}
				if err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return fmt.Errorf("read inbox %s: %w", target, err)
				}
				n := 0
				for msg := range batch.Messages() {
					n++
					if err := printDelivery(g, msg.Data(), asJSON); err != nil {
						return err
					}
					if err := msg.DoubleAck(ctx); err != nil {
						return fmt.Errorf("acknowledge wake-up: %w", err)
					}
				}
				if err := batch.Error(); n == 0 && consumerNotPlacedYet(ctx, err) {
					continue
				} else if err != nil && !errors.Is(err, context.Canceled) && ctx.Err() == nil {
					return fmt.Errorf("read inbox %s: %w", target, err)
				}
				if ctx.Err() != nil || (!follow && n == 0) {
					return nil
				}
			}
		},
	}
	f := cmd.Flags()
	f.StringVar(&target, "target", engine.DefaultTarget, "whose inbox")
	f.BoolVar(&follow, "follow", false, "keep waiting for new wake-ups")
	f.BoolVar(&asJSON, "json", false, "print each wake-up as one line of JSON")
	return cmd
}

func printDelivery(g *globals, data []byte, asJSON bool) error {
	var w events.Wakeup
	if err := json.Unmarshal(data, &w); err != nil {
		return fmt.Errorf("unreadable wake-up in the inbox: %w", err)
	}
	if asJSON {
		return printJSONLine(g.stdout, w)
	}
	fmt.Fprintf(g.stdout, "=== %s %s (exit %s) ===\n", w.ID, w.Status, exitString(w.ExitCode))
	return printWakeup(g.stdout, w)
}
