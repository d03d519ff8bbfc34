package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/client"
)

// list's filters select the tasks they name; a bad value is a usage error.
func TestListFilterFlags(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	startServer(t, home)
	// Placed on a pool no worker has, they stay armed.
	blue := addTask(t, home, "--kind", "build", "--target", "agent-1", "--label", "pool=blue", "--", "true")
	between := time.Now()
	green := addTask(t, home, "--kind", "test", "--target", "agent-2", "--label", "pool=green", "--label", "zone=eu", "--", "true")
	bgtask(t, home, "cancel", green).must(t, 0, "cancel")
	ids := func(args ...string) []string {
		t.Helper()
		r := bgtask(t, home, append([]string{"list", "--json"}, args...)...).must(t, 0, "list "+strings.Join(args, " "))
		var got []string
		for _, task := range decode[struct{ Tasks []struct{ ID string } }](t, r.stdout).Tasks {
			got = append(got, task.ID)
		}
		return got
	}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{nil, []string{green, blue}},
		{[]string{"--status", "cancelled"}, []string{green}},
		{[]string{"--target", "agent-1"}, []string{blue}},
		{[]string{"--kind", "test"}, []string{green}},
		{[]string{"--label", "pool=green", "--label", "zone=eu"}, []string{green}},
		{[]string{"--label", "pool=green", "--label", "zone=us"}, nil},
		{[]string{"--since", between.Format(time.RFC3339Nano)}, []string{green}},
		{[]string{"--until", between.Format(time.RFC3339Nano)}, []string{blue}},
		{[]string{"--since", "1h"}, []string{green, blue}},
		{[]string{"--until", "1h"}, nil},
	} {
		if got := ids(tc.args...); !slices.Equal(got, tc.want) {
			t.Errorf("list %s: %v, want %v", strings.Join(tc.args, " "), got, tc.want)
		}
	}
	for _, args := range [][]string{
		{"--status", "finished"}, {"--target", "a.b"}, {"--label", "pool"}, {"--label", "pool=a b"},
		{"--since", "yesterday"}, {"--until", "-1h"}, {"--since", "1h", "--until", "2h"},
	} {
		r := bgtask(t, home, append([]string{"list"}, args...)...).must(t, client.ExitUsage, "list "+strings.Join(args, " "))
		if flag := strings.TrimPrefix(args[len(args)-2], "--"); !strings.Contains(r.stderr, flag) {
			t.Errorf("list %s: %q does not name %s", strings.Join(args, " "), r.stderr, flag)
		}
	}
}
