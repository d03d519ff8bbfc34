package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/agents/claudecode"
	"github.com/bgtask/bgtask/client"
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
			exe, home, err := g.setupPaths()
			if err != nil {
				return err
			}
			err = claudecode.Setup{Scope: sc, Remove: remove, Bgtask: exe, Home: home, Stdout: g.stdout, Stderr: g.stderr}.Run()
			if errors.As(err, new(*claudecode.SettingsError)) {
				return &exitError{code: client.ExitUsage, err: err}
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&scope, "scope", string(claudecode.ScopeUser), "user: ~/.claude/settings.json; project: .claude/settings.json of the current directory")
	f.BoolVar(&remove, "remove", false, "take bgtask's hooks out again")
	return cmd
}

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
			cfg, err := g.clientConfig("bgtask-claude-code-hook")
			var home string
			if err == nil {
				home, err = serverhome.Dir(g.home)
			}
			if err != nil {
				if args[0] != claudecode.Wake { // the waiter's stderr is handed to the session
					fmt.Fprintf(g.stderr, "bgtask hook claude-code: %v\n", err)
				}
				return nil
			}
			hook := claudecode.Hook{Config: cfg, Home: home, Stdin: os.Stdin, Stderr: g.stderr}
			if status := hook.Run(cmd.Context(), args[0]); status != 0 {
				return &exitError{code: status}
			}
			return nil
		},
	}
}
