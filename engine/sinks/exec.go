package sinks

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/secretenv"
)

// execWaitDelay bounds the wait for a program's output after it exited or was
// killed: a daemon it left behind holding the pipe does not hold the attempt.
const execWaitDelay = 2 * time.Second

// runExec runs argv in a process group of its own with w's prompt on stdin and
// w's fields in its environment. Exit 0 is success; the group is killed when ctx
// ends (the sink's timeout).
func runExec(ctx context.Context, argv []string, w events.Wakeup, attempt int) engine.SinkOutcome {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdin = strings.NewReader(w.Prompt)
	out := &tailBuffer{max: maxOutput}
	cmd.Stdout, cmd.Stderr = out, out
	// The server's environment, but not the credentials bgtask runs with.
	cmd.Env = append(secretenv.Without(os.Environ()), Env(w, attempt)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = execWaitDelay
	err := cmd.Run()
	o := engine.SinkOutcome{Output: out.String()}
	var exit *exec.ExitError
	switch {
	case err == nil, errors.Is(err, exec.ErrWaitDelay):
		// ErrWaitDelay: it exited 0, and something it left behind still holds its
		// output; the rest of that output is not the sink's answer.
		o.OK = true
		code := 0
		o.ExitCode = &code
	case errors.As(err, &exit):
		if code := exit.ExitCode(); code >= 0 { // -1: killed by a signal, which Error names
			o.ExitCode = &code
		}
		o.Error = exit.String()
		if ctx.Err() != nil {
			o.Error = "timed out: " + o.Error
		}
	case cmd.Process == nil:
		// It could not start (no such program, not executable): the same next time.
		o.Permanent, o.Error = true, err.Error()
	default:
		o.Error = err.Error()
	}
	return o
}

// Env is the environment an exec sink adds for wake-up w: its fields, and each
// top-level key of its origin as BGTASK_ORIGIN_<KEY> (upper case, other characters
// as _), strings as they are and other values as JSON.
func Env(w events.Wakeup, attempt int) []string {
	exit := ""
	if w.ExitCode != nil {
		exit = strconv.Itoa(*w.ExitCode)
	}
	env := []string{
		"BGTASK_TASK_ID=" + w.ID,
		"BGTASK_STATUS=" + w.Status,
		"BGTASK_EXIT_CODE=" + exit,
		"BGTASK_SIGNAL=" + w.Signal,
		"BGTASK_TARGET=" + w.Target,
		"BGTASK_KIND=" + w.Kind,
		"BGTASK_ATTEMPT=" + strconv.Itoa(attempt),
		"BGTASK_ORIGIN=" + string(w.Origin),
	}
	dec := json.NewDecoder(bytes.NewReader(w.Origin))
	dec.UseNumber() // a 64-bit chat id must not come back rounded
	var origin map[string]any
	if len(w.Origin) == 0 || dec.Decode(&origin) != nil {
		return env
	}
	// Keys that make the same name ("chat-id", "chat_id") go in sorted order, the
	// first one winning, so every attempt sees the same environment.
	named := map[string]bool{}
	for _, k := range slices.Sorted(maps.Keys(origin)) {
		name := "BGTASK_ORIGIN_" + envName(k)
		if named[name] {
			continue
		}
		named[name] = true
		v := origin[k]
		value, ok := v.(string)
		if !ok {
			data, _ := json.Marshal(v)
			value = string(data)
		}
		if strings.ContainsRune(value, 0) {
			continue
		}
		env = append(env, name+"="+value)
	}
	return env
}

func envName(key string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return r
		}
		return '_'
	}, key)
}
