package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The connection flags of a deployment of one's own: an nkey seed file
// authenticates, no identity is refused, and flags that do not fit together are
// a bad command line.
func TestNATSConnectionFlags(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home)
	var d struct{ URL string }
	var c struct {
		Seed string `json:"nkey_seed"`
	}
	for file, v := range map[string]any{"server.json": &d, "credentials.json": &c} {
		data, err := os.ReadFile(filepath.Join(home, file))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, v); err != nil {
			t.Fatal(err)
		}
	}
	seed := filepath.Join(t.TempDir(), "user.nk")
	if err := os.WriteFile(seed, []byte(c.Seed+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	other := t.TempDir() // not the server's home: only the flags find it
	ok(t, other, "--nats", d.URL, "--nkey", seed, "list")

	if r := run(t, other, "--nats", d.URL, "list"); r.code != 1 || !strings.Contains(strings.ToLower(r.stderr), "authorization") {
		t.Errorf("no identity: exit %d, %s", r.code, r.stderr)
	}
	for _, args := range [][]string{
		{"--nats", d.URL, "--nkey", seed, "--user", "u", "list"},
		{"--nats", d.URL, "--password", "p", "list"},
		{"--nats", d.URL, "--tls-cert", seed, "list"},
		{"--nkey", seed, "list"},
		{"--nats", d.URL, "--nkey", filepath.Join(t.TempDir(), "missing"), "list"},
		{"server", "--replicas", "3"},
		{"server", "--nats", d.URL, "--nkey", seed, "--sync", "interval"},
	} {
		if r := run(t, other, args...); r.code != 2 {
			t.Errorf("bgtask %s: exit %d, want 2 (%s)", strings.Join(args, " "), r.code, r.stderr)
		}
	}
}
