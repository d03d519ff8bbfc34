package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/client"
)

// addEachLine runs `bgtask add --each-line args` as a process of its own (this test
// binary running main) with stdin as its standard input.
func addEachLine(t *testing.T, home, stdin string, args ...string) result {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"--home", home, "add", "--each-line"}, args...)...)
	cmd.Env = append(os.Environ(), mcpRunMain+"=1")
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	return result{stdout: stdout.String(), stderr: stderr.String(), code: cmd.ProcessState.ExitCode()}
}

// Each line is a task of its own, its command the line's and the rest the flags';
// with --idempotency-key the same input given again arms none twice.
func TestAddEachLineArmsATaskPerLine(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	startServer(t, home)
	input := "echo one\n\n  echo two  \n"
	type registered struct {
		ID      string `json:"id"`
		Created bool   `json:"created"`
	}
	lines := func(r result) []registered {
		var regs []registered
		for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
			regs = append(regs, decode[registered](t, l))
		}
		return regs
	}
	first := lines(addEachLine(t, home, input, "--json", "--target", "batch", "--idempotency-key", "k").must(t, 0, "add --each-line"))
	if len(first) != 2 || first[0].ID == first[1].ID || !first[0].Created || !first[1].Created {
		t.Fatalf("add --each-line of two commands and a blank line printed %+v, want two new tasks", first)
	}
	for i, want := range []string{"echo one", "echo two"} {
		got := decode[struct {
			Command string `json:"command"`
			Spec    struct {
				Target         string `json:"target"`
				IdempotencyKey string `json:"idempotency_key"`
			} `json:"spec"`
		}](t, bgtask(t, home, "show", first[i].ID, "--json").must(t, 0, "show").stdout)
		if got.Command != want || got.Spec.Target != "batch" {
			t.Errorf("task %d: command %q, target %q; want %q, batch", i, got.Command, got.Spec.Target, want)
		}
	}
	again := lines(addEachLine(t, home, input, "--json", "--target", "batch", "--idempotency-key", "k").must(t, 0, "add --each-line again"))
	if len(again) != 2 || again[0].ID != first[0].ID || again[1].ID != first[1].ID || again[0].Created || again[1].Created {
		t.Fatalf("the same input again printed %+v, want the tasks of %+v, not created", again, first)
	}
}

// A line that cannot be a task stops the batch: the error names it, and what was
// printed is what was armed.
func TestAddEachLineStopsAtABadLine(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	startServer(t, home)
	long := strings.Repeat("x", 70_000)
	r := addEachLine(t, home, "echo armed\n"+long+"\necho never\n", "--target", "batch").must(t, client.ExitUsage, "add --each-line with a line too long")
	ids := strings.Fields(r.stdout)
	if len(ids) != 1 || !strings.Contains(r.stderr, "line 2") {
		t.Fatalf("stdout %q, stderr %q: want the one id armed, and line 2 named", r.stdout, r.stderr)
	}
	listed := decode[struct {
		Tasks []struct{ ID string } `json:"tasks"`
	}](t, bgtask(t, home, "list", "--json").must(t, 0, "list").stdout)
	if len(listed.Tasks) != 1 || listed.Tasks[0].ID != ids[0] {
		t.Fatalf("tasks %+v, want only %s", listed.Tasks, ids[0])
	}
	for _, c := range []struct {
		stdin string
		args  []string
		says  string
	}{
		{"echo x\n", []string{"--", "true"}, "not after --"},
		{"echo x\n", []string{"--spec", "-"}, "--spec -"},
		{"\n \n", nil, "no command"},
		{"echo x\n", []string{"--policy", "nope"}, "line 1: policy"},
		{"echo x\n", []string{"--external"}, "not with --pid or --external"},
		{"echo x\n", []string{"--pid", "1"}, "not with --pid or --external"},
	} {
		if r := addEachLine(t, home, c.stdin, c.args...); r.code != client.ExitUsage || !strings.Contains(r.stderr, c.says) {
			t.Errorf("add --each-line %v: exit %d, stderr %q; want %d saying %q", c.args, r.code, r.stderr, client.ExitUsage, c.says)
		}
	}
}

// An interrupt ends --each-line while it waits for its next line: a terminal or a
// pipe that stays open must not hold it.
func TestAddEachLineEndsAtASignalWhileItReads(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	startServer(t, home)
	cmd := exec.Command(os.Args[0], "--home", home, "add", "--each-line", "--delay", "1h")
	cmd.Env = append(os.Environ(), mcpRunMain+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(stdin, "echo first\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(stdout).ReadString('\n'); err != nil {
		t.Fatalf("no id for the first line: %v", err)
	}
	// It has armed the first line's task, and reads the next.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() { ended <- cmd.Wait() }()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-ended
		t.Fatal("add --each-line still read its input 10 s after SIGTERM")
	}
}
