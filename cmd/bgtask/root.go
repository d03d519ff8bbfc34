package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/engine/api"
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
	// gone is why a client command's server went for good while it was connected
	// (watchGone); its error is then that one. Shared by copies of the globals.
	gone *atomic.Pointer[error]
}

// ifGone is err, or, when the server went for good under it, why (status 7).
func (g *globals) ifGone(err error) error {
	if g.gone == nil || err == nil {
		return err
	}
	if gone := g.gone.Load(); gone != nil {
		return &exitError{code: exitNoServer, err: *gone}
	}
	return err
}

// Run runs the bgtask command line.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	g := &globals{stdout: stdout, stderr: stderr, ctx: ctx, timeout: defaultTimeout, gone: new(atomic.Pointer[error])}
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
		return &exitError{code: exitUsage, err: err}
	})
	// The client commands wait for the server up to their --timeout; wait's bounds
	// the wait for the task too, and target's subcommands have their own.
	for _, c := range []*cobra.Command{addCmd(g), rerunCmd(g), pauseCmd(g), resumeCmd(g), completeCmd(g), joinCmd(g), listCmd(g), showCmd(g), historyCmd(g), logsCmd(g), cancelCmd(g), inboxCmd(g), auditCmd(g), workersCmd(g)} {
		g.timeoutFlag(c)
		root.AddCommand(c)
	}
	root.AddCommand(serverCmd(g), workerCmd(g), waitCmd(g), targetCmd(g), benchCmd(g), shimCmd())
	root.AddCommand(setupCmd(g), mcpCmd(g), hookCmd(g))
	root.AddCommand(scheduleCmd(g), serviceCmd(g), uiCmd(g))
	cmd, err := root.ExecuteC()
	err = g.ifGone(err)
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

// connect opens a connection: to --nats if given, else to the server whose
// discovery file is in the home directory, with the credentials it generated there.
// A server that is not there now but may be soon (one that is restarting) is a
// *serverAbsent; a home where no server ever ran is not.
func (g *globals) connect(name string, extra ...nats.Option) (*nats.Conn, error) {
	return g.connectAs(name, serverhome.ReadCredentials, extra...)
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

// connectAs opens a connection named name: to --nats with the auth flags, else to
// the home's server as the identity that identity reads from the home.
func (g *globals) connectAs(name string, identity func(home string) (serverhome.Credentials, error), extra ...nats.Option) (*nats.Conn, error) {
	opts := append([]nats.Option{nats.Name(name), nats.Timeout(5 * time.Second), nats.MaxReconnects(-1)}, extra...)
	if g.natsURL != "" {
		auth, err := g.auth.options()
		if err != nil {
			return nil, err
		}
		nc, err := nats.Connect(g.natsURL, append(opts, auth...)...)
		if err != nil {
			return nil, absentIf(fmt.Errorf("connect to %s: %w", g.natsURL, err))
		}
		return nc, nil
	}
	if g.auth.given() {
		return nil, usageErr("the NATS auth and TLS flags go with --nats URL; without it the home's own credentials are used")
	}
	home, err := serverhome.Dir(g.home)
	if err != nil {
		return nil, err
	}
	d, err := serverhome.ReadDiscovery(home)
	if errors.Is(err, os.ErrNotExist) {
		// A server writes its credentials at its first start and removes its
		// discovery file when it stops: with credentials, one ran here and may be
		// starting again.
		if _, cerr := os.Stat(filepath.Join(home, serverhome.CredentialsFile)); cerr == nil {
			return nil, &serverAbsent{err: fmt.Errorf("the bgtask server of %s is not running (it wrote no %s yet)", home, serverhome.DiscoveryFile), gone: serverhome.Gone(home)}
		}
		return nil, &exitError{code: exitNoServer, err: fmt.Errorf("no bgtask server in %s: start one with 'bgtask server' (or pass --home, or --nats URL)", home)}
	}
	if err != nil {
		return nil, err
	}
	creds, err := identity(home)
	if err != nil {
		return nil, fmt.Errorf("read the identity of %s: %w", name, err)
	}
	auth, err := creds.NATSOption()
	if err != nil {
		return nil, fmt.Errorf("read the identity of %s: %w", name, err)
	}
	// Reconnects go where the server is now, should it come back on another port.
	opts = append(opts, auth, nats.SetCustomDialer(serverhome.NewDialer(home, 5*time.Second)))
	nc, err := nats.Connect(d.URL, opts...)
	if err != nil {
		err = absentIf(fmt.Errorf("the bgtask server of %s (pid %d, %s) does not answer: %w", home, d.PID, d.URL, err))
		if absent, ok := err.(*serverAbsent); ok {
			absent.gone = serverhome.Gone(home)
		}
		return nil, err
	}
	return nc, nil
}

// serverAbsent: no server answers now, and one may soon (it is restarting),
// unless gone says why none will.
type serverAbsent struct {
	err  error
	gone error
}

func (e *serverAbsent) Error() string { return e.err.Error() }
func (e *serverAbsent) Unwrap() error { return e.err }

// absentIf makes a failed connection a *serverAbsent when nothing accepted it, as
// opposed to a server that refused the credentials or the TLS.
func absentIf(err error) error {
	if errors.Is(err, nats.ErrNoServers) || errors.Is(err, nats.ErrTimeout) {
		return &serverAbsent{err: err}
	}
	return err
}

// defaultTimeout bounds a client command that does not wait for a task to end:
// the server's answer, and a restart of the server before it.
const defaultTimeout = 30 * time.Second

// retryEvery is how often a client command tries again a server it waits for.
const retryEvery = 200 * time.Millisecond

// timeoutFlag gives a client command its --timeout.
func (g *globals) timeoutFlag(cmd *cobra.Command) {
	cmd.Flags().DurationVar(&g.timeout, "timeout", defaultTimeout, "how long to wait for the server to answer, through a restart of it (then exit status 7); 0 waits for ever")
}

// bounded bounds ctx by --timeout; 0 is no bound.
func (g *globals) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
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

// gaveUp is the error of a command that waited for the server until ctx ended.
func gaveUp(ctx context.Context, bound time.Duration, why error) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return ctx.Err()
	}
	return &exitError{code: exitNoServer, err: fmt.Errorf("no bgtask server answered within %s: %w", bound, why)}
}

// watchGone gives a client command's connection to the home's server a watch
// that closes it once the server is gone for good (serverhome.Gone, for goneFor), as a
// connection that reconnects for ever would leave a wait with no bound hanging.
func (g *globals) watchGone() []nats.Option {
	if g.natsURL != "" || g.gone == nil {
		return nil
	}
	home, err := serverhome.Dir(g.home)
	if err != nil {
		return nil
	}
	var since time.Time
	return []nats.Option{nats.ReconnectWait(retryEvery), nats.ReconnectErrHandler(func(nc *nats.Conn, _ error) {
		gone := serverhome.Gone(home)
		switch {
		case gone == nil:
			since = time.Time{}
		case since.IsZero():
			since = time.Now()
		case time.Since(since) >= goneFor:
			g.gone.Store(&gone)
			nc.Close()
		}
	})}
}

// pause waits retryEvery, or until ctx ends (false).
func pause(ctx context.Context) bool { return pauseFor(ctx, retryEvery) }

// pauseFor waits d, or until ctx ends (false).
func pauseFor(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// client is a connection and the API over it, for the client commands.
type client struct {
	nc  *nats.Conn
	api *api.Client
}

// goneFor is how long a home's server must look gone for good (serverhome.Gone) before
// a client says so instead of waiting: a server restarted by hand takes the home's
// lock within it.
const goneFor = 500 * time.Millisecond

// dial connects a client command, waiting for a server that is absent (restarting)
// until ctx ends; bound is ctx's timeout, for the messages (0: none). A server
// that is gone with nothing to restart it ends the wait at once.
func (g *globals) dial(ctx context.Context, bound time.Duration) (*client, error) {
	var goneSince time.Time
	for {
		nc, err := g.connect("bgtask-cli", g.watchGone()...)
		if err == nil {
			return &client{nc: nc, api: api.NewClient(nc)}, nil
		}
		var absent *serverAbsent
		if !errors.As(err, &absent) {
			return nil, err
		}
		switch {
		case absent.gone == nil:
			goneSince = time.Time{}
		case goneSince.IsZero():
			goneSince = time.Now()
		case time.Since(goneSince) >= goneFor:
			return nil, &exitError{code: exitNoServer, err: absent.gone}
		}
		if absent.gone != nil {
			if !pauseFor(ctx, goneFor/5) {
				return nil, gaveUp(ctx, bound, err)
			}
			continue
		}
		g.sayWaiting(bound, err)
		if !pause(ctx) {
			return nil, gaveUp(ctx, bound, err)
		}
	}
}

// call makes an API call, again while no server answers it: while the engine is not
// serving yet (no responder: the request reached nobody), and, when the call may be
// made twice (idempotent), while the connection is down, a dropped connection having
// cut the call. A call cut that must not be made twice fails.
func (g *globals) call(ctx context.Context, c *client, bound time.Duration, idempotent bool, fn func(context.Context) error) error {
	for {
		err, dropped := attempt(ctx, c.nc, fn)
		switch {
		case err == nil:
			return nil
		case errors.As(err, new(*api.Error)):
			return err // the server answered
		case ctx.Err() != nil:
			return gaveUp(ctx, bound, err)
		case errors.Is(err, api.ErrNoServer):
		case dropped && idempotent:
			err = fmt.Errorf("the connection to the server dropped: %w", err)
		case dropped:
			return &exitError{code: exitNoServer, err: fmt.Errorf("the connection to the server dropped during the request, which may or may not have been carried out: %w", err)}
		default:
			return err
		}
		g.sayWaiting(bound, err)
		if !pause(ctx) {
			return gaveUp(ctx, bound, err)
		}
	}
}

// attempt calls fn, cut short if the connection drops meanwhile (dropped).
func attempt(ctx context.Context, nc *nats.Conn, fn func(context.Context) error) (err error, dropped bool) {
	ctx, cancel := context.WithCancel(ctx)
	changes := nc.StatusChanged(nats.RECONNECTING, nats.DISCONNECTED, nats.CLOSED)
	var cut atomic.Bool
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-changes:
			cut.Store(true)
			cancel()
		case <-ctx.Done():
		}
	}()
	err = fn(ctx)
	cancel()
	<-watched
	nc.RemoveStatusListener(changes)
	return err, cut.Load()
}

func (c *client) Close() { c.nc.Close() }

func (c *client) jetstream() (jetstream.JetStream, error) { return jetstream.New(c.nc) }

// streamClient opens a client for a command that reads the streams itself, waiting
// up to its --timeout for the server.
func (g *globals) streamClient() (*client, jetstream.JetStream, error) {
	ctx, cancel := g.bounded(g.ctx)
	defer cancel()
	c, err := g.dial(ctx, g.timeout)
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

// request opens a client and makes the calls of one command, all within its
// --timeout, and again through a restart of the server: call must be one that may
// be made twice (reads, and a registration, which has an idempotency key). What
// call prints is held until it succeeds, so that an attempt cut short prints
// nothing.
func (g *globals) request(ctx context.Context, call func(context.Context, *client) error) error {
	return g.requestWith(ctx, true, call)
}

// requestOnce is request for a call that must not be made twice: it is made again
// only when it reached no server.
func (g *globals) requestOnce(ctx context.Context, call func(context.Context, *client) error) error {
	return g.requestWith(ctx, false, call)
}

func (g *globals) requestWith(ctx context.Context, idempotent bool, call func(context.Context, *client) error) error {
	ctx, cancel := g.bounded(ctx)
	defer cancel()
	c, err := g.dial(ctx, g.timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	stdout := g.stdout
	defer func() { g.stdout = stdout }()
	var out bytes.Buffer
	err = g.call(ctx, c, g.timeout, idempotent, func(ctx context.Context) error {
		out.Reset()
		g.stdout = &out
		return call(ctx, c)
	})
	g.stdout = stdout
	if err != nil {
		return err
	}
	_, err = stdout.Write(out.Bytes())
	return err
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

// connectWorker opens the connection of a `bgtask worker` process: with --nats,
// as the auth flags say; else as the home's worker identity.
func (g *globals) connectWorker() (*nats.Conn, error) {
	return g.connectAs("bgtask-worker", func(home string) (serverhome.Credentials, error) {
		return serverhome.ReadSeedFile(filepath.Join(home, serverhome.WorkerSeedFile))
	})
}
