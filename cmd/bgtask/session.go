package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/bgtask/bgtask/events"
)

// agentSession is the agent session a command runs in, as its runtime tells its
// tools through the environment.
type agentSession struct {
	target string            // the session's inbox: claude-ID or codex-ID
	origin map[string]string // the runtime and the session's id, for the wake-up's reader
}

// sessionVars are the variables an agent runtime sets for the commands its tools run,
// in the order they are looked at.
var sessionVars = []struct{ name, runtime, prefix, key string }{
	{"CLAUDE_CODE_SESSION_ID", "claude-code", "claude-", "session_id"},
	{"CODEX_THREAD_ID", "codex", "codex-", "thread_id"},
}

// currentSession is the agent session of this process's environment, if any. An id
// that cannot name a target is reported on warn and ignored: the task then goes to
// the default target rather than failing a command that named no target at all.
func currentSession(getenv func(string) string, warn io.Writer) (agentSession, bool) {
	for _, v := range sessionVars {
		id := getenv(v.name)
		if id == "" {
			continue
		}
		target := v.prefix + id
		if !events.ValidToken(target) {
			fmt.Fprintf(warn, "bgtask: %s=%q cannot name a target (1-128 letters, digits, '-' or '_'); the wake-up goes to the default target\n", v.name, id)
			return agentSession{}, false
		}
		return agentSession{target: target, origin: map[string]string{"runtime": v.runtime, v.key: id}}, true
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
}
