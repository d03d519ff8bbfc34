package main

import (
	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/agents/openclaw"
)

func setupOpenClawCmd(g *globals) *cobra.Command {
	var (
		remove   bool
		stateDir string
	)
	cmd := &cobra.Command{
		Use:   "openclaw",
		Short: "Make OpenClaw sessions get the wake-ups of the tasks they registered, each as one turn",
		Long: `Edit OpenClaw's configuration ($OPENCLAW_CONFIG_PATH, else
$OPENCLAW_STATE_DIR/openclaw.json, default ~/.openclaw/openclaw.json), keeping
everything else in it, so that the wake-up of a task an OpenClaw agent registered
with 'bgtask add' comes back to the session it came from as one agent turn:

  - hooks: enabled, allowRequestSessionKey true, and "agent:" among
    allowedSessionKeyPrefixes (with "hook:" when there were none), which
    /hooks/agent needs to run a turn in a named session; a hooks.token is made
    when there is none.
  - plugins: bgtask's plugin, written into bgtask's home, loaded
    (plugins.load.paths) and enabled with the conversation hooks it uses
    (plugins.entries.bgtask). It gives every exec command its session key
    (BGTASK_OPENCLAW_SESSION) and the gateway's /hooks/agent URL, and marks the
    session busy in bgtask while a turn runs (bgtask hook openclaw).

The gateway's hook token goes to the bgtask server of this home (its
bearers/openclaw.json, read at each push, sent to the gateway's /hooks/agent
only), never into a spec. A task registered from an OpenClaw session then gets a
webhook sink that posts to /hooks/agent with waitForCompletion in that session:
the gateway answers once the turn ran, and a post repeated after a crash (the
same Idempotency-Key) replays that answer rather than run a second turn.

Run it on the host of the gateway and of the bgtask server; run it again after
changing gateway.port, hooks.path or hooks.token. A running gateway applies the
change by itself (hybrid reload). --remove takes all of it out: the plugin, the
token, and the hooks settings as they were before setup. OpenClaw reads JSON5;
setup edits only a configuration written as plain JSON, as OpenClaw writes it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path, err := openclaw.ConfigPath(stateDir)
			if err != nil {
				return err
			}
			exe, home, err := g.setupPaths()
			if err != nil {
				return err
			}
			return openclaw.Setup{Config: path, Remove: remove, Bgtask: exe, Home: home, Stdout: g.stdout, Stderr: g.stderr}.Run()
		},
	}
	f := cmd.Flags()
	f.BoolVar(&remove, "remove", false, "take bgtask's plugin, hooks settings and token out again")
	f.StringVar(&stateDir, "state-dir", "", "OpenClaw's state directory, which holds openclaw.json (default $OPENCLAW_STATE_DIR, else ~/.openclaw)")
	return cmd
}

func hookOpenClawCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "openclaw busy|idle SESSION_KEY",
		Short: "OpenClaw's turn hooks (run by the plugin 'bgtask setup openclaw' installs)",
		Long: `Mark the target of an OpenClaw session busy (as a turn starts; for 30 minutes at
most) or idle (as it ends): the wake-ups of the session's tasks are pushed
between its turns, since a /hooks/agent turn started in a session that runs
another makes that one fail.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := g.clientConfig("bgtask-openclaw-hook")
			if err != nil {
				return err
			}
			return openclaw.Hook{Config: cfg}.Run(cmd.Context(), args[0], args[1])
		},
	}
}
