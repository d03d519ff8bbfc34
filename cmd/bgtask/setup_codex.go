package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/agents/codex"
	"github.com/bgtask/bgtask/internal/serverhome"
)

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
			dir, err := codex.HomeDir(codexHome)
			if err != nil {
				return err
			}
			exe, home, err := g.setupPaths()
			if err != nil {
				return err
			}
			return codex.Setup{CodexHome: dir, Remove: remove, Bgtask: exe, Home: home, Stdout: g.stdout, Stderr: g.stderr}.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.BoolVar(&remove, "remove", false, "take bgtask's hooks out of the Codex configuration")
	f.StringVar(&codexHome, "codex-home", "", "Codex's configuration directory (default $CODEX_HOME, else ~/.codex)")
	cmd.AddCommand(codexDeliverCmd(g), codexHookCmd(g))
	return cmd
}

func codexDeliverCmd(g *globals) *cobra.Command {
	var thread, program, codexHome string
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
recorded in the home's codex/codex-ID.handed before it is acknowledged, and is
never queued again; one whose 'codex queue' was cut short is queued again (at
least once). A wake-up Codex did not take stays in the inbox and the command
exits 1, so that the exec sink that runs it tries again. A thread that a live
'codex exec' process holds takes the message from the queue and drops it as the
process exits (openai/codex#41060): wake a closed exec thread, not a running one.

'bgtask add' in a Codex session adds this as the task's exec sink.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := codex.CheckThread(thread); err != nil {
				return usageErr("--thread: %v", err)
			}
			dir, err := codex.HomeDir(codexHome)
			if err != nil {
				return err
			}
			if program, err = codex.FindCodex(program, dir); err != nil {
				return err
			}
			home, err := serverhome.Dir(g.home)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), codex.DeliverBound)
			defer cancel()
			openCtx, cancelOpen := g.bounded(ctx)
			defer cancelOpen()
			c, err := g.open(openCtx, g.timeout)
			if err != nil {
				return err
			}
			defer c.Close()
			d := &codex.Delivery{Thread: thread, Codex: program, CodexHome: dir, Dir: filepath.Join(home, codex.StateDir), Stdout: g.stdout, Stderr: g.stderr}
			return d.Run(ctx, c)
		},
	}
	f := cmd.Flags()
	f.StringVar(&thread, "thread", "", "the Codex thread (CODEX_THREAD_ID)")
	f.StringVar(&program, "codex", "", "the codex program (default: codex on PATH, else the one of Codex's app-server daemon under the Codex home)")
	f.StringVar(&codexHome, "codex-home", "", "Codex's configuration directory (default $CODEX_HOME, else ~/.codex)")
	g.timeoutFlag(cmd)
	_ = cmd.MarkFlagRequired("thread")
	return cmd
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
			if err := codexHook(cmd, g); err != nil {
				fmt.Fprintf(g.stderr, "bgtask: codex hook: %v\n", err)
			}
			return nil
		},
	}
}

func codexHook(cmd *cobra.Command, g *globals) error {
	cfg, err := g.clientConfig("bgtask-codex-hook")
	if err != nil {
		return err
	}
	home, err := serverhome.Dir(g.home)
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	hook := codex.Hook{Config: cfg, Home: home, Bgtask: []string{exe, "--home", home}}
	return hook.Run(cmd.Context(), cmd.InOrStdin())
}
