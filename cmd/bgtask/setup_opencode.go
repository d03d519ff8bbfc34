package main

import (
	"errors"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/agents/opencode"
	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/internal/serverhome"
)

func setupOpencodeCmd(g *globals) *cobra.Command {
	var (
		scope  string
		remove bool
	)
	cmd := &cobra.Command{
		Use:   "opencode",
		Short: "Install the plugin that wakes a running opencode session when its tasks end",
		Long: `Write bgtask's plugin, bgtask.js, into opencode's plugins directory:
$XDG_CONFIG_HOME/opencode/plugins (default ~/.config/opencode/plugins) with
--scope user (the default), .opencode/plugins of the current directory with
--scope project. No other file is touched, and the plugin needs no package.

Then the commands of opencode's shell tool get OPENCODE_SESSION_ID, so a task
that 'bgtask add' registers there goes to the session's target
(opencode-SESSION_ID); the session's turns mark it busy and idle; and its
wake-ups come back to it, each once: one that comes while the session is open
(in the TUI or 'opencode serve') starts a new turn, at once when the session is
idle, after its turn when it is busy; one that came while it was closed comes
with the next message the session gets ('opencode -s ID', 'opencode run -s ID').

Running setup again changes nothing; --remove takes the plugin out. A file of
that name that bgtask did not write is refused. See docs/opencode.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sc, err := opencode.ParseScope(scope)
			if err != nil {
				return usageErr("--scope: %v", err)
			}
			exe, home, err := g.setupPaths()
			if err != nil {
				return err
			}
			err = opencode.Setup{Scope: sc, Remove: remove, Bgtask: exe, Home: home, Stdout: g.stdout, Stderr: g.stderr}.Run()
			if errors.As(err, new(*opencode.PluginError)) {
				return &exitError{code: client.ExitUsage, err: err}
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&scope, "scope", string(opencode.ScopeUser), "user: opencode's global plugins directory; project: .opencode/plugins of the current directory")
	f.BoolVar(&remove, "remove", false, "take bgtask's plugin out again")
	return cmd
}

func hookOpencodeCmd(g *globals) *cobra.Command {
	var live bool
	cmd := &cobra.Command{
		Use:   "opencode session ID",
		Short: "The helper of bgtask's opencode plugin for one session (started by the plugin)",
		Long: `Serve bgtask's opencode plugin for session ID, in JSON lines on stdin and stdout:
the plugin writes the session's states ({"state": "busy"} or "idle": the target
opencode-ID is marked so, busy for 30 minutes at most) and its answers to
offers ({"taken": true}, or false with "error"); the helper offers the session's
wake-ups ({"offer": TEXT}), first what is pending now (or {"none": true}),
then, with --live, each that comes. A wake-up is acknowledged once the plugin
answers that opencode recorded its message; otherwise it goes back to the inbox.
One helper of a session waits at a time. It ends when stdin does; what went
wrong goes to opencode/opencode.log in the bgtask home.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[0] != "session" {
				return usageErr("want: opencode session ID")
			}
			if err := opencode.CheckSession(args[1]); err != nil {
				return usageErr("%v", err)
			}
			cfg, err := g.clientConfig("bgtask-opencode-plugin")
			if err != nil {
				return err
			}
			home, err := serverhome.Dir(g.home)
			if err != nil {
				return err
			}
			// The helper ends with its stdin, giving back what it offered and opencode
			// did not take; the terminal's signals, which reach opencode's process
			// group, are opencode's to act on (SIGTERM still ends it the same way).
			signal.Ignore(syscall.SIGHUP, syscall.SIGINT)
			s := &opencode.Session{Config: cfg, Home: home, ID: args[1], Live: live,
				In: cmd.InOrStdin(), Out: cmd.OutOrStdout(), Log: opencode.LogFile(home)}
			return s.Run(cmd.Context())
		},
	}
	cmd.Flags().BoolVar(&live, "live", false, "offer each wake-up that comes while the session is open, not only what is pending now")
	return cmd
}
