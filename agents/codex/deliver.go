package codex

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/bgtask/bgtask/client"
)

// TargetPrefix names a thread's target: codex-THREAD_ID.
const TargetPrefix = "codex-"

// CheckThread says why id cannot be a thread's, if it cannot: its target,
// TargetPrefix+id, must be a valid one.
func CheckThread(id string) error {
	if client.CheckTarget(TargetPrefix+id) != nil {
		return fmt.Errorf("thread %q: a Codex thread id is letters, digits, '-' or '_'", id)
	}
	return nil
}

// StateDir, in the bgtask home, holds each thread's lock and ledger
// (codex-THREAD.lock, codex-THREAD.handed: client.Handoff's) and the log of the
// delivers its hooks start (THREAD.log).
const StateDir = "codex"

// DeliverBound bounds one deliver, the wait for the thread's lock included: it
// ends by itself before the exec sink's timeout (3m) would kill it in the middle
// of a hand-over, and one a hook started, which nobody waits for, ends at all.
const DeliverBound = 2 * time.Minute

// stepBound bounds one run of the codex CLI while a wake-up is handed over.
const stepBound = time.Minute

// maxArg is the most one argument of a program can carry on Linux
// (MAX_ARG_STRLEN, 32 pages, its terminating NUL included).
const maxArg = 128 << 10

// Delivery is `bgtask setup codex deliver`: the pending wake-ups of a thread
// handed to Codex, each as a new turn, with `codex queue --resume`.
type Delivery struct {
	Thread string
	// Codex is the codex program (FindCodex), CodexHome its configuration.
	Codex, CodexHome string
	// Dir holds the thread's lock and ledger: StateDir of the bgtask home.
	Dir string
	// Stdout is told what was handed over, Stderr what Codex did not do at once.
	Stdout, Stderr io.Writer

	daemonUp bool
}

// Run hands the thread's pending wake-ups to Codex, one at a time and in
// order, within ctx. One deliver of a thread runs at a time: a second waits for
// the first, then reads what is left, so one that finds nothing knows its
// wake-up was handed over. A wake-up Codex took is never queued again; one
// whose `codex queue` was cut short is queued again by the next deliver (at
// least once). A wake-up Codex did not take stays in the inbox, and Run fails.
func (d *Delivery) Run(ctx context.Context, c *client.Client) error {
	h := &client.Handoff{Target: TargetPrefix + d.Thread, Dir: d.Dir, Deliver: d.queue, Dropped: d.dropped,
		Redeliver: true}
	unlock, err := h.Lock(ctx, true)
	if err != nil {
		return fmt.Errorf("wait for the other deliver of thread %s: %w", d.Thread, err)
	}
	defer unlock()
	_, err = h.Pending(ctx, c)
	return err
}

// queue queues the wake-up's prompt in the thread (a batch of one).
func (d *Delivery) queue(ctx context.Context, batch []client.Wakeup) error {
	w := batch[0]
	if !d.daemonUp {
		// queue --resume resumes the thread only on a running daemon; without one the
		// message would wait for the next 'codex resume'. Starting a running one is a
		// no-op; the daemon detaches itself (a session of its own), so the exec sink's
		// timeout, which kills this process group, does not reach it.
		if out, err := d.runCodex(ctx, "app-server", "daemon", "start"); err != nil {
			return fmt.Errorf("start Codex's app-server daemon: %w: %s", err, lastLine(out))
		}
		d.daemonUp = true
	}
	out, err := d.runCodex(ctx, "queue", "--thread", d.Thread, "--message="+PromptArg(w.Prompt), "--resume")
	if err != nil {
		return fmt.Errorf("codex queue --thread %s: %w: %s", d.Thread, err, lastLine(out))
	}
	switch ParseQueueOutput(out) {
	case QueuedNotResumed:
		fmt.Fprintf(d.Stderr, "bgtask: Codex queued wake-up %s but could not resume thread %s now; it runs at the thread's next resume: %s\n", w.ID, d.Thread, lastLine(out))
	case HeldElsewhere:
		// The process that holds the thread takes it from the queue at the end of its
		// turn: a TUI runs it, a `codex exec` about to exit drops it (#41060).
		fmt.Fprintf(d.Stderr, "bgtask: thread %s is open in a Codex process of its own, which takes wake-up %s from Codex's queue (a 'codex exec' drops it: openai/codex#41060)\n", d.Thread, w.ID)
	}
	fmt.Fprintf(d.Stdout, "wake-up %s handed to Codex thread %s\n", w.ID, d.Thread)
	return nil
}

// dropped says that a message of the inbox that is no wake-up was dropped:
// never readable, it would hold every later wake-up of the thread.
func (d *Delivery) dropped(m *client.Delivery) {
	fmt.Fprintf(d.Stderr, "bgtask: dropped an unreadable wake-up from inbox %s%s (%v): %.200q\n", TargetPrefix, d.Thread, m.Err, m.Raw)
}

// PromptArg is the prompt as one argument "--message=PROMPT" can carry: a
// longer one is cut, at a character's start, with a line saying so.
func PromptArg(prompt string) string {
	// A NUL would end the argument: the kernel refuses it.
	prompt = strings.ReplaceAll(prompt, "\x00", "")
	room := maxArg - 1 - len("--message=")
	if len(prompt) <= room {
		return prompt
	}
	marker := fmt.Sprintf("\n[bgtask: prompt cut from %d bytes to what one argument carries; see 'bgtask logs' for the rest]", len(prompt))
	cut := room - len(marker)
	for cut > 0 && !utf8.RuneStart(prompt[cut]) {
		cut--
	}
	return prompt[:cut] + marker
}

// runCodex runs the codex CLI with the Codex home, and without bgtask's
// per-wake-up variables: a daemon it starts would pass them to every later
// shell command.
func (d *Delivery) runCodex(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, stepBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.Codex, args...)
	var env []string
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "BGTASK_") && name != "BGTASK_HOME" || name == "CODEX_HOME" {
			continue
		}
		env = append(env, kv)
	}
	cmd.Env = append(env, "CODEX_HOME="+d.CodexHome)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = time.Second // the daemon it starts keeps no copy of the pipes open for long
	err := cmd.Run()
	if errors.Is(err, exec.ErrWaitDelay) {
		err = nil
	}
	return out.String(), err
}

// FindCodex is the codex program: path if given, else codex on PATH, else the
// copy Codex installs for its app-server daemon under codexHome (a Codex shell
// tool's PATH and a bgtask server's often lack the npm one).
func FindCodex(path, codexHome string) (string, error) {
	if path != "" {
		return path, nil
	}
	if p, err := exec.LookPath("codex"); err == nil {
		return p, nil
	}
	managed := filepath.Join(codexHome, "packages", "app-server-daemon", "current", "bin", "codex")
	if st, err := os.Stat(managed); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
		return managed, nil
	}
	return "", fmt.Errorf("no codex program: not on PATH, not at %s; give --codex", managed)
}

func lastLine(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return lines[len(lines)-1]
}
