package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
)

const scheduleLong = `Schedules register a task, an occurrence, at each of their slots: the times a
cron expression names (five fields, or @hourly, @daily, @weekly, @monthly,
@yearly; in --tz ZONE, UTC by default), or every --every D from the schedule's
creation. Each occurrence is an ordinary task whose id derives from the
schedule's name and the slot's time, so a slot runs at most once however many
engines run and however often they restart.

--overlap says what a slot does while the previous occurrence still runs:
skip (default) skips it, buffer_one runs the newest such slot once the previous
ends, allow runs it alongside, cancel_previous cancels the previous and runs it.
--catch-up says what happens to slots missed while no engine ran: latest
(default) runs the latest of them once, late; none skips them (only a slot at
most 30s late runs); all runs every one (at most 100). In a zone with daylight
saving time, a slot the clocks skip (02:30 on the spring-forward day) runs when
they jump (03:00), and one they show twice (01:30 on the fall-back day) runs
once, at the first.
A paused schedule registers nothing; resumed, it counts its slots from then.`

func scheduleCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "schedule",
		Short: "Run a command on a cron expression or every so often",
		Long:  scheduleLong,
	}
	cmd.AddCommand(scheduleAddCmd(g))
	for _, sub := range []struct{ use, short string }{
		{"list", "List the schedules with their next slots"},
		{"show", "Show a schedule, its next slots and its last occurrences with their outcomes"},
		{"pause", "Stop a schedule's slots; an occurrence already registered goes on"},
		{"resume", "Restart a paused schedule's slots, from now: the slots it missed do not run"},
		{"delete", "Delete a schedule; its occurrences stay tasks"},
		{"trigger", "Register an occurrence of a schedule now; prints its task id"},
	} {
		cmd.AddCommand(scheduleNameCmd(g, sub.use, sub.short))
	}
	return cmd
}

type scheduleAddOptions struct {
	addOptions
	cron, tz, every, overlap, catchUp string
}

func scheduleAddCmd(g *globals) *cobra.Command {
	var o scheduleAddOptions
	cmd := &cobra.Command{
		Use:   "add NAME (--cron EXPR [--tz ZONE] | --every D) [flags] -- 'SHELL COMMAND' | PROGRAM ARG...",
		Short: "Add a schedule: the command runs at each slot, with the add flags",
		Long: scheduleLong + `

The flags of bgtask add shape the task each slot registers (but for
--idempotency-key: each occurrence has its own), and the words after -- are
its command as they are add's: one word a shell command line, several a
program and its arguments. Each occurrence runs in the environment schedule add
ran in, as add's task does (--environment login: the worker's).`,
		Example: `  bgtask schedule add nightly --cron '30 2 * * *' --tz Europe/Paris -- make backup
  bgtask schedule add poll --every 5m --overlap skip --target ci -- ./check.sh`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if dash := cmd.ArgsLenAtDash(); dash != 1 {
				return usageErr("want NAME, then -- and the command")
			}
			o.g = g
			doc, err := o.fields(cmd, args[1:])
			if err != nil {
				return err
			}
			spec, err := json.Marshal(doc)
			if err != nil {
				return err
			}
			s := engine.Schedule{Name: args[0], Cron: o.cron, TZ: o.tz, Every: o.every, Overlap: o.overlap, CatchUp: o.catchUp, Spec: spec}
			return g.withClient(cmd.Context(), func(ctx context.Context, c *client.Client) error {
				v, err := c.AddSchedule(ctx, s)
				if err != nil {
					return err
				}
				return printSchedule(g, v, o.asJSON)
			})
		},
	}
	f := cmd.Flags()
	o.register(f)
	f.StringVar(&o.cron, "cron", "", "the slots: a cron expression of five fields (min hour dom month dow) or @hourly, @daily...")
	f.StringVar(&o.tz, "tz", "", "the IANA zone the cron expression is read in (default UTC)")
	f.StringVar(&o.every, "every", "", "the slots: every this long from now (at least 1s)")
	f.StringVar(&o.overlap, "overlap", "", "while the previous occurrence runs: skip (default), buffer_one, allow or cancel_previous")
	f.StringVar(&o.catchUp, "catch-up", "", "slots missed while no engine ran: latest (default), none or all")
	f.Lookup("json").Usage = "print the schedule and its next slots as JSON"
	g.timeoutFlag(cmd)
	return cmd
}

func scheduleNameCmd(g *globals, use, short string) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   use + " NAME",
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(cmd.Context(), func(ctx context.Context, c *client.Client) error {
				return runSchedule(ctx, g, c, use, args[0], asJSON)
			})
		},
	}
	if use == "list" {
		cmd.Use, cmd.Args = "list", cobra.NoArgs
		cmd.RunE = func(cmd *cobra.Command, _ []string) error {
			return g.withClient(cmd.Context(), func(ctx context.Context, c *client.Client) error {
				return runSchedule(ctx, g, c, use, "", asJSON)
			})
		}
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the reply as JSON")
	g.timeoutFlag(cmd)
	return cmd
}

func runSchedule(ctx context.Context, g *globals, c *client.Client, use, name string, asJSON bool) error {
	var (
		v   client.ScheduleView
		err error
	)
	switch use {
	case "list":
		list, err := c.Schedules(ctx)
		if err != nil || asJSON {
			return printOr(g, list, err)
		}
		for _, s := range list.Schedules {
			fmt.Fprintf(g.stdout, "%s\t%s\t%s\n", s.Schedule.Name, when(s.Schedule), nextOf(s))
		}
		return nil
	case "delete":
		out, err := c.DeleteSchedule(ctx, name)
		if err != nil || asJSON {
			return printOr(g, out, err)
		}
		_, err = fmt.Fprintln(g.stdout, "deleted", name)
		return err
	case "trigger":
		reg, err := c.TriggerSchedule(ctx, name)
		if err != nil || asJSON {
			return printOr(g, reg, err)
		}
		_, err = fmt.Fprintln(g.stdout, reg.ID)
		return err
	case "show":
		v, err = c.Schedule(ctx, name)
	default:
		v, err = c.PauseSchedule(ctx, name, use == "pause")
	}
	if err != nil {
		return err
	}
	return printSchedule(g, v, asJSON)
}

func printOr(g *globals, v any, err error) error {
	if err != nil {
		return err
	}
	return printJSONLine(g.stdout, v)
}

func when(s engine.Schedule) string {
	w := "every " + s.Every
	if s.Cron != "" {
		w = "cron " + s.Cron
		if s.TZ != "" {
			w += " (" + s.TZ + ")"
		}
	}
	if s.Paused {
		w += ", paused"
	}
	return w
}

func nextOf(v api.ScheduleView) string {
	if len(v.Next) == 0 {
		return "next: none"
	}
	return "next: " + v.Next[0].Local().Format(time.RFC3339)
}

func printSchedule(g *globals, v api.ScheduleView, asJSON bool) error {
	if asJSON {
		return printJSONLine(g.stdout, v)
	}
	s := v.Schedule
	fmt.Fprintf(g.stdout, "%s: %s, overlap %s, catch-up %s\n", s.Name, when(s), s.Overlap, s.CatchUp)
	next := make([]string, len(v.Next))
	for i, t := range v.Next {
		next[i] = t.Local().Format(time.RFC3339)
	}
	fmt.Fprintf(g.stdout, "next: %s\n", strings.Join(next, ", "))
	for _, o := range v.Occurrences {
		fmt.Fprintf(g.stdout, "%s\t%s\t%s\t%s\n", o.Slot.Local().Format(time.RFC3339), o.ID, o.State, o.Status)
	}
	return nil
}
