package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/client"
)

// pauseCmd and resumeCmd hold a task that has not started, and let it go on.
func pauseCmd(g *globals) *cobra.Command {
	return holdCmd(g, "pause", "Hold a task that has not started: no worker takes it and a timer does not fire until 'bgtask resume'",
		"paused", (*client.Client).Pause)
}

func resumeCmd(g *globals) *cobra.Command {
	return holdCmd(g, "resume", "Let a paused task go on: a start or a timer whose time passed meanwhile happens at once",
		"resumed", (*client.Client).Resume)
}

func holdCmd(g *globals, name, short, done string, change func(*client.Client, context.Context, string) (client.Task, error)) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   name + " ID",
		Short: short,
		Long: short + `.

A task can be paused while it is armed: waiting for its --delay or --at, for its
next --retry attempt, for its timer's time, or for a worker. A running or
finished task cannot (exit status 6); cancel stops a running one.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			// Made once, as cancel is: a pause made again after one that took effect
			// would say the task is paused already.
			return g.withClient(cmd.Context(), func(ctx context.Context, c *client.Client) error {
				t, err := change(c, ctx, args[0])
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(g.stdout, t)
				}
				_, err = fmt.Fprintf(g.stdout, "%s %s\n", done, t.ID)
				return err
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the task as JSON")
	return cmd
}
