package main

import (
	"encoding/json"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/client"
	mcpserver "github.com/bgtask/bgtask/internal/mcp"
)

func mcpCmd(g *globals) *cobra.Command {
	var progressEvery time.Duration
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve bgtask to an agent as an MCP server on stdin and stdout",
		Long: `Serve the Model Context Protocol on stdin and stdout, for an agent runtime that
starts it ('claude mcp add bgtask -- bgtask mcp'; docs/mcp.md). It ends when its
input closes. A line that is not a JSON-RPC message gets its JSON-RPC error
(-32700 or -32600), and the session goes on.

Tools: add (register a task: a command and any other spec field), join (one
wake-up for a group), show, list, logs, cancel, complete (end a task from
outside) and wait (with consume: the wake-up it returns wakes nobody again).
Resources: each task as bgtask://tasks/ID, its view as JSON.

add does what 'bgtask add' does: the default cwd is this server's working
directory, which places the task on this host; inside an agent session
(CLAUDE_CODE_SESSION_ID or CODEX_THREAD_ID set) a task that names no target
wakes that session. Each call waits for the server as a client command does,
through a restart of it, up to --timeout. A wait sends a progress notification
every --progress-every to a client that asked for them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if progressEvery <= 0 {
				return usageErr("--progress-every %s: want a positive duration", progressEvery)
			}
			cfg, err := mcpConfig(g)
			if err != nil {
				return err
			}
			cfg.ProgressEvery = progressEvery
			return mcpserver.Serve(cmd.Context(), cfg, cmd.InOrStdin(), g.stdout)
		},
	}
	g.timeoutFlag(cmd)
	cmd.Flags().DurationVar(&progressEvery, "progress-every", mcpserver.DefaultProgressEvery, "how often a wait sends a progress notification to a client that gave a progress token")
	return cmd
}

// mcpConfig is what `bgtask mcp` serves with: the deployment and the --timeout
// of its flags, and what `bgtask add` run here would default a task to.
func mcpConfig(g *globals) (mcpserver.Config, error) {
	deployment, err := g.clientConfig("bgtask-mcp")
	if err != nil {
		return mcpserver.Config{}, err
	}
	cwd, err := os.Getwd()
	if err != nil {
		return mcpserver.Config{}, err
	}
	// Held before the environment is read: a variable that holds a credential,
	// under any name, stays here.
	g.holdCredentials()
	cfg := mcpserver.Config{Client: deployment, Timeout: g.timeout, Stderr: g.stderr, Version: version(),
		Cwd: cwd, Host: hostName(), Env: callerEnv(os.Environ(), ""),
		Describe: func(t client.Task) string {
			var text strings.Builder
			_ = printTask(&text, t)
			return text.String()
		}}
	if s, ok := currentSession(os.Getenv, g.home, g.stderr); ok {
		cfg.Session, err = mcpSession(s)
	}
	return cfg, err
}

// mcpSession is the agent session s as the MCP server takes it.
func mcpSession(s agentSession) (*mcpserver.Session, error) {
	origin, err := json.Marshal(s.origin)
	if err != nil {
		return nil, err
	}
	session := &mcpserver.Session{Target: s.target, Origin: origin}
	if s.deliver != nil {
		raw, err := json.Marshal(s.deliver)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(raw, &session.Deliver); err != nil {
			return nil, err
		}
	}
	return session, nil
}
