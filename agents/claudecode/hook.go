package claudecode

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/sys/unix"

	"github.com/bgtask/bgtask/client"
)

// SessionsDir, in the bgtask home, holds the waiters' locks and ledgers
// (claude-SESSION.lock, claude-SESSION.handed: client.Handoff's), what a waiter
// could not say (panic.log, dropped.log).
const SessionsDir = "claude-sessions"

// TargetPrefix names a session's target: claude-SESSION_ID.
const TargetPrefix = "claude-"

// hookBound bounds a quick hook's talk with the server: Claude Code waits for it
// before it goes on.
const hookBound = 3 * time.Second

// BusyTTL ends a session's busy state by itself: a Claude Code killed in a turn
// runs no Stop hook, and its target would stay busy for good.
const BusyTTL = 30 * time.Minute

// waitBatch is how many wake-ups that came together the waiter hands over in
// one turn at most.
const waitBatch = 16

// Hook is one run of `bgtask hook claude-code EVENT`, one of Claude Code's hooks.
type Hook struct {
	// Config reaches the bgtask server; Home is its home, in whose SessionsDir
	// the waiters keep their files.
	Config client.Config
	Home   string
	// Stdin is the hook's JSON (session_id); Stderr is where it says what went
	// wrong, and, for the waiter, the prompts it hands over.
	Stdin  io.Reader
	Stderr io.Writer
}

// Run runs the hook of event and returns the exit status Claude Code is to get:
// 2 when the waiter (Wake) handed wake-ups over, their prompts on Stderr, which
// Claude Code's asyncRewake turns into a new turn; 1 when the waiter panicked;
// else 0. UserPromptSubmit marks the session's target busy (for BusyTTL at
// most); Stop, SessionStart and SessionEnd idle.
//
// A hook never breaks the session: when no server answers, or the input is not
// understood, it says so on Stderr and returns 0. The waiter says nothing there
// but prompts, as Claude Code hands the session all of it.
func (h Hook) Run(ctx context.Context, event string) int {
	warn := h.Stderr
	if event == Wake {
		warn = io.Discard
	}
	sid := readHookInput(h.Stdin, warn).SessionID
	if sid == "" {
		sid = os.Getenv("CLAUDE_CODE_SESSION_ID")
	}
	target := TargetPrefix + sid
	switch {
	case sid == "":
		fmt.Fprintln(warn, "bgtask hook claude-code: no session_id in the hook's input")
		return 0
	case client.CheckTarget(target) != nil:
		fmt.Fprintf(warn, "bgtask hook claude-code: session_id %q cannot name a target (1-128 letters, digits, '-' or '_')\n", sid)
		return 0
	}
	switch event {
	case "UserPromptSubmit":
		h.mark(ctx, target, client.TargetBusy)
	case "Stop", "SessionStart", "SessionEnd":
		h.mark(ctx, target, client.TargetIdle)
	case Wake:
		return h.wake(ctx, target)
	default:
		fmt.Fprintf(h.Stderr, "bgtask hook claude-code: event %q: use UserPromptSubmit, Stop, SessionStart, SessionEnd or %s\n", event, Wake)
	}
	return 0
}

// hookInput is what Claude Code writes to a hook's stdin that bgtask reads.
type hookInput struct {
	SessionID string `json:"session_id"`
}

// readHookInput reads the hook's JSON, however large (a tool's response may be);
// what is not there or not understood leaves the fields empty.
func readHookInput(stdin io.Reader, warn io.Writer) hookInput {
	var in hookInput
	if f, ok := stdin.(*os.File); ok {
		if st, err := f.Stat(); err != nil || st.Mode()&fs.ModeCharDevice != 0 {
			return in // a terminal: run by hand
		}
	}
	err := json.NewDecoder(stdin).Decode(&in)
	// Claude Code writes all of its input; a hook that stops reading could block it.
	_, _ = io.Copy(io.Discard, stdin)
	if err != nil && !errors.Is(err, io.EOF) {
		fmt.Fprintf(warn, "bgtask hook claude-code: the hook's input is not JSON: %v\n", err)
	}
	return in
}

// mark records the session's state, within hookBound; a failure is only said.
func (h Hook) mark(ctx context.Context, target, state string) {
	ctx, cancel := context.WithTimeout(ctx, hookBound)
	defer cancel()
	if err := client.MarkSession(ctx, h.Config, target, state, BusyTTL); err != nil {
		fmt.Fprintf(h.Stderr, "bgtask hook claude-code: target %s %s: %v\n", state, target, err)
	}
}

// wake is the waiting hook: it holds the session's lock, waits for wake-ups in
// the target's inbox, through restarts of the server, and hands those that came
// together to the session (client.Handoff). It ends, handing nothing over, when
// Claude Code stops it (SIGTERM at the session's end or the hook's timeout) or
// the Claude Code process is gone; at once when another waiter of the session
// runs.
func (h Hook) wake(ctx context.Context, target string) (status int) {
	// A print-mode session (claude -p) runs asyncRewake hooks in the foreground: a
	// waiter would hold it until its timeout.
	if os.Getenv("CLAUDE_CODE_ENTRYPOINT") == "sdk-cli" {
		return 0
	}
	dir := filepath.Join(h.Home, SessionsDir)
	defer quietPanic(dir, &status)
	pid, _ := strconv.Atoi(os.Getenv("CLAUDE_PID"))
	w := &waiter{stderr: h.Stderr, pid: pid, dir: dir}
	handoff := &client.Handoff{Target: target, Dir: dir, Batch: waitBatch, Deliver: w.deliver, Dropped: w.dropped,
		// Claude Code drops what a hook it stopped wrote; a `wait --consume` in the
		// session's turn gives that turn the wake-up itself.
		Revocable: true, LeaveToWaits: true}
	unlock, err := handoff.Lock(ctx, false)
	if err != nil {
		return 0 // another waiter waits for this session, or the home is unusable
	}
	defer unlock()
	ctx, stop := w.watchClaude(ctx)
	defer stop()
	if n, _ := handoff.Await(ctx, quiet(h.Config)); n > 0 {
		return 2
	}
	return 0
}

// quiet is the waiter's cfg. nats.go's default error handler writes to stderr,
// which the session would be handed: its errors are dropped.
func quiet(cfg client.Config) client.Config {
	cfg.Name = "bgtask-claude-code-hook"
	cfg.Waiting = nil
	cfg.Options = append(slices.Clone(cfg.Options), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	return cfg
}

// waiter is a session's waiting hook.
type waiter struct {
	stderr io.Writer
	pid    int    // Claude Code's, 0: not known
	dir    string // SessionsDir
}

// errSessionGone: the Claude Code process of the session is gone.
var errSessionGone = errors.New("the Claude Code session is gone")

// deliver writes the prompts to stderr for Claude Code: the exit status 2 that
// follows makes them the session's next turn. A session that is gone, or
// ending, gets nothing.
func (w *waiter) deliver(ctx context.Context, batch []client.Wakeup) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if w.pid > 0 && !processAlive(w.pid) {
		return errSessionGone
	}
	var text bytes.Buffer
	for i, wk := range batch {
		if i > 0 {
			text.WriteByte('\n')
		}
		text.WriteString(strings.TrimRight(wk.Prompt, "\n") + "\n")
	}
	_, err := w.stderr.Write(text.Bytes())
	return err
}

// dropped notes a message of the inbox that is no wake-up in dropped.log: the
// session is not shown what anyone may have put there.
func (w *waiter) dropped(d *client.Delivery) {
	f, err := os.OpenFile(filepath.Join(w.dir, "dropped.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "%s: dropped message %d of the inbox (%v): %.200q\n", time.Now().UTC().Format(time.RFC3339), d.Seq, d.Err, d.Raw)
}

// watchClaude is ctx, ended once the Claude Code process is gone.
func (w *waiter) watchClaude(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	if w.pid <= 0 {
		return ctx, cancel
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		defer cancel()
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for processAlive(w.pid) {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
	return ctx, func() { cancel(); wg.Wait() }
}

// processAlive reports whether pid is a live process.
func processAlive(pid int) bool {
	return !errors.Is(unix.Kill(pid, 0), unix.ESRCH)
}

// quietPanic turns a panic of the waiter into exit status 1 with nothing on
// stderr: Go's own exit status for a panic, 2, would hand its trace to the
// session as a turn. The trace goes to dir/panic.log.
func quietPanic(dir string, status *int) {
	r := recover()
	if r == nil {
		return
	}
	_ = os.MkdirAll(dir, 0o700)
	if f, err := os.OpenFile(filepath.Join(dir, "panic.log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600); err == nil {
		fmt.Fprintf(f, "%s: bgtask hook claude-code wake: panic: %v\n%s", time.Now().UTC().Format(time.RFC3339), r, debug.Stack())
		f.Close()
	}
	*status = 1
}
