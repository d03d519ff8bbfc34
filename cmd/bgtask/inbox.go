package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/client"
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
			openCtx, cancel := g.bounded(ctx)
			defer cancel()
			c, err := g.open(openCtx, g.timeout)
			if err != nil {
				return err
			}
			defer c.Close()
			inbox, err := c.Inbox(openCtx, target)
			if err != nil {
				return err
			}
			return readInbox(ctx, g, inbox, follow, asJSON)
		},
	}
	f := cmd.Flags()
	f.StringVar(&target, "target", client.DefaultTarget, "whose inbox")
	f.BoolVar(&follow, "follow", false, "keep waiting for new wake-ups")
	f.BoolVar(&asJSON, "json", false, "print each wake-up as one line of JSON")
	return cmd
}

// readInbox prints the wake-ups of an inbox and acknowledges each once printed:
// those there now, and with follow those that come, until ctx ends.
func readInbox(ctx context.Context, g *globals, inbox *client.Inbox, follow, asJSON bool) error {
	wait := time.Duration(0)
	if follow {
		wait = 20 * time.Second
	}
	for ctx.Err() == nil {
		batch, err := inbox.Fetch(ctx, 64, wait)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		for _, d := range batch {
			if err := printDelivery(g, d, asJSON); err != nil {
				return err
			}
			if err := d.Ack(ctx); err != nil {
				return fmt.Errorf("acknowledge wake-up: %w", err)
			}
		}
		if !follow && len(batch) == 0 {
			return nil
		}
	}
	return nil
}

func printDelivery(g *globals, d *client.Delivery, asJSON bool) error {
	if d.Err != nil {
		return fmt.Errorf("unreadable wake-up in the inbox: %w", d.Err)
	}
	w := d.Wakeup
	if asJSON {
		return printJSONLine(g.stdout, w)
	}
	fmt.Fprintf(g.stdout, "=== %s %s (exit %s) ===\n", w.ID, w.Status, exitString(w.ExitCode))
	return printWakeup(g.stdout, w)
}
