package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine/server"
	"github.com/bgtask/bgtask/internal/secretenv"
	"github.com/bgtask/bgtask/internal/serverhome"
)

// globals are the flags every command has.
type globals struct {
	home    string
	natsURL string
	auth    natsAuth
	// timeout bounds a client command's wait for the server (--timeout).
	timeout time.Duration
	stdout  io.Writer
	stderr  io.Writer
	// ctx is the run's: interrupted by SIGINT or SIGTERM.
	ctx         context.Context
	saidWaiting bool
	// bound is what a command waited for the server at most, for the message
	// that no server answered within it.
	bound time.Duration
}

// Run runs the bgtask command line.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	g := &globals{stdout: stdout, stderr: stderr, ctx: ctx, timeout: defaultTimeout}
	root := &cobra.Command{
		Use:   "bgtask",
		Short: "A durable supervisor for background work someone is waiting on",
		Long: `bgtask runs a command in the background, watches it, and when it ends wakes the
caller exactly once with the exit code, the output tail and a rendered prompt,
even if bgtask restarted in between. Every change of a task is an event in a
NATS JetStream stream.

Start a server (embedded NATS, engine and a worker) with 'bgtask server', then
register work with 'bgtask add -- COMMAND' and wait for it with 'bgtask wait ID'.

Client commands wait for a restarting server up to --timeout. With --json they
print the API's objects, and an error as {"error": {"code", "field", "message"}}
on stdout. Exit statuses (docs/cli.md): 0 success, 1 other failure, 2 bad
command line or input, 3 wait: the task ended without succeeding, 4 wait: it was
cancelled, 5 no such task, 6 not possible in the task's state, 7 no server
answered, 124 wait: --timeout passed.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version(),
	}
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetContext(ctx)
	pf := root.PersistentFlags()
	pf.StringVar(&g.home, "home", "", "server home directory (default $BGTASK_HOME, else $XDG_STATE_HOME/bgtask or ~/.local/state/bgtask)")
	pf.StringVar(&g.natsURL, "nats", "", "NATS URL(s) of a bgtask deployment, comma separated, instead of finding the server through --home")
	g.auth.register(pf)
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		if f := cmd.Flags().Lookup("timeout"); f != nil && strings.HasPrefix(f.Value.String(), "-") {
			return usageErr("--timeout %s: negative; 0 waits for ever", f.Value)
		}
		return nil
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return &exitError{code: client.ExitUsage, err: err}
	})
	// The client commands wait for the server up to their --timeout; wait's bounds
	// the wait for the task too, and target's subcommands have their own.
	for _, c := range []*cobra.Command{addCmd(g), rerunCmd(g), pauseCmd(g), resumeCmd(g), completeCmd(g), joinCmd(g), listCmd(g), showCmd(g), historyCmd(g), logsCmd(g), cancelCmd(g), redeliverCmd(g), inboxCmd(g), auditCmd(g), workersCmd(g)} {
		g.timeoutFlag(c)
		root.AddCommand(c)
	}
	root.AddCommand(serverCmd(g), workerCmd(g), waitCmd(g), targetCmd(g), benchCmd(g), shimCmd())
	root.AddCommand(setupCmd(g), mcpCmd(g), hookCmd(g))
	root.AddCommand(scheduleCmd(g), serviceCmd(g), uiCmd(g))
	cmd, err := root.ExecuteC()
	err = g.noServer(err)
	return report(err, wantsJSON(cmd, args, err), stdout, stderr)
}

// wantsJSON reports whether the command was asked for --json, also when its command
// line failed to parse before cobra reached that flag.
func wantsJSON(cmd *cobra.Command, args []string, err error) bool {
	f := cmd.Flags().Lookup("json")
	if f == nil {
		return false
	}
	if f.Changed || err == nil {
		return f.Value.String() == "true"
	}
	for _, arg := range args {
		if arg == "--" {
			break
		}
		if v, ok := strings.CutPrefix(arg, "--json="); ok {
			b, _ := strconv.ParseBool(v)
			return b
		}
		if arg == "--json" {
			return true
		}
	}
	return false
}

// isUsageError recognises cobra's own complaints about the command line.
func isUsageError(err error) bool {
	msg := err.Error()
	for _, prefix := range []string{"unknown command", "accepts ", "requires at least", "unknown flag", "unknown shorthand"} {
		if len(msg) >= len(prefix) && msg[:len(prefix)] == prefix {
			return true
		}
	}
	return false
}

// version is the module version this binary was built from, as SemVer (the micro
// service requires it); a build from a checkout is 0.0.0-dev.
func version() string {
	if info, ok := debug.ReadBuildInfo(); ok && strings.HasPrefix(info.Main.Version, "v") {
		return strings.TrimPrefix(info.Main.Version, "v")
	}
	return "0.0.0-dev"
}

// buildID names this build more closely than version: a development build by
// the commit it was built from (and whether the tree had changes), for the
// projection snapshots, which a build does not take from another.
func buildID() string {
	id := version()
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			switch {
			case s.Key == "vcs.revision":
				id += "+" + s.Value
			case s.Key == "vcs.modified" && s.Value == "true":
				id += "-modified"
			}
		}
	}
	return id
}

// connect opens a connection as the client identity of the home (or as the auth
// flags say, with --nats), for a program that acts as a client of the server.
func (g *globals) connect(name string, extra ...nats.Option) (*nats.Conn, error) {
	d, err := g.deployment()
	if err != nil {
		return nil, err
	}
	return d.Connect(name, extra...)
}

// deployment is where the global flags say a process connects: to --nats with
// the auth flags' options, else to the server of the home.
func (g *globals) deployment() (server.Deployment, error) {
	d := server.Deployment{Home: g.home, URL: g.natsURL}
	if g.natsURL == "" {
		if g.auth.given() {
			return d, usageErr("the NATS auth and TLS flags go with --nats URL; without it the home's own credentials are used")
		}
		return d, nil
	}
	var err error
	d.Auth, err = g.auth.options()
	return d, err
}

// holdCredentials holds (secretenv.Hold) the credentials a client command
// connects with, before it connects: a command that hands its environment to a
// task does so first. What cannot be read now, the connection reports.
func (g *globals) holdCredentials() {
	if g.natsURL != "" {
		_, _ = g.auth.options()
		return
	}
	if home, err := serverhome.Dir(g.home); err == nil {
		if creds, err := serverhome.ReadCredentials(home); err == nil {
			secretenv.Hold(creds.Seed)
		}
	}
}

// defaultTimeout bounds a client command that does not wait for a task to end:
// the server's answer, and a restart of the server before it.
const defaultTimeout = 30 * time.Second

// timeoutFlag gives a client command its --timeout.
func (g *globals) timeoutFlag(cmd *cobra.Command) {
	cmd.Flags().DurationVar(&g.timeout, "timeout", defaultTimeout, "how long to wait for the server to answer, through a restart of it (then exit status 7); 0 waits for ever")
}

// bounded bounds ctx by --timeout; 0 is no bound.
func (g *globals) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	g.bound = g.timeout
	if g.timeout == 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, g.timeout)
}

// sayWaiting tells the user, once, that the command waits for the server and why.
func (g *globals) sayWaiting(bound time.Duration, why error) {
	if g.saidWaiting {
		return
	}
	g.saidWaiting = true
	upTo := ""
	if bound > 0 {
		upTo = " up to " + bound.String()
	}
	fmt.Fprintf(g.stderr, "bgtask: waiting%s for the server: %v\n", upTo, why)
}

// open connects a client command to its deployment within ctx, waiting for a
// server that is restarting (said once on stderr); bound is ctx's bound, for the
// messages (0: none).
func (g *globals) open(ctx context.Context, bound time.Duration) (*client.Client, error) {
	g.bound = bound
	cfg, err := g.clientConfig("bgtask-cli")
	if err != nil {
		return nil, err
	}
	cfg.Waiting = func(why error) { g.sayWaiting(bound, why) }
	return client.Connect(ctx, cfg)
}

// clientConfig is the deployment the global flags name, to a connection named
// name.
func (g *globals) clientConfig(name string) (client.Config, error) {
	d, err := g.deployment()
	if err != nil {
		return client.Config{}, err
	}
	return client.Config{Home: d.Home, URL: d.URL, Options: d.Auth, Name: name}, nil
}

// withClient runs fn with a client of the command's deployment, all within its
// --timeout.
func (g *globals) withClient(ctx context.Context, fn func(context.Context, *client.Client) error) error {
	ctx, cancel := g.bounded(ctx)
	defer cancel()
	c, err := g.open(ctx, g.timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	return fn(ctx, c)
}

// noServer says of a command that no server answered how long it waited for one.
func (g *globals) noServer(err error) error {
	var absent *client.NoServerError
	if !errors.As(err, &absent) {
		return err
	}
	if absent.Waited && g.bound > 0 {
		err = fmt.Errorf("no bgtask server answered within %s: %w", g.bound, absent.Err)
	}
	return &exitError{code: client.ExitNoServer, err: err}
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printJSONLine writes one compact JSON value per line, for streams of values.
func printJSONLine(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}
