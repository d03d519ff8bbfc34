package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/engine/api"
)

// exitError carries a specific exit status.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// Exit statuses besides 0 and 1.
const (
	exitUsage   = 2
	exitTimeout = 124 // as timeout(1)
)

// globals are the flags every command has.
type globals struct {
	home    string
	natsURL string
	auth    natsAuth
	stdout  io.Writer
	stderr  io.Writer
}

// Run runs the bgtask command line.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	g := &globals{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "bgtask",
		Short: "A durable supervisor for background work someone is waiting on",
		Long: `bgtask runs a command in the background, watches it, and when it ends wakes the
caller exactly once with the exit code, the output tail and a rendered prompt,
even if bgtask restarted in between. Every change of a task is an event in a
NATS JetStream stream.

Start a server (embedded NATS, engine and a worker) with 'bgtask server', then
register work with 'bgtask add -- COMMAND' and wait for it with 'bgtask wait ID'.`,
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
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return &exitError{code: exitUsage, err: err}
	})
	root.AddCommand(
		serverCmd(g), workerCmd(g), addCmd(g), waitCmd(g), listCmd(g),
		showCmd(g), historyCmd(g), logsCmd(g), cancelCmd(g), inboxCmd(g), targetCmd(g), auditCmd(g), workersCmd(g), benchCmd(g), shimCmd(),
	)
	err := root.Execute()
	if err != nil && !errors.As(err, new(*exitError)) && isUsageError(err) {
		return &exitError{code: exitUsage, err: err}
	}
	return err
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

// connect opens a client connection: to --nats if given, else to the server whose
// discovery file is in the home directory, with the credentials it generated there.
func (g *globals) connect(name string) (*nats.Conn, error) {
	opts := []nats.Option{nats.Name(name), nats.Timeout(5 * time.Second), nats.MaxReconnects(-1)}
	if g.natsURL != "" {
		auth, err := g.auth.options()
		if err != nil {
			return nil, err
		}
		nc, err := nats.Connect(g.natsURL, append(opts, auth...)...)
		if err != nil {
			return nil, fmt.Errorf("connect to %s: %w", g.natsURL, err)
		}
		return nc, nil
	}
	if g.auth.given() {
		return nil, usageErr("the NATS auth and TLS flags go with --nats URL; without it the home's own credentials are used")
	}
	home, err := homeDir(g.home)
	if err != nil {
		return nil, err
	}
	d, err := readDiscovery(home)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no bgtask server in %s: start one with 'bgtask server' (or pass --home, or --nats URL)", home)
	}
	if err != nil {
		return nil, err
	}
	creds, err := readCredentials(home)
	if err != nil {
		return nil, fmt.Errorf("read credentials: %w", err)
	}
	auth, err := creds.natsOption()
	if err != nil {
		return nil, fmt.Errorf("read credentials: %w", err)
	}
	// Reconnects go where the server is now, should it come back on another port.
	opts = append(opts, auth, nats.SetCustomDialer(&discoveryDialer{home: home, dialer: net.Dialer{Timeout: 5 * time.Second}}))
	nc, err := nats.Connect(d.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("the bgtask server of %s (pid %d, %s) does not answer: %w", home, d.PID, d.URL, err)
	}
	return nc, nil
}

// client is a connection and the API over it, for the client commands.
type client struct {
	nc  *nats.Conn
	api *api.Client
}

func (g *globals) client() (*client, error) {
	nc, err := g.connect("bgtask-cli")
	if err != nil {
		return nil, err
	}
	return &client{nc: nc, api: api.NewClient(nc)}, nil
}

func (c *client) Close() { c.nc.Close() }

func (c *client) jetstream() (jetstream.JetStream, error) { return jetstream.New(c.nc) }

// streamClient opens a client for a command that reads the streams itself.
func (g *globals) streamClient() (*client, jetstream.JetStream, error) {
	c, err := g.client()
	if err != nil {
		return nil, nil, err
	}
	js, err := c.jetstream()
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return c, js, nil
}

// request opens a client and makes the calls of one command within the bound of
// a request.
func (g *globals) request(ctx context.Context, call func(context.Context, *client) error) error {
	c, err := g.client()
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := requestContext(ctx)
	defer cancel()
	return call(ctx, c)
}

// requestContext bounds one API call.
func requestContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, 30*time.Second)
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
