package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
)

func joinCmd(g *globals) *cobra.Command {
	var (
		joinAll, joinAny, asJSON bool
		prompt, target, kind     string
		wakeOn                   string
	)
	cmd := &cobra.Command{
		Use:   "join --all|--any ID...",
		Short: "One wake-up for a group of tasks: when all of them (or the first) have ended",
		Long: `Register a task that runs nothing and fires once when all of the tasks named
(--all), or the first of them (--any), have ended; an ID may be a unique start
of the task's id (at least 6 characters). Its wake-up lists every member's id,
status and exit code ({{members}} in --prompt). The group succeeds if every
member that ended succeeded; otherwise it fails, its reason counting and naming
the members that did not, so 'bgtask wait GROUP && deploy' stops at a failure
(wait exits 3). Members added with --wake-on none wake nobody on their own, so
the group's is the one wake-up; --wake-on failed on the group wakes the caller
only if a member did not succeed.`,
		Example: `  a=$(bgtask add --wake-on none -- make test)
  b=$(bgtask add --wake-on none -- make lint)
  bgtask join --all "$a" "$b" --prompt 'checks done:
{{members}}'
  g=$(bgtask join --all "$a" "$b") && bgtask wait "$g" && make deploy`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if joinAll == joinAny {
				return usageErr("give one of --all and --any")
			}
			mode := engine.JoinAll
			if joinAny {
				mode = engine.JoinAny
			}
			doc := map[string]any{"idempotency_key": "join-" + uuid.NewString()}
			for flag, v := range map[string]string{"prompt": prompt, "target": target, "kind": kind} {
				if cmd.Flags().Changed(flag) {
					doc[flag] = v
				}
			}
			if cmd.Flags().Changed("wake-on") {
				doc["wake_on"] = strings.Split(wakeOn, ",")
			}
			if s, ok := currentSession(os.Getenv, g.home, cmd.ErrOrStderr()); ok {
				applySession(doc, s)
			}
			return g.withClient(cmd.Context(), func(ctx context.Context, c *client.Client) error {
				members, err := wholeIDs(ctx, c, args)
				if err != nil {
					return err
				}
				doc["join"] = engine.Join{Mode: mode, Members: members}
				raw, err := json.Marshal(doc)
				if err != nil {
					return err
				}
				reg, err := c.RegisterJSON(ctx, raw)
				if err != nil {
					return err
				}
				reg.Created = true // the key is this command's own
				if asJSON {
					return printJSONLine(g.stdout, reg)
				}
				_, err = fmt.Fprintln(g.stdout, reg.ID)
				return err
			})
		},
	}
	f := cmd.Flags()
	f.BoolVar(&joinAll, "all", false, "fire once every member has ended")
	f.BoolVar(&joinAny, "any", false, "fire once the first member has ended")
	f.StringVar(&prompt, "prompt", "", "template of the wake-up's prompt; {{members}} lists the members (default: a summary)")
	f.StringVar(&target, "target", "", "inbox the wake-up goes to (default: the agent session it runs in, else \"default\")")
	f.StringVar(&kind, "kind", "", "a label for the group")
	f.StringVar(&wakeOn, "wake-on", "", "the group's outcomes that wake the caller, comma separated: succeeded, failed (default: both); another ends the group quietly")
	f.BoolVar(&asJSON, "json", false, "print {\"id\": ...} as JSON")
	return cmd
}

// wholeIDs are the ids of the tasks refs name: a start of an id, as a command's
// ID argument may be, is looked up, and a whole id is kept as it is (the engine
// finds whether it is a task's).
func wholeIDs(ctx context.Context, c *client.Client, refs []string) ([]string, error) {
	ids := make([]string, len(refs))
	for i, ref := range refs {
		if api.IsWholeID(ref) {
			ids[i] = ref
			continue
		}
		t, err := c.Get(ctx, ref)
		if err != nil {
			return nil, err
		}
		ids[i] = t.ID
	}
	return ids, nil
}
