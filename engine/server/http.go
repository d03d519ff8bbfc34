package server

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/internal/httpapi"
	"github.com/bgtask/bgtask/internal/serverhome"
)

// HTTPOptions say where the server serves its HTTP API and dashboard.
type HTTPOptions struct {
	// Addr is HOST:PORT (port 0: the last run's port if free, else a free one),
	// or off.
	Addr string
	// Remote allows an Addr that is not loopback.
	Remote bool
}

// Check refuses a bad Addr before anything starts.
func (o HTTPOptions) Check() error {
	if o.Addr == "off" {
		return nil
	}
	if err := httpapi.CheckAddr(o.Addr, o.Remote); err != nil {
		return &BadOption{Err: err}
	}
	return nil
}

// newHTTPToken is the bearer token of one run of the server.
func newHTTPToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// serveHTTP serves the HTTP API on nc at addr and writes HOME/http.json (0600);
// nil with --http off. Port 0 listens where the home's last HTTP API did, if
// that port is free.
func serveHTTP(ctx context.Context, nc *nats.Conn, o HTTPOptions, addr, home, token string, metrics http.Handler, logger *slog.Logger) (*httpapi.Server, error) {
	if o.Addr == "off" {
		return nil, nil
	}
	metricsToken, err := loadMetricsToken(home)
	if err != nil {
		return nil, err
	}
	runAudit := func(ctx context.Context) (client.AuditReport, error) {
		return client.New(nc).Audit(ctx, client.DefaultStuckAfter)
	}
	s, err := httpapi.New(httpapi.Config{Conn: nc, Addr: addr, Prefer: lastHTTPAddr(addr, home), Remote: o.Remote, Token: token,
		Metrics: metrics, MetricsToken: metricsToken, Audit: runAudit, Logger: logger.With("component", "http")})
	if err != nil {
		return nil, err
	}
	if err := s.Start(ctx); err != nil {
		return nil, err
	}
	if err := announceHTTP(home, s.URL(), token); err != nil {
		s.Stop()
		return nil, err
	}
	logger.Info("HTTP API ready", "url", s.URL())
	return s, nil
}

// lastHTTPAddr is, where addr's port is 0, addr on the port the home's last
// HTTP API listened on, for the server to try first: the dashboard's address and
// a scraper's target stay the same across restarts. "" where there is none.
func lastHTTPAddr(addr, home string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port != "0" {
		return ""
	}
	if prev := serverhome.RememberedPort(home, serverhome.HTTPPortFile); prev > 0 {
		return net.JoinHostPort(host, strconv.Itoa(prev))
	}
	return ""
}

// announceHTTP writes HOME/http.json, and the port for the next start.
func announceHTTP(home, url, token string) error {
	if _, port, err := net.SplitHostPort(strings.TrimPrefix(url, "http://")); err == nil {
		p, _ := strconv.Atoi(port)
		if err := serverhome.RememberPort(home, serverhome.HTTPPortFile, p); err != nil {
			return fmt.Errorf("write %s: %w", serverhome.HTTPPortFile, err)
		}
	}
	if err := serverhome.WriteHTTPInfo(home, serverhome.HTTPInfo{URL: url, Token: token, PID: os.Getpid()}); err != nil {
		return fmt.Errorf("write %s: %w", serverhome.HTTPFile, err)
	}
	return nil
}

// loadMetricsToken reads HOME/metrics.token, making it (0600) the first time.
func loadMetricsToken(home string) (string, error) {
	path := filepath.Join(home, serverhome.MetricsTokenFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		token := newHTTPToken()
		if err := serverhome.WriteFileAtomic(path, []byte(token)); err != nil {
			return "", fmt.Errorf("write %s: %w", serverhome.MetricsTokenFile, err)
		}
		return token, nil
	}
	if err != nil {
		return "", err
	}
	token := strings.TrimSpace(string(data))
	if len(token) < 32 {
		return "", fmt.Errorf("%s holds %d characters, too short for a token: remove it, and the server makes a new one", path, len(token))
	}
	return token, nil
}

// removeHTTPFile removes HOME/http.json if this process wrote it (replicas of
// an engine may share a home).
func removeHTTPFile(home string) {
	if info, err := serverhome.ReadHTTPInfo(home); err == nil && info.PID == os.Getpid() {
		os.Remove(filepath.Join(home, serverhome.HTTPFile))
	}
}

// startHTTP serves the HTTP API as the client identity, on an in-process
// connection; the same port again when the server runs again after a full disk.
func (e *embeddedServer) startHTTP(ctx context.Context, ns *natsserver.Server, metrics http.Handler) (stop func(), err error) {
	if e.o.HTTP.Addr == "off" {
		return func() {}, nil
	}
	nc, err := connectInProcess(ns, e.ids.Client, "bgtask-http")
	if err != nil {
		return nil, err
	}
	s, err := serveHTTP(ctx, nc, e.o.HTTP, e.httpAddr, e.home, e.httpToken, metrics, e.logger)
	if err != nil {
		nc.Close()
		return nil, err
	}
	e.httpAddr = strings.TrimPrefix(s.URL(), "http://")
	return func() { s.Stop(); nc.Close() }, nil
}

// externalHTTP serves the HTTP API of a server on a NATS deployment of your own,
// on a connection of its own; with no home to write http.json to, none.
func externalHTTP(ctx context.Context, o Options, home string, homeErr error, metrics http.Handler, logger *slog.Logger) (stop func(), err error) {
	if o.HTTP.Addr == "off" {
		return func() {}, nil
	}
	if homeErr != nil {
		logger.Warn("no HTTP API: the home for "+serverhome.HTTPFile+" cannot be created", "home", home, "err", homeErr)
		return func() {}, nil
	}
	nc, err := o.Connect("bgtask-http")
	if err != nil {
		return nil, err
	}
	s, err := serveHTTP(ctx, nc, o.HTTP, o.HTTP.Addr, home, newHTTPToken(), metrics, logger)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return func() { s.Stop(); nc.Close(); removeHTTPFile(home) }, nil
}
