package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine"
)

func (s *server) addWaitTool(m *mcp.Server) {
	addTool(m, &mcp.Tool{
		Name:  "wait",
		Title: "Wait for a task to end",
		Description: "Block until the task has fired (or was cancelled) and return its wake-up: status, exit_code, prompt, result. " +
			"With timeout, return after that long with ended false if it is still running. " +
			"The wake-up comes to the session by itself; wait only when the result is needed before anything else, " +
			"and then give consume true, so that the same wake-up does not wake the session again. " +
			"A long wait sends progress notifications.",
		// Not read-only: with consume, it removes the wake-up from the inbox.
		Annotations: &mcp.ToolAnnotations{DestructiveHint: new(false), IdempotentHint: true, OpenWorldHint: new(false)},
	}, s.wait)
}

type waitArgs struct {
	taskArgs
	Timeout string `json:"timeout,omitempty" jsonschema:"give up after this long, a Go duration such as 90s or 10m (default: wait until the task ends)"`
	Consume bool   `json:"consume,omitempty" jsonschema:"remove the returned wake-up from the target's inbox, so it wakes nobody again (a task that woke nobody: nothing to do)"`
}

type waitResult struct {
	ID string `json:"id"`
	// Ended: the task fired or was cancelled, and Wakeup is its wake-up; else the
	// timeout passed in State.
	Ended  bool           `json:"ended"`
	State  engine.Phase   `json:"state"`
	Wakeup *client.Wakeup `json:"wakeup,omitempty"`
	// Consumed: the wake-up was removed from the inbox, as consume asked.
	Consumed bool `json:"consumed,omitempty"`
}

func (s *server) wait(ctx context.Context, req *mcp.CallToolRequest, in waitArgs) (string, waitResult, error) {
	var timeout time.Duration
	if in.Timeout != "" {
		d, err := time.ParseDuration(in.Timeout)
		if err != nil || d <= 0 {
			return "", waitResult{}, &argError{"timeout", fmt.Sprintf("%q: want a positive duration such as 90s or 10m", in.Timeout)}
		}
		timeout = d
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	var seen atomic.Value // the task, as the wait last saw it: its id as given until it is read
	seen.Store(waitSeen{id: in.ID})
	if token := req.Params.GetProgressToken(); token != nil {
		stop := s.sendProgress(ctx, req.Session, token, &seen)
		defer stop()
	}
	c, err := s.connect(ctx, timeout)
	if err != nil {
		return "", waitResult{}, err
	}
	defer c.Close()
	out, err := s.waitFor(ctx, c, in, &seen)
	if err != nil {
		return "", waitResult{}, noServer(err, timeout)
	}
	if !out.Ended {
		return fmt.Sprintf("task %s is still %s after %s; wait again, or let its wake-up come", out.ID, out.State, timeout), out, nil
	}
	w := out.Wakeup
	return fmt.Sprintf("task %s %s, exit code %s\n\n%s", w.ID, w.Status, exitString(w.ExitCode), strings.TrimRight(w.Prompt, "\n")), out, nil
}

// waitFor waits until the task has ended and returns its wake-up, consumed if
// the call asked; when ctx's deadline passes first, the task as it is then.
func (s *server) waitFor(ctx context.Context, c *client.Client, in waitArgs, seen *atomic.Value) (waitResult, error) {
	t, err := c.Get(ctx, in.ID)
	if err != nil {
		return waitResult{}, err
	}
	if in.Consume {
		release, err := c.HoldWakeup(t.ID)
		if err != nil {
			return waitResult{}, err
		}
		defer release()
	}
	seen.Store(waitSeen{t.ID, t.Phase})
	if !client.Ended(t) {
		t, err = c.Follow(ctx, t.ID, func(t client.Task) bool {
			seen.Store(waitSeen{t.ID, t.Phase})
			return client.Ended(t)
		})
		if errors.Is(err, context.DeadlineExceeded) {
			return waitResult{ID: t.ID, State: t.Phase}, nil // the timeout passed: no error
		}
		if err != nil {
			return waitResult{}, err
		}
	}
	w := client.WakeupOf(t)
	out := waitResult{ID: t.ID, Ended: true, State: t.Phase, Wakeup: &w}
	if in.Consume {
		if out.Consumed, err = c.ConsumeWakeup(ctx, t); err != nil {
			return waitResult{}, err
		}
	}
	return out, nil
}

// waitSeen is a waited task as a wait last saw it.
type waitSeen struct {
	id    string
	phase engine.Phase // "": not read yet
}

// sendProgress tells the client every ProgressEvery, from now until stop, that
// the wait goes on: the seconds waited so far and the task as seen holds it.
func (s *server) sendProgress(ctx context.Context, session *mcp.ServerSession, token any, seen *atomic.Value) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		start := time.Now()
		tick := time.NewTicker(s.cfg.ProgressEvery)
		defer tick.Stop()
		for {
			waited := time.Since(start)
			task := seen.Load().(waitSeen)
			msg := fmt.Sprintf("waiting for task %s for %s", task.id, waited.Round(time.Second))
			if task.phase != "" {
				msg += " (" + string(task.phase) + ")"
			}
			// A notification the client does not get is no reason to stop waiting.
			_ = session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: waited.Seconds(), Message: msg})
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() { cancel(); <-done }
}
