package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/internal/httpapi"
	"github.com/bgtask/bgtask/internal/serverhome"
)

// httpOptions are the server's --http flags.
type httpOptions struct {
	addr   string // HOST:PORT, or off
	remote bool
}

func (o *httpOptions) register(f *pflag.FlagSet) {
	f.StringVar(&o.addr, "http", "127.0.0.1:0", "HOST:PORT of the HTTP API and dashboard (port 0: the last run's port if free, else a free one), or off; its URL and token go to HOME/"+serverhome.HTTPFile+", a token for /metrics alone to HOME/"+serverhome.MetricsTokenFile)
	f.BoolVar(&o.remote, "http-remote", false, "allow --http on an address that is not loopback: whoever reaches it with the token runs commands, over plain HTTP (put TLS in front)")
}

// check refuses a bad --http before anything starts.
func (o httpOptions) check() error {
	if o.addr == "off" {
		return nil
	}
	if err := httpapi.CheckAddr(o.addr, o.remote); err != nil {
		return &exitError{code: client.ExitUsage, err: err}
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
func serveHTTP(ctx context.Context, nc *nats.Conn, o httpOptions, addr, home, token string, metrics http.Handler, logger *slog.Logger) (*httpapi.Server, error) {
	if o.addr == "off" {
		return nil, nil
	}
	metricsToken, err := loadMetricsToken(home)
	if err != nil {
		return nil, err
	}
	runAudit := func(ctx context.Context) (client.AuditReport, error) {
		return client.New(nc).Audit(ctx, client.DefaultStuckAfter)
	}
	s, err := httpapi.New(httpapi.Config{Conn: nc, Addr: lastHTTPAddr(addr, home, logger), Remote: o.remote, Token: token,
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

// lastHTTPAddr is addr, or, when its port is 0, addr on the port the home's last
// HTTP API listened on if that port is free: the dashboard's address and a
// scraper's target stay the same across restarts.
func lastHTTPAddr(addr, home string, logger *slog.Logger) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port != "0" {
		return addr
	}
	prev := serverhome.RememberedPort(home, serverhome.HTTPPortFile)
	switch {
	case prev == 0:
		return addr
	case portFree(host, prev):
		return net.JoinHostPort(host, strconv.Itoa(prev))
	}
	logger.Warn("the port of the last run's HTTP API is taken: it listens on a new one", "port", prev)
	return addr
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

func uiCmd(g *globals) *cobra.Command {
	var print bool
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Open the dashboard in a browser, logged in through a one-time link",
		Long: `Ask the server of the home for a one-time login link to its dashboard and open it
in a browser (xdg-open, or open on macOS) through HOME/` + loginPageFile + `, a page
only you can read (mode 0600) that forwards to the link: an argument of the
opener is in the process list, where any local user could read a link and log
in first. With --print, or when no browser opener is found, it prints the link.
The link works once, within 2 minutes; visiting it starts a session (an
HttpOnly, SameSite=Strict cookie, 24 hours, ended by a restart of the server).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			home, err := serverhome.Dir(g.home)
			if err != nil {
				return err
			}
			link, err := loginLink(cmd.Context(), home)
			if err != nil {
				return err
			}
			if !print && openLoginLink(home, link) == nil {
				fmt.Fprintln(g.stderr, "bgtask: opened the dashboard in the browser")
				return nil
			}
			fmt.Fprintln(g.stdout, link)
			return nil
		},
	}
	cmd.Flags().BoolVar(&print, "print", false, "print the login link instead of opening it")
	return cmd
}

// loginLink asks the server of home for a one-time login link.
func loginLink(ctx context.Context, home string) (string, error) {
	info, err := serverhome.ReadHTTPInfo(home)
	if errors.Is(err, fs.ErrNotExist) {
		return "", &exitError{code: client.ExitNoServer, err: fmt.Errorf("no HTTP API runs in %s: start 'bgtask server' (without --http off)", home)}
	}
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(info.URL, "/")+"/v1/login", nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+info.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", &exitError{code: client.ExitNoServer, err: fmt.Errorf("the HTTP API of %s (%s) does not answer: %w", home, info.URL, err)}
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var out struct {
		URL string `json:"url"`
	}
	if resp.StatusCode != http.StatusCreated || json.Unmarshal(data, &out) != nil || out.URL == "" {
		return "", fmt.Errorf("the HTTP API of %s refused a login link: %s %s", home, resp.Status, strings.TrimSpace(string(data)))
	}
	return out.URL, nil
}

// loginPageFile, in the home, is the page `bgtask ui` opens: it forwards the
// browser to the login link. The opener gets the page's path, not the link, as
// any local user may read a process's arguments. Each run replaces it; the link
// in it is spent by the visit or expired within minutes.
const loginPageFile = "ui-login.html"

// openLoginLink opens link in a browser through HOME/ui-login.html; an error if
// there is no opener.
func openLoginLink(home, link string) error {
	opener := "xdg-open"
	if runtime.GOOS == "darwin" {
		opener = "open"
	}
	exe, err := exec.LookPath(opener)
	if err != nil {
		return err
	}
	page, err := writeLoginPage(home, link)
	if err != nil {
		return err
	}
	cmd := exec.Command(exe, page)
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	return cmd.Run()
}

// writeLoginPage writes HOME/ui-login.html (0600), forwarding to link, and
// returns its path.
func writeLoginPage(home, link string) (string, error) {
	u := html.EscapeString(link)
	page := `<!DOCTYPE html>
<html><head><meta charset="utf-8"><meta name="referrer" content="no-referrer">
<meta http-equiv="refresh" content="0;url=` + u + `">
<title>bgtask: logging in</title></head>
<body><p><a href="` + u + `">Open the bgtask dashboard</a> (a one-time link: run <code>bgtask ui</code> again once it is used or 2 minutes old).</p></body></html>`
	path := filepath.Join(home, loginPageFile)
	if err := serverhome.WriteFileAtomic(path, []byte(page)); err != nil {
		return "", fmt.Errorf("write the login page: %w", err)
	}
	return path, nil
}

// startHTTP serves the HTTP API as the client identity, on an in-process
// connection; the same port again when the server runs again after a full disk.
func (e *embeddedServer) startHTTP(ctx context.Context, ns *server.Server, metrics http.Handler) (stop func(), err error) {
	if e.o.http.addr == "off" {
		return func() {}, nil
	}
	nc, err := connectInProcess(ns, e.ids.Client, "bgtask-http")
	if err != nil {
		return nil, err
	}
	s, err := serveHTTP(ctx, nc, e.o.http, e.httpAddr, e.home, e.httpToken, metrics, e.logger)
	if err != nil {
		nc.Close()
		return nil, err
	}
	e.httpAddr = strings.TrimPrefix(s.URL(), "http://")
	return func() { s.Stop(); nc.Close() }, nil
}

// externalHTTP serves the HTTP API of a server on a NATS deployment of your own,
// on a connection of its own; with no home to write http.json to, none.
func externalHTTP(ctx context.Context, g *globals, o httpOptions, home string, homeErr error, metrics http.Handler, logger *slog.Logger) (stop func(), err error) {
	if o.addr == "off" {
		return func() {}, nil
	}
	if homeErr != nil {
		logger.Warn("no HTTP API: the home for "+serverhome.HTTPFile+" cannot be created", "home", home, "err", homeErr)
		return func() {}, nil
	}
	nc, err := g.connect("bgtask-http")
	if err != nil {
		return nil, err
	}
	s, err := serveHTTP(ctx, nc, o, o.addr, home, newHTTPToken(), metrics, logger)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return func() { s.Stop(); nc.Close(); removeHTTPFile(home) }, nil
}
