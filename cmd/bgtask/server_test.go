package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bgtask/bgtask/client"
)

// A value of a server's flag that the server cannot run with is the command
// line's fault, found by the server or the command: exit status 2, naming the
// flag, and nothing serves.
func TestAServerRefusesABadFlagWithStatus2(t *testing.T) {
	short := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(short, []byte("too-short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"--sync", "sometimes"}, "--sync"},
		{[]string{"--listen", "0.0.0.0:4222"}, "--listen"},
		{[]string{"--label", "pool"}, "--label"},
		{[]string{"--webhook-secret-file", short}, "webhook secret " + short},
		{[]string{"--replicas", "3"}, "--replicas goes with --nats"},
	} {
		home := t.TempDir()
		r := bgtask(t, home, append([]string{"server"}, c.args...)...)
		if r.code != client.ExitUsage || !strings.Contains(r.stderr, c.says) {
			t.Errorf("server %s: exit %d, stderr %q; want %d naming %s", strings.Join(c.args, " "), r.code, r.stderr, client.ExitUsage, c.says)
		}
		if _, err := os.Stat(filepath.Join(home, "server.json")); !os.IsNotExist(err) {
			t.Errorf("server %s served: %v", strings.Join(c.args, " "), err)
		}
	}
}
