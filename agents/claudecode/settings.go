package claudecode

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/bgtask/bgtask/agents/internal/setup"
)

// CommandMarker is in the command of every hook bgtask installs: the bgtask
// subcommand that handles them, followed by the event (or Wake).
const CommandMarker = " hook claude-code "

// Wake is the argument of the hook that waits for the session's wake-ups.
const Wake = "wake"

// HookTimeoutSeconds bounds bgtask's quick hooks (they mark the session busy or idle
// and give up sooner than this).
const HookTimeoutSeconds = 10

// WakeTimeoutSeconds is how long Claude Code lets the waiting hook run before it
// stops it with SIGTERM: a week. Claude Code counts it in milliseconds with a timer
// that cannot hold more than 2^31-1 ms (24.8 days).
const WakeTimeoutSeconds = 7 * 24 * 3600

// RewakeMessage and RewakeSummary are what Claude Code puts before the wake-up's
// prompt in the new turn, and shows in the terminal, when the waiting hook hands one
// over (exit status 2; Claude Code's own default names it "Stop hook feedback").
const (
	RewakeMessage = "bgtask wake-up:"
	RewakeSummary = "bgtask: a background task finished"
)

// Scope is where the hooks go: the user's settings (~/.claude/settings.json) or a
// project's (.claude/settings.json).
type Scope string

const (
	ScopeUser    Scope = "user"
	ScopeProject Scope = "project"
)

// ParseScope reads a --scope value.
func ParseScope(s string) (Scope, error) {
	switch Scope(s) {
	case ScopeUser, ScopeProject:
		return Scope(s), nil
	}
	return "", fmt.Errorf("scope %q: use user or project", s)
}

// Handler is one hook bgtask installs.
type Handler struct {
	Event string
	// Arg is what the command is run with: the event, or Wake.
	Arg string
	// Wait: the handler runs in the background and wakes the session when it exits 2.
	Wait bool
}

// Handlers are the hooks of a scope, in the order they are installed. A turn that
// starts (a prompt, or a wake-up's own turn) marks the session busy, one that ends
// idle; a waiter is started at every occasion so that one always runs while the
// session does (at most one per session runs, the others exit at once): at the end
// of each turn, during each turn, and after each tool call, which may have
// registered a task.
//
// A project's SessionStart hooks run at startup and resume in the background
// without the power to wake the session (Claude Code 2.1.328 turns asyncRewake off
// for them), so a waiter there would take a wake-up and lose it: in that scope the
// wake-ups pending at start wait for the first turn's waiter.
func Handlers(scope Scope) []Handler {
	hs := []Handler{{Event: "SessionStart", Arg: "SessionStart"}}
	if scope == ScopeUser {
		hs = append(hs, Handler{Event: "SessionStart", Arg: Wake, Wait: true})
	}
	return append(hs,
		Handler{Event: "UserPromptSubmit", Arg: "UserPromptSubmit"},
		Handler{Event: "UserPromptSubmit", Arg: Wake, Wait: true},
		Handler{Event: "PostToolUse", Arg: Wake, Wait: true},
		Handler{Event: "Stop", Arg: "Stop"},
		Handler{Event: "Stop", Arg: Wake, Wait: true},
		Handler{Event: "SessionEnd", Arg: "SessionEnd"},
	)
}

// IsOurs reports whether a hook's command is one of bgtask's.
func IsOurs(command string) bool { return strings.Contains(command+" ", CommandMarker) }

// groups are the matcher groups of bgtask's hooks: one per event, in the order the
// events first appear in Handlers. prefix is the command that runs bgtask, with its
// global flags.
func groups(prefix string, scope Scope) (events []string, byEvent map[string]json.RawMessage) {
	type handler struct {
		Type          string `json:"type"`
		Command       string `json:"command"`
		Timeout       int    `json:"timeout"`
		AsyncRewake   bool   `json:"asyncRewake,omitempty"`
		RewakeMessage string `json:"rewakeMessage,omitempty"`
		RewakeSummary string `json:"rewakeSummary,omitempty"`
	}
	type group struct {
		Matcher string    `json:"matcher,omitempty"`
		Hooks   []handler `json:"hooks"`
	}
	all := map[string]*group{}
	for _, h := range Handlers(scope) {
		g, ok := all[h.Event]
		if !ok {
			g = &group{}
			if h.Event == "PostToolUse" {
				g.Matcher = "*"
			}
			all[h.Event] = g
			events = append(events, h.Event)
		}
		x := handler{Type: "command", Command: prefix + CommandMarker + h.Arg, Timeout: HookTimeoutSeconds}
		if h.Wait {
			x.Timeout, x.AsyncRewake, x.RewakeMessage, x.RewakeSummary = WakeTimeoutSeconds, true, RewakeMessage, RewakeSummary
		}
		g.Hooks = append(g.Hooks, x)
	}
	byEvent = map[string]json.RawMessage{}
	for event, g := range all {
		byEvent[event], _ = setup.Marshal(g)
	}
	return events, byEvent
}

// Install returns the settings data (empty: no file yet) with bgtask's hooks, run
// through prefix (the shell words that start bgtask), and no other hook of
// bgtask's. Settings that already hold exactly these hooks come back unchanged, byte
// for byte, so a second setup writes nothing.
func Install(data []byte, prefix string, scope Scope) ([]byte, error) {
	doc, err := setup.ParseObject(data, "the settings")
	if err != nil {
		return nil, err
	}
	hooks, err := setup.Hooks(doc)
	if err != nil {
		return nil, err
	}
	events, want := groups(prefix, scope)
	if setup.HooksInstalled(hooks, events, want, IsOurs) {
		return data, nil
	}
	hooks, _ = setup.WithoutHooks(hooks, IsOurs)
	if hooks, err = setup.WithHooks(hooks, events, want); err != nil {
		return nil, err
	}
	encoded, _ := hooks.Encode()
	return doc.Set("hooks", encoded).Indent()
}

// Remove returns the settings data without bgtask's hooks: each handler of bgtask's
// goes, and so does a group, an event and the "hooks" setup.Object that only it had kept
// from being empty. Settings without any come back unchanged.
func Remove(data []byte) ([]byte, error) {
	doc, err := setup.ParseObject(data, "the settings")
	if err != nil {
		return nil, err
	}
	hooks, err := setup.Hooks(doc)
	if err != nil {
		return nil, err
	}
	hooks, removed := setup.WithoutHooks(hooks, IsOurs)
	if !removed {
		return data, nil
	}
	if len(hooks) == 0 {
		doc = doc.Without("hooks")
	} else {
		encoded, _ := hooks.Encode()
		doc = doc.Set("hooks", encoded)
	}
	return doc.Indent()
}
