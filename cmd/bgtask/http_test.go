package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/internal/serverhome"
	"github.com/bgtask/bgtask/internal/testkit"
)

// httpCall makes a request to the home's HTTP API with its token.
func httpCall(t *testing.T, info serverhome.HTTPInfo, method, path, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, info.URL+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+info.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

// The server serves its HTTP API by default, as the client identity: its URL and
// token in HOME/http.json (0600, gone when it stops); what the CLI does over NATS
// works over HTTP (a registration, a target's state, the inbox and its ack), and
// `bgtask ui --print` prints a login link that opens the dashboard.
func TestServerServesTheHTTPAPI(t *testing.T) {
	home := t.TempDir()
	s := startServer(t, home)
	fi, err := os.Stat(filepath.Join(home, serverhome.HTTPFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s: %v, %v", serverhome.HTTPFile, fi, err)
	}
	info, err := serverhome.ReadHTTPInfo(home)
	if err != nil || !strings.HasPrefix(info.URL, "http://127.0.0.1:") || len(info.Token) < 40 {
		t.Fatalf("%s: %+v, %v", serverhome.HTTPFile, info, err)
	}
	code, body := httpCall(t, info, "POST", "/v1/tasks", `{"command":"echo over-http","target":"web"}`)
	if code != 201 {
		t.Fatalf("register: %d %s", code, body)
	}
	id := decode[struct{ ID string }](t, body).ID
	bgtask(t, home, "wait", id, "--timeout", "30s").must(t, 0, "wait")
	if code, body := httpCall(t, info, "PUT", "/v1/targets/web", `{"state":"busy","ttl":"1m"}`); code != 200 {
		t.Fatalf("target busy: %d %s", code, body)
	}
	if out := bgtask(t, home, "target", "list", "--json").must(t, 0, "target list").stdout; !strings.Contains(out, "busy") {
		t.Fatalf("target list after PUT: %s", out)
	}
	code, body = httpCall(t, info, "GET", "/v1/targets/web/inbox?wait=5s", "")
	inbox := decode[struct {
		Wakeups []struct {
			Ack    string
			Wakeup struct{ ID string }
		}
	}](t, body)
	if code != 200 || len(inbox.Wakeups) != 1 || inbox.Wakeups[0].Wakeup.ID != id {
		t.Fatalf("inbox: %d %s", code, body)
	}
	ack, _ := json.Marshal(map[string][]string{"acks": {inbox.Wakeups[0].Ack}})
	if code, body := httpCall(t, info, "POST", "/v1/targets/web/inbox/ack", string(ack)); code != 200 {
		t.Fatalf("ack as the client identity: %d %s", code, body)
	}

	// The engine's metrics, behind the same token: the task fired above is counted.
	if code, body := httpCall(t, info, "GET", "/metrics", ""); code != 200 || !strings.Contains(body, `bgtask_tasks_fired_total{status="succeeded"} 1`) {
		t.Fatalf("/metrics: %d %.2000s", code, body)
	}
	req, _ := http.NewRequest("GET", info.URL+"/metrics", nil)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 401 {
		t.Fatalf("/metrics without the token: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	link := strings.TrimSpace(bgtask(t, home, "ui", "--print").must(t, 0, "ui --print").stdout)
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar}
	resp, err := browser.Get(link)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp, err = browser.Get(info.URL + "/"); err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(page), id[:8]) {
		t.Fatalf("the login link: %d %s", resp.StatusCode, page)
	}
	s.stop()
	if _, err := os.Stat(filepath.Join(home, serverhome.HTTPFile)); !os.IsNotExist(err) {
		t.Fatalf("%s after the server stopped: %v", serverhome.HTTPFile, err)
	}
	if r := bgtask(t, home, "ui", "--print"); r.code != client.ExitNoServer {
		t.Fatalf("ui with no server: exit %d, want %d", r.code, client.ExitNoServer)
	}
}

// A --http the server cannot serve on is the command line's fault: exit status 2,
// naming the way out.
func TestServerHTTPFlags(t *testing.T) {
	home := t.TempDir()
	if r := bgtask(t, home, "server", "--http", "192.0.2.1:8080"); r.code != client.ExitUsage || !strings.Contains(r.stderr, "--http-remote") {
		t.Fatalf("a non-loopback --http: exit %d, %s", r.code, r.stderr)
	}
}

// `bgtask ui` hands the desktop's opener a page only the user can read, which
// forwards to the one-time login link: nothing in the opener's arguments logs
// anyone in. A real headless Chromium that opens the page, logged in by it,
// shows the task list.
func TestUIOpensTheDashboardInABrowser(t *testing.T) {
	testkit.FullOnly(t)
	home := t.TempDir()
	startServer(t, home)
	id := addTask(t, home, "--", "echo in-the-browser")
	bgtask(t, home, "wait", id, "--timeout", "30s").must(t, 0, "wait")

	bin := t.TempDir()
	opened := filepath.Join(bin, "opened")
	opener := "xdg-open"
	if runtime.GOOS == "darwin" {
		opener = "open"
	}
	script := "#!/bin/sh\nprintf '%s' \"$*\" > " + opened + "\n"
	if err := os.WriteFile(filepath.Join(bin, opener), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	if r := bgtask(t, home, "ui").must(t, 0, "ui"); r.stdout != "" {
		t.Fatalf("ui printed %q with an opener at hand", r.stdout)
	}
	args, err := os.ReadFile(opened)
	if err != nil {
		t.Fatal(err)
	}
	page := string(args)
	if strings.Contains(page, "token") || strings.Contains(page, "http") {
		t.Fatalf("the opener's arguments hold the link: %q", page)
	}
	if st, err := os.Stat(page); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("the opener was given %q: %v, %v; want a file of mode 0600", page, st, err)
	}
	if data, _ := os.ReadFile(page); !strings.Contains(string(data), "/login?token=") {
		t.Fatalf("%s does not forward to a login link:\n%s", page, data)
	}

	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("no chromium here (apt-get install chromium)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The acceptance check's way: the page's loads end, its live streams open.
	dom, err := exec.CommandContext(ctx, chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir="+t.TempDir(), "--virtual-time-budget=5000", "--dump-dom", page).Output()
	if err != nil || !strings.Contains(string(dom), id) || !strings.Contains(string(dom), "echo in-the-browser") {
		t.Fatalf("chromium on the login page: %v\n%s", err, dom)
	}
}
