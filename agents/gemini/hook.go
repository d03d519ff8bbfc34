package gemini

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/bgtask/bgtask/client"
)

// TargetPrefix names a session's target: gemini-SESSION_ID.
const TargetPrefix = "gemini-"

// StateDir, in the bgtask home, holds each session's lock and ledger
// (gemini-SESSION.lock, gemini-SESSION.handed: client.Handoff's).
const StateDir = "gemini"

// BusyTTL ends a session's busy state by itself: a Gemini CLI killed in a turn
// runs no AfterAgent hook.
const BusyTTL = 30 * time.Minute

// hookBound bounds each of a hook's talks with the server: Gemini CLI waits for
// the hook before it goes on.
const hookBound = 3 * time.Second

// pendingBatch is how many pending wake-ups BeforeAgent adds to a turn at most;
// the rest come with the next.
const pendingBatch = 16

// Hook is one run of `bgtask hook gemini EVENT`, one of Gemini CLI's hooks.
type Hook struct {
	// Config reaches the bgtask server; Home is its home, in whose StateDir the
	// hand-offs keep their files.
	Config client.Config
	Home   string
	// Bgtask is this bgtask binary, which the waiter of a rewritten shell call
	// runs on Home; Gemini is the Gemini CLI process, which runs the hook (its
	// parent), and which the waiter watches.
	Bgtask string
	Gemini int
	// Stdin is the hook's JSON; Stdout its answer to Gemini CLI (JSON); Stderr
	// where it says what went wrong.
	Stdin          io.Reader
	Stdout, Stderr io.Writer
}

// hookInput is what Gemini CLI writes to a hook's stdin that bgtask reads.
type hookInput struct {
	SessionID string `json:"session_id"`
	ToolName  string `json:"tool_name"`
	ToolInput struct {
		Command string `json:"command"`
	} `json:"tool_input"`
}

// hookOutput is a hook's answer: hookSpecificOutput, or nothing to change.
type hookOutput struct {
	Specific map[string]any `json:"hookSpecificOutput,omitempty"`
}

// Run runs the hook of event and writes its answer on Stdout. SessionStart,
// AfterAgent and SessionEnd mark the session's target idle. BeforeAgent marks it
// busy (for BusyTTL at most), and adds to the turn the wake-ups that wait for
// the session while no waiter runs (one that was closed, resumed). BeforeTool
// hands a shell call that registers a task to a waiter (Rewrite).
//
// A hook never breaks the session: when no server answers, or the input is not
// understood, it says so on Stderr and answers that nothing changes.
func (h Hook) Run(ctx context.Context, event string) {
	out := hookOutput{}
	defer func() { _ = json.NewEncoder(h.Stdout).Encode(out) }()
	var in hookInput
	if err := json.NewDecoder(io.LimitReader(h.Stdin, 16<<20)).Decode(&in); err != nil {
		fmt.Fprintf(h.Stderr, "bgtask hook gemini: the hook's input is not JSON: %v\n", err)
		return
	}
	target := TargetPrefix + in.SessionID
	if client.CheckTarget(target) != nil {
		fmt.Fprintf(h.Stderr, "bgtask hook gemini: session_id %q cannot name a target (letters, digits, '-' or '_')\n", in.SessionID)
		return
	}
	switch event {
	case "BeforeTool":
		if in.ToolName != ShellTool {
			return
		}
		if input, ok := Rewrite(commandPrefix(h.Bgtask, h.Home), in.SessionID, h.Gemini, in.ToolInput.Command); ok {
			out.Specific = map[string]any{"hookEventName": event, "tool_input": input}
		}
	case "BeforeAgent":
		h.mark(ctx, target, client.TargetBusy)
		if text := h.pending(ctx, target); text != "" {
			out.Specific = map[string]any{"hookEventName": event, "additionalContext": text}
		}
	case "AfterAgent", "SessionStart", "SessionEnd":
		h.mark(ctx, target, client.TargetIdle)
	default:
		fmt.Fprintf(h.Stderr, "bgtask hook gemini: event %q: use one of %s\n", event, strings.Join(Events, ", "))
	}
}

// mark records the session's state, within hookBound; a failure is only said.
func (h Hook) mark(ctx context.Context, target, state string) {
	ctx, cancel := context.WithTimeout(ctx, hookBound)
	defer cancel()
	if err := client.MarkSession(ctx, h.Config, target, state, BusyTTL); err != nil {
		fmt.Fprintf(h.Stderr, "bgtask hook gemini: target %s %s: %v\n", state, target, err)
	}
}

// pending hands over, as the text to add to the turn that starts, the wake-ups
// in the target's inbox, unless a waiter of the session holds its lock (it
// hands them over itself).
func (h Hook) pending(ctx context.Context, target string) string {
	ctx, cancel := context.WithTimeout(ctx, hookBound)
	defer cancel()
	var text strings.Builder
	// Handed over is what this hook prints: it ends within its bounds, long before
	// Gemini CLI would time it out and drop its answer.
	handoff := &client.Handoff{Target: target, Dir: filepath.Join(h.Home, StateDir), Batch: pendingBatch, LeaveToWaits: true,
		Deliver: func(ctx context.Context, batch []client.Wakeup) error {
			text.WriteString(wakeupLines(batch))
			return nil
		},
		Dropped: func(d *client.Delivery) { dropped(h.Stderr, target, d) },
	}
	unlock, err := handoff.Lock(ctx, false)
	if errors.Is(err, client.ErrLocked) {
		return ""
	}
	if err != nil {
		fmt.Fprintf(h.Stderr, "bgtask hook gemini: the hand-off of %s: %v\n", target, err)
		return ""
	}
	defer unlock()
	c, err := client.Connect(ctx, h.Config)
	if err != nil {
		fmt.Fprintf(h.Stderr, "bgtask hook gemini: the wake-ups of %s: %v\n", target, err)
		return ""
	}
	defer c.Close()
	if _, err := handoff.Next(ctx, c, 0); err != nil && !errors.Is(err, client.ErrUnacknowledged) {
		fmt.Fprintf(h.Stderr, "bgtask hook gemini: the wake-ups of %s: %v\n", target, err)
	}
	return text.String()
}

// wakeupLines is how the session is given wake-ups, by a waiter or BeforeAgent:
// each prompt after "bgtask wake-up:", which tells it apart from the output
// around it (the task id 'bgtask add' printed, which may be another task's).
func wakeupLines(batch []client.Wakeup) string {
	var b strings.Builder
	for _, w := range batch {
		fmt.Fprintf(&b, "bgtask wake-up: %s\n", strings.TrimRight(w.Prompt, "\n"))
	}
	return b.String()
}

// dropped says that a message of the inbox that is no wake-up was dropped:
// never readable, it would hold every later wake-up of the session.
func dropped(w io.Writer, target string, d *client.Delivery) {
	fmt.Fprintf(w, "bgtask: dropped an unreadable message from inbox %s (%v): %.200q\n", target, d.Err, d.Raw)
}
