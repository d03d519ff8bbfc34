package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"

	"github.com/bgtask/bgtask/agents/openclaw"
	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/internal/serverhome"
)

// agentSession is the agent session a command runs in, as its runtime tells its
// tools through the environment.
type agentSession struct {
	target string            // the session's inbox: claude-ID, codex-ID, gemini-ID or openclaw-KEY
	origin map[string]string // the runtime and the session's id, for the wake-up's reader
	// deliver is the push sink that hands the wake-up to the session, for a runtime
	// whose live session bgtask reaches only that way (Codex, OpenClaw).
	deliver []map[string]any
}

// sessionVars are the variables an agent runtime sets for the commands its tools run,
// in the order they are looked at.
var sessionVars = []struct{ name, runtime, prefix, key string }{
	{"CLAUDE_CODE_SESSION_ID", "claude-code", "claude-", "session_id"},
	{"CODEX_THREAD_ID", "codex", "codex-", "thread_id"},
	// Set by bgtask's opencode plugin (bgtask setup opencode).
	{"OPENCODE_SESSION_ID", "opencode", "opencode-", "session_id"},
	// Gemini CLI gives it to its hooks only; the waiter of a shell call that
	// registers a task gives it to that call ('bgtask hook gemini attach').
	{"GEMINI_SESSION_ID", "gemini", "gemini-", "session_id"},
	// Set by bgtask's OpenClaw plugin (bgtask setup openclaw).
	{openclaw.SessionEnv, "openclaw", "", "session"},
}

// currentSession is the agent session of this process's environment, if any; home
// is the --home given to this command ("": the default), which a Codex session's
// delivery sink is to use too. An id
// that cannot name a target is reported on warn and ignored: the task then goes to
// the default target rather than failing a command that named no target at all.
func currentSession(getenv func(string) string, home string, warn io.Writer) (agentSession, bool) {
	for _, v := range sessionVars {
		id := getenv(v.name)
		if id == "" {
			continue
		}
		if v.runtime == "openclaw" {
			return openClawSession(getenv, id, warn), true
		}
		target := v.prefix + id
		if !client.ValidName(target) {
			fmt.Fprintf(warn, "bgtask: %s=%q cannot name a target (1-128 letters, digits, '-' or '_'); the wake-up goes to the default target\n", v.name, id)
			return agentSession{}, false
		}
		s := agentSession{target: target, origin: map[string]string{"runtime": v.runtime, v.key: id}}
		if v.runtime == "codex" {
			s.deliver = codexDeliverSink(getenv, home, id)
		}
		return s, true
	}
	return agentSession{}, false
}

// applySession sends the wake-up back to the session that registered the task: its
// target and origin, unless the spec or a flag already says where it goes.
func applySession(doc map[string]any, s agentSession) {
	if _, ok := doc["target"]; !ok {
		doc["target"] = s.target
	}
	if _, ok := doc["origin"]; !ok {
		origin, _ := json.Marshal(s.origin)
		doc["origin"] = json.RawMessage(origin)
	}
	if _, ok := doc["deliver"]; !ok && s.deliver != nil {
		doc["deliver"] = s.deliver
	}
}

// openClawSession is the OpenClaw session key, as bgtask's plugin gives it to
// exec commands: its target, and the webhook sink to the gateway's /hooks/agent
// that the plugin names too.
func openClawSession(getenv func(string) string, key string, warn io.Writer) agentSession {
	s := agentSession{target: openclaw.Target(key), origin: openclaw.Origin(key)}
	if url := getenv(openclaw.URLEnv); url != "" {
		s.deliver = []map[string]any{openclaw.Sink(url)}
	} else {
		fmt.Fprintf(warn, "bgtask: %s is not set, so the wake-up stays in the inbox of %s: run 'bgtask setup openclaw' again\n", openclaw.URLEnv, s.target)
	}
	return s
}

// codexDeliverSink is the exec sink that hands a Codex thread's wake-ups to it
// ('bgtask setup codex deliver'). It runs in the bgtask server's environment, so
// it names this bgtask, its home and the Codex home of the session, and the codex
// program if this environment has one on PATH.
func codexDeliverSink(getenv func(string) string, homeFlag, thread string) []map[string]any {
	exe, err := os.Executable()
	if err != nil {
		return nil
	}
	home, err := serverhome.Dir(homeFlag)
	if err != nil {
		return nil
	}
	argv := []string{exe, "--home", home, "setup", "codex", "deliver", "--thread", thread}
	if dir := getenv("CODEX_HOME"); dir != "" {
		argv = append(argv, "--codex-home", dir)
	}
	if p, err := exec.LookPath("codex"); err == nil {
		argv = append(argv, "--codex", p)
	}
	return []map[string]any{{"type": "exec", "argv": argv, "timeout": "3m"}}
}
