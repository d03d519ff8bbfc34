package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/bgtask/bgtask/events"
)

// Placeholders a prompt template may use, besides {{origin.<key>}}. An exec sink's
// argv may also use {{prompt}}, the rendered prompt itself.
var (
	placeholders     = []string{"result", "exit_code", "status", "reason", "task_id", "kind", "command", "tail", "duration"}
	argvPlaceholders = append([]string{"prompt"}, placeholders...)
)

func knownPlaceholder(name string, known []string) bool {
	if key, ok := strings.CutPrefix(name, "origin."); ok {
		return key != ""
	}
	return slices.Contains(known, name)
}

// scanTemplate splits a template into literal text and placeholder names and calls
// fn for each; it fails on an unclosed {{ or a name not in known.
func scanTemplate(tmpl string, known []string, literal func(string), placeholder func(string)) error {
	for {
		start := strings.Index(tmpl, "{{")
		if start < 0 {
			literal(tmpl)
			return nil
		}
		end := strings.Index(tmpl[start:], "}}")
		if end < 0 {
			return fmt.Errorf("unclosed {{ at byte %d", start)
		}
		name := strings.TrimSpace(tmpl[start+2 : start+end])
		if !knownPlaceholder(name, known) {
			return fmt.Errorf("unknown placeholder {{%s}}; known: {{%s}} and {{origin.<key>}}", name, strings.Join(known, "}} {{"))
		}
		literal(tmpl[:start])
		placeholder(name)
		tmpl = tmpl[start+end+2:]
	}
}

func checkTemplate(tmpl string, known []string) error {
	return scanTemplate(tmpl, known, func(string) {}, func(string) {})
}

// render fills a template that checkTemplate accepted; vars holds the values of
// the placeholders it may use.
func render(tmpl string, vars map[string]string, origin json.RawMessage) string {
	var b strings.Builder
	_ = scanTemplate(tmpl, argvPlaceholders, func(s string) { b.WriteString(s) }, func(name string) {
		if key, ok := strings.CutPrefix(name, "origin."); ok {
			b.WriteString(originValue(origin, key))
			return
		}
		b.WriteString(vars[name])
	})
	return b.String()
}

// RenderArgv fills the placeholders of an exec sink's argv for wake-up w.
func RenderArgv(argv []string, w events.Wakeup) []string {
	vars := promptVars(w, w.Kind)
	vars["prompt"] = w.Prompt
	out := make([]string, len(argv))
	for i, a := range argv {
		out[i] = render(a, vars, w.Origin)
	}
	return out
}

// originValue looks up a dotted key in the origin object: strings as they are,
// anything else as JSON, a missing key as "".
func originValue(origin json.RawMessage, key string) string {
	// Numbers stay as written: a 64-bit chat id must not come back rounded.
	dec := json.NewDecoder(bytes.NewReader(origin))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return ""
	}
	for _, part := range strings.Split(key, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return ""
		}
		if v, ok = m[part]; !ok {
			return ""
		}
	}
	if s, ok := v.(string); ok {
		return s
	}
	out, _ := json.Marshal(v)
	return string(out)
}

// promptVars are the values of the placeholders for a finished task.
func promptVars(w events.Wakeup, kind string) map[string]string {
	exit := "none"
	if w.ExitCode != nil {
		exit = strconv.Itoa(*w.ExitCode)
	}
	duration := ""
	if w.StartedAt != nil && w.EndedAt != nil {
		duration = w.EndedAt.Sub(*w.StartedAt).Round(time.Millisecond).String()
	}
	tail := strings.Join(w.Tail, "\n")
	return map[string]string{
		"result": w.Result, "exit_code": exit, "status": w.Status, "reason": w.Reason,
		"task_id": w.ID, "kind": kind, "command": w.Command, "tail": tail, "duration": duration,
	}
}

// defaultPrompt is used when a spec has none: enough for a reader who has forgotten
// the task to know what ran, how it ended and what it printed last.
func defaultPrompt(w events.Wakeup, vars map[string]string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Background task %s %s", w.ID, w.Status)
	if w.ExitCode != nil {
		fmt.Fprintf(&b, " (exit code %d", *w.ExitCode)
		if w.Signal != "" {
			fmt.Fprintf(&b, ", signal %s", w.Signal)
		}
		b.WriteString(")")
	}
	if vars["duration"] != "" {
		fmt.Fprintf(&b, " after %s", vars["duration"])
	}
	fmt.Fprintf(&b, ".\nCommand: %s\n", w.Command)
	if w.Reason != "" {
		fmt.Fprintf(&b, "Reason: %s\n", w.Reason)
	}
	if len(w.Tail) > 0 {
		fmt.Fprintf(&b, "Last %d lines of output:\n%s\n", len(w.Tail), vars["tail"])
	} else {
		b.WriteString("It printed nothing.\n")
	}
	return b.String()
}
