package setup

import (
	"encoding/json"
	"fmt"
)

// The "hooks" object of a settings file, as Claude Code and Gemini CLI write it:
// each event's array of matcher groups, {"matcher": ..., "hooks": [handler]}, a
// handler {"type": "command", "command": ...}. A setup's own handlers are told
// apart by their command (ours).

// Hooks is the "hooks" object of the settings doc (empty when there is none).
func Hooks(doc Object) (Object, error) {
	raw, ok := doc.Get("hooks")
	if !ok {
		return nil, nil
	}
	return ParseObject(raw, "hooks")
}

// HooksInstalled reports whether hooks hold the groups of want, each last in its
// event's list, for each of events, and no other handler of ours.
func HooksInstalled(hooks Object, events []string, want map[string]json.RawMessage, ours func(command string) bool) bool {
	found := 0
	for _, m := range hooks {
		var list []json.RawMessage
		if json.Unmarshal(m.Value, &list) != nil {
			continue
		}
		for i, g := range list {
			if countOurs(g, ours) > 0 {
				w, ok := want[m.Key]
				if !ok || i != len(list)-1 || !SameJSON(g, w) {
					return false
				}
				found++
			}
		}
	}
	return found == len(events)
}

// WithHooks adds the group of want to the end of each of events' lists.
func WithHooks(hooks Object, events []string, want map[string]json.RawMessage) (Object, error) {
	for _, event := range events {
		var list []json.RawMessage
		if raw, ok := hooks.Get(event); ok {
			if err := json.Unmarshal(raw, &list); err != nil {
				return nil, fmt.Errorf("hooks.%s: not an array of matcher groups: %w", event, err)
			}
		}
		data, _ := Marshal(append(list, want[event]))
		hooks = hooks.Set(event, data)
	}
	return hooks, nil
}

// WithoutHooks drops our handlers from every event's groups, and the groups and
// events left empty by that; removed reports whether there was any.
func WithoutHooks(hooks Object, ours func(command string) bool) (out Object, removed bool) {
	for _, m := range hooks {
		var list []json.RawMessage
		if json.Unmarshal(m.Value, &list) != nil {
			out = append(out, m) // not ours to judge: the runtime reports it
			continue
		}
		var kept []json.RawMessage
		changed := false
		for _, g := range list {
			if countOurs(g, ours) == 0 {
				kept = append(kept, g)
				continue
			}
			changed = true
			if theirs := withoutOurHandlers(g, ours); theirs != nil {
				kept = append(kept, theirs)
			}
		}
		if !changed {
			out = append(out, m)
			continue
		}
		removed = true
		if len(kept) > 0 {
			data, _ := Marshal(kept)
			out = append(out, Member{Key: m.Key, Value: data})
		}
	}
	return out, removed
}

// withoutOurHandlers is the group without our handlers; nil when none is left.
func withoutOurHandlers(g json.RawMessage, ours func(string) bool) json.RawMessage {
	group, _ := ParseObject(g, "group")
	var handlers []json.RawMessage
	raw, _ := group.Get("hooks")
	_ = json.Unmarshal(raw, &handlers)
	var theirs []json.RawMessage
	for _, h := range handlers {
		if !isOurHandler(h, ours) {
			theirs = append(theirs, h)
		}
	}
	if len(theirs) == 0 {
		return nil
	}
	data, _ := Marshal(theirs)
	encoded, _ := group.Set("hooks", data).Encode()
	return encoded
}

// countOurs counts our handlers in a matcher group.
func countOurs(group json.RawMessage, ours func(string) bool) int {
	var g struct {
		Hooks []json.RawMessage `json:"hooks"`
	}
	if json.Unmarshal(group, &g) != nil {
		return 0
	}
	n := 0
	for _, h := range g.Hooks {
		if isOurHandler(h, ours) {
			n++
		}
	}
	return n
}

func isOurHandler(raw json.RawMessage, ours func(string) bool) bool {
	var h struct{ Type, Command string }
	return json.Unmarshal(raw, &h) == nil && h.Type == "command" && ours(h.Command)
}
