package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/client"
)

func completeCmd(g *globals) *cobra.Command {
	var (
		req    client.CompleteRequest
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "complete ID",
		Short: "End a task from outside, with a status and a result; its wake-up follows",
		Long: `End a task from outside: one that has not started never runs, a running one's
command is stopped (TERM, then KILL), and the caller is woken once with the
status and result given here. Whichever comes first, this, the command's exit or
its deadline, decides: a second never changes the outcome (exit status 6).

A task registered with 'bgtask add --external --deadline D' runs nothing and
waits for this: a durable "wait for this event" that a CI job or a webhook ends.`,
		Example: `  id=$(bgtask add --external --deadline 1h --prompt 'CI finished: {{status}} {{result}}')
  bgtask complete "$id" --status failed --result 'test/foo: 2 failures'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req.ID = args[0]
			// Made once, as cancel is: made again after it took effect, it would say
			// the task has ended.
			return g.withClient(cmd.Context(), func(ctx context.Context, c *client.Client) error {
				t, err := c.Complete(ctx, req)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(g.stdout, t)
				}
				_, err = fmt.Fprintf(g.stdout, "completed %s: %s\n", t.ID, t.Status)
				return err
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Status, "status", "succeeded", "the outcome: succeeded or failed")
	f.StringVar(&req.Result, "result", "", "the wake-up's {{result}} (at most 32 KiB)")
	f.BoolVar(&asJSON, "json", false, "print the task as JSON")
	return cmd
}
