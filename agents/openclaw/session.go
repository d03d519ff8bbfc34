package openclaw

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/bgtask/bgtask/client"
)

// The variables bgtask's plugin sets for every exec command of an OpenClaw agent.
const (
	// SessionEnv is the key of the session the command runs for, such as
	// agent:main:main.
	SessionEnv = "BGTASK_OPENCLAW_SESSION"
	// URLEnv is the gateway's /hooks/agent URL, as setup read it from OpenClaw's
	// configuration.
	URLEnv = "BGTASK_OPENCLAW_URL"
)

// BearerName is the bearer token, declared in bgtask's home, that the sink of
// Sink sends: the gateway's hook token.
const BearerName = "openclaw"

// BusyTTL ends a session's busy state by itself: a gateway killed in a turn runs
// no agent_end, and its session's wake-ups would wait for good.
const BusyTTL = 30 * time.Minute

// targetPrefix starts the target of every OpenClaw session.
const targetPrefix = "openclaw-"

// Target is the inbox of the OpenClaw session key: openclaw- and the key with
// every character a target name cannot hold (':' above all) made '_', or, for a
// key too long for a name, its start and a hash of it. Keys that differ only
// there share a target, and so its busy state; their wake-ups still go each to
// its own session, which the origin names.
func Target(key string) string {
	name := targetPrefix + strings.Map(func(r rune) rune {
		if r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' {
			return r
		}
		return '_'
	}, key)
	if len(name) > maxTarget {
		sum := sha256.Sum256([]byte(key))
		name = name[:maxTarget-17] + "-" + hex.EncodeToString(sum[:8])
	}
	return name
}

// maxTarget is the longest name a target may have (client.ValidName).
const maxTarget = 128

// Origin is the origin of a task registered from the session key: its runtime
// and the key, which the sink's body sends back as sessionKey.
func Origin(key string) map[string]string {
	return map[string]string{"runtime": "openclaw", "session": key}
}

// Sink is the push sink that hands a task's wake-up to the OpenClaw session of
// its origin, through the gateway's /hooks/agent at url: a turn in that session
// (sessionMode persistent) whose prompt is the wake-up's, answered once the turn
// has run (waitForCompletion), with no announcement of the turn's reply to the
// main session (deliver false: that would start a second turn there). A turn can
// take minutes, hence the attempt's timeout; a retry joins the run in flight, as
// it carries the same Idempotency-Key. A gateway that is down is retried for the
// sink's default retry_for, a day.
func Sink(url string) map[string]any {
	return map[string]any{
		"type":   "webhook",
		"url":    url,
		"bearer": BearerName,
		"body": json.RawMessage(`{"message": "{{prompt}}", "name": "bgtask", "sessionKey": "{{origin.session}}", ` +
			`"sessionMode": "persistent", "waitForCompletion": true, "deliver": false}`),
		"timeout": "10m",
	}
}

// hookBound bounds a hook's wait for the bgtask server, which may be down.
const hookBound = 10 * time.Second

// Hook is `bgtask hook openclaw busy|idle KEY`, run by bgtask's plugin as a turn
// of the session starts and ends: the session's target is marked busy (for
// BusyTTL at most) or idle, and its wake-ups wait while it is busy.
type Hook struct {
	Config client.Config
}

// Run marks the target of the session key busy or idle.
func (h Hook) Run(ctx context.Context, state, key string) error {
	if state != client.TargetBusy && state != client.TargetIdle {
		return fmt.Errorf("state %q: want busy or idle", state)
	}
	if strings.TrimSpace(key) == "" {
		return fmt.Errorf("no session key")
	}
	ctx, cancel := context.WithTimeout(ctx, hookBound)
	defer cancel()
	return client.MarkSession(ctx, h.Config, Target(key), state, BusyTTL)
}
