package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/bgtask/bgtask/agents/claudecode"
	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/serverhome"
)

func setupClaudeCodeCmd(g *globals) *cobra.Command {
	var (
		scope  string
		remove bool
	)
	cmd := &cobra.Command{
		Use:   "claude-code",
		Short: "Install the hooks that wake a running Claude Code session when its tasks end",
		Long: `Install bgtask's hooks into Claude Code's settings: ~/.claude/settings.json with
--scope user (the default), .claude/settings.json of the current directory with
--scope project. Then a task that 'bgtask add' registers from Claude's Bash tool
goes to the session's target (claude-SESSION_ID), and when it ends the session gets
one new turn holding the wake-up's prompt, even while it is idle. A session that
was closed gets its pending wake-ups when it is resumed. The session's turns mark
its target busy and idle.

The hooks run 'bgtask hook claude-code EVENT'. Running setup again changes nothing;
the other settings and hooks are kept as they are; --remove takes out exactly
bgtask's hooks. A settings file that is a symbolic link stays one: the file it
leads to is changed, keeping its owner and mode; a link that leads nowhere is
refused. See docs/claude-code.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sc, err := claudecode.ParseScope(scope)
			if err != nil {
				return usageErr("--scope: %v", err)
			}
			path, prefix, err := claudeSettings(g, sc)
			if err != nil {
				return err
			}
			// 0644 for a new file, as Claude Code writes them.
			f, err := readConfigFile(path, 0o644)
			if err != nil {
				return err
			}
			old := f.data
			var data []byte
			if remove {
				data, err = claudecode.Remove(old)
			} else {
				data, err = claudecode.Install(old, prefix, sc)
			}
			if err != nil {
				return usageErr("%s: %v; nothing was changed", path, err)
			}
			switch {
			case bytes.Equal(data, old) && remove:
				fmt.Fprintf(g.stdout, "No bgtask hooks in %s: nothing to remove.\n", path)
				return nil
			case bytes.Equal(data, old):
				fmt.Fprintf(g.stdout, "The bgtask hooks are already in %s.\n", path)
				return nil
			}
			if err := f.write(data, 0o755); err != nil {
				return err
			}
			if remove {
				fmt.Fprintf(g.stdout, "Removed the bgtask hooks from %s.\n", path)
				return nil
			}
			fmt.Fprintf(g.stdout, "Installed the bgtask hooks in %s. Claude Code sessions started from now on are woken when their tasks end.\n", path)
			if _, err := exec.LookPath("bgtask"); err != nil && sc == claudecode.ScopeProject {
				fmt.Fprintln(g.stderr, "bgtask: warning: bgtask is not on PATH, and a project's hooks run it from there")
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&scope, "scope", string(claudecode.ScopeUser), "user: ~/.claude/settings.json; project: .claude/settings.json of the current directory")
	f.BoolVar(&remove, "remove", false, "take bgtask's hooks out again")
	return cmd
}

// claudeSettings is the settings file of a scope, and the command its hooks start
// bgtask with. The user's hooks name this binary and this home; a project's, which
// are shared with everyone who works on it, name bgtask on PATH and its default home.
func claudeSettings(g *globals, scope claudecode.Scope) (path, prefix string, err error) {
	if scope == claudecode.ScopeProject {
		dir, err := os.Getwd()
		if err != nil {
			return "", "", err
		}
		return filepath.Join(dir, ".claude", "settings.json"), "bgtask", nil
	}
	userHome, err := os.UserHomeDir()
	if err != nil {
		return "", "", fmt.Errorf("no home directory for ~/.claude: %w", err)
	}
	exe, err := os.Executable()
	if err != nil {
		return "", "", fmt.Errorf("find the bgtask binary for the hooks: %w", err)
	}
	home, err := serverhome.Dir(g.home)
	if err != nil {
		return "", "", err
	}
	return filepath.Join(userHome, ".claude", "settings.json"), claudeQuote(exe) + " --home " + claudeQuote(home), nil
}

// claudeQuote quotes s for the shell Claude Code runs a hook's command with.
func claudeQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// claudeHookInput is what Claude Code writes to a hook's stdin that bgtask reads.
type claudeHookInput struct {
	SessionID string `json:"session_id"`
}

// claudeHookBound bounds a quick hook's talk with the server: Claude Code waits for
// it before it goes on.
const claudeHookBound = 3 * time.Second

// claudeBusyTTL ends a session's busy state by itself: a Claude Code killed in a
// turn runs no Stop hook, and its target would stay busy for good.
const claudeBusyTTL = 30 * time.Minute

func hookClaudeCodeCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "claude-code EVENT",
		Short: "Claude Code's hooks (installed by 'bgtask setup claude-code')",
		Long: `Run as one of Claude Code's hooks, reading the hook's JSON on stdin (session_id).
EVENT is UserPromptSubmit (the session's target claude-SESSION_ID is busy, for 30
minutes at most), Stop, SessionStart or SessionEnd (it is idle), or wake: wait for
the target's next wake-ups and hand them to the session (their prompts on stderr,
exit status 2, which Claude Code's asyncRewake turns into a new turn),
acknowledging them only then. Only one wake hook waits per session; the others
exit at once.

A hook never breaks the session: when no server answers, or the input is not
understood, it says so on stderr and exits 0.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			g.stdout = io.Discard // a hook's stdout is read by Claude Code as its answer
			if len(args) != 1 {
				fmt.Fprintf(g.stderr, "bgtask hook claude-code: want one EVENT, got %q\n", args)
				return nil
			}
			// The waiter's stderr is what the session is handed on exit 2: only
			// prompts go there.
			warn := g.stderr
			if args[0] == claudecode.Wake {
				warn = io.Discard
			}
			sid := readClaudeHookInput(warn).SessionID
			if sid == "" {
				sid = os.Getenv("CLAUDE_CODE_SESSION_ID")
			}
			target := "claude-" + sid
			switch {
			case sid == "":
				fmt.Fprintln(warn, "bgtask hook claude-code: no session_id in the hook's input")
				return nil
			case !events.ValidToken(target):
				fmt.Fprintf(warn, "bgtask hook claude-code: session_id %q cannot name a target (1-128 letters, digits, '-' or '_')\n", sid)
				return nil
			}
			switch args[0] {
			case "UserPromptSubmit":
				g.setClaudeTarget(cmd.Context(), target, events.TargetBusy)
			case "Stop", "SessionStart", "SessionEnd":
				g.setClaudeTarget(cmd.Context(), target, events.TargetIdle)
			case claudecode.Wake:
				return g.claudeWake(cmd.Context(), sid, target)
			default:
				fmt.Fprintf(g.stderr, "bgtask hook claude-code: event %q: use UserPromptSubmit, Stop, SessionStart, SessionEnd or %s\n", args[0], claudecode.Wake)
			}
			return nil
		},
	}
}

// readClaudeHookInput reads the hook's JSON from stdin, however large (a tool's
// response may be); what is not there or not understood leaves the fields empty.
func readClaudeHookInput(warn io.Writer) claudeHookInput {
	var in claudeHookInput
	if st, err := os.Stdin.Stat(); err != nil || st.Mode()&fs.ModeCharDevice != 0 {
		return in // a terminal: run by hand
	}
	err := json.NewDecoder(os.Stdin).Decode(&in)
	// Claude Code writes all of its input; a hook that stops reading could block it.
	_, _ = io.Copy(io.Discard, os.Stdin)
	if err != nil && !errors.Is(err, io.EOF) {
		fmt.Fprintf(warn, "bgtask hook claude-code: the hook's input is not JSON: %v\n", err)
	}
	return in
}

// setClaudeTarget records the session's state, within claudeHookBound; a failure is
// only reported.
func (g *globals) setClaudeTarget(ctx context.Context, target, state string) {
	g.timeout = claudeHookBound
	ttl := time.Duration(0)
	if state == client.TargetBusy {
		ttl = claudeBusyTTL
	}
	err := g.withClient(ctx, func(ctx context.Context, c *client.Client) error {
		return c.SetTarget(ctx, target, state, ttl)
	})
	if err != nil {
		fmt.Fprintf(g.stderr, "bgtask hook claude-code: target %s %s: %v\n", state, target, err)
	}
}

// claudeWake is the waiting hook: it holds the session's lock, waits for wake-ups in
// the target's inbox, writes their prompts to stderr, acknowledges them and exits 2.
// It waits through restarts of the server, and ends (exit 0, nothing acknowledged)
// when Claude Code stops it (SIGTERM at the session's end or the hook's timeout) or
// the Claude Code process is gone.
func (g *globals) claudeWake(ctx context.Context, sid, target string) (err error) {
	// A print-mode session (claude -p) runs asyncRewake hooks in the foreground: a
	// waiter would hold it until its timeout.
	if os.Getenv("CLAUDE_CODE_ENTRYPOINT") == "sdk-cli" {
		return nil
	}
	home, err := serverhome.Dir(g.home)
	if err != nil {
		return nil
	}
	defer quietPanic(home, &err)
	dir := filepath.Join(home, claudeSessionsDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil
	}
	lock, held, err := lockClaudeSession(dir, sid)
	if err != nil || !held {
		return nil // unusable, or another hook waits for this session
	}
	defer unlockClaudeSession(lock)
	pruneClaudeSessions(dir, time.Now())
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	claudePID, _ := strconv.Atoi(os.Getenv("CLAUDE_PID"))
	if claudePID > 0 {
		go func() {
			for ctx.Err() == nil && processAlive(claudePID) {
				select {
				case <-ctx.Done():
				case <-time.After(500 * time.Millisecond):
				}
			}
			cancel()
		}()
	}
	w := &claudeWaiter{g: g, handed: handedFile{path: filepath.Join(dir, sid+".handed")}, claudePID: claudePID}
	for ctx.Err() == nil {
		handed, retry := w.waitOnce(ctx, target)
		if handed {
			return &exitError{code: 2}
		}
		if !retry || !claudePause(ctx) {
			return nil
		}
	}
	return nil
}

// quietPanic turns a panic of the waiter into exit status 1 with nothing on stderr:
// Go's own exit status for a panic, 2, would hand its trace to the session as a
// turn. The trace goes to HOME/claude-sessions/panic.log.
func quietPanic(home string, err *error) {
	r := recover()
	if r == nil {
		return
	}
	if f, ferr := os.OpenFile(filepath.Join(home, claudeSessionsDir, "panic.log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600); ferr == nil {
		fmt.Fprintf(f, "%s: bgtask hook claude-code wake: panic: %v\n%s", time.Now().UTC().Format(time.RFC3339), r, debug.Stack())
		f.Close()
	}
	*err = &exitError{code: 1}
}

// claudeSessionsDir, in the home, holds each session's lock and handed file.
const claudeSessionsDir = "claude-sessions"

// claudeAckBound is how long a waiter that wrote its prompts retries their acks:
// the session's turn waits for its exit, and an ack not made by then is made by the
// session's next waiter, which the handed file keeps from handing it over again.
const claudeAckBound = 10 * time.Second

// claudeHandedKeep is how long an entry of a handed file is kept: as long as the
// inbox keeps a wake-up by default, after which it cannot come back.
const claudeHandedKeep = 30 * 24 * time.Hour

// claudeWaiter is one session's waiting hook.
type claudeWaiter struct {
	g         *globals
	handed    handedFile
	claudePID int
}

// waitOnce waits on one connection: handed says wake-ups were handed over, retry
// that the server may come back.
func (w *claudeWaiter) waitOnce(ctx context.Context, target string) (handed, retry bool) {
	nc, err := w.g.claudeConnect()
	if err != nil {
		return false, w.g.serverMayComeBack()
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return false, true
	}
	cons, err := events.InboxConsumer(ctx, js, target)
	if err != nil {
		return false, true
	}
	for ctx.Err() == nil {
		fctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		batch, err := cons.Fetch(1, jetstream.FetchContext(fctx))
		var msgs []jetstream.Msg
		if err == nil {
			for msg := range batch.Messages() {
				msgs = append(msgs, msg)
			}
			err = batch.Error()
		}
		cancel()
		if len(msgs) == 0 {
			if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
				return false, true
			}
			continue
		}
		// Wake-ups that fired together go in the same turn.
		if more, err := cons.FetchNoWait(15); err == nil {
			for msg := range more.Messages() {
				msgs = append(msgs, msg)
			}
		}
		if w.handOver(ctx, w.leftToAWait(ctx, nc, msgs)) {
			return true, true
		}
	}
	return false, false
}

// claudeConsumeBound is how long a waiter leaves a wake-up to a `wait --consume`
// that says it holds it: its print and consume take milliseconds.
const claudeConsumeBound = time.Minute

// leftToAWait takes out of msgs, and acknowledges, the wake-ups that a
// `bgtask wait --consume` in the session returned and consumed: it fetched them
// at once, as the wait saw the task fire, and the turn that waited has them. It
// asks each wake-up's task on consumingSubject until no wait answers; one whose
// wait ended without consuming it (killed, timed out, failed) is kept.
func (w *claudeWaiter) leftToAWait(ctx context.Context, nc *nats.Conn, msgs []jetstream.Msg) []jetstream.Msg {
	var kept []jetstream.Msg
	for _, m := range msgs {
		var wk events.Wakeup
		if json.Unmarshal(m.Data(), &wk) != nil || wk.Notice != "" || !heldByAWait(ctx, nc, wk.ID) {
			kept = append(kept, m)
			continue
		}
		t, err := api.NewClient(nc).Get(ctx, wk.ID)
		if err != nil || !t.Consumed {
			kept = append(kept, m)
			continue
		}
		ackUntil(ctx, m, time.Now().Add(claudeAckBound))
	}
	return kept
}

// heldByAWait reports whether a `wait --consume` of task id answered, and then
// waits, up to claudeConsumeBound, until none does.
func heldByAWait(ctx context.Context, nc *nats.Conn, id string) bool {
	deadline := time.Now().Add(claudeConsumeBound)
	for asked := false; ; asked = true {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := nc.RequestWithContext(rctx, client.ConsumingPrefix+"."+id, nil)
		cancel()
		if err != nil || time.Now().After(deadline) {
			return asked // no one answers (any more): it is the wait's if one did
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// serverMayComeBack reports whether a server ran in the home and nothing says it
// is gone for good.
func (g *globals) serverMayComeBack() bool {
	if g.natsURL != "" {
		return true
	}
	home, err := serverhome.Dir(g.home)
	if err != nil {
		return false
	}
	if _, err := os.Stat(filepath.Join(home, serverhome.CredentialsFile)); err != nil {
		return false
	}
	return serverhome.Gone(home) == nil
}

// claudeConnect is the waiter's connection. nats.go's default error handler writes
// to stderr, which the session would be handed: its errors are dropped.
func (g *globals) claudeConnect() (*nats.Conn, error) {
	return g.connect("bgtask-claude-code-hook", nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
}

// handOver writes the wake-ups' prompts to stderr for Claude Code and acknowledges
// them: the exit status 2 that follows makes them the session's next turn. Their
// keys go to the handed file first, so that one whose ack fails is acknowledged by
// the session's next waiter without being handed over again. A session that is
// gone, or ending, gets nothing, and the wake-ups go back to the inbox. Wake-ups an
// earlier waiter handed over are only acknowledged; handed is false when there were
// only those.
func (w *claudeWaiter) handOver(ctx context.Context, msgs []jetstream.Msg) (handed bool) {
	before, _ := w.handed.read(time.Now())
	var text bytes.Buffer
	var fresh []jetstream.Msg
	var keys []string
	for _, m := range msgs {
		var wk events.Wakeup
		if err := json.Unmarshal(m.Data(), &wk); err != nil {
			fresh, keys = append(fresh, m), append(keys, "")
			if text.Len() > 0 {
				text.WriteByte('\n')
			}
			fmt.Fprintf(&text, "bgtask: an unreadable wake-up in the inbox: %s\n", m.Data())
			continue
		}
		key := handedKey(wk)
		if before[key] {
			if ackUntil(ctx, m, time.Now().Add(claudeAckBound)) {
				_ = w.handed.remove(key)
			}
			continue
		}
		fresh, keys = append(fresh, m), append(keys, key)
		if text.Len() > 0 {
			text.WriteByte('\n')
		}
		_ = printWakeup(&text, wk)
	}
	if len(fresh) == 0 {
		return false
	}
	giveBack := func(acked []bool) {
		for i, m := range fresh {
			if !acked[i] {
				_ = w.handed.remove(keys[i])
				_ = m.Nak()
			}
		}
	}
	acked := make([]bool, len(fresh))
	if ctx.Err() != nil || (w.claudePID > 0 && !processAlive(w.claudePID)) {
		giveBack(acked)
		return false
	}
	if err := w.handed.add(keys...); err != nil {
		giveBack(acked)
		claudePause(ctx) // the wake-ups are back at once: don't spin on a full disk
		return false
	}
	if _, err := w.g.stderr.Write(text.Bytes()); err != nil {
		giveBack(acked)
		return false
	}
	deadline := time.Now().Add(claudeAckBound)
	for i, m := range fresh {
		if ctx.Err() != nil {
			break
		}
		if ackUntil(ctx, m, deadline) {
			acked[i] = true
			_ = w.handed.remove(keys[i])
		}
	}
	// Claude Code drops the output of a hook it stopped: what is not acknowledged
	// yet goes back to be handed over again.
	if ctx.Err() != nil {
		giveBack(acked)
		return false
	}
	return true
}

// ackUntil acknowledges m, again and again until it works, ctx ends or the deadline
// passes.
func ackUntil(ctx context.Context, m jetstream.Msg, deadline time.Time) bool {
	for {
		actx, cancel := context.WithDeadline(ctx, deadline)
		err := m.DoubleAck(actx)
		cancel()
		if err == nil {
			return true
		}
		if ctx.Err() != nil || time.Now().After(deadline) || !claudePause(ctx) {
			return false
		}
	}
}

// handedKey names a wake-up in a handed file: its task, and its notice, as a
// task's stall notice and its end are two wake-ups.
func handedKey(w events.Wakeup) string {
	if w.Notice != "" {
		return w.ID + "/" + w.Notice
	}
	return w.ID
}

// handedFile lists the wake-ups a session's waiter wrote to stderr and has not
// acknowledged yet, one "UNIX-SECONDS KEY" a line. It is removed when it is empty.
type handedFile struct{ path string }

// read is the file's keys not older than claudeHandedKeep at now.
func (h handedFile) read(now time.Time) (map[string]bool, error) {
	data, err := os.ReadFile(h.path)
	if err != nil {
		return map[string]bool{}, err
	}
	keys := map[string]bool{}
	for line := range strings.Lines(string(data)) {
		at, key, ok := strings.Cut(strings.TrimSpace(line), " ")
		sec, err := strconv.ParseInt(at, 10, 64)
		if ok && err == nil && now.Sub(time.Unix(sec, 0)) < claudeHandedKeep {
			keys[key] = true
		}
	}
	return keys, nil
}

// add records keys (empty ones are not recorded) and syncs the file.
func (h handedFile) add(keys ...string) error {
	now := time.Now()
	data, err := os.ReadFile(h.path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for _, k := range keys {
		if k != "" {
			data = fmt.Appendf(data, "%d %s\n", now.Unix(), k)
		}
	}
	return h.write(data, now)
}

// remove takes keys out of the file, and entries older than claudeHandedKeep.
func (h handedFile) remove(keys ...string) error {
	now := time.Now()
	kept, err := h.read(now)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	data, _ := os.ReadFile(h.path)
	var out []byte
	for line := range strings.Lines(string(data)) {
		_, key, _ := strings.Cut(strings.TrimSpace(line), " ")
		if kept[key] && !slices.Contains(keys, key) {
			out = append(out, line...)
		}
	}
	return h.write(out, now)
}

// write replaces the file with data, synced, or removes it when data is empty.
func (h handedFile) write(data []byte, now time.Time) error {
	if len(data) == 0 {
		err := os.Remove(h.path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	tmp := fmt.Sprintf("%s.%d", h.path, now.UnixNano())
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, h.path)
}

// pruneClaudeSessions removes the files of sessions that no waiter wrote for
// claudeHandedKeep: their wake-ups are gone from the inbox, and no waiter runs that
// long (claudecode.WakeTimeoutSeconds), so no lock among them is held.
func pruneClaudeSessions(dir string, now time.Time) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if !strings.Contains(e.Name(), ".handed") && !strings.HasSuffix(e.Name(), ".lock") {
			continue
		}
		if info, err := e.Info(); err == nil && now.Sub(info.ModTime()) > claudeHandedKeep {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

// lockClaudeSession takes the lock that lets one waiting hook run per session. The
// kernel drops it when the hook ends, however it ends. The file is removed when the
// waiter is done, so a lock taken on a file that is no longer the one at its path
// is taken again.
func lockClaudeSession(dir, sid string) (*os.File, bool, error) {
	path := filepath.Join(dir, sid+".lock")
	for {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return nil, false, err
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, false, nil
			}
			return nil, false, fmt.Errorf("lock session %s: %w", sid, err)
		}
		held, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, false, err
		}
		if now, err := os.Stat(path); err == nil && os.SameFile(held, now) {
			return f, true, nil
		}
		f.Close()
	}
}

// unlockClaudeSession removes the session's lock file and lets the lock go.
func unlockClaudeSession(f *os.File) {
	_ = os.Remove(f.Name())
	f.Close()
}

// processAlive reports whether pid is a live process.
func processAlive(pid int) bool {
	return !errors.Is(unix.Kill(pid, 0), unix.ESRCH)
}

// claudePause waits a moment, or until ctx ends (false).
func claudePause(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(200 * time.Millisecond):
		return true
	}
}
