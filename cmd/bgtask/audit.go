package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/client"
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
			var report client.AuditReport
			err := g.withClient(cmd.Context(), func(ctx context.Context, c *client.Client) (err error) {
				report, err = c.Audit(ctx, stuckAfter)
				return err
			})
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
	cmd.Flags().DurationVar(&stuckAfter, "stuck-after", client.DefaultStuckAfter, "how far past what the engine promises a task may stay in its phase before it is stuck")
	return cmd
}
