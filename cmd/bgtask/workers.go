package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
)

func workersCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "workers",
		Short: "List the live workers: labels, running tasks, capacity, last heartbeat",
		Long: `List the workers whose heartbeat is within the lease TTL, as the engine sees
them: id, state (starting, ready, draining, stopped), labels, how many tasks the
event log says each runs against its --max-tasks, and how long ago its last
heartbeat was stored. A stopped worker left running commands and still holds
their leases until it starts again or the TTL passes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.withClient(cmd.Context(), func(ctx context.Context, c *client.Client) error {
				reply, err := c.Workers(ctx)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(g.stdout, reply)
				}
				return printWorkers(g.stdout, reply)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, `print {"workers": [...]} as JSON`)
	return cmd
}

func printWorkers(w io.Writer, reply api.WorkersReply) error {
	if len(reply.Workers) == 0 {
		_, err := fmt.Fprintln(w, "no live worker")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tRUNNING\tHEARTBEAT\tLABELS")
	for _, wk := range reply.Workers {
		fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%s ago\t%s\n", wk.ID, wk.State, wk.Running, wk.MaxTasks,
			age(wk.LastSeen), engine.FormatLabels(wk.Labels))
	}
	return tw.Flush()
}
