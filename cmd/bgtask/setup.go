package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/internal/serverhome"
)

func setupCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "setup",
		Short: "Install what an agent runtime needs to be woken by bgtask",
		Long: `Install, in an agent runtime's own configuration, what makes the wake-up of a task
that a session registered reach that session while it runs, and at its next start
when it was closed. Each subcommand is idempotent, leaves the runtime's other
settings alone, and takes out what it installed with --remove.`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(setupClaudeCodeCmd(g), setupCodexCmd(g), setupOpencodeCmd(g), setupGeminiCmd(g), setupOpenClawCmd(g))
	return cmd
}

func hookCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "hook",
		Short: "Run as an agent runtime's hook (installed by 'bgtask setup')",
		Args:  cobra.NoArgs,
		// A hook writes what it hands over to a pipe of its runtime's, which may be
		// gone: the write then fails (EPIPE) and the hand-off gives the wake-up back
		// to the inbox, where SIGPIPE would end the hook in the middle of it and
		// leave the wake-up handing.
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			signal.Ignore(syscall.SIGPIPE)
			return cmd.Root().PersistentPreRunE(cmd, args)
		},
	}
	cmd.AddCommand(hookClaudeCodeCmd(g), hookOpencodeCmd(g), hookGeminiCmd(g), hookOpenClawCmd(g))
	return cmd
}

// setupPaths are what every setup writes into a runtime's configuration: this
// bgtask binary, which its hooks run, and the home they run it on.
func (g *globals) setupPaths() (exe, home string, err error) {
	if exe, err = os.Executable(); err != nil {
		return "", "", fmt.Errorf("find this bgtask binary, which the runtime's hooks run: %w", err)
	}
	home, err = serverhome.Dir(g.home)
	return exe, home, err
}
