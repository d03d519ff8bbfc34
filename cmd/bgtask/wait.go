package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/client"
)

func waitCmd(g *globals) *cobra.Command {
	var o waitOptions
	cmd := &cobra.Command{
		Use:   "wait ID...",
		Short: "Block until tasks have fired (or were cancelled) and print their wake-ups",
		Long: `Block until the task has fired or was cancelled, then print its wake-up: the
prompt, or with --json an object with at least id, status, exit_code and prompt.
status is the outcome: succeeded, failed, timed_out, stalled, lost or cancelled.
An ID may be a unique start of the task's id (at least 6 characters).

The exit status says the outcome, so that 'bgtask wait ID && next' runs next only
after a success: 0 succeeded, 3 ended otherwise (failed, timed_out, stalled, lost),
4 cancelled; 124 when --timeout passed first. The wake-up is printed in each case.

With several IDs, wait waits for all of them and prints each wake-up as its task
ends (a blank line between prompts; --json: one object a line). The exit status
is 0 if every one succeeded, else 3 if any ended otherwise, else 4. With --any it
returns at the first that ends, prints that one's wake-up (as for one ID) and
exits with its status. Every ID is checked before the wait begins: one that names
no task, or several, is an error at once.

A server that is restarting is waited for (said once on stderr), within --timeout.
Waiting does not consume the wake-up: it stays in the target's inbox, and the
target is woken by it as well. With --consume, each wake-up that wait printed is
removed from the target's inbox (the engine records it as the event consumed),
so an agent that waited for the result inside its turn is not woken by it again;
the target's other wake-ups stay. A task that woke nobody (cancelled, or an
outcome its --wake-on does not name) has nothing to consume: --consume does
nothing then. A wake-up that cannot be consumed is an error, with the exit
status of that error; the wake-up stays in the inbox.`,
		Example: `  bgtask wait "$id" && deploy
  bgtask wait 0196f3 "$b" --timeout 10m     # both; a start of an id will do
  bgtask wait --any "$fast" "$slow" --json`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runWait(cmd.Context(), g, args, o)
		},
	}
	cmd.Flags().DurationVar(&o.timeout, "timeout", 0, "give up after this long: exit status 124 while a task runs, 7 while no server answers (a restart); 0 waits forever")
	cmd.Flags().BoolVar(&o.asJSON, "json", false, "print the wake-up as JSON (several: one a line)")
	cmd.Flags().BoolVar(&o.consume, "consume", false, "remove each printed wake-up from the target's inbox, so it wakes nobody again")
	cmd.Flags().BoolVar(&o.any, "any", false, "with several IDs, return at the first task that ends")
	return cmd
}

type waitOptions struct {
	timeout              time.Duration
	asJSON, consume, any bool
}

// runWait waits for the tasks refs name, prints their wake-ups as they end,
// consumes them if asked, and returns the exit status their outcomes give.
func runWait(ctx context.Context, g *globals, refs []string, o waitOptions) error {
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	c, err := g.open(ctx, o.timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	tasks, err := waitedTasks(ctx, c, refs)
	if err != nil {
		return err
	}
	if o.consume {
		for _, t := range tasks {
			release, err := c.HoldWakeup(t.ID)
			if err != nil {
				return err
			}
			defer release()
		}
	}
	ended, stop := endOfEach(ctx, c, tasks)
	defer stop()
	want := len(tasks)
	if o.any {
		want = 1
	}
	printer := &wakeupPrinter{w: g.stdout, asJSON: o.asJSON, several: want > 1}
	done := make([]bool, len(tasks))
	var statuses []string
	for range want {
		r := <-ended
		if r.err != nil {
			if errors.Is(r.err, context.DeadlineExceeded) {
				return waitTimedOut(o.timeout, tasks, done, r, ended)
			}
			return r.err
		}
		done[r.i] = true
		w, err := printer.print(r.task)
		if err != nil {
			return err
		}
		if o.consume {
			if _, err := c.ConsumeWakeup(ctx, r.task); err != nil {
				return err
			}
		}
		statuses = append(statuses, w.Status)
	}
	return worstOutcome(statuses)
}

// waitedTasks reads the tasks refs name, each once: a ref that names no task, or
// several, is an error before anything is waited for.
func waitedTasks(ctx context.Context, c *client.Client, refs []string) ([]client.Task, error) {
	var tasks []client.Task
	seen := map[string]bool{}
	for _, ref := range refs {
		t, err := c.Get(ctx, ref)
		if err != nil {
			return nil, err
		}
		if !seen[t.ID] {
			seen[t.ID] = true
			tasks = append(tasks, t)
		}
	}
	return tasks, nil
}

// taskEnd is tasks[i] as it ended, or why it could not be seen to.
type taskEnd struct {
	i    int
	task client.Task
	err  error
}

// endOfEach sends each task's end as it comes, those that had ended first, in
// order; stop ends the follows still going.
func endOfEach(ctx context.Context, c *client.Client, tasks []client.Task) (<-chan taskEnd, func()) {
	ended := make(chan taskEnd, len(tasks)) // no follow waits to send
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i, t := range tasks {
		if client.Ended(t) {
			ended <- taskEnd{i: i, task: t}
			continue
		}
		wg.Go(func() {
			t, err := c.Follow(ctx, t.ID, client.Ended)
			ended <- taskEnd{i: i, task: t, err: err}
		})
	}
	return ended, func() { cancel(); wg.Wait() }
}

// wakeupPrinter prints wake-ups: one alone as it always was; several one JSON
// object a line, or the prompts with a blank line between them.
type wakeupPrinter struct {
	w       io.Writer
	asJSON  bool
	several bool
	printed int
}

func (p *wakeupPrinter) print(t client.Task) (client.Wakeup, error) {
	w := client.WakeupOf(t)
	var err error
	switch {
	case p.asJSON && p.several:
		err = printJSONLine(p.w, w)
	case p.asJSON:
		err = printJSON(p.w, w)
	default:
		if p.printed > 0 {
			_, err = io.WriteString(p.w, "\n")
		}
		if err == nil {
			err = printWakeup(p.w, w)
		}
	}
	p.printed++
	return w, err
}

// waitTimedOut is the error of a wait whose timeout passed: first is the follow
// that said so, and the others that had not ended say so through ended.
func waitTimedOut(timeout time.Duration, tasks []client.Task, done []bool, first taskEnd, ended <-chan taskEnd) error {
	open := []taskEnd{first}
	for i := range tasks {
		if !done[i] && i != first.i {
			open = append(open, <-ended)
		}
	}
	slices.SortFunc(open, func(a, b taskEnd) int { return a.i - b.i })
	var names []string
	for _, r := range open {
		names = append(names, fmt.Sprintf("%s (%s)", tasks[r.i].ID, r.task.Phase))
	}
	what := "task " + names[0]
	if len(tasks) > 1 {
		what = fmt.Sprintf("%d of %d tasks: %s", len(open), len(tasks), strings.Join(names, ", "))
	}
	return &exitError{code: client.ExitTimeout, err: fmt.Errorf("timed out after %s waiting for %s", timeout, what)}
}

// worstOutcome is wait's exit for the statuses of the tasks it waited for: a
// success only if each succeeded, else 3 if any ended otherwise, else 4.
func worstOutcome(statuses []string) error {
	worst := 0
	for _, status := range statuses {
		switch code := client.OutcomeStatus(status); {
		case code == client.ExitTaskFailed:
			worst = code
		case worst == 0:
			worst = code
		}
	}
	if worst == 0 {
		return nil
	}
	return &exitError{code: worst}
}

func printWakeup(w io.Writer, wake client.Wakeup) error {
	_, err := io.WriteString(w, strings.TrimRight(wake.Prompt, "\n")+"\n")
	return err
}
