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
	placeholders     = []string{"result", "exit_code", "status", "reason", "task_id", "kind", "command", "tail", "duration", "late_by", "members"}
	argvPlaceholders = append([]string{"prompt"}, placeholders...)
)

func knownPlaceholder(name string, known []string) bool {
	if key, ok := strings.CutPrefix(name, "origin."); ok {
		return key != ""
	}
	return slices.Contains(known, name)
}

// scanTemplate splits a template into literal text and placeholders and calls
// literal or placeholder for each in turn; it fails on an unclosed {{, a name not
// in known, or a default that holds {{. A placeholder is {{name}}, or
// {{name|default}}: the default is literal text that stands for a value that is
// empty (an origin key the task's origin lacks, a result not set); spaces
// around the name and the default are left out.
func scanTemplate(tmpl string, known []string, literal func(string), placeholder func(name, def string)) error {
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
		name, def, _ := strings.Cut(tmpl[start+2:start+end], "|")
		name, def = strings.TrimSpace(name), strings.TrimSpace(def)
		if !knownPlaceholder(name, known) {
			return fmt.Errorf("unknown placeholder {{%s}}; known: {{%s}} and {{origin.<key>}}, each with a default if wanted ({{origin.<key>|default}})",
				name, strings.Join(known, "}} {{"))
		}
		if strings.Contains(def, "{{") {
			return fmt.Errorf("the default of {{%s}} at byte %d holds {{: a default is plain text", name, start)
		}
		literal(tmpl[:start])
		placeholder(name, def)
		tmpl = tmpl[start+end+2:]
	}
}

func checkTemplate(tmpl string, known []string) error {
	return scanTemplate(tmpl, known, func(string) {}, func(string, string) {})
}

// part is a piece of a prompt: literal text, or the placeholder name names, with
// the text def that stands for it when its value is empty.
type part struct{ text, name, def string }

func lit(format string, a ...any) part { return part{text: fmt.Sprintf(format, a...)} }

func placeholder(name string) part { return part{name: name} }

// parseTemplate splits a template that checkTemplate accepted into its parts.
func parseTemplate(tmpl string) []part {
	var parts []part
	_ = scanTemplate(tmpl, argvPlaceholders, func(s string) {
		if s != "" {
			parts = append(parts, part{text: s})
		}
	}, func(name, def string) { parts = append(parts, part{name: name, def: def}) })
	return parts
}

// values are what a prompt's placeholders stand for.
type values struct {
	vars   map[string]string
	origin json.RawMessage
	found  map[string]string // origin keys looked up, once each
	sizes  map[string]int    // values sized as JSON, once each
}

func newValues(vars map[string]string, origin json.RawMessage) *values {
	return &values{vars: vars, origin: origin, found: map[string]string{}, sizes: map[string]int{}}
}

// size is how many bytes a placeholder's value takes in a JSON string.
func (v *values) size(name string) int {
	n, ok := v.sizes[name]
	if !ok {
		n = jsonLen(v.get(name)) - 2
		v.sizes[name] = n
	}
	return n
}

// text is what placeholder p stands for: its value, or its default when that
// is empty.
func (v *values) text(p part) string {
	if s := v.get(p.name); s != "" || p.def == "" {
		return s
	}
	return p.def
}

// partSize is how many bytes placeholder p's text takes in a JSON string.
func (v *values) partSize(p part) int {
	if p.def != "" && v.get(p.name) == "" {
		return jsonLen(p.def) - 2
	}
	return v.size(p.name)
}

func (v *values) get(name string) string {
	key, ok := strings.CutPrefix(name, "origin.")
	if !ok {
		return v.vars[name]
	}
	s, ok := v.found[key]
	if !ok {
		s = originValue(v.origin, key)
		v.found[key] = s
	}
	return s
}

// promptSize is the size of a prompt's parts as JSON, quotes left out.
type promptSize struct {
	sizes []int
	// total is the whole prompt's and literal its text's, quotes included; needs
	// are the placeholders', in order.
	total, literal int
	needs          []int
}

func measure(parts []part, vals *values) promptSize {
	m := promptSize{sizes: make([]int, len(parts)), total: 2, literal: 2}
	for i, p := range parts {
		if p.name == "" {
			m.sizes[i] = jsonLen(p.text) - 2
			m.literal += m.sizes[i]
		} else {
			m.sizes[i] = vals.partSize(p)
			m.needs = append(m.needs, m.sizes[i])
		}
		m.total += m.sizes[i]
	}
	return m
}

// promptLen is how many bytes parts filled with vals take as a JSON string.
func promptLen(parts []part, vals *values) int { return measure(parts, vals).total }

// minShare is the least a placeholder cut to fit a prompt keeps. A template with
// so many long placeholders that each would keep less is cut where it reaches its
// budget instead.
const minShare = 1 << 10

// promptCut ends a prompt cut where it reached its budget.
const promptCut = "\n[the rest of the prompt was cut to fit bgtask's byte budget]"

// renderParts fills parts with vals within limit bytes as a JSON string, quotes
// included. It sizes the prompt before it builds it, and never builds more than
// limit bytes: a prompt over its budget has its longest placeholders cut to fair
// shares (the end of {{tail}} kept, the start of the others), each with a marker;
// where that would leave each of them less than minShare (a template that repeats
// a placeholder thousands of times), the prompt is cut where it reaches its
// budget, with a marker.
func renderParts(parts []part, vals *values, limit int) string {
	m := measure(parts, vals)
	sizes, total, literal, needs := m.sizes, m.total, m.literal, m.needs
	var b strings.Builder
	text := func(p part) string {
		if p.name == "" {
			return p.text
		}
		return vals.text(p)
	}
	if total <= limit {
		for _, p := range parts {
			b.WriteString(text(p))
		}
		return b.String()
	}
	share := shares(limit-literal, needs...)
	fits := literal <= limit
	for i, n := range needs {
		fits = fits && (share[i] == n || share[i] >= minShare)
	}
	if fits {
		k := 0
		for _, p := range parts {
			if p.name == "" {
				b.WriteString(p.text)
				continue
			}
			if v := vals.text(p); share[k] < needs[k] && p.name == "tail" {
				b.WriteString(cutEnd(v, share[k]+2))
			} else if share[k] < needs[k] {
				b.WriteString(cutStart(v, share[k]+2))
			} else {
				b.WriteString(v)
			}
			k++
		}
		return b.String()
	}
	room := limit - jsonLen(promptCut)
	if room < 0 {
		return ""
	}
	for i, p := range parts {
		if sizes[i] > room {
			b.WriteString(jsonPrefix(text(p), room))
			break
		}
		b.WriteString(text(p))
		room -= sizes[i]
	}
	b.WriteString(promptCut)
	return b.String()
}

// maxArgBytes bounds each argument of an exec sink (Linux refuses one over 128
// KiB) and maxArgvBytes all of them: an argv that repeats {{prompt}} must not
// build gigabytes.
const (
	maxArgBytes  = 128<<10 - 1
	maxArgvBytes = 1 << 20
)

// RenderArgv fills the placeholders of an exec sink's argv for wake-up w, each
// argument cut to fit the budget of an argv as a prompt is.
func RenderArgv(argv []string, w events.Wakeup) []string {
	vars := promptVars(w, w.Kind)
	vars["prompt"] = w.Prompt
	vals := newValues(vars, w.Origin)
	out := make([]string, len(argv))
	left := maxArgvBytes
	for i, a := range argv {
		out[i] = renderParts(parseTemplate(a), vals, min(maxArgBytes, left))
		left -= min(len(out[i]), left)
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
		"late_by": w.LateBy, "members": memberList(w.Members),
	}
}

// defaultPrompt is used when a spec has none: enough for a reader who has forgotten
// the task to know what ran, how it ended and what it printed last.
func (s State) defaultPrompt(w events.Wakeup, vars map[string]string) []part {
	if w.Command == "" {
		return timerPrompt(w)
	}
	parts := []part{lit("Background task %s %s", w.ID, w.Status)}
	// A run a completion rule ended has the exit code of bgtask's stop, which its
	// reason gives.
	if ruleEnded := s.Run != nil && s.Run.Matched; w.ExitCode != nil && !ruleEnded {
		signal := ""
		if w.Signal != "" {
			signal = ", signal " + w.Signal
		}
		parts = append(parts, lit(" (exit code %d%s)", *w.ExitCode, signal))
	}
	if vars["duration"] != "" {
		parts = append(parts, lit(" after %s", vars["duration"]))
	}
	parts = append(parts, lit(".\nCommand: "), placeholder("command"), lit("\n"))
	if w.Reason != "" {
		parts = append(parts, lit("Reason: "), placeholder("reason"), lit("\n"))
	}
	if s.ExternalResult != nil && w.Result != "" {
		parts = append(parts, lit("Result: "), placeholder("result"), lit("\n"))
	}
	if len(w.Attempts) > 0 {
		parts = append(parts, lit("That was attempt %d; the earlier ones: %s.\n", len(w.Attempts)+1, attemptList(w.Attempts)))
	}
	if w.Probes > 0 {
		parts = append(parts, lit("That was probe run %d; the %d before it did not meet its rule.\n", w.Probes+1, w.Probes))
	}
	return append(parts, s.outputParts(w)...)
}

// outputParts say what the command printed: its last lines, that it printed
// nothing, or that it did not run. A run ended with none recorded (completed from
// outside, lost) says nothing: what it printed is in its log.
func (s State) outputParts(w events.Wakeup) []part {
	switch {
	case len(w.Tail) > 0:
		return []part{lit("Last %d lines of output:\n", len(w.Tail)), placeholder("tail"), lit("\n")}
	case s.Run == nil && s.Epoch == 0, s.Run != nil && s.Run.NotStarted:
		return []part{lit("Its command did not run.\n")}
	case s.Run != nil:
		return []part{lit("It printed nothing.\n")}
	}
	return nil
}

// noticePrompt is the prompt of a stall notice of a spec without a template.
func noticePrompt(w events.Wakeup) []part {
	return []part{lit("Background task %s %s: ", w.ID, w.Status), placeholder("reason"), lit(".\nCommand: "), placeholder("command"), lit("\n")}
}

// joinPrompt is the prompt of a group whose spec has none.
func joinPrompt(w events.Wakeup) []part {
	parts := []part{lit("Group %s %s. How its members ended:\n", w.ID, w.Status), placeholder("members"), lit("\n")}
	if w.Reason != "" {
		parts = append(parts, lit("Reason: "), placeholder("reason"), lit("\n"))
	}
	return parts
}

// externalPrompt is the prompt of a task that waited for an external completion,
// whose spec has none.
func externalPrompt(w events.Wakeup) []part {
	parts := []part{lit("Task %s %s.\n", w.ID, w.Status)}
	if w.Reason != "" {
		parts = append(parts, lit("Reason: "), placeholder("reason"), lit("\n"))
	}
	if w.Result != "" {
		parts = append(parts, lit("Result: "), placeholder("result"), lit("\n"))
	}
	return parts
}

// timerPrompt is the prompt of a timer whose spec has none.
func timerPrompt(w events.Wakeup) []part {
	late := ""
	if d, err := time.ParseDuration(w.LateBy); err == nil && d >= time.Second {
		late = " (late by " + w.LateBy + ")"
	}
	return []part{lit("Timer %s is due%s.\n", w.ID, late)}
}

// attemptList says how each earlier attempt ended: "failed (exit code 3), lost".
func attemptList(attempts []events.Attempt) string {
	out := make([]string, len(attempts))
	for i, a := range attempts {
		out[i] = a.Status
		if a.ExitCode != nil {
			out[i] += fmt.Sprintf(" (exit code %d)", *a.ExitCode)
		}
	}
	return strings.Join(out, ", ")
}
