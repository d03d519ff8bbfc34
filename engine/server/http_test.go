package server

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bgtask/bgtask/internal/serverhome"
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

// A restart keeps the HTTP API's address, as it keeps the NATS port, and
// HOME/metrics.token (0600, made once) reads /metrics across restarts; the API's
// own token is new at each start. When the last port is taken, the server
// listens on another and says so.
func TestServerKeepsItsHTTPAddressAndMetricsToken(t *testing.T) {
	home := t.TempDir()
	s := startServer(t, home)
	first, err := serverhome.ReadHTTPInfo(home)
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(home, serverhome.MetricsTokenFile)
	if st, err := os.Stat(tokenFile); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("%s: %v, %v", serverhome.MetricsTokenFile, st, err)
	}
	metricsToken, _ := os.ReadFile(tokenFile)
	scrape := func(info serverhome.HTTPInfo) int {
		t.Helper()
		req, _ := http.NewRequest("GET", info.URL+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(metricsToken)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := scrape(first); code != 200 {
		t.Fatalf("/metrics with %s: %d", serverhome.MetricsTokenFile, code)
	}
	s.stop()

	s = startServer(t, home)
	again, err := serverhome.ReadHTTPInfo(home)
	if err != nil {
		t.Fatal(err)
	}
	if again.URL != first.URL || again.Token == first.Token {
		t.Fatalf("after a restart: %s, token new: %v; want %s, a new token", again.URL, again.Token != first.Token, first.URL)
	}
	if kept, _ := os.ReadFile(tokenFile); string(kept) != string(metricsToken) {
		t.Fatalf("%s changed at a restart", serverhome.MetricsTokenFile)
	}
	if code := scrape(again); code != 200 {
		t.Fatalf("/metrics with %s after a restart: %d", serverhome.MetricsTokenFile, code)
	}
	s.stop()

	taken, err := net.Listen("tcp", strings.TrimPrefix(first.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	s = startServer(t, home)
	moved, err := serverhome.ReadHTTPInfo(home)
	if err != nil {
		t.Fatal(err)
	}
	if moved.URL == first.URL || !strings.Contains(s.log.String(), "the port of the last run's HTTP API is taken") {
		t.Fatalf("with its port taken: %s\n%s", moved.URL, s.log.String())
	}
}

// With HTTP off, the server serves no HTTP API and writes no http.json.
func TestServerWithHTTPOffWritesNoHTTPFile(t *testing.T) {
	home := t.TempDir()
	startServer(t, home, func(o *Options) { o.HTTP.Addr, o.NoWorker = "off", true })
	if _, err := os.Stat(filepath.Join(home, serverhome.HTTPFile)); !os.IsNotExist(err) {
		t.Fatalf("%s with the HTTP API off: %v", serverhome.HTTPFile, err)
	}
}

// On a NATS deployment of your own, the server serves the HTTP API too, and
// writes its http.json into the home, removed when it stops.
func TestServerWithNATSServesHTTP(t *testing.T) {
	url := startExternalNATS(t)
	home := t.TempDir()
	log := &syncBuffer{}
	o := externalOptions(url, home, log)
	o.NoWorker = true
	stop := runExternal(t, o, log)
	info, err := serverhome.ReadHTTPInfo(home)
	if err != nil {
		t.Fatal(err)
	}
	code, body := httpCall(t, info, "POST", "/v1/tasks", `{"start_at":"1h","prompt":"later"}`)
	if code != 201 {
		t.Fatalf("register over HTTP with --nats: %d %s", code, body)
	}
	var reg struct{ ID string }
	if err := json.Unmarshal([]byte(body), &reg); err != nil {
		t.Fatal(err)
	}
	if code, body := httpCall(t, info, "GET", "/v1/tasks/"+reg.ID, ""); code != 200 || !strings.Contains(body, `"armed"`) {
		t.Fatalf("get: %d %s", code, body)
	}
	stop()
	if _, err := os.Stat(filepath.Join(home, serverhome.HTTPFile)); !os.IsNotExist(err) {
		t.Fatalf("%s after the server stopped: %v", serverhome.HTTPFile, err)
	}
}
