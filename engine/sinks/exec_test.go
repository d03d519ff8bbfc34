package sinks

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/testkit"
)

func execSink(argv ...string) engine.Sink { return engine.Sink{Type: engine.SinkExec, Argv: argv} }

// readEnviron parses a /proc/PID/environ copy: NUL-separated KEY=VALUE.
func readEnviron(t *testing.T, file string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, kv := range bytes.Split(data, []byte{0}) {
		if k, v, ok := strings.Cut(string(kv), "="); ok {
			env[k] = v
		}
	}
	return env
}

// decodeNumbers decodes JSON keeping numbers as written.
func decodeNumbers(t *testing.T, data string) any {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, data)
	}
	return v
}

func TestExecGetsThePromptOnStdinAndTheWakeupInItsEnvironment(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	wake := testWakeup()
	// sh's own environment is the one the sink gave it.
	script := fmt.Sprintf(`cat > %s/stdin && cat /proc/$$/environ > %s/environ`, dir, dir)

	o := push(t, context.Background(), execSink("sh", "-c", script), wake, 4)
	if !o.OK || o.ExitCode == nil || *o.ExitCode != 0 || o.Error != "" {
		t.Fatalf("outcome = %+v, want OK with exit code 0", o)
	}
	stdin, err := os.ReadFile(filepath.Join(dir, "stdin"))
	if err != nil {
		t.Fatal(err)
	}
	if string(stdin) != wake.Prompt {
		t.Errorf("stdin = %q, want the prompt %q", stdin, wake.Prompt)
	}

	env := readEnviron(t, filepath.Join(dir, "environ"))
	for k, want := range map[string]string{
		"BGTASK_TASK_ID":          wake.ID,
		"BGTASK_STATUS":           "failed",
		"BGTASK_EXIT_CODE":        "3",
		"BGTASK_SIGNAL":           "",
		"BGTASK_TARGET":           "agent-7",
		"BGTASK_KIND":             "build",
		"BGTASK_ATTEMPT":          "4",
		"BGTASK_ORIGIN":           string(wake.Origin),
		"BGTASK_ORIGIN_CHAT":      "c-42",
		"BGTASK_ORIGIN_USER_ID":   "9007199254740993", // 2^53+1: a float64 makes it ...992
		"BGTASK_ORIGIN_THREAD_ID": "t 1",
	} {
		got, ok := env[k]
		if !ok {
			t.Errorf("%s is not set", k)
		} else if got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	// A nested value comes as JSON, equal to the origin's.
	if got, want := decodeNumbers(t, env["BGTASK_ORIGIN_NESTED"]), decodeNumbers(t, `{"a":[1,"ü"]}`); !reflect.DeepEqual(got, want) {
		t.Errorf("BGTASK_ORIGIN_NESTED = %q, want {\"a\":[1,\"ü\"]}", env["BGTASK_ORIGIN_NESTED"])
	}
	// The server's own environment is passed on (PATH finds the programs).
	if env["PATH"] != os.Getenv("PATH") {
		t.Errorf("PATH = %q, want the parent's %q", env["PATH"], os.Getenv("PATH"))
	}
}

func TestExecEnvOfAWakeupWithoutExitCodeOrOrigin(t *testing.T) {
	t.Parallel()
	w := events.Wakeup{ID: "t1", Status: "lost", Target: "default"}
	env := map[string]string{}
	for _, kv := range Env(w, 1) {
		k, v, _ := strings.Cut(kv, "=")
		if _, dup := env[k]; dup {
			t.Errorf("%s set twice", k)
		}
		env[k] = v
	}
	if env["BGTASK_EXIT_CODE"] != "" || env["BGTASK_ORIGIN"] != "" {
		t.Errorf("exit code %q, origin %q: want both empty", env["BGTASK_EXIT_CODE"], env["BGTASK_ORIGIN"])
	}
	for k := range env {
		if strings.HasPrefix(k, "BGTASK_ORIGIN_") {
			t.Errorf("%s set without an origin", k)
		}
	}
}

func TestExecArgvPlaceholdersAreRendered(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	wake := testWakeup()
	// Each argument after $0 on its own, NUL-terminated: the prompt has newlines.
	script := fmt.Sprintf(`printf '%%s\0' "$@" > %s/args`, dir)
	o := push(t, context.Background(), execSink("sh", "-c", script, "sh",
		"{{task_id}}", "{{prompt}}", "{{origin.chat}}", "id={{origin.user_id}}", "{{origin.nested.a}}",
		"{{status}}/{{exit_code}}/{{kind}}", "{{origin.missing}}", "plain"), wake, 1)
	if !o.OK {
		t.Fatalf("outcome = %+v, want OK", o)
	}
	data, err := os.ReadFile(filepath.Join(dir, "args"))
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSuffix(string(data), "\x00"), "\x00")
	want := []string{wake.ID, wake.Prompt, "c-42", "id=9007199254740993", `[1,"ü"]`, "failed/3/build", "", "plain"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("argv = %q\nwant   %q", got, want)
	}
}

func TestExecExitCodes(t *testing.T) {
	t.Parallel()
	o := push(t, context.Background(), execSink("sh", "-c", "echo fine"), testWakeup(), 1)
	if !o.OK || o.Permanent || o.ExitCode == nil || *o.ExitCode != 0 || o.Output != "fine\n" {
		t.Fatalf("exit 0: outcome = %+v, want OK, exit code 0, output fine", o)
	}

	o = push(t, context.Background(), execSink("sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 3"), testWakeup(), 1)
	if o.OK || o.Permanent {
		t.Fatalf("exit 3: outcome = %+v, want a retryable failure", o)
	}
	if o.ExitCode == nil || *o.ExitCode != 3 {
		t.Fatalf("exit 3: exit code = %v, want 3", o.ExitCode)
	}
	if !strings.Contains(o.Output, "to-stdout") || !strings.Contains(o.Output, "to-stderr") {
		t.Errorf("exit 3: output = %q, want stdout and stderr", o.Output)
	}
	if o.Error == "" {
		t.Errorf("exit 3: no error")
	}
	if o.HTTPStatus != 0 {
		t.Errorf("an exec outcome has HTTP status %d", o.HTTPStatus)
	}
}

func TestExecOutputKeepsItsTail(t *testing.T) {
	t.Parallel()
	// 20 KiB of output then a last line: the history keeps the end, which says why.
	script := `i=0; while [ $i -lt 2048 ]; do echo 123456789; i=$((i+1)); done; echo LAST; exit 1`
	o := push(t, context.Background(), execSink("sh", "-c", script), testWakeup(), 1)
	if !strings.HasSuffix(o.Output, "LAST\n") {
		t.Fatalf("output does not end with the last line: ...%q", o.Output[max(0, len(o.Output)-40):])
	}
	if len(o.Output) > maxOutput+100 {
		t.Fatalf("output is %d bytes, want about %d", len(o.Output), maxOutput)
	}
	if !strings.Contains(o.Output, "not kept") {
		t.Errorf("output does not say that its start was cut")
	}
}

func TestExecMissingProgramIsPermanent(t *testing.T) {
	t.Parallel()
	notExecutable := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(notExecutable, []byte("#!/bin/sh\nexit 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, argv0 := range []string{"bgtask-no-such-program-here", "/nonexistent/dir/prog", notExecutable} {
		o := push(t, context.Background(), execSink(argv0, "arg"), testWakeup(), 1)
		if o.OK || !o.Permanent || o.ExitCode != nil || o.Error == "" {
			t.Errorf("%s: outcome = %+v, want a permanent failure without exit code", argv0, o)
		}
	}
}

// pidGone reports whether pid has exited: no such process, or a zombie waiting for
// a parent that is not this test.
func pidGone(pid int) bool {
	if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	return len(fields) > 0 && fields[0] == "Z"
}

// waitGone waits until pid is gone; it fails the test, and kills pid, after a
// generous bound.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	defer func() { // also as the failure ends the test
		if !pidGone(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}()
	testkit.Eventually(t, 10*time.Second, fmt.Sprintf("process %d gone", pid), func() bool { return pidGone(pid) })
}

// readPID waits for a script to write a pid file.
func readPID(t *testing.T, file string) int {
	t.Helper()
	var data []byte
	testkit.Eventually(t, 10*time.Second, file+" written", func() bool {
		var err error
		data, err = os.ReadFile(file)
		return err == nil && strings.HasSuffix(string(data), "\n")
	})
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

func TestExecTimeoutKillsTheWholeProcessGroup(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "grandchild")
	// The grandchild holds the output pipe: the attempt must not wait for it.
	// "started" is in the pipe before the PID file exists, so before the kill.
	script := fmt.Sprintf(`echo started; sleep 1000 & echo $! > %s; wait`, pidFile)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan engine.SinkOutcome, 1)
	go func() { done <- New(testSecret).Push(ctx, execSink("sh", "-c", script), testWakeup(), 1) }()
	grandchild := readPID(t, pidFile)
	t.Cleanup(func() { _ = syscall.Kill(grandchild, syscall.SIGKILL) })
	cancel() // the sink's timeout

	var o engine.SinkOutcome
	select {
	case o = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the attempt did not end when its context did")
	}
	if o.OK || o.Permanent {
		t.Fatalf("outcome = %+v, want a retryable failure", o)
	}
	if !strings.Contains(o.Error, "timed out") {
		t.Errorf("error = %q, want it to say the attempt timed out", o.Error)
	}
	if !strings.Contains(o.Output, "started") {
		t.Errorf("output = %q, want what it printed before the kill", o.Output)
	}
	// The grandchild held the output pipe: had it survived, the attempt would
	// have waited for it (up to the wait delay) and it would run on.
	waitGone(t, grandchild)
}

func TestExecTimeoutFromTheSinksDeadline(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	o := New(testSecret).Push(ctx, execSink("sh", "-c", "exec sleep 1000"), testWakeup(), 1)
	if o.OK || o.Permanent || !strings.Contains(o.Error, "timed out") {
		t.Fatalf("outcome = %+v, want a retryable time-out", o)
	}
	if ctx.Err() == nil {
		t.Fatalf("the attempt ended before its deadline: %+v", o)
	}
}

// A program that succeeds but leaves a daemon behind holding its stdout (a
// notifier that forks a helper, `cmd &` in a script) has still delivered: exit 0 is
// success. Reporting it as a failure retries the push: the wake-up is pushed again.
func TestExecExitZeroWithADaemonHoldingTheOutputIsSuccess(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "daemon")
	// setsid: the daemon leaves the process group, as a real one does.
	script := fmt.Sprintf(`setsid sleep 1000 & echo $! > %s; echo delivered; exit 0`, pidFile)

	o := push(t, context.Background(), execSink("sh", "-c", script), testWakeup(), 1)
	daemon := readPID(t, pidFile)
	_ = syscall.Kill(daemon, syscall.SIGKILL)
	waitGone(t, daemon)
	if !o.OK || o.ExitCode == nil || *o.ExitCode != 0 {
		t.Fatalf("outcome = %+v (exit code %v), want OK with exit code 0: the program exited 0", o, o.ExitCode)
	}
}

// Two origin keys that map to one variable name ("chat-id" and "chat_id") must give
// that variable the same value on every attempt; which one wins may not depend on
// the order of a Go map.
func TestExecEnvIsTheSameOnEveryAttempt(t *testing.T) {
	t.Parallel()
	w := testWakeup()
	w.Origin = json.RawMessage(`{"chat-id":"from chat-id","chat_id":"from chat_id","Chat.Id":"from Chat.Id"}`)
	effective := func() string {
		value := ""
		for _, kv := range Env(w, 1) { // os/exec keeps the last of duplicates
			if v, ok := strings.CutPrefix(kv, "BGTASK_ORIGIN_CHAT_ID="); ok {
				value = v
			}
		}
		return value
	}
	first := effective()
	for range 100 {
		if got := effective(); got != first {
			t.Fatalf("BGTASK_ORIGIN_CHAT_ID is %q on one attempt and %q on another", first, got)
		}
	}
}
