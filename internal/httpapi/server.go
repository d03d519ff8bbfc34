// Package httpapi is bgtask's HTTP API: the routes of the NATS API one to one,
// with the same JSON and the same error object, live events and task output as
// Server-Sent Events, and the dashboard. It is a client like the CLI, built on
// package client as the CLI is: its handlers make the requests `bgtask` makes,
// on a connection with the client identity's permissions.
//
// Every request must name this server as its Host (DNS rebinding), carry no
// foreign Origin, and present the bearer token or a dashboard session; a
// state-changing request from another origin is refused. docs/http.md has the
// routes, the login flow and the reasons.
package httpapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine/api"
)

// Config is what a Server is made of.
type Config struct {
	// Conn reaches the engine's API and reads the streams, as package client
	// does; it should have the client identity's permissions, not the engine's.
	Conn *nats.Conn
	// Addr is the HOST:PORT to listen on; port 0 picks a free one.
	Addr string
	// Prefer, if set, is a HOST:PORT tried before Addr: the port a restarted
	// server listened on last, taken meanwhile or not. Trying it, rather than
	// looking first, leaves no moment for another program to take it in between.
	Prefer string
	// Remote allows an address that is not loopback.
	Remote bool
	// Token is the bearer token every API request presents (at least 32 bytes).
	Token string
	// Metrics, if set, is served at GET /metrics, behind the same checks.
	Metrics http.Handler
	// MetricsToken, if set, is a bearer token good for GET /metrics only (at
	// least 32 bytes): a scraper's credential, which runs no command.
	MetricsToken string
	// Audit, if set, runs `bgtask audit` for the dashboard's audit page; it
	// reads the whole event log, so the page runs it when asked, not when shown.
	Audit func(ctx context.Context) (client.AuditReport, error)
	// Heartbeat is how often an idle event stream sends a comment, so that
	// proxies keep it open; 0: 15 s.
	Heartbeat time.Duration
	// MaxStreams is how many event and log streams may be open at once (each
	// holds a JetStream consumer); 0: 64.
	MaxStreams int
	Logger     *slog.Logger
}

// Limits of what one request may hold or cost.
const (
	maxSpecBody   = 256 << 10 // a registration (the engine refuses a spec over 64 KiB and an env over 128 KiB, naming them)
	maxSmallBody  = 16 << 10  // every other request body
	streamBuffer  = 256       // events held for one slow stream client before it is dropped
	readTimeout   = time.Minute
	writeTimeout  = 30 * time.Second
	requestBudget = 30 * time.Second
	minTokenBytes = 32
)

// Server serves the HTTP API (the engine.Component lifecycle: Start, Stop).
type Server struct {
	cfg Config
	// api makes the NATS API's requests once each, and passes the engine's
	// replies on as it wrote them: a route answers 503 at once when no engine
	// answers, where client waits for one.
	api *api.Client
	// client reads what the NATS API does not serve: the event and log streams,
	// the inbox, the targets.
	client   *client.Client
	log      *slog.Logger
	handler  http.Handler
	sessions *sessions
	streams  chan struct{} // a slot per open stream

	mu       sync.Mutex
	srv      *http.Server
	url      string
	hosts    map[string]bool // the Host values that name this server
	cancel   context.CancelFunc
	serving  chan struct{}
	stopping bool
}

// New checks cfg and builds the server; Start listens.
func New(cfg Config) (*Server, error) {
	switch {
	case cfg.Conn == nil:
		return nil, errors.New("httpapi: Conn is nil")
	case len(cfg.Token) < minTokenBytes:
		return nil, fmt.Errorf("httpapi: Token has %d bytes, want at least %d", len(cfg.Token), minTokenBytes)
	case cfg.MetricsToken != "" && len(cfg.MetricsToken) < minTokenBytes:
		return nil, fmt.Errorf("httpapi: MetricsToken has %d bytes, want at least %d", len(cfg.MetricsToken), minTokenBytes)
	}
	if err := CheckAddr(cfg.Addr, cfg.Remote); err != nil {
		return nil, err
	}
	if cfg.Prefer != "" {
		if err := CheckAddr(cfg.Prefer, cfg.Remote); err != nil {
			return nil, err
		}
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 15 * time.Second
	}
	if cfg.MaxStreams <= 0 {
		cfg.MaxStreams = 64
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, api: api.NewClient(cfg.Conn), client: client.New(cfg.Conn), log: cfg.Logger,
		sessions: newSessions(), streams: make(chan struct{}, cfg.MaxStreams)}
	s.handler = s.guard(s.routes())
	return s, nil
}

// CheckAddr refuses an address that is not HOST:PORT with an IP host, or that is
// not loopback unless remote: the API runs commands for whoever holds the token,
// and plain HTTP carries it in the clear.
func CheckAddr(addr string, remote bool) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--http %q: want HOST:PORT: %w", addr, err)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("--http %q: bad port", addr)
	}
	if host == "localhost" {
		return nil
	}
	ip := net.ParseIP(host)
	switch {
	case ip == nil:
		return fmt.Errorf("--http %q: give an IP address (127.0.0.1, ::1), not a name", addr)
	case ip.IsUnspecified():
		return fmt.Errorf("--http %q: give the one address clients reach (a request must name it as its Host)", addr)
	case !ip.IsLoopback() && !remote:
		return fmt.Errorf("--http %q is not loopback: anyone who reaches it with the token runs commands, over plain HTTP; give --http-remote to mean it", addr)
	}
	return nil
}

// Start listens and serves until Stop.
func (s *Server) Start(ctx context.Context) error {
	l, err := s.listen()
	if err != nil {
		return err
	}
	bound := l.Addr().(*net.TCPAddr)
	base, cancel := context.WithCancel(context.WithoutCancel(ctx))
	srv := &http.Server{
		Handler: s.handler,
		// No ReadTimeout: its deadline would end the streams. Each JSON route
		// bounds its body's read itself.
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		BaseContext:       func(net.Listener) context.Context { return base },
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	s.mu.Lock()
	if s.srv != nil || s.stopping {
		s.mu.Unlock()
		cancel()
		l.Close()
		return errors.New("httpapi: started already")
	}
	s.srv, s.cancel, s.serving = srv, cancel, make(chan struct{})
	s.url = "http://" + bound.String()
	s.hosts = ownHosts(bound)
	serving := s.serving
	s.mu.Unlock()
	go func() {
		defer close(serving)
		if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("HTTP API stopped", "err", err)
		}
	}()
	return nil
}

// listen listens on Prefer, if set and free, else on Addr.
func (s *Server) listen() (net.Listener, error) {
	if s.cfg.Prefer != "" {
		l, err := net.Listen("tcp", ipAddr(s.cfg.Prefer))
		if err == nil {
			return l, nil
		}
		s.log.Warn("the port of the last run's HTTP API is taken: it listens on a new one", "addr", s.cfg.Prefer, "err", err)
	}
	addr := ipAddr(s.cfg.Addr)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for HTTP on %s: %w", addr, err)
	}
	return l, nil
}

// ipAddr is addr with localhost as 127.0.0.1.
func ipAddr(addr string) string {
	if host, port, _ := net.SplitHostPort(addr); host == "localhost" {
		return net.JoinHostPort("127.0.0.1", port)
	}
	return addr
}

// ownHosts are the Host header values a request to this listener may carry: its
// address, and localhost for a loopback one.
func ownHosts(a *net.TCPAddr) map[string]bool {
	port := strconv.Itoa(a.Port)
	hosts := map[string]bool{net.JoinHostPort(a.IP.String(), port): true}
	if a.IP.IsLoopback() {
		hosts[net.JoinHostPort("localhost", port)] = true
	}
	return hosts
}

// URL is where the server listens, such as http://127.0.0.1:8080; "" before Start.
func (s *Server) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.url
}

// Handler is the server's whole handler, with its checks.
func (s *Server) Handler() http.Handler { return s.handler }

// Stop ends every stream, waits for the requests in flight up to a few seconds,
// and closes the listener; it is safe before Start and twice.
func (s *Server) Stop() {
	s.mu.Lock()
	srv, cancel, serving := s.srv, s.cancel, s.serving
	s.stopping = true
	s.srv = nil
	s.mu.Unlock()
	if srv == nil {
		return
	}
	cancel() // the streams end, and their requests with them
	ctx, done := context.WithTimeout(context.Background(), 5*time.Second)
	defer done()
	if err := srv.Shutdown(ctx); err != nil {
		s.log.Warn("HTTP API not stopped cleanly", "err", err)
		srv.Close()
	}
	<-serving
}
