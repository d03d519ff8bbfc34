package main

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/bgtask/bgtask/client"
)

// add --pid sends the process's identity, read here, and places the task on this
// host; what cannot be watched is refused before anything is sent.
func TestAddPIDNamesTheProcessAndThisHost(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	startServer(t, home)
	sleep := exec.Command("sleep", "300")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sleep.Process.Kill(); _ = sleep.Wait() }()
	pid := strconv.Itoa(sleep.Process.Pid)
	r := bgtask(t, home, "add", "--json", "--pid", pid, "--label", "pool=blue").must(t, 0, "add --pid")
	type shown struct {
		Spec struct {
			Cwd     string `json:"cwd"`
			Process struct {
				PID   int    `json:"pid"`
				Start uint64 `json:"start"`
				Boot  string `json:"boot"`
			} `json:"process"`
			Placement struct {
				Labels map[string]string `json:"labels"`
			} `json:"placement"`
		} `json:"spec"`
		Command string `json:"command"`
	}
	got := decode[shown](t, bgtask(t, home, "show", decode[struct{ ID string }](t, r.stdout).ID, "--json").must(t, 0, "show").stdout)
	p, labels := got.Spec.Process, got.Spec.Placement.Labels
	host, _ := os.Hostname()
	if p.PID != sleep.Process.Pid || p.Start == 0 || p.Boot == "" || got.Spec.Cwd != "" || got.Command != "pid "+pid {
		t.Fatalf("spec of add --pid: %+v, command %q", got.Spec, got.Command)
	}
	if len(labels) != 2 || labels["host"] != host || labels["pool"] != "blue" {
		t.Fatalf("placement of add --pid: %v, want host=%s and pool=blue", labels, host)
	}
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"--pid", pid, "--", "true"}, "--pid and a command"},
		{[]string{"--pid", pid, "--anywhere"}, "--pid and --anywhere"},
		{[]string{"--pid", pid, "--label", "host=elsewhere"}, "--label host=elsewhere"},
		{[]string{"--pid", "0"}, "--pid 0"},
		{[]string{"--pid", "4194305"}, "process 4194305 does not exist"},
	} {
		r := bgtask(t, home, append([]string{"add"}, c.args...)...)
		if r.code != client.ExitUsage || !strings.Contains(r.stderr, c.says) {
			t.Errorf("add %s: exit %d, stderr %q; want %d saying %q", strings.Join(c.args, " "), r.code, r.stderr, client.ExitUsage, c.says)
		}
	}
	if list := bgtask(t, home, "list", "--json").must(t, 0, "list").stdout; !strings.Contains(list, `"total": 1`) {
		t.Fatalf("a refused add registered a task: %s", list)
	}
}
