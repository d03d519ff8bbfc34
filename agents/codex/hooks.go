package codex

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// HookCommandSuffix ends the command of every hook bgtask installs: the bgtask
// subcommand that handles all the events, reading which one from its stdin.
const HookCommandSuffix = " setup codex hook"

// HookEvents are the events bgtask hooks: a session start hands over what is
// pending for the thread, a submitted prompt (typed or queued) makes the thread
// busy, and the end of a turn idle.
var HookEvents = []string{"SessionStart", "UserPromptSubmit", "Stop"}

// HookTimeoutSeconds bounds each of bgtask's hooks; they talk only to the local
// bgtask server and give up sooner than this.
const HookTimeoutSeconds = 15

// InstallHooks returns the hooks document data (empty: none yet) with bgtask's
// hook, command, on each of HookEvents, and no other hook of bgtask's. The same
// input and command give the same output, so running setup again changes nothing
// (and Codex, which trusts a hook by the hash of its definition, does not ask again).
func InstallHooks(data []byte, command string) ([]byte, error) {
	doc, hooks, err := parse(data)
	if err != nil {
		return nil, err
	}
	for event, groups := range hooks {
		hooks[event] = withoutOurs(groups)
	}
	for _, event := range HookEvents {
		group, _ := json.Marshal(map[string]any{"hooks": []map[string]any{{
			"type": "command", "command": command, "timeout": HookTimeoutSeconds,
		}}})
		hooks[event] = append(hooks[event], group)
	}
	return encode(doc, hooks)
}

// RemoveHooks returns data without bgtask's hooks. empty reports that nothing is
// left in the document, so the file can go.
func RemoveHooks(data []byte) (out []byte, empty bool, err error) {
	doc, hooks, err := parse(data)
	if err != nil {
		return nil, false, err
	}
	for event, groups := range hooks {
		if groups = withoutOurs(groups); len(groups) == 0 {
			delete(hooks, event)
		} else {
			hooks[event] = groups
		}
	}
	out, err = encode(doc, hooks)
	return out, len(hooks) == 0 && len(doc) == 0, err
}

// HasHooks reports whether data holds a hook of bgtask's.
func HasHooks(data []byte) (bool, error) {
	_, hooks, err := parse(data)
	if err != nil {
		return false, err
	}
	for _, groups := range hooks {
		if len(withoutOurs(groups)) != len(groups) {
			return true, nil
		}
	}
	return false, nil
}

// parse splits a hooks document into its other root fields and its events.
func parse(data []byte) (doc map[string]json.RawMessage, hooks map[string][]json.RawMessage, err error) {
	doc, hooks = map[string]json.RawMessage{}, map[string][]json.RawMessage{}
	if len(bytes.TrimSpace(data)) == 0 {
		return doc, hooks, nil
	}
	if err := json.Unmarshal(data, &doc); err != nil || doc == nil {
		return nil, nil, fmt.Errorf("not a JSON object: %v", err)
	}
	if raw, ok := doc["hooks"]; ok {
		if err := json.Unmarshal(raw, &hooks); err != nil {
			return nil, nil, fmt.Errorf("field hooks: want an object of event names to arrays of groups: %v", err)
		}
		delete(doc, "hooks")
	}
	if hooks == nil {
		hooks = map[string][]json.RawMessage{}
	}
	return doc, hooks, nil
}

func encode(doc map[string]json.RawMessage, hooks map[string][]json.RawMessage) ([]byte, error) {
	out := map[string]any{}
	for k, v := range doc {
		out[k] = v
	}
	if len(hooks) > 0 || len(doc) > 0 {
		out["hooks"] = hooks
	}
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

// withoutOurs drops bgtask's handlers from groups, and a group left with none of
// its own. A group it cannot read is someone else's, and stays.
func withoutOurs(groups []json.RawMessage) []json.RawMessage {
	var kept []json.RawMessage
	for _, raw := range groups {
		var group map[string]json.RawMessage
		var handlers []json.RawMessage
		if json.Unmarshal(raw, &group) != nil || json.Unmarshal(group["hooks"], &handlers) != nil {
			kept = append(kept, raw)
			continue
		}
		others := slices.DeleteFunc(slices.Clone(handlers), isOurs)
		switch {
		case len(others) == len(handlers):
			kept = append(kept, raw)
		case len(others) > 0:
			group["hooks"], _ = json.Marshal(others)
			data, _ := json.Marshal(group)
			kept = append(kept, data)
		}
	}
	return kept
}

func isOurs(raw json.RawMessage) bool {
	var h struct {
		Command string `json:"command"`
	}
	return json.Unmarshal(raw, &h) == nil && strings.HasSuffix(h.Command, HookCommandSuffix)
}

// HookInput is what Codex writes on a command hook's stdin (the fields bgtask reads).
type HookInput struct {
	// SessionID is the thread's id, the one its tools see as CODEX_THREAD_ID.
	SessionID string `json:"session_id"`
	// Event is SessionStart, UserPromptSubmit, Stop, ...
	Event string `json:"hook_event_name"`
	// Source is startup, resume or clear for SessionStart.
	Source string `json:"source"`
}
