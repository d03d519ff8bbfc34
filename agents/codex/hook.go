package codex

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/bgtask/bgtask/client"
)

// BusyTTL ends a thread's busy state by itself: a Codex killed in a turn runs
// no Stop hook, and must not hold its wake-ups for ever.
const BusyTTL = 30 * time.Minute

// hookBound bounds a hook's wait for the bgtask server: a hook holds the Codex
// turn, and a server that is down must not.
const hookBound = 5 * time.Second

// Hook is one run of `bgtask setup codex hook`, the handler of each hook bgtask
// installs in Codex.
type Hook struct {
	// Config reaches the bgtask server; Home is its home, in whose StateDir the
	// delivers a hook starts write their logs.
	Config client.Config
	Home   string
	// Bgtask is the command line that runs bgtask on that home (the binary,
	// --home HOME): a hook starts `Bgtask setup codex deliver --thread ID`.
	Bgtask []string
}

// Run handles the event Codex wrote on stdin: UserPromptSubmit marks the
// thread's target busy (for BusyTTL at most), Stop idle; a resumed session's
// SessionStart, and UserPromptSubmit (a resume of a thread the daemon still
// holds runs no SessionStart), hand over what the thread's inbox holds, in a
// deliver of its own that the hook does not wait for. A hook never fails the
// Codex turn it runs in: its caller says the error on stderr, and exits 0.
func (h Hook) Run(ctx context.Context, stdin io.Reader) error {
	var in HookInput
	if err := json.NewDecoder(io.LimitReader(stdin, 1<<20)).Decode(&in); err != nil {
		return fmt.Errorf("read the hook's input: %w", err)
	}
	if CheckThread(in.SessionID) != nil {
		return fmt.Errorf("session_id %q cannot name a target", in.SessionID)
	}
	target := TargetPrefix + in.SessionID
	state := client.TargetIdle
	switch in.Event {
	case "UserPromptSubmit":
		state = client.TargetBusy
		if err := h.spawnDeliver(in.SessionID, in.Event); err != nil {
			return err
		}
	case "Stop":
	case "SessionStart":
		// Only a resumed thread can have wake-ups pending; a new one has no inbox yet.
		if in.Source != "resume" {
			return nil
		}
		// The session is still starting, and the turns the wake-ups open come after it.
		if err := h.spawnDeliver(in.SessionID, in.Event); err != nil {
			return err
		}
	default:
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, hookBound)
	defer cancel()
	return client.MarkSession(ctx, h.Config, target, state, BusyTTL)
}

// spawnDeliver hands the thread what its inbox holds, in a process of its own
// (the hook that asks for it, from event, must not wait for Codex). What it did
// goes to the thread's log, as nobody reads its output.
func (h Hook) spawnDeliver(thread, event string) error {
	dir := filepath.Join(h.Home, StateDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	logFile, err := os.OpenFile(filepath.Join(dir, thread+".log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logFile.Close()
	fmt.Fprintf(logFile, "%s %s: deliver --thread %s\n", time.Now().UTC().Format(time.RFC3339), event, thread)
	argv := append(append([]string(nil), h.Bgtask...), "setup", "codex", "deliver", "--thread", thread)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	return cmd.Process.Release()
}
