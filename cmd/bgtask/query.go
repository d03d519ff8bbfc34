package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
)

func listCmd(g *globals) *cobra.Command {
	var (
		q            engine.ListQuery
		state        string
		labels       []string
		since, until string
		asJSON       bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List tasks, newest first",
		Long: "List tasks, newest first. Each filter given must hold: --state, --status, --delivery, --target, --kind, " +
			"--label (each KEY=VALUE the task's placement requires), and --since and --until on the time it was registered.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			q.Phase = engine.Phase(state)
			if err := listFilters(&q, labels, since, until, time.Now()); err != nil {
				return err
			}
			return g.withClient(cmd.Context(), func(ctx context.Context, c *client.Client) error {
				reply, err := c.List(ctx, q)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(g.stdout, reply)
				}
				return printTaskTable(g.stdout, reply)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&state, "state", "", "only tasks in this state: "+engine.PhaseNames())
	f.StringVar(&q.Status, "status", "", "only tasks with this outcome: "+strings.Join(engine.Statuses, ", ")+
		" (the task's; its pushes': --delivery)")
	f.StringVar(&q.Delivery, "delivery", "", "only fired tasks whose pushes (deliver sinks) are "+strings.Join(engine.DeliveryStates, ", ")+
		" (failed: one gave up; bgtask redeliver sends it again)")
	f.StringVar(&q.Target, "target", "", "only tasks whose wake-up goes to this target")
	f.StringVar(&q.Kind, "kind", "", "only tasks of this kind")
	f.StringArrayVar(&labels, "label", nil, "only tasks whose placement requires KEY=VALUE (repeatable: all must hold)")
	f.StringVar(&since, "since", "", "only tasks registered at or after this time: RFC 3339, or a duration ago such as 2h")
	f.StringVar(&until, "until", "", "only tasks registered before this time: RFC 3339, or a duration ago")
	f.IntVar(&q.Limit, "limit", 100, "at most this many tasks (0: all)")
	f.BoolVar(&asJSON, "json", false, `print {"tasks": [...], "total": N}, the API's list reply with every page merged`)
	return cmd
}

// listFilters reads list's --label, --since and --until into q.
func listFilters(q *engine.ListQuery, labels []string, since, until string, now time.Time) error {
	if len(labels) > 0 {
		m, err := parseKeyValues("--label", labels)
		if err != nil {
			return err
		}
		q.Labels = m
	}
	var err error
	if q.Since, err = listTime("--since", since, now); err != nil {
		return err
	}
	q.Until, err = listTime("--until", until, now)
	return err
}

// listTime is a time in RFC 3339, or a duration before now; "" is none.
func listTime(flag, v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, usageErr("%s %q: want a time in RFC 3339 (2026-12-01T09:30:00Z) or a duration ago (2h)", flag, v)
}

func printTaskTable(w io.Writer, reply api.ListReply) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tSTATUS\tEXIT\tAGE\tCOMMAND")
	for _, t := range reply.Tasks {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", oneLine(t.ID, 64), oneLine(string(t.Phase), 32), dash(oneLine(t.Status, 32)),
			exitString(t.ExitCode), age(t.ArmedAt), oneLine(t.Command, 60))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, t := range reply.Tasks {
		switch {
		case t.Waiting != "":
			fmt.Fprintf(w, "%s %s\n", printable(t.ID, false), printable(t.Waiting, false))
		case t.Delivery == engine.DeliveryFailed:
			fmt.Fprintf(w, "%s a push gave up: bgtask redeliver %s\n", printable(t.ID, false), printable(t.ID, false))
		}
	}
	if reply.Total > len(reply.Tasks) {
		_, err := fmt.Fprintf(w, "(%d of %d tasks; --limit 0 shows all)\n", len(reply.Tasks), reply.Total)
		return err
	}
	return nil
}

func showCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show a task's current state",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(cmd.Context(), func(ctx context.Context, c *client.Client) error {
				t, err := c.Get(ctx, args[0])
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(g.stdout, t)
				}
				return printTask(g.stdout, t)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the task as JSON")
	return cmd
}

func printTask(w io.Writer, t api.TaskView) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "%s:\t%s\n", k, printable(v, false))
		}
	}
	row("id", t.ID)
	row("state", string(t.Phase))
	row("status", t.Status)
	row("command", t.Command)
	row("cwd", t.Spec.Cwd)
	row("environment", environmentRow(t.Spec))
	row("kind", t.Spec.Kind)
	row("target", t.Spec.Target)
	row("placement", t.Spec.Placement.String())
	row("armed", stamp(&t.ArmedAt))
	row("waiting", t.Waiting)
	if t.Worker != "" {
		row("worker", t.Worker+" on "+t.Host)
	}
	if t.PID != 0 {
		row("pid", fmt.Sprint(t.PID))
	}
	row("started", stamp(t.SpawnedAt))
	row("last tick", stamp(t.LastTickAt))
	row("ended", stamp(t.EndedAt))
	if t.ExitCode != nil {
		exit := fmt.Sprint(*t.ExitCode)
		if t.Run.Signal != "" {
			exit += " (signal " + t.Run.Signal + ")"
		}
		row("exit code", exit)
	}
	if t.Run != nil && t.Run.KeptRunning {
		row("exit code", "none: the command was left running")
	}
	row("reason", t.Reason)
	row("matched line", oneLine(t.MatchedLine, 200))
	if t.Respawns > 0 {
		row("respawns", fmt.Sprint(t.Respawns))
	}
	row("deadline", t.Spec.Deadline)
	timingRows(row, t)
	row("fired", stamp(t.FiredAt))
	if t.ArchiveSeq != 0 {
		row("archived", fmt.Sprintf("its history is in %s at seq %d", client.ArchiveStreamName, t.ArchiveSeq))
	}
	if len(t.Spec.Deliver) > 0 {
		row("policy", t.Spec.DeliveryPolicy())
	}
	for i, sink := range t.Spec.Deliver {
		row(fmt.Sprintf("push %d", i), sink.Type+" "+sinkDestination(sink)+": "+sinkProgress(t.State, i))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if t.Result != "" {
		fmt.Fprintln(w, "\nresult:")
		for _, line := range strings.Split(t.Result, "\n") {
			fmt.Fprintln(w, "  "+printable(line, true))
		}
	}
	if t.Run != nil && len(t.Run.Tail) > 0 {
		fmt.Fprintf(w, "\noutput (last %d lines):\n", len(t.Run.Tail))
		for _, line := range t.Run.Tail {
			fmt.Fprintln(w, "  "+printable(line, true))
		}
	}
	return nil
}

func sinkDestination(k engine.Sink) string {
	if k.Type == engine.SinkWebhook {
		return k.URL
	}
	return oneLine(strings.Join(k.Argv, " "), 80)
}

// sinkProgress says how far push sink i of a task has got.
func sinkProgress(s engine.State, i int) string {
	if i >= len(s.Deliveries) {
		return "after the task fires"
	}
	k := s.Deliveries[i]
	tried := fmt.Sprintf(" (%d attempts)", k.Attempts)
	switch {
	case k.Delivered:
		return "delivered" + tried
	case k.Skipped:
		return "not made: the wake-up was consumed" + tried
	case k.Failed:
		return "gave up: " + k.LastError + tried + "; bgtask redeliver sends it again"
	case k.GivingUp:
		return "giving up: " + k.LastError + tried
	case k.Claim != nil:
		return fmt.Sprintf("attempt %d in flight", k.Claim.Attempt)
	case k.RetryAt != nil:
		until := k.RetryUntil(s.Spec.Deliver[i])
		return "retry at " + stamp(k.RetryAt) + " after " + k.LastError + tried + ", retried until " + stamp(&until)
	case k.Redelivering:
		return "sent again (bgtask redeliver), waiting for the policy (" + s.Spec.DeliveryPolicy() + ")" + tried
	}
	return "waiting for the policy (" + s.Spec.DeliveryPolicy() + ": target busy, or an earlier wake-up first)"
}

func historyCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "history ID",
		Short: "Print a task's events in order",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(cmd.Context(), func(ctx context.Context, c *client.Client) error {
				h, err := c.History(ctx, args[0])
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(g.stdout, h)
				}
				tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "SEQ\tTIME\tTYPE\tWRITER\tEPOCH\tPAYLOAD")
				for _, e := range h.Events {
					fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\n", e.Seq, e.Time.Local().Format("15:04:05.000"),
						oneLine(string(e.Type), 40), oneLine(e.Writer, 80), e.Epoch, oneLine(string(e.Payload), 80))
				}
				return tw.Flush()
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, `print {"events": [...]} as JSON, each event with type, seq and time`)
	return cmd
}

func cancelCmd(g *globals) *cobra.Command {
	var (
		reason string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "cancel ID",
		Short: "Cancel a task: stop its process group (TERM, then KILL); nothing is delivered",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(cmd.Context(), func(ctx context.Context, c *client.Client) error {
				t, err := c.Cancel(ctx, args[0], reason)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(g.stdout, t)
				}
				_, err = fmt.Fprintf(g.stdout, "cancelled %s\n", t.ID)
				return err
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, kept in the task's history")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the cancelled task as JSON")
	return cmd
}

// environmentRow says what a task's command runs in; the values of its env are
// no reader's (engine.Spec.HideEnv).
func environmentRow(s engine.Spec) string {
	names := slices.Sorted(maps.Keys(s.Env))
	switch {
	case s.Environment == engine.EnvironmentCaller:
		return fmt.Sprintf("the caller's, %d variables (show --json names them)", len(names))
	case len(names) > 0:
		return "login, with " + strings.Join(names, " ")
	}
	return ""
}

// timingRows are the rows of a task's start, retries and rerun.
func timingRows(row func(k, v string), t api.TaskView) {
	row("start at", t.Spec.StartAt)
	row("late by", t.LateBy)
	if r := t.Spec.Retry; r != nil {
		row("retries", fmt.Sprintf("%d of %d used (on %s, backoff %s up to %s)", len(t.Attempts), r.Max, strings.Join(r.On, ","), r.Backoff, r.MaxBackoff))
	}
	for i, a := range t.Attempts {
		row(fmt.Sprintf("attempt %d", i+1), a.Status+" (exit code "+exitString(a.ExitCode)+") "+a.Reason)
	}
	if t.RetryAt != nil {
		row("next attempt", stamp(t.RetryAt))
	}
	row("rerun of", t.Spec.RerunOf)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func exitString(code *int) string {
	if code == nil {
		return "-"
	}
	return fmt.Sprint(*code)
}

func age(t time.Time) string {
	d := time.Since(t)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

func stamp(t *time.Time) string {
	if t == nil || t.IsZero() {
		return ""
	}
	return t.Local().Format("2006-01-02 15:04:05.000")
}

// oneLine is s on one line for a terminal (see printable), cut to at most max
// bytes, at a character boundary.
func oneLine(s string, max int) string {
	s = printable(strings.Join(strings.Fields(s), " "), false)
	if len(s) <= max {
		return s
	}
	cut := max - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
