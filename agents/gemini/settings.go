package gemini

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/bgtask/bgtask/agents/internal/setup"
)

// CommandMarker is in the command of every hook bgtask installs: the bgtask
// subcommand that handles them, followed by the event.
const CommandMarker = " hook gemini "

// HookName names bgtask's hooks in Gemini CLI's /hooks panel and its
// hooksConfig.disabled list.
const HookName = "bgtask"

// Events are the hook events bgtask handles, in the order they are installed:
// BeforeTool hands a shell command that runs 'bgtask add' to a waiter (Rewrite);
// BeforeAgent marks the session busy and hands it what is pending; the others
// mark it idle.
var Events = []string{"SessionStart", "BeforeAgent", "BeforeTool", "AfterAgent", "SessionEnd"}

// ShellTool is the name of Gemini CLI's shell tool, BeforeTool's matcher.
const ShellTool = "run_shell_command"

// Hook timeouts, in milliseconds as Gemini CLI counts them: each hook gives up
// talking to the server well before.
const (
	hookTimeoutMillis        = 10_000
	beforeAgentTimeoutMillis = 15_000
)

// A Setting is a value setup gives a key of Gemini CLI's settings, at Path.
type Setting struct {
	Path  []string
	Value json.RawMessage
}

func (s Setting) String() string { return strings.Join(s.Path, ".") + " = " + string(s.Value) }

// Settings are the values a live session needs to be woken: with them, a shell
// command that Gemini CLI runs in the background and that ends while the session
// is idle starts a new turn holding its output (without modelSteering, Gemini CLI
// keeps that output until the model's next tool call).
var Settings = []Setting{
	{Path: []string{"experimental", "modelSteering"}, Value: json.RawMessage(`true`)},
	{Path: []string{"tools", "shell", "backgroundCompletionBehavior"}, Value: json.RawMessage(`"inject"`)},
}

// IsOurs reports whether a hook's command is one of bgtask's.
func IsOurs(command string) bool { return strings.Contains(command+" ", CommandMarker) }

// groups are the matcher groups of bgtask's hooks, one per event. prefix is the
// command that runs bgtask, with its global flags.
func groups(prefix string) map[string]json.RawMessage {
	type handler struct {
		Name    string `json:"name"`
		Type    string `json:"type"`
		Command string `json:"command"`
		Timeout int    `json:"timeout"`
	}
	type group struct {
		Matcher string    `json:"matcher,omitempty"`
		Hooks   []handler `json:"hooks"`
	}
	out := map[string]json.RawMessage{}
	for _, event := range Events {
		g := group{Hooks: []handler{{Name: HookName, Type: "command", Command: prefix + CommandMarker + event, Timeout: hookTimeoutMillis}}}
		switch event {
		case "BeforeTool":
			g.Matcher = ShellTool
		case "BeforeAgent":
			g.Hooks[0].Timeout = beforeAgentTimeoutMillis
		}
		out[event], _ = setup.Marshal(g)
	}
	return out
}

// Install returns the settings data (empty: no file yet) with bgtask's Settings
// and hooks, run through prefix (the shell words that start bgtask), and no
// other hook of bgtask's. Settings that hold all of it already come back
// unchanged, byte for byte, so a second setup writes nothing.
func Install(data []byte, prefix string) ([]byte, error) {
	doc, err := parse(data)
	if err != nil {
		return nil, err
	}
	hooks, err := setup.Hooks(doc)
	if err != nil {
		return nil, err
	}
	want := groups(prefix)
	settingsIn := true
	for _, s := range Settings {
		cur, ok, err := get(doc, s.Path)
		if err != nil {
			return nil, err
		}
		settingsIn = settingsIn && ok && setup.SameJSON(cur, s.Value)
	}
	if settingsIn && setup.HooksInstalled(hooks, Events, want, IsOurs) {
		return data, nil
	}
	for _, s := range Settings {
		if doc, err = set(doc, s.Path, s.Value); err != nil {
			return nil, err
		}
	}
	hooks, _ = setup.WithoutHooks(hooks, IsOurs)
	if hooks, err = setup.WithHooks(hooks, Events, want); err != nil {
		return nil, err
	}
	encoded, _ := hooks.Encode()
	return doc.Set("hooks", encoded).Indent()
}

// Remove returns the settings data without what Install put in: bgtask's hooks
// (and a group, an event or the "hooks" object that only they filled), and each
// of Settings that still has bgtask's value, which gets back the value of the
// original (the file before the first setup; nil: there was none), or goes with
// the objects it alone filled when the original had not it. A setting the user
// changed since stays as they left it. empty reports that nothing is left.
func Remove(data, original []byte) (out []byte, empty bool, err error) {
	doc, err := parse(data)
	if err != nil {
		return nil, false, err
	}
	hooks, err := setup.Hooks(doc)
	if err != nil {
		return nil, false, err
	}
	orig, _ := parse(original) // unreadable: as if there were none
	hooks, removed := setup.WithoutHooks(hooks, IsOurs)
	if removed {
		if _, had := orig.Get("hooks"); len(hooks) == 0 && !had {
			doc = doc.Without("hooks")
		} else {
			encoded, _ := hooks.Encode()
			doc = doc.Set("hooks", encoded)
		}
	}
	for _, s := range Settings {
		cur, ok, _ := get(doc, s.Path)
		if !ok || !setup.SameJSON(cur, s.Value) {
			continue
		}
		removed = true
		if was, had, _ := get(orig, s.Path); had {
			doc, _ = set(doc, s.Path, was)
		} else {
			doc = unset(doc, orig, s.Path)
		}
	}
	if !removed {
		return data, len(doc) == 0, nil
	}
	out, err = doc.Indent()
	return out, len(doc) == 0, err
}

// HooksDisabled reports whether the settings turn Gemini CLI's hooks off
// (hooksConfig.enabled false), or bgtask's by name (hooksConfig.disabled).
func HooksDisabled(data []byte) bool {
	var s struct {
		HooksConfig struct {
			Enabled  *bool    `json:"enabled"`
			Disabled []string `json:"disabled"`
		} `json:"hooksConfig"`
	}
	if json.Unmarshal(data, &s) != nil {
		return false
	}
	return s.HooksConfig.Enabled != nil && !*s.HooksConfig.Enabled || slices.Contains(s.HooksConfig.Disabled, HookName)
}

// errComments: Gemini CLI reads its settings as JSON with comments, and setup
// writes JSON: it would drop them.
var errComments = errors.New("has comments (// or /* */), which setup would not keep: take them out of the file (or add bgtask's settings and hooks by hand, docs/gemini.md lists them)")

// parse reads the settings document; a file with comments is refused, naming
// them, rather than said to be no JSON.
func parse(data []byte) (setup.Object, error) {
	if hasComment(data) {
		return nil, errComments
	}
	return setup.ParseObject(data, "the settings")
}

// hasComment reports whether data has a // or /* outside its strings.
func hasComment(data []byte) bool {
	inString, escaped := false, false
	for i, c := range data {
		switch {
		case inString && escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case c == '"':
			inString = !inString
		case !inString && c == '/' && i+1 < len(data) && (data[i+1] == '/' || data[i+1] == '*'):
			return true
		}
	}
	return false
}

// get is the value at path in obj; ok is false when a key on the way is not
// there. A value on the way that is not an object is an error naming its path.
func get(obj setup.Object, path []string) (value json.RawMessage, ok bool, err error) {
	raw, ok := obj.Get(path[0])
	if !ok || len(path) == 1 {
		return raw, ok, nil
	}
	inner, err := setup.ParseObject(raw, path[0])
	if err != nil {
		return nil, false, err
	}
	value, ok, err = get(inner, path[1:])
	if err != nil {
		return nil, false, fmt.Errorf("%s.%w", path[0], err)
	}
	return value, ok, nil
}

// set gives path in obj value, making the objects on the way that are not
// there. A value on the way that is not an object is an error naming its path.
func set(obj setup.Object, path []string, value json.RawMessage) (setup.Object, error) {
	if len(path) == 1 {
		return obj.Set(path[0], value), nil
	}
	var inner setup.Object
	if raw, ok := obj.Get(path[0]); ok {
		var err error
		if inner, err = setup.ParseObject(raw, path[0]); err != nil {
			return nil, err
		}
	}
	inner, err := set(inner, path[1:], value)
	if err != nil {
		return nil, fmt.Errorf("%s.%w", path[0], err)
	}
	encoded, _ := inner.Encode()
	return obj.Set(path[0], encoded), nil
}

// unset takes path out of obj, and with it each object on the way that it
// leaves empty, unless orig (the same level of the original) has that object.
func unset(obj, orig setup.Object, path []string) setup.Object {
	if len(path) == 1 {
		return obj.Without(path[0])
	}
	raw, ok := obj.Get(path[0])
	if !ok {
		return obj
	}
	inner, err := setup.ParseObject(raw, path[0])
	if err != nil {
		return obj
	}
	var origInner setup.Object
	origRaw, had := orig.Get(path[0])
	if had {
		origInner, _ = setup.ParseObject(origRaw, path[0])
	}
	inner = unset(inner, origInner, path[1:])
	if len(inner) == 0 && !had {
		return obj.Without(path[0])
	}
	encoded, _ := inner.Encode()
	return obj.Set(path[0], encoded)
}
