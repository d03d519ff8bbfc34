package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/agents/codex"
	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/serverhome"
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
A hooks.json that is a symbolic link stays one: the file it leads to is changed,
keeping its owner and mode; a link that leads nowhere is refused. The hooks run
this binary by its path, but the model runs 'bgtask add' by name in your login
shell: setup warns when '$SHELL -lc' does not find bgtask.

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
			home, err := serverhome.Dir(g.home)
			if err != nil {
				return err
			}
			command := shellQuote(exe) + " --home " + shellQuote(home) + codex.HookCommandSuffix
			if err := installCodexHooks(g, path, command); err != nil {
				return err
			}
			warnUnlessOnLoginPath(cmd.Context(), g, exe)
			return nil
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
	f, err := readConfigFile(path, 0o600)
	if err != nil {
		return err
	}
	data, err := codex.InstallHooks(f.data, command)
	if err != nil {
		return fmt.Errorf("%s: %w; fix or move it, nothing was changed", path, err)
	}
	if bytes.Equal(f.data, data) {
		fmt.Fprintf(g.stdout, "bgtask's hooks are already in %s\n", path)
		return nil
	}
	if err := f.write(data, 0o700); err != nil {
		return err
	}
	fmt.Fprintf(g.stdout, "installed bgtask's hooks (%s) in %s\nThe next Codex session asks you to review them: trust them, or the thread's busy/idle state is not followed.\n",
		strings.Join(codex.HookEvents, ", "), path)
	return nil
}

func removeCodexHooks(g *globals, path string) error {
	f, err := readConfigFile(path, 0o600)
	if err != nil {
		return err
	}
	if has, err := codex.HasHooks(f.data); err != nil {
		return fmt.Errorf("%s: %w; fix or move it, nothing was changed", path, err)
	} else if !has {
		fmt.Fprintf(g.stdout, "no hook of bgtask's in %s\n", path)
		return nil
	}
	data, empty, err := codex.RemoveHooks(f.data)
	if err != nil {
		return err
	}
	// A file only bgtask's hooks filled goes, unless a link leads to it: the
	// user's link would then lead nowhere.
	if empty && !f.linked() {
		err = os.Remove(path)
	} else {
		err = f.write(data, 0o700)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(g.stdout, "removed bgtask's hooks from %s\n", path)
	return nil
}

// loginShellBound bounds the login shell that setup asks where bgtask is: a
// profile that waits for input must not hold setup.
const loginShellBound = 10 * time.Second

// warnUnlessOnLoginPath warns when the user's login shell, which Codex's shell
// tool runs the model's commands in, does not find bgtask: the hooks call exe by
// its path, the model's 'bgtask add' calls it by name.
func warnUnlessOnLoginPath(ctx context.Context, g *globals, exe string) {
	shell, found, err := loginShellFinds(ctx, "bgtask")
	switch {
	case err != nil:
		fmt.Fprintf(g.stderr, "bgtask: warning: could not ask your login shell (%s -l) whether bgtask is on its PATH, as Codex's shell tool needs: %v\n", shell, err)
	case !found:
		fmt.Fprintf(g.stderr, "bgtask: warning: your login shell (%s -l), which Codex's shell tool runs commands in, does not find bgtask on its PATH:\n"+
			"the hooks run %s by its path, but the model's 'bgtask add' will fail with \"command not found\".\n"+
			"Add %s to PATH in your shell's login profile (~/.profile, ~/.bash_profile or ~/.zprofile), or link bgtask into a directory on it.\n",
			shell, exe, filepath.Dir(exe))
	}
}

// loginShellFinds reports whether the user's login shell ($SHELL, else bash),
// run as Codex runs it (-l -c), finds the command name. The shell runs in a
// process group of its own, and past loginShellBound gets SIGTERM, which runs
// the exit traps of a profile holding a lock.
func loginShellFinds(ctx context.Context, name string) (shell string, found bool, err error) {
	shell = os.Getenv("SHELL")
	if shell == "" {
		shell = "bash"
	}
	ctx, cancel := context.WithTimeout(ctx, loginShellBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, shell, "-lc", "command -v "+name)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = time.Second // a child of the profile may hold stdout open
	out, err := cmd.Output()
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		return shell, false, fmt.Errorf("it did not answer within %s", loginShellBound)
	case errors.As(err, &exit):
		return shell, false, nil // command -v: not found
	case err != nil:
		return shell, false, err
	}
	// A profile may print: the answer is the last line.
	out = bytes.TrimSpace(out)
	return shell, filepath.IsAbs(string(out[bytes.LastIndexByte(out, '\n')+1:])), nil
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
with 'codex queue --thread ID --message=PROMPT --resume' (starting Codex's
app-server daemon first if it is not running), one at a time and in order,
acknowledging each only after Codex took it. The running session gets a new
turn with the prompt; a closed one is resumed in the daemon. A prompt longer
than one argument carries (128 KiB) is cut, with a line saying so.

One deliver of a thread runs at a time (a lock under the bgtask home; a second
waits, then reads what is left), for at most 2 minutes. A wake-up Codex took is
recorded in the home's codex/ID.handed before it is acknowledged, and is never
queued again; one whose 'codex queue' was cut short is queued again (at least
once). A wake-up Codex did not take stays in the inbox and the command exits 1,
so that the exec sink that runs it tries again. A thread that a live 'codex
exec' process holds takes the message from the queue and drops it as the
process exits (openai/codex#41060): wake a closed exec thread, not a running one.

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

// codexDeliverDeadline bounds one deliver run, the wait for the thread's lock
// included: it ends by itself before the exec sink's timeout (3m) would kill it
// in the middle of a handover, and a detached run (SessionStart) ends at all.
var codexDeliverDeadline = 2 * time.Minute

// codexMaxArg is the most one argument of a program can carry on Linux
// (MAX_ARG_STRLEN, 32 pages, its terminating NUL included).
const codexMaxArg = 128 << 10

// codexProgressEvery is how often a wake-up being handed over is told to the
// inbox as in progress: well within its ack wait, so no other reader gets it.
const codexProgressEvery = 3 * time.Second

// codexDelivery hands a thread's pending wake-ups to Codex.
type codexDelivery struct {
	thread, codex, codexHome string
	daemonUp                 bool
	handed                   *handedLog
}

func (o *codexDelivery) run(ctx context.Context, g *globals) error {
	ctx, cancel := context.WithTimeout(ctx, codexDeliverDeadline)
	defer cancel()
	home, err := codexHomeDir(o.codexHome)
	if err != nil {
		return err
	}
	o.codexHome = home
	if o.codex, err = findCodex(o.codex, home); err != nil {
		return err
	}
	dir, err := codexStateDir(g)
	if err != nil {
		return err
	}
	// One deliver at a time per thread: a second one waits, then reads what is
	// left, so a run that finds nothing knows its wake-up was handed over.
	unlock, err := lockThread(ctx, filepath.Join(dir, o.thread+".lock"))
	if err != nil {
		return fmt.Errorf("wait for the other deliver of thread %s: %w", o.thread, err)
	}
	defer unlock()
	if o.handed, err = openHandedLog(filepath.Join(dir, o.thread+".handed")); err != nil {
		return err
	}
	openCtx, cancel := g.bounded(ctx)
	defer cancel()
	c, err := g.open(openCtx, g.timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	js, err := jetstream.New(c.Conn())
	if err != nil {
		return err
	}
	target := "codex-" + o.thread
	cons, err := events.InboxConsumer(ctx, js, target)
	if err != nil {
		return err
	}
	for {
		// One at a time: a message fetched is pending for this reader only, and each
		// is kept in progress while it is handed over.
		batch, err := cons.FetchNoWait(1)
		if noConsumerYet(ctx, err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("read inbox %s: %w", target, err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			if err := o.handOver(ctx, g, msg); err != nil {
				return err
			}
		}
		if err := batch.Error(); n == 0 && noConsumerYet(ctx, err) {
			continue
		} else if err != nil && !errors.Is(err, context.Canceled) && ctx.Err() == nil {
			return fmt.Errorf("read inbox %s: %w", target, err)
		}
		if n == 0 {
			return ctx.Err()
		}
	}
}

// handOver queues one wake-up's prompt in the thread and acknowledges it. A
// wake-up the log marks handed is only acknowledged: Codex has it already.
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
	if o.handed.state(w.ID) == handedDone {
		return o.ack(ctx, g, msg, w.ID)
	}
	stop := keepInProgress(msg)
	defer stop()
	if !o.daemonUp {
		// queue --resume resumes the thread only on a running daemon; without one the
		// message would wait for the next 'codex resume'. Starting a running one is a
		// no-op; the daemon detaches itself (a session of its own), so the exec sink's
		// timeout, which kills this process group, does not reach it.
		if out, err := o.runCodex(ctx, "app-server", "daemon", "start"); err != nil {
			_ = msg.Nak()
			return fmt.Errorf("start Codex's app-server daemon: %w: %s", err, lastLine(out))
		}
		o.daemonUp = true
	}
	// Recorded before Codex may have it: a run killed while queue runs leaves
	// "handing", and the next run queues it again (at least once).
	if err := o.handed.set(w.ID, handedHanding); err != nil {
		_ = msg.Nak()
		return err
	}
	out, err := o.runCodex(ctx, "queue", "--thread", o.thread, "--message="+codexPromptArg(w.Prompt), "--resume")
	if err != nil {
		_ = msg.Nak()
		return fmt.Errorf("codex queue --thread %s: %w: %s", o.thread, err, lastLine(out))
	}
	// Codex has it: from here on it is never queued again, only acknowledged.
	if err := o.handed.set(w.ID, handedDone); err != nil {
		return err
	}
	switch codex.ParseQueueOutput(out) {
	case codex.QueuedNotResumed:
		fmt.Fprintf(g.stderr, "bgtask: Codex queued wake-up %s but could not resume thread %s now; it runs at the thread's next resume: %s\n", w.ID, o.thread, lastLine(out))
	case codex.HeldElsewhere:
		// The process that holds the thread takes it from the queue at the end of its
		// turn: a TUI runs it, a `codex exec` about to exit drops it (#41060).
		fmt.Fprintf(g.stderr, "bgtask: thread %s is open in a Codex process of its own, which takes wake-up %s from Codex's queue (a 'codex exec' drops it: openai/codex#41060)\n", o.thread, w.ID)
	}
	return o.ack(ctx, g, msg, w.ID)
}

// ack acknowledges a wake-up Codex has, trying again: left unacknowledged it is
// redelivered after the ack wait, and the next run acknowledges it then.
func (o *codexDelivery) ack(ctx context.Context, g *globals, msg jetstream.Msg, id string) error {
	var err error
	for range 3 {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = msg.DoubleAck(actx)
		cancel()
		if err == nil {
			fmt.Fprintf(g.stdout, "wake-up %s handed to Codex thread %s\n", id, o.thread)
			return o.handed.set(id, "")
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("acknowledge wake-up %s (Codex has it): %w", id, err)
		case <-time.After(500 * time.Millisecond):
		}
	}
	return fmt.Errorf("acknowledge wake-up %s (Codex has it; the next deliver acknowledges it): %w", id, err)
}

// keepInProgress tells the inbox, until stop, that msg is being handed over.
func keepInProgress(msg jetstream.Msg) (stop func()) {
	_ = msg.InProgress()
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(codexProgressEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(done); <-finished })
	}
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

// codexStateDir is where deliver keeps its per-thread files: under the bgtask home.
func codexStateDir(g *globals) (string, error) {
	home, err := serverhome.Dir(g.home)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(home, "codex")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	return dir, nil
}

// lockThread takes an exclusive flock on path, waiting for it until ctx ends.
func lockThread(ctx context.Context, path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, err
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

const (
	handedHanding = "handing" // codex queue was started: Codex may have it
	handedDone    = "handed"  // codex queue exited 0: Codex has it
)

// handedLog is the file of a thread's wake-ups handed to Codex and not yet known
// acknowledged, one "STATE ID" a line. Each change is on disk before the step it
// records: a run that dies anywhere leaves it true.
type handedLog struct {
	path string
	ids  map[string]string
}

func openHandedLog(path string) (*handedLog, error) {
	l := &handedLog{path: path, ids: map[string]string{}}
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if state, id, ok := strings.Cut(line, " "); ok && (state == handedHanding || state == handedDone) {
			l.ids[id] = state
		}
	}
	return l, nil
}

func (l *handedLog) state(id string) string { return l.ids[id] }

// set records id's state ("" forgets it: acknowledged) and syncs the file.
func (l *handedLog) set(id, state string) error {
	if state == "" {
		delete(l.ids, id)
	} else {
		l.ids[id] = state
	}
	var b strings.Builder
	for _, id := range slices.Sorted(maps.Keys(l.ids)) {
		fmt.Fprintf(&b, "%s %s\n", l.ids[id], id)
	}
	if err := serverhome.ReplaceFile(l.path, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("record wake-up %s as %q in %s: %w", id, state, l.path, err)
	}
	return nil
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
		// A resume of a thread the daemon still holds runs no SessionStart: what its
		// inbox holds is handed over from the user's first prompt, for the turn after.
		if err := spawnCodexDeliver(g, in.SessionID, in.Event); err != nil {
			return err
		}
	case "Stop":
	case "SessionStart":
		// Only a resumed thread can have wake-ups pending; a new one has no inbox yet.
		if in.Source != "resume" {
			return nil
		}
		// Handed over by a process of its own: the session is still starting, and the
		// turns the wake-ups open come after it.
		if err := spawnCodexDeliver(g, in.SessionID, in.Event); err != nil {
			return err
		}
	default:
		return nil
	}
	ttl := time.Duration(0)
	if st.Until != nil {
		ttl = st.Until.Sub(st.Since)
	}
	return g.withClient(ctx, func(ctx context.Context, c *client.Client) error {
		return c.SetTarget(ctx, target, st.State, ttl)
	})
}

// spawnCodexDeliver hands the thread what its inbox holds, in a process of its own
// (the hook that asks for it, from event, must not wait for Codex).
func spawnCodexDeliver(g *globals, thread, event string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	home, err := serverhome.Dir(g.home)
	if err != nil {
		return err
	}
	dir, err := codexStateDir(g)
	if err != nil {
		return err
	}
	// Nobody reads its output: what it did goes to a file of the thread's.
	logFile, err := os.OpenFile(filepath.Join(dir, thread+".log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logFile.Close()
	fmt.Fprintf(logFile, "%s %s: deliver --thread %s\n", time.Now().UTC().Format(time.RFC3339), event, thread)
	cmd := exec.Command(exe, "--home", home, "setup", "codex", "deliver", "--thread", thread)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	return cmd.Process.Release()
}

// noConsumerYet says whether a fetch found no consumer to answer it, as happens
// on a cluster just after the consumer was created; it waits a moment before the
// caller asks again.
func noConsumerYet(ctx context.Context, err error) bool {
	if !errors.Is(err, nats.ErrNoResponders) || ctx.Err() != nil {
		return false
	}
	select {
	case <-ctx.Done():
	case <-time.After(100 * time.Millisecond):
	}
	return true
}
