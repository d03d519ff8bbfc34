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
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/agents/codex"
	"github.com/bgtask/bgtask/events"
)

// codexBusyTTL ends a Codex thread's busy state by itself: a Codex killed in a
// turn runs no Stop hook, and must not hold its wake-ups for ever.
const codexBusyTTL = 30 * time.Minute

// codexHookTimeout bounds a hook's wait for the bgtask server: a hook holds the
// Codex turn, and a server that is down must not.
const codexHookTimeout = 5 * time.Second

// codexStepTimeout bounds one run of the codex CLI while handing a wake-up over.
const codexStepTimeout = time.Minute

func setupCodexCmd(g *globals) *cobra.Command {
	var (
		remove    bool
		codexHome string
	)
	cmd := &cobra.Command{
		Use:   "codex",
		Short: "Make the Codex CLI's sessions get the wake-ups of the tasks they registered",
		Long: `Install bgtask's hooks in $CODEX_HOME/hooks.json (default ~/.codex/hooks.json),
keeping every other hook there: a prompt (typed or queued) marks the thread's
target codex-THREAD busy, the end of a turn idle, and a resumed session gets
the wake-ups still pending for it after its first turn (Codex runs the
SessionStart hook as that turn starts). Codex asks once, at the next session start,
to review the new hooks: trust them. --remove takes bgtask's hooks out again.

What needs no setup: 'bgtask add' run by Codex's shell tool sees CODEX_THREAD_ID,
so its task's target is codex-THREAD and, unless the spec names its own push
sinks, it gets an exec sink running 'bgtask setup codex deliver --thread THREAD'
when it fires. That hands each pending wake-up of the thread to Codex with
'codex queue --resume': the running session (TUI or app-server) gets it as a new
turn, at once when idle, else after the turn that runs; a closed session's
thread is resumed in Codex's app-server daemon and runs the turn there.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir, err := codexHomeDir(codexHome)
			if err != nil {
				return err
			}
			path := filepath.Join(dir, "hooks.json")
			if remove {
				return removeCodexHooks(g, path)
			}
			exe, err := os.Executable()
			if err != nil {
				return fmt.Errorf("where is this bgtask binary: %w", err)
			}
			home, err := homeDir(g.home)
			if err != nil {
				return err
			}
			command := shellQuote(exe) + " --home " + shellQuote(home) + codex.HookCommandSuffix
			return installCodexHooks(g, path, command)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&remove, "remove", false, "take bgtask's hooks out of the Codex configuration")
	f.StringVar(&codexHome, "codex-home", "", "Codex's configuration directory (default $CODEX_HOME, else ~/.codex)")
	cmd.AddCommand(codexDeliverCmd(g), codexHookCmd(g))
	return cmd
}

// codexHomeDir is Codex's configuration directory: flag, else $CODEX_HOME, else ~/.codex.
func codexHomeDir(flag string) (string, error) {
	dir := flag
	if dir == "" {
		dir = os.Getenv("CODEX_HOME")
	}
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("no home directory: give --codex-home or set CODEX_HOME: %w", err)
		}
		dir = filepath.Join(home, ".codex")
	}
	return filepath.Abs(dir)
}

func installCodexHooks(g *globals, path, command string) error {
	old, mode, err := readConfigFile(path)
	if err != nil {
		return err
	}
	data, err := codex.InstallHooks(old, command)
	if err != nil {
		return fmt.Errorf("%s: %w; fix or move it, nothing was changed", path, err)
	}
	if bytes.Equal(old, data) {
		fmt.Fprintf(g.stdout, "bgtask's hooks are already in %s\n", path)
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	if err := writeConfigFile(path, data, mode); err != nil {
		return err
	}
	fmt.Fprintf(g.stdout, "installed bgtask's hooks (%s) in %s\nThe next Codex session asks you to review them: trust them, or the thread's busy/idle state is not followed.\n",
		strings.Join(codex.HookEvents, ", "), path)
	return nil
}

func removeCodexHooks(g *globals, path string) error {
	old, mode, err := readConfigFile(path)
	if err != nil {
		return err
	}
	if has, err := codex.HasHooks(old); err != nil {
		return fmt.Errorf("%s: %w; fix or move it, nothing was changed", path, err)
	} else if !has {
		fmt.Fprintf(g.stdout, "no hook of bgtask's in %s\n", path)
		return nil
	}
	data, empty, err := codex.RemoveHooks(old)
	if err != nil {
		return err
	}
	if empty {
		err = os.Remove(path)
	} else {
		err = writeConfigFile(path, data, mode)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(g.stdout, "removed bgtask's hooks from %s\n", path)
	return nil
}

// readConfigFile reads a configuration file that may not exist yet (nil, 0600).
func readConfigFile(path string) ([]byte, fs.FileMode, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0o600, nil
	}
	if err != nil {
		return nil, 0, err
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, 0, err
	}
	return data, st.Mode().Perm(), nil
}

// writeConfigFile replaces path with data: a reader (Codex starting a session)
// sees the old file or the new one, never half of one.
func writeConfigFile(path string, data []byte, mode fs.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// shellQuote quotes s for the POSIX shell Codex runs a hook's command with.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func codexDeliverCmd(g *globals) *cobra.Command {
	var o codexDelivery
	cmd := &cobra.Command{
		Use:   "deliver --thread ID",
		Short: "Hand the pending wake-ups of a Codex thread to Codex, each as a new turn",
		Long: `Read the inbox of target codex-ID and hand each wake-up's prompt to the thread
with 'codex queue --thread ID --message PROMPT --resume' (starting Codex's
app-server daemon first if it is not running), acknowledging each only after
Codex took it. The running session gets a new turn with the prompt; a closed one
is resumed in the daemon. A wake-up Codex did not take stays in the inbox and
the command exits 1, so that the exec sink that runs it tries again. A thread
that a live 'codex exec' process holds takes the message from the queue and
drops it as the process exits (openai/codex#41060): wake a closed exec thread,
not a running one.

'bgtask add' in a Codex session adds this as the task's exec sink.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !events.ValidToken("codex-" + o.thread) {
				return usageErr("--thread %q: a Codex thread id (letters, digits, '-' or '_')", o.thread)
			}
			return o.run(cmd.Context(), g)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.thread, "thread", "", "the Codex thread (CODEX_THREAD_ID)")
	f.StringVar(&o.codex, "codex", "", "the codex program (default: codex on PATH, else the one of Codex's app-server daemon under the Codex home)")
	f.StringVar(&o.codexHome, "codex-home", "", "Codex's configuration directory (default $CODEX_HOME, else ~/.codex)")
	g.timeoutFlag(cmd)
	_ = cmd.MarkFlagRequired("thread")
	return cmd
}

// codexMaxArg is the most one argument of a program can carry on Linux
// (MAX_ARG_STRLEN, 32 pages, its terminating NUL included).
const codexMaxArg = 128 << 10

// codexDelivery hands a thread's pending wake-ups to Codex.
type codexDelivery struct {
	thread, codex, codexHome string
	daemonUp                 bool
}

func (o *codexDelivery) run(ctx context.Context, g *globals) error {
	home, err := codexHomeDir(o.codexHome)
	if err != nil {
		return err
	}
	o.codexHome = home
	if o.codex, err = findCodex(o.codex, home); err != nil {
		return err
	}
	c, js, err := g.streamClient()
	if err != nil {
		return err
	}
	defer c.Close()
	target := "codex-" + o.thread
	cons, err := events.InboxConsumer(ctx, js, target)
	if err != nil {
		return err
	}
	for {
		batch, err := cons.FetchNoWait(16)
		if consumerNotPlacedYet(ctx, err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("read inbox %s: %w", target, err)
		}
		n := 0
		var failed error
		for msg := range batch.Messages() {
			n++
			if failed != nil {
				// Handed over in order: a later one waits for the one that failed.
				_ = msg.Nak()
				continue
			}
			if failed = o.handOver(ctx, g, msg); failed != nil {
				_ = msg.Nak()
			}
		}
		if failed != nil {
			return failed
		}
		if err := batch.Error(); n == 0 && consumerNotPlacedYet(ctx, err) {
			continue
		} else if err != nil && !errors.Is(err, context.Canceled) && ctx.Err() == nil {
			return fmt.Errorf("read inbox %s: %w", target, err)
		}
		if n == 0 {
			return nil
		}
	}
}

// handOver queues one wake-up's prompt in the thread and acknowledges it.
func (o *codexDelivery) handOver(ctx context.Context, g *globals, msg jetstream.Msg) error {
	var w events.Wakeup
	if err := json.Unmarshal(msg.Data(), &w); err != nil || w.ID == "" {
		// Never readable: it would hold every later wake-up of the thread.
		fmt.Fprintf(g.stderr, "bgtask: dropped an unreadable wake-up from inbox codex-%s (%v): %.200q\n", o.thread, err, msg.Data())
		if err := msg.Term(); err != nil {
			return fmt.Errorf("drop an unreadable wake-up: %w", err)
		}
		return nil
	}
	if !o.daemonUp {
		// queue --resume resumes the thread only on a running daemon; without one the
		// message would wait for the next 'codex resume'. Starting a running one is a
		// no-op.
		_ = msg.InProgress()
		if out, err := o.runCodex(ctx, "app-server", "daemon", "start"); err != nil {
			return fmt.Errorf("start Codex's app-server daemon: %w: %s", err, lastLine(out))
		}
		o.daemonUp = true
	}
	_ = msg.InProgress()
	out, err := o.runCodex(ctx, "queue", "--thread", o.thread, "--message="+codexPromptArg(w.Prompt), "--resume")
	if err != nil {
		return fmt.Errorf("codex queue --thread %s: %w: %s", o.thread, err, lastLine(out))
	}
	switch codex.ParseQueueOutput(out) {
	case codex.QueuedNotResumed:
		fmt.Fprintf(g.stderr, "bgtask: Codex queued wake-up %s but could not resume thread %s now; it runs at the thread's next resume: %s\n", w.ID, o.thread, lastLine(out))
	case codex.HeldElsewhere:
		// The process that holds the thread takes it from the queue at the end of its
		// turn: a TUI runs it, a `codex exec` about to exit drops it (#41060).
		fmt.Fprintf(g.stderr, "bgtask: thread %s is open in a Codex process of its own, which takes wake-up %s from Codex's queue (a 'codex exec' drops it: openai/codex#41060)\n", o.thread, w.ID)
	}
	if err := msg.DoubleAck(ctx); err != nil {
		return fmt.Errorf("acknowledge wake-up %s (Codex has it): %w", w.ID, err)
	}
	fmt.Fprintf(g.stdout, "wake-up %s handed to Codex thread %s\n", w.ID, o.thread)
	return nil
}

// codexPromptArg is the prompt as one argument "--message=PROMPT" can carry: a
// longer one is cut, at a character's start, with a line saying so.
func codexPromptArg(prompt string) string {
	// A NUL would end the argument: the kernel refuses it.
	prompt = strings.ReplaceAll(prompt, "\x00", "")
	room := codexMaxArg - 1 - len("--message=")
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

// runCodex runs the codex CLI with the Codex home, and without bgtask's per-wake-up
// variables: a daemon it starts would pass them to every later shell command.
func (o *codexDelivery) runCodex(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, codexStepTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, o.codex, args...)
	var env []string
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "BGTASK_") && name != "BGTASK_HOME" || name == "CODEX_HOME" {
			continue
		}
		env = append(env, kv)
	}
	cmd.Env = append(env, "CODEX_HOME="+o.codexHome)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = time.Second // the daemon it starts keeps no copy of the pipes open for long
	err := cmd.Run()
	if errors.Is(err, exec.ErrWaitDelay) {
		err = nil
	}
	return out.String(), err
}

// findCodex is the codex program: flag, else codex on PATH, else the copy Codex
// installs for its app-server daemon under its home (a Codex shell tool's PATH and
// a bgtask server's often lack the npm one).
func findCodex(flag, codexHome string) (string, error) {
	if flag != "" {
		return flag, nil
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

func codexHookCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:    "hook",
		Short:  "Run as a Codex hook (installed by 'bgtask setup codex'): the event is read from stdin",
		Hidden: true,
		Args:   cobra.NoArgs,
		// A hook never fails the Codex turn it runs in, and writes nothing on stdout,
		// which Codex would read as the hook's decision: what went wrong goes to stderr.
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := codexHook(cmd.Context(), g, cmd.InOrStdin()); err != nil {
				fmt.Fprintf(g.stderr, "bgtask: codex hook: %v\n", err)
			}
			return nil
		},
	}
}

func codexHook(ctx context.Context, g *globals, stdin io.Reader) error {
	var in codex.HookInput
	if err := json.NewDecoder(io.LimitReader(stdin, 1<<20)).Decode(&in); err != nil {
		return fmt.Errorf("read the hook's input: %w", err)
	}
	target := "codex-" + in.SessionID
	if !events.ValidToken(target) {
		return fmt.Errorf("session_id %q cannot name a target", in.SessionID)
	}
	g.timeout = codexHookTimeout
	st := events.TargetState{State: events.TargetIdle, Since: time.Now().UTC()}
	switch in.Event {
	case "UserPromptSubmit":
		until := st.Since.Add(codexBusyTTL)
		st.State, st.Until = events.TargetBusy, &until
	case "Stop":
	case "SessionStart":
		// Only a resumed thread can have wake-ups pending; a new one has no inbox yet.
		if in.Source != "resume" {
			return nil
		}
		// Handed over by a process of its own: the session is still starting, and the
		// turns the wake-ups open come after it.
		if err := spawnCodexDeliver(g, in.SessionID); err != nil {
			return err
		}
	default:
		return nil
	}
	return g.withTargets(ctx, func(ctx context.Context, targets *events.Targets) error {
		return targets.Set(ctx, target, st)
	})
}

func spawnCodexDeliver(g *globals, thread string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	home, err := homeDir(g.home)
	if err != nil {
		return err
	}
	cmd := exec.Command(exe, "--home", home, "setup", "codex", "deliver", "--thread", thread)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	return cmd.Process.Release()
}
