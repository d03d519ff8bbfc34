package main

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/client"
)

func rerunCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "rerun ID",
		Short: "Register a new task with the same spec as task ID; prints the new id",
		Long: `Register a new task that runs task ID's command again: the same spec, a new id,
and rerun_of naming ID. A start (--delay, --at) and a deadline keep their
distance from the registration; the idempotency key is not carried over. The
environment is the one ID ran with, the caller's it captured included.`,
		Example: `  bgtask rerun 01a2b3c4-...
  bgtask wait "$(bgtask rerun "$id")"`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			// One key for every attempt of this command: a request made again through
			// a restart of the server registers once.
			key := "rerun-" + uuid.NewString()
			return g.withClient(cmd.Context(), func(ctx context.Context, c *client.Client) error {
				reg, err := c.Rerun(ctx, args[0], key)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSONLine(g.stdout, reg)
				}
				_, err = fmt.Fprintln(g.stdout, reg.ID)
				return err
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, `print {"id": ...} as JSON`)
	return cmd
}
