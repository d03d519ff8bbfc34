package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/client"
)

// redeliverCmd pushes a fired task's wake-up again.
func redeliverCmd(g *globals) *cobra.Command {
	var (
		sink   int
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "redeliver ID",
		Short: "Push a fired task's wake-up again, once: to each push sink that gave up",
		Long: `Push a fired task's wake-up again, once, to its push sinks (deliver): the
same wake-up with the same Idempotency-Key (an exec sink: BGTASK_TASK_ID). It
goes to each push that gave up, or, if none did, to each one (a receiver that
answered 200 and then lost it); --sink N picks one, delivered or gave up. Each
call starts each of those pushes over, once: made when the task's policy and
target allow, retried as its sink says (retry_for, max_attempts) until it is
delivered or gives up again; 'bgtask show ID' says where it is.

'bgtask list --delivery failed' lists the tasks with a push that gave up. A push
not done yet (held, in flight, waiting for its next retry), a task with no push
sink, one not fired, cancelled, consumed by a wait or archived: exit status 6,
and the error says where its pushes are. Made once, as cancel: a call the
connection cut is not made again.`,
		Example: `  bgtask list --delivery failed
  bgtask redeliver 019ae3 --sink 0`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := client.RedeliverRequest{ID: args[0]}
			if cmd.Flags().Changed("sink") {
				req.Sink = &sink
			}
			return g.withClient(cmd.Context(), func(ctx context.Context, c *client.Client) error {
				t, err := c.Redeliver(ctx, req)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(g.stdout, t)
				}
				for i, k := range t.Deliveries {
					if k.Redelivering {
						sink := t.Spec.Deliver[i]
						fmt.Fprintf(g.stdout, "redelivering %s: push %d, %s %s\n", t.ID, i, sink.Type, printable(sinkDestination(sink), false))
					}
				}
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.IntVar(&sink, "sink", 0, "push only this sink again (its place in the spec's deliver, from 0)")
	f.BoolVar(&asJSON, "json", false, `print the task as JSON, the sinks pushed again with "redelivering": true`)
	return cmd
}
