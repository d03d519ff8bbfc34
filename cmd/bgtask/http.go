package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"io/fs"
	"net/http"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine/server"
	"github.com/bgtask/bgtask/internal/serverhome"
)

func registerHTTPFlags(f *pflag.FlagSet, o *server.HTTPOptions) {
	f.StringVar(&o.Addr, "http", "127.0.0.1:0", "HOST:PORT of the HTTP API and dashboard (port 0: the last run's port if free, else a free one), or off; its URL and token go to HOME/"+serverhome.HTTPFile+", a token for /metrics alone to HOME/"+serverhome.MetricsTokenFile)
	f.BoolVar(&o.Remote, "http-remote", false, "allow --http on an address that is not loopback: whoever reaches it with the token runs commands, over plain HTTP (put TLS in front)")
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
