package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/agents/gemini"
	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/internal/serverhome"
)

func setupGeminiCmd(g *globals) *cobra.Command {
	var remove bool
	cmd := &cobra.Command{
		Use:   "gemini",
		Short: "Install the hooks that wake a running Gemini CLI session when its tasks end",
		Long: `Merge bgtask's hooks and two settings into Gemini CLI's user settings,
~/.gemini/settings.json ($GEMINI_CLI_HOME/.gemini/settings.json when that is
set): experimental.modelSteering true and tools.shell.backgroundCompletionBehavior
"inject", with which a background shell command that ends starts a turn of the
idle session. Then a shell call of the model that runs 'bgtask add' is run, in
the background, by a waiter ('bgtask hook gemini attach') that registers the
task for the session (target gemini-SESSION_ID) and, when it ends, prints the
wake-up: the running session gets one new turn holding it, at once when idle,
after the turn that runs when busy. A session that was closed gets its pending
wake-ups with the first turn of 'gemini --resume ID'. The session's turns mark
its target busy and idle.

The hooks run 'bgtask hook gemini EVENT'. Running setup again changes nothing;
the other settings and hooks are kept as they are; --remove takes out exactly
what setup put in (a setting it changed gets its former value back). A settings
file with comments is refused: setup writes JSON and would drop them. A settings
file that is a symbolic link stays one. See docs/gemini.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			exe, home, err := g.setupPaths()
			if err != nil {
				return err
			}
			err = gemini.Setup{Remove: remove, Bgtask: exe, Home: home, Stdout: g.stdout, Stderr: g.stderr}.Run()
			if errors.As(err, new(*gemini.SettingsError)) {
				return &exitError{code: client.ExitUsage, err: err}
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&remove, "remove", false, "take bgtask's hooks and settings out again")
	return cmd
}

func hookGeminiCmd(g *globals) *cobra.Command {
	var pid int
	cmd := &cobra.Command{
		Use:   "gemini EVENT | attach [--pid GEMINI_PID] SESSION_ID -- COMMAND",
		Short: "Gemini CLI's hooks (installed by 'bgtask setup gemini')",
		Long: `Run as one of Gemini CLI's hooks, reading the hook's JSON on stdin (session_id,
tool_input) and answering with JSON on stdout. EVENT is BeforeAgent (the
session's target gemini-SESSION_ID is busy, for 30 minutes at most, and the turn
gets the wake-ups that waited for the session), AfterAgent, SessionStart or
SessionEnd (it is idle), or BeforeTool: a shell call that runs 'bgtask add' is
given back to run in the background as 'attach'.

attach runs COMMAND with GEMINI_SESSION_ID and BGTASK_HOME set (exiting with its
status when it fails), then waits for the session's next wake-up and prints its
prompt: Gemini CLI makes the end of that background command a turn of the
session. It is acknowledged once printed; one waiter waits at a time. It stops,
handing nothing over, when the Gemini CLI process --pid is gone.

A hook never breaks the session: when no server answers, or the input is not
understood, it says so on stderr and answers that nothing changes.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 3 && args[0] == gemini.Attach && cmd.ArgsLenAtDash() == 2 {
				return geminiAttach(cmd.Context(), g, pid, args[1], args[2])
			}
			stdout := g.stdout
			g.stdout = io.Discard // a hook's stdout is read by Gemini CLI as its answer
			if len(args) != 1 {
				fmt.Fprintf(g.stderr, "bgtask hook gemini: want one EVENT, or attach SESSION_ID -- COMMAND; got %q\n", args)
				fmt.Fprintln(stdout, "{}")
				return nil
			}
			// Gemini CLI runs a hook with 'bash -c', which runs it in its stead.
			hook := gemini.Hook{Gemini: os.Getppid(), Stdin: os.Stdin, Stdout: stdout, Stderr: g.stderr}
			var err error
			if hook.Config, hook.Home, hook.Bgtask, err = geminiHookEnv(g); err != nil {
				fmt.Fprintf(g.stderr, "bgtask hook gemini: %v\n", err)
				fmt.Fprintln(stdout, "{}")
				return nil
			}
			hook.Run(cmd.Context(), args[0])
			return nil
		},
	}
	cmd.Flags().IntVar(&pid, "pid", 0, "attach: the Gemini CLI process whose session it waits for")
	return cmd
}

// geminiHookEnv is the server, the home and this bgtask binary, of a Gemini CLI
// hook.
func geminiHookEnv(g *globals) (cfg client.Config, home, exe string, err error) {
	if cfg, err = g.clientConfig("bgtask-gemini-hook"); err != nil {
		return
	}
	if home, err = serverhome.Dir(g.home); err != nil {
		return
	}
	exe, err = os.Executable()
	return cfg, home, exe, err
}

// geminiAttach runs the waiter of a rewritten shell call. Gemini CLI stops a
// background command with SIGHUP when the session ends: the waiter then hands
// nothing over. Its output is a pipe or a terminal of Gemini CLI's: a write
// there once Gemini CLI is gone fails (hookCmd ignores SIGPIPE), and the
// wake-up goes back to the inbox.
func geminiAttach(ctx context.Context, g *globals, gem int, session, command string) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGHUP)
	defer stop()
	if err := client.CheckTarget(gemini.TargetPrefix + session); err != nil {
		return usageErr("session %q cannot name a target (letters, digits, '-' or '_')", session)
	}
	cfg, home, _, err := geminiHookEnv(g)
	if err != nil {
		return err
	}
	w := gemini.Waiter{Session: session, Command: command, Gemini: gem, Config: cfg, Home: home, Stdout: g.stdout, Stderr: g.stderr}
	if status := w.Run(ctx); status != 0 {
		return &exitError{code: status}
	}
	return nil
}
