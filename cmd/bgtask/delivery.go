package main

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/server"
	"github.com/bgtask/bgtask/engine/sinks"
	"github.com/bgtask/bgtask/internal/serverhome"
)

func registerDeliveryFlags(f *pflag.FlagSet, o *server.DeliveryOptions) {
	f.StringVar(&o.SecretFile, "webhook-secret-file", "", "file with the key that signs webhook bodies (X-Bgtask-Signature: sha256=HMAC); default HOME/"+serverhome.WebhookSecretFile+", generated on first start. Engine replicas need the same one")
	f.DurationVar(&o.RetryBase, "retry-base", engine.DefaultRetryBase, "wait after a push sink's first failed attempt; it doubles with each attempt, up to 5m, with jitter")
	f.Var(&bearerFlag{m: &o.Bearers}, "webhook-bearer", "declare a bearer token that webhook sinks may name (\"bearer\": \"NAME\") as NAME=file:PATH@URLPREFIX or NAME=env:VAR@URLPREFIX: the token is read from the file (again at each push) or the server's environment variable, and sent as Authorization: Bearer only to URLs under the prefix; repeat with the same NAME and source for more prefixes (docs/webhooks.md). Engine replicas need the same ones")
}

// bearerFlag is --webhook-bearer, checked as each is given: its token is readable
// now (a typo fails the start, not the first push) and its prefix is a URL prefix.
type bearerFlag struct {
	m    *engine.WebhookBearers
	args []string
}

func (b *bearerFlag) String() string { return strings.Join(b.args, " ") }

func (b *bearerFlag) Type() string { return "NAME=SOURCE@URLPREFIX" }

func (b *bearerFlag) Set(arg string) error {
	name, rest, ok := strings.Cut(arg, "=")
	if !ok || !client.ValidName(name) {
		return fmt.Errorf("%q: want NAME=file:PATH@URLPREFIX or NAME=env:VAR@URLPREFIX, NAME 1-128 letters, digits, '-' or '_'", arg)
	}
	at := max(strings.LastIndex(rest, "@http://"), strings.LastIndex(rest, "@https://"))
	if at < 0 {
		return fmt.Errorf("%s: no @URLPREFIX (an http:// or https:// URL the token may be sent to)", name)
	}
	source, raw := rest[:at], rest[at+1:]
	prefix, err := engine.ParseURLPrefix(raw)
	if err != nil {
		return fmt.Errorf("%s: URL prefix %v", name, err)
	}
	bearer := engine.WebhookBearer{Name: name}
	switch kind, where, _ := strings.Cut(source, ":"); {
	case kind == "file" && filepath.IsAbs(where):
		bearer.File = where
	case kind == "env" && envName.MatchString(where):
		bearer.Env = where
	default:
		return fmt.Errorf("%s: source %q: want file:ABSOLUTE-PATH or env:VARIABLE", name, source)
	}
	if _, err := sinks.Token(bearer); err != nil {
		return err
	}
	if earlier, ok := (*b.m)[name]; ok {
		if earlier.File != bearer.File || earlier.Env != bearer.Env {
			return fmt.Errorf("%s is declared twice with different sources", name)
		}
		bearer.Prefixes = earlier.Prefixes
	}
	bearer.Prefixes = append(bearer.Prefixes, prefix)
	if *b.m == nil {
		*b.m = engine.WebhookBearers{}
	}
	(*b.m)[name] = bearer
	b.args = append(b.args, arg)
	return nil
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func targetListCmd(g *globals) *cobra.Command {
	var asJSON bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List the targets that have a state",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var states map[string]client.TargetState
			err := g.withClient(cmd.Context(), func(ctx context.Context, c *client.Client) (err error) {
				states, err = c.Targets(ctx)
				return err
			})
			if err != nil {
				return err
			}
			type row struct {
				Name string `json:"name"`
				client.TargetState
				Busy bool `json:"busy"`
			}
			rows := []row{}
			now := time.Now()
			for name, st := range states {
				rows = append(rows, row{Name: name, TargetState: st, Busy: st.BusyAt(now)})
			}
			slices.SortFunc(rows, func(a, b row) int { return strings.Compare(a.Name, b.Name) })
			if asJSON {
				return printJSON(g.stdout, rows)
			}
			for _, r := range rows {
				state := client.TargetIdle
				if r.Busy {
					state = client.TargetBusy
					if r.Until != nil {
						state += " until " + r.Until.Local().Format(time.DateTime)
					}
				}
				fmt.Fprintf(g.stdout, "%-24s %s\n", r.Name, state)
			}
			return nil
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	g.timeoutFlag(list)
	return list
}

const targetLong = `A target's state decides when its wake-ups are pushed to the push sinks of their
specs (deliver: webhook, exec): policy queue (the default) holds them while the
target is busy and pushes them in order when it is idle again; defer_idle also
waits for each push to be acknowledged before the next; immediate ignores the
state. The inbox copy is written when the task fires, whatever the state.

The states live in the JetStream KV bucket ` + client.TargetsBucket + `, one key per
target, so a runtime can set its own with any NATS client: the value is busy,
idle, or {"state":"busy","until":"RFC 3339 time"}. A target that never said
anything is idle.`

func targetCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "target",
		Short: "Say whether a target (an agent, a conversation, a bot) is busy or idle",
		Long:  targetLong,
	}
	var ttl time.Duration
	set := func(state string) *cobra.Command {
		c := &cobra.Command{
			Use:   state + " NAME",
			Short: "Mark a target " + state,
			Args:  cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				if ttl != 0 {
					if err := client.CheckBusyTTL(ttl); err != nil {
						return usageErr("--ttl %v", err)
					}
				}
				return g.withClient(cmd.Context(), func(ctx context.Context, c *client.Client) error {
					_, err := c.SetTarget(ctx, args[0], state, ttl)
					return err
				})
			},
		}
		g.timeoutFlag(c)
		if state == client.TargetBusy {
			c.Long = "Mark a target busy: wake-ups with policy queue or defer_idle are held until it is idle."
			c.Flags().DurationVar(&ttl, "ttl", 0, "the busy state ends by itself after this long, at most 24h (so a runtime that crashes while busy does not hold its wake-ups forever); 0: until 'target idle'")
		} else {
			c.Long = "Mark a target idle: the wake-ups held for it are pushed, in the order they fired."
		}
		return c
	}
	cmd.AddCommand(set(client.TargetBusy), set(client.TargetIdle), targetListCmd(g))
	return cmd
}
