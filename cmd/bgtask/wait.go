package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/events"
)

func waitCmd(g *globals) *cobra.Command {
	var (
		timeout time.Duration
		asJSON  bool
		consume bool
	)
	cmd := &cobra.Command{
		Use:   "wait ID",
		Short: "Block until a task has fired (or was cancelled) and print its wake-up",
		Long: `Block until the task has fired or was cancelled, then print its wake-up: the
prompt, or with --json an object with at least id, status, exit_code and prompt.
status is the outcome: succeeded, failed, timed_out, stalled, lost or cancelled.

The exit status says the outcome, so that 'bgtask wait ID && next' runs next only
after a success: 0 succeeded, 3 ended otherwise (failed, timed_out, stalled, lost),
4 cancelled; 124 when --timeout passed first. The wake-up is printed in each case.

A server that is restarting is waited for (said once on stderr), within --timeout.
Waiting does not consume the wake-up: it stays in the target's inbox, and the
target is woken by it as well. With --consume, the wake-up that wait printed is
removed from the target's inbox (the engine records it as the event consumed),
so an agent that waited for the result inside its turn is not woken by it again;
the target's other wake-ups stay. A task that woke nobody (cancelled, or an
outcome its --wake-on does not name) has nothing to consume: --consume does
nothing then. A wake-up that cannot be consumed is an error, with the exit
status of that error; the wake-up stays in the inbox.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runWait(cmd.Context(), g, args[0], timeout, asJSON, consume)
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "give up after this long: exit status 124 while the task runs, 7 while no server answers (a restart); 0 waits forever")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the wake-up as JSON")
	cmd.Flags().BoolVar(&consume, "consume", false, "remove the printed wake-up from the target's inbox, so it wakes nobody again")
	return cmd
}

// runWait waits for task id, prints its wake-up, consumes it if asked, and
// returns the exit status its outcome gives.
func runWait(ctx context.Context, g *globals, id string, timeout time.Duration, asJSON, consume bool) error {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	c, err := g.dial(ctx, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	var t api.TaskView
	err = g.call(ctx, c, timeout, true, func(ctx context.Context) (err error) {
		t, err = c.api.Get(ctx, id)
		return err
	})
	if err != nil {
		return err
	}
	if consume {
		stop, err := sayConsuming(c, t.ID)
		if err != nil {
			return err
		}
		defer stop()
	}
	state := t.State
	if !state.Phase.Terminal() {
		state, err = follow(ctx, c, t.ID, func(s engine.State) bool { return s.Phase.Terminal() })
		if errors.Is(err, context.DeadlineExceeded) {
			return &exitError{code: exitTimeout, err: fmt.Errorf("timed out after %s waiting for task %s (%s)", timeout, t.ID, state.Phase)}
		}
		if err != nil {
			return err
		}
	}
	w := state.CancelledWakeup()
	if state.Wakeup != nil {
		w = *state.Wakeup
	}
	if asJSON {
		err = printJSON(g.stdout, w)
	} else {
		err = printWakeup(g.stdout, w)
	}
	if err != nil {
		return err
	}
	if consume {
		if _, err := consumeWakeup(ctx, g, c, timeout, state); err != nil {
			return err
		}
	}
	return outcome(w.Status)
}

// sayConsuming answers on consumingSubject(id), until stop, that this wait will
// consume the task's wake-up: from before the task fires until it is consumed,
// so that the session's own reader of the inbox leaves it to the wait.
func sayConsuming(c *client, id string) (stop func(), err error) {
	sub, err := c.nc.Subscribe(consumingSubject(id), func(m *nats.Msg) { _ = m.Respond(nil) })
	if err != nil {
		return nil, err
	}
	return func() { _ = sub.Unsubscribe() }, nil
}

// consumeWakeup consumes the wake-up of a task that a wait saw end, and says
// whether there was one: a task that woke nobody (cancelled, quiet) has none.
func consumeWakeup(ctx context.Context, g *globals, c *client, timeout time.Duration, state engine.State) (bool, error) {
	if state.Phase != engine.PhaseFired || state.Quiet {
		return false, nil
	}
	err := g.call(ctx, c, timeout, true, func(ctx context.Context) error {
		_, err := c.api.Consume(ctx, state.ID)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("consume the wake-up of %s: %w", state.ID, err)
	}
	return true, nil
}

// ConsumingPrefix is where a `wait --consume` says it holds a task's wake-up:
// it answers a request on ConsumingPrefix.<task id> from before the task fires
// until it has consumed the wake-up. A reader of the inbox that hands wake-ups
// to an agent (the Claude Code waiter) asks before it hands one over.
const ConsumingPrefix = "bgtask.consuming"

func consumingSubject(id string) string { return ConsumingPrefix + "." + id }

// outcome is wait's exit for a task that ended with status: nil for a success,
// else the status that tells a script it must not go on.
func outcome(status string) error {
	switch status {
	case engine.StatusSucceeded:
		return nil
	case engine.StatusCancelled:
		return &exitError{code: exitTaskCancelled}
	}
	return &exitError{code: exitTaskFailed}
}

// follow reads a task's events until its state satisfies done, and returns that
// state. On a timeout it returns the state reached so far with the context's error.
func follow(ctx context.Context, c *client, id string, done func(engine.State) bool) (engine.State, error) {
	js, err := c.jetstream()
	if err != nil {
		return engine.State{}, err
	}
	store, err := events.ConnectStore(ctx, js)
	if err != nil {
		return engine.State{}, err
	}
	var s engine.State
	err = store.Follow(ctx, id, 0, func(rec events.Record, decodeErr error) bool {
		if decodeErr == nil {
			s, _ = engine.Apply(s, rec)
		}
		return !done(s)
	})
	return s, err
}

func printWakeup(w io.Writer, wake events.Wakeup) error {
	_, err := io.WriteString(w, strings.TrimRight(wake.Prompt, "\n")+"\n")
	return err
}
