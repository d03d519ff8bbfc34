package gemini

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/sys/unix"

	"github.com/bgtask/bgtask/client"
)

// backgroundAfter is how long a waiter lives at least. Gemini CLI moves a shell
// call that the model (or BeforeTool) ran in the background 200 ms after its
// start, and turns only the end of a command it moved there into a turn: a
// waiter that printed and ended sooner would be told to nobody.
const backgroundAfter = 2 * time.Second

// maxShown is how much of a wake-up's prompt a waiter prints at most: Gemini CLI
// gives the session the first 5,000 characters of a background command's
// output, the command's own lines before it included.
const maxShown = 4000

// Waiter is `bgtask hook gemini attach SESSION_ID COMMAND`, which a shell call
// of the session that registers a task runs instead (Rewrite), in the
// background of the session.
type Waiter struct {
	// Session is the Gemini CLI session's id; Command the shell call the model
	// asked for; Gemini the Gemini CLI process that runs it (0: not known).
	Session, Command string
	Gemini           int
	// Config reaches the bgtask server; Home is its home, in whose StateDir the
	// hand-offs of the session keep their files.
	Config client.Config
	Home   string
	// Stdout and Stderr are the shell call's output, which Gemini CLI gives the
	// session when the waiter ends.
	Stdout, Stderr io.Writer
}

// Run runs Command in the session (GEMINI_SESSION_ID, so that its `bgtask add`
// sends the wake-up to the session's target, and BGTASK_HOME, this bgtask's
// home) and returns its exit status when it fails. Once it has registered its
// task, Run waits, through restarts of the server, for the session's next
// wake-up (usually that task's: one waiter runs at a time, the others wait for
// it), prints its prompt, has it acknowledged, and returns 0: Gemini CLI makes
// that output the session's next turn. A waiter whose session ends (ctx, or the
// Gemini CLI process is gone) hands nothing over, and returns 1; so does one
// whose output nobody reads any more: the wake-up goes back to the inbox.
func (w Waiter) Run(ctx context.Context) int {
	started := time.Now()
	if status := w.runCommand(ctx); status != 0 {
		pause(ctx, time.Until(started.Add(backgroundAfter)))
		return status
	}
	target := TargetPrefix + w.Session
	handoff := &client.Handoff{Target: target, Dir: filepath.Join(w.Home, StateDir), Deliver: w.deliver,
		Dropped: func(d *client.Delivery) { dropped(w.Stderr, target, d) },
		// Gemini CLI drops the output of a background command it stopped (the
		// session ended); a `bgtask wait --consume` gives its turn the wake-up itself.
		Revocable: true, LeaveToWaits: true}
	ctx, stop := watchGemini(ctx, w.Gemini)
	defer stop()
	unlock, err := handoff.Lock(ctx, true)
	if err != nil {
		if ctx.Err() == nil {
			fmt.Fprintf(w.Stderr, "bgtask: wait for the wake-ups of %s: %v\n", target, err)
		}
		return 1
	}
	defer unlock()
	if !pause(ctx, time.Until(started.Add(backgroundAfter))) {
		return 1
	}
	n, err := handoff.Await(ctx, quiet(w.Config))
	switch {
	case n > 0:
		return 0
	case ctx.Err() == nil:
		fmt.Fprintf(w.Stderr, "bgtask: wait for the wake-ups of %s: %v\n", target, err)
	}
	return 1
}

// runCommand runs the model's command with the session's variables, its output
// the waiter's, and returns its exit status.
func (w Waiter) runCommand(ctx context.Context) int {
	shell := "bash"
	if _, err := exec.LookPath(shell); err != nil {
		shell = "sh"
	}
	cmd := exec.CommandContext(ctx, shell, "-c", w.Command)
	cmd.Env = append(slices.Clone(os.Environ()), "GEMINI_SESSION_ID="+w.Session, "BGTASK_HOME="+w.Home)
	cmd.Stdout, cmd.Stderr = w.Stdout, w.Stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit) && exit.ExitCode() > 0:
		return exit.ExitCode()
	case ctx.Err() != nil:
		return 1 // the session ended: nobody reads
	default:
		fmt.Fprintf(w.Stderr, "bgtask: run %q: %v\n", w.Command, err)
		return 1
	}
}

// deliver prints the wake-up's prompt (a batch of one), cut to what Gemini CLI
// shows the session.
func (w Waiter) deliver(ctx context.Context, batch []client.Wakeup) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	wk := batch[0]
	wk.Prompt = Shown(wk)
	_, err := io.WriteString(w.Stdout, wakeupLines([]client.Wakeup{wk}))
	return err
}

// Shown is the wake-up's prompt as a waiter prints it: at most maxShown
// characters, a longer one cut with a line that says where the rest is.
func Shown(wk client.Wakeup) string {
	prompt := []rune(wk.Prompt)
	if len(prompt) <= maxShown {
		return wk.Prompt
	}
	marker := fmt.Sprintf("\n[bgtask: the wake-up is cut from %d characters; 'bgtask wait %s' prints all of it]", len(prompt), wk.ID)
	return string(prompt[:maxShown-len([]rune(marker))]) + marker
}

// quiet is the waiter's cfg. nats.go's default error handler writes to stderr,
// which the session would be shown: its errors are dropped.
func quiet(cfg client.Config) client.Config {
	cfg.Name = "bgtask-gemini-waiter"
	cfg.Waiting = nil
	cfg.Options = append(slices.Clone(cfg.Options), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	return cfg
}

// watchGemini is ctx, ended once the Gemini CLI process pid is gone (0: not
// known). A Gemini CLI that ends after a headless turn (-p), or is killed with
// SIGKILL, leaves its background commands running.
func watchGemini(ctx context.Context, pid int) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	if pid <= 0 {
		return ctx, cancel
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		defer cancel()
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for !errors.Is(unix.Kill(pid, 0), unix.ESRCH) {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
	return ctx, func() { cancel(); wg.Wait() }
}

// pause waits for d, or until ctx ends: false then.
func pause(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
