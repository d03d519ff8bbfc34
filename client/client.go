package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/internal/serverhome"
)

// Config says which bgtask deployment a Client reaches.
type Config struct {
	// Home is the directory a `bgtask server` runs in: the client finds the server
	// through its discovery file and connects as the client identity the server
	// generated there. Empty, with no URL: $BGTASK_HOME, else
	// $XDG_STATE_HOME/bgtask (~/.local/state/bgtask).
	Home string
	// URL is the NATS URL (several, comma separated) of a deployment of your own,
	// instead of a home; Options carry its credentials and TLS.
	URL     string
	Options []nats.Option
	// Name names the connection on the server (default "bgtask-client").
	Name string
	// Waiting, if set, is called once, the first time the client waits for a
	// server that does not answer now but may soon (one that is restarting), with
	// the reason. A command line says then that it waits.
	Waiting func(reason error)
}

// Client is a connection to a bgtask deployment and the calls over it. Every call
// is bounded by its context. A call that may be made twice (a read, a
// registration with an idempotency key) is made again while no server answers,
// through a restart of the server, until its context ends; one that must not be
// made twice is made again only when it reached no server.
//
// A Client is safe for concurrent use.
type Client struct {
	cfg  Config
	home string // "" with a URL
	nc   *nats.Conn
	api  *api.Client

	waiting sync.Once
	// gone is why the home's server went for good while the client was
	// connected: the connection is closed then, and every call fails with it.
	gone atomic.Pointer[NoServerError]

	jsOnce sync.Once
	js     jetstream.JetStream
	jsErr  error
}

// retryEvery is how often a client tries again a server it waits for.
const retryEvery = 200 * time.Millisecond

// goneFor is how long a home's server must look gone for good (serverhome.Gone)
// before a client says so instead of waiting: a server restarted by hand takes
// the home's lock well within it.
const goneFor = 500 * time.Millisecond

// Connect connects to the deployment cfg names. While its server is absent but
// may come back (a restart), it waits, until ctx ends; a home whose server is
// gone with nothing to restart it, or where none ever ran, fails at once with a
// *NoServerError.
func Connect(ctx context.Context, cfg Config) (*Client, error) {
	if cfg.Name == "" {
		cfg.Name = "bgtask-client"
	}
	c := &Client{cfg: cfg}
	if cfg.URL == "" {
		dir, err := serverhome.Dir(cfg.Home)
		if err != nil {
			return nil, err
		}
		c.home = dir
	}
	var goneSince time.Time
	for {
		nc, err := c.dial()
		if err == nil {
			c.nc, c.api = nc, api.NewClient(nc)
			return c, nil
		}
		var absent *NoServerError
		if !errors.As(err, &absent) || absent.Never {
			return nil, err
		}
		switch {
		case !absent.Gone:
			goneSince = time.Time{}
		case goneSince.IsZero():
			goneSince = time.Now()
		case time.Since(goneSince) >= goneFor:
			return nil, err
		}
		every := retryEvery
		if absent.Gone {
			every = goneFor / 5
		} else {
			c.sayWaiting(err)
		}
		if !pause(ctx, every) {
			return nil, c.gaveUp(ctx, absent)
		}
	}
}

// New returns a client over a connection of the caller's, allowed what the
// client identity may do (docs/security.md): for a program that manages its own
// connection, or a part of the server that acts as a client.
func New(nc *nats.Conn) *Client {
	return &Client{cfg: Config{Name: "bgtask-client"}, nc: nc, api: api.NewClient(nc)}
}

// dial opens a connection, or says why none could be: a *NoServerError when no
// server answers.
func (c *Client) dial() (*nats.Conn, error) {
	opts := []nats.Option{nats.Name(c.cfg.Name), nats.Timeout(5 * time.Second), nats.MaxReconnects(-1),
		nats.ReconnectWait(retryEvery)}
	if c.home == "" {
		nc, err := nats.Connect(c.cfg.URL, append(opts, c.cfg.Options...)...)
		if err != nil {
			return nil, absentIf(fmt.Errorf("connect to %s: %w", c.cfg.URL, err), "")
		}
		return nc, nil
	}
	d, err := serverhome.ReadDiscovery(c.home)
	if errors.Is(err, os.ErrNotExist) {
		// A server writes its credentials at its first start and removes its
		// discovery file when it stops: with credentials, one ran here and may be
		// starting again.
		if _, cerr := os.Stat(filepath.Join(c.home, serverhome.CredentialsFile)); cerr != nil {
			return nil, &NoServerError{Never: true, Err: fmt.Errorf("no bgtask server in %s: start one with 'bgtask server' (or name another home, or a NATS URL)", c.home)}
		}
		return nil, absent(fmt.Errorf("the bgtask server of %s is not running (it wrote no %s yet)", c.home, serverhome.DiscoveryFile), c.home)
	}
	if err != nil {
		return nil, err
	}
	creds, err := serverhome.ReadCredentials(c.home)
	if err != nil {
		return nil, fmt.Errorf("read the client identity of %s: %w", c.home, err)
	}
	auth, err := creds.NATSOption()
	if err != nil {
		return nil, fmt.Errorf("read the client identity of %s: %w", c.home, err)
	}
	// Reconnects go where the server is now, should it come back on another port;
	// the connection is closed once the server is gone for good.
	opts = append(opts, auth, nats.SetCustomDialer(serverhome.NewDialer(c.home, 5*time.Second)), c.watchGone())
	opts = append(opts, c.cfg.Options...)
	nc, err := nats.Connect(d.URL, opts...)
	if err != nil {
		return nil, absentIf(fmt.Errorf("the bgtask server of %s (pid %d, %s) does not answer: %w", c.home, d.PID, d.URL, err), c.home)
	}
	return nc, nil
}

// absentIf makes a failed connection a *NoServerError when nothing accepted it,
// as opposed to a server that refused the credentials or the TLS.
func absentIf(err error, dir string) error {
	if errors.Is(err, nats.ErrNoServers) || errors.Is(err, nats.ErrTimeout) {
		return absent(err, dir)
	}
	return err
}

// absent is the *NoServerError of a server that does not answer: one gone for
// good, when nothing will start the server of home (dir) again.
func absent(err error, dir string) *NoServerError {
	if dir != "" {
		if why := serverhome.Gone(dir); why != nil {
			return &NoServerError{Err: why, Gone: true}
		}
	}
	return &NoServerError{Err: err}
}

// watchGone closes the connection once the home's server is gone for good
// (serverhome.Gone, for goneFor): a connection that reconnects for ever would leave a
// call with no deadline hanging.
func (c *Client) watchGone() nats.Option {
	var since time.Time
	return nats.ReconnectErrHandler(func(nc *nats.Conn, _ error) {
		why := serverhome.Gone(c.home)
		switch {
		case why == nil:
			since = time.Time{}
		case since.IsZero():
			since = time.Now()
		case time.Since(since) >= goneFor:
			c.gone.Store(&NoServerError{Err: why, Gone: true})
			nc.Close()
		}
	})
}

// Close closes the client's connection.
func (c *Client) Close() { c.nc.Close() }

// Home is the home the client found its server through; "" with a URL.
func (c *Client) Home() string { return c.home }

// Conn is the client's NATS connection, for what this package does not do.
func (c *Client) Conn() *nats.Conn { return c.nc }

// jetstream is the JetStream context of the client's connection.
func (c *Client) jetstream() (jetstream.JetStream, error) {
	c.jsOnce.Do(func() { c.js, c.jsErr = jetstream.New(c.nc) })
	return c.js, c.jsErr
}

// sayWaiting tells the caller, once, that the client waits for the server.
func (c *Client) sayWaiting(why error) {
	if c.cfg.Waiting != nil {
		c.waiting.Do(func() { c.cfg.Waiting(why) })
	}
}

// gaveUp is the error of a call that waited for the server until ctx ended.
func (c *Client) gaveUp(ctx context.Context, why error) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return ctx.Err()
	}
	var absent *NoServerError
	if errors.As(why, &absent) {
		return &NoServerError{Err: absent.Err, Waited: true}
	}
	return &NoServerError{Err: why, Waited: true}
}

// do makes a call, again while no server answers it: while the engine is not
// serving yet (no responder: the request reached nobody), and, when the call may
// be made twice (idempotent), while the connection is down, a dropped connection
// having cut the call. A call cut that must not be made twice fails.
func (c *Client) do(ctx context.Context, idempotent bool, call func(context.Context) error) error {
	for {
		err, dropped := c.attempt(ctx, call)
		if gone := c.gone.Load(); gone != nil && err != nil {
			return gone
		}
		switch {
		case err == nil:
			return nil
		case errors.As(err, new(*api.Error)):
			return err // the server answered
		case ctx.Err() != nil:
			return c.gaveUp(ctx, err)
		case errors.Is(err, api.ErrNoServer):
		case dropped && idempotent:
			err = fmt.Errorf("the connection to the server dropped: %w", err)
		case dropped:
			return &NoServerError{Err: err, MayHaveRun: true}
		default:
			return err
		}
		c.sayWaiting(err)
		if !pause(ctx, retryEvery) {
			return c.gaveUp(ctx, err)
		}
	}
}

// attempt makes call, cut short if the connection drops meanwhile (dropped).
func (c *Client) attempt(ctx context.Context, call func(context.Context) error) (err error, dropped bool) {
	ctx, cancel := context.WithCancel(ctx)
	changes := c.nc.StatusChanged(nats.RECONNECTING, nats.DISCONNECTED, nats.CLOSED)
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
	err = call(ctx)
	cancel()
	<-watched
	c.nc.RemoveStatusListener(changes)
	return err, cut.Load()
}

// pause waits d, or until ctx ends (false).
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
