package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"reflect"
	"regexp"
	"strings"
	"time"
)

// Completion rule types.
const (
	CompleteOnExit    = "exit"
	CompleteOnJSON    = "json_line"
	CompleteOnPattern = "line_pattern"
)

// Completion decides when a task is done. The default is the command's exit.
type Completion struct {
	Type string `json:"type" jsonschema:"json_line: a JSON line with the fields of match; line_pattern: a line matching regex"`
	// Match is, for json_line, the fields a stdout line's JSON object must have: a
	// value ending in * matches by prefix, dotted keys reach nested fields.
	Match map[string]any `json:"match,omitempty" jsonschema:"json_line: fields the line's object must have (a value ending in * matches a prefix, a.b reaches nested keys)"`
	// Regex is, for line_pattern, the Go RE2 expression a stdout line must match.
	Regex string `json:"regex,omitempty" jsonschema:"line_pattern: a Go RE2 regular expression"`
}

// Stall actions.
const (
	OnStallNotify  = "notify"
	OnStallKill    = "kill"
	OnStallRespawn = "respawn"
)

// What on_lost does.
const (
	OnLostFail    = "fail"
	OnLostRespawn = "respawn"
)

// Result types.
const (
	ResultTail        = "tail"
	ResultMatchedLine = "matched_line"
	ResultCommand     = "command"
)

// Result decides what the wake-up's {{result}} holds.
type Result struct {
	Type string `json:"type" jsonschema:"tail, matched_line or command"`
	// Lines is, for tail, how many lines of output (default 50, at most MaxTailLines).
	Lines int `json:"lines,omitempty" jsonschema:"tail: how many lines (default 50, at most 1000)"`
	// Argv is, for command, a program run after completion in the task's cwd and env;
	// its stdout is the result.
	Argv []string `json:"argv,omitempty" jsonschema:"command: a program run after the task in its cwd and env; its stdout is the result"`
	// Timeout bounds the result command (default 60s).
	Timeout string `json:"timeout,omitempty" jsonschema:"command: its bound (default 60s)"`
}

// Limits and defaults of the watch rules.
const (
	DefaultTailLines      = 50
	MaxTailLines          = 1000
	DefaultMaxResultBytes = 32 << 10
	// MaxResultBytesLimit keeps a result within about a quarter of a wake-up.
	MaxResultBytesLimit  = 64 << 10
	DefaultResultTimeout = time.Minute
	// MaxResultTimeout bounds a result command: it runs before the exit is recorded.
	MaxResultTimeout   = 10 * time.Minute
	DefaultMaxRespawns = 1
	// MatchLineBytes is how much of a stdout line the completion rules look at: a
	// longer line is matched on its first MatchLineBytes bytes.
	MatchLineBytes = 1 << 20
	minTimer       = 100 * time.Millisecond
)

// validateWatch checks the watch fields of a spec, fills in their defaults and turns
// a relative deadline into a time.
func (s *Spec) validateWatch(now time.Time) error {
	if err := s.validateCompletion(); err != nil {
		return err
	}
	if s.KeepRunning && s.Completion == nil {
		return fieldErr("keep_running", "only with a json_line or line_pattern completion")
	}
	if s.StallAfter != "" {
		if _, err := parsePositiveDuration(s.StallAfter); err != nil {
			return fieldErr("stall_after", "%v", err)
		}
		switch s.OnStall {
		case "":
			s.OnStall = OnStallNotify
		case OnStallNotify, OnStallKill, OnStallRespawn:
		default:
			return fieldErr("on_stall", "%q: want notify, kill or respawn", s.OnStall)
		}
	} else if s.OnStall != "" {
		return fieldErr("on_stall", "only with stall_after")
	}
	if s.MaxRespawns != nil {
		if s.OnStall != OnStallRespawn {
			return fieldErr("max_respawns", "only with on_stall respawn")
		}
		if *s.MaxRespawns < 0 || *s.MaxRespawns > 100 {
			return fieldErr("max_respawns", "%d: want 0 to 100", *s.MaxRespawns)
		}
	}
	if s.Deadline != "" {
		// A relative deadline counts from the start: a delayed command gets all of it.
		from := now
		if start := s.StartTime(); start.After(now) {
			from = start
		}
		if s.Retry != nil && s.Retry.Deadline == "" {
			if d, err := time.ParseDuration(s.Deadline); err == nil {
				s.Retry.Deadline = d.String() // each attempt has as long
			}
		}
		at, err := parseFutureTime(s.Deadline, from, "deadline")
		if err != nil {
			return fieldErr("deadline", "%v", err)
		}
		s.Deadline = at.UTC().Format(time.RFC3339Nano)
	}
	if err := s.validateResult(); err != nil {
		return err
	}
	switch s.OnLost {
	case "", OnLostFail, OnLostRespawn:
	default:
		return fieldErr("on_lost", "%q: want fail or respawn", s.OnLost)
	}
	if s.MaxResultBytes < 0 || s.MaxResultBytes > MaxResultBytesLimit {
		return fieldErr("max_result_bytes", "%d: want 1 to %d, for a wake-up takes at most %d bytes", s.MaxResultBytes, MaxResultBytesLimit, MaxWakeupBytes)
	}
	// The rest of a wake-up is cut to fit around what it carries whole.
	return s.checkCarried()
}

// validateCompletion checks the completion rule; an exit rule is the default, kept
// as none.
func (s *Spec) validateCompletion() error {
	c := s.Completion
	if c == nil {
		return nil
	}
	switch c.Type {
	case CompleteOnExit, "":
		c.Type = CompleteOnExit
		if len(c.Match) > 0 || c.Regex != "" {
			return fieldErr("completion", "type exit takes no match or regex")
		}
	case CompleteOnJSON:
		if len(c.Match) == 0 {
			return fieldErr("completion.match", "json_line needs at least one field to match")
		}
		if c.Regex != "" {
			return fieldErr("completion.regex", "only with type line_pattern")
		}
	case CompleteOnPattern:
		if c.Regex == "" {
			return fieldErr("completion.regex", "line_pattern needs a regex")
		}
		if _, err := regexp.Compile(c.Regex); err != nil {
			return fieldErr("completion.regex", "%v", err)
		}
		if len(c.Match) > 0 {
			return fieldErr("completion.match", "only with type json_line")
		}
	default:
		return fieldErr("completion.type", "%q: want exit, json_line or line_pattern", c.Type)
	}
	if c.Type == CompleteOnExit {
		s.Completion = nil
	}
	return nil
}

// validateResult checks what the wake-up's result is made of.
func (s *Spec) validateResult() error {
	r := s.Result
	if r == nil {
		return nil
	}
	switch r.Type {
	case ResultTail:
		if r.Lines < 0 || r.Lines > MaxTailLines {
			return fieldErr("result.lines", "%d: want 1 to %d", r.Lines, MaxTailLines)
		}
	case ResultMatchedLine:
		if s.Completion == nil {
			return fieldErr("result", "matched_line needs a json_line or line_pattern completion")
		}
	case ResultCommand:
		if len(r.Argv) == 0 || r.Argv[0] == "" {
			return fieldErr("result.argv", "command needs an argv")
		}
		if r.Timeout != "" {
			d, err := parsePositiveDuration(r.Timeout)
			if err != nil {
				return fieldErr("result.timeout", "%v", err)
			}
			if d > MaxResultTimeout {
				return fieldErr("result.timeout", "%s is over the limit of %s", d, MaxResultTimeout)
			}
		}
	default:
		return fieldErr("result.type", "%q: want tail, matched_line or command", r.Type)
	}
	if r.Type != ResultTail && r.Lines != 0 {
		return fieldErr("result.lines", "only with type tail")
	}
	return nil
}

func parsePositiveDuration(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration like 30s or 5m", v)
	}
	if d < minTimer {
		return 0, fmt.Errorf("%s is shorter than %s", d, minTimer)
	}
	return d, nil
}

// maxDeadline is the latest deadline a task may have: the shim and the timers hold
// it as Unix nanoseconds in an int64, which end in April 2262.
var maxDeadline = time.Unix(0, math.MaxInt64).UTC()

// parseFutureTime reads a duration from now or an RFC 3339 time; it must be ahead,
// and no later than maxDeadline.
func parseFutureTime(v string, now time.Time, field string) (time.Time, error) {
	at, err := time.Parse(time.RFC3339Nano, v)
	if d, derr := time.ParseDuration(v); derr == nil {
		if d < minTimer {
			return time.Time{}, fmt.Errorf("%s is not ahead: want at least %s", d, minTimer)
		}
		at, err = now.Add(d), nil
	}
	switch {
	case err != nil:
		return time.Time{}, fmt.Errorf("%q is neither a duration (10m) nor an RFC 3339 time", v)
	case !at.After(now):
		return time.Time{}, fmt.Errorf("%s is in the past", v)
	case at.After(maxDeadline):
		return time.Time{}, fmt.Errorf("%s is after %s, the latest time bgtask can hold; leave %s out for none",
			v, maxDeadline.Format(time.RFC3339), field)
	}
	return at, nil
}

// StallDuration is how long the command may print nothing; 0 means no stall rule.
func (s Spec) StallDuration() time.Duration {
	d, _ := time.ParseDuration(s.StallAfter)
	return d
}

// DeadlineTime is when the command is stopped as timed out; zero means never.
func (s Spec) DeadlineTime() time.Time {
	at, _ := time.Parse(time.RFC3339Nano, s.Deadline)
	return at
}

// deadlineText is the deadline for a reason, to the millisecond: a reader has no
// use for its nanoseconds.
func (s Spec) deadlineText() string {
	return s.DeadlineTime().Round(time.Millisecond).Format(time.RFC3339Nano)
}

// Respawns is how many times a stalled command may be started again.
func (s Spec) Respawns() int {
	if s.OnStall != OnStallRespawn {
		return 0
	}
	if s.MaxRespawns == nil {
		return DefaultMaxRespawns
	}
	return *s.MaxRespawns
}

// TailLines is how many lines of output the exited event keeps.
func (s Spec) TailLines() int {
	if s.Result != nil && s.Result.Type == ResultTail && s.Result.Lines > DefaultTailLines {
		return s.Result.Lines
	}
	return DefaultTailLines
}

// ResultTimeout bounds a result command.
func (r Result) ResultTimeout() time.Duration {
	if d, err := time.ParseDuration(r.Timeout); err == nil && d > 0 {
		return d
	}
	return DefaultResultTimeout
}

func (s Spec) maxResultBytes() int {
	if s.MaxResultBytes > 0 {
		return s.MaxResultBytes
	}
	return DefaultMaxResultBytes
}

// LineMatcher reports whether a stdout line completes the task.
type LineMatcher func(line []byte) bool

// Matcher returns the spec's completion rule as a line matcher, or nil when the
// task completes on exit.
func (s Spec) Matcher() LineMatcher {
	if s.Completion == nil {
		return nil
	}
	return s.Completion.matcher()
}

// describe names the rule and what it matches: line_pattern `^OK$`.
func (c Completion) describe() string {
	if c.Type == CompleteOnJSON {
		raw, _ := json.Marshal(c.Match) // decoded from JSON: it encodes
		return c.Type + " " + quoted(string(raw))
	}
	return c.Type + " " + quoted(c.Regex)
}

// matcher is the rule as a line matcher, or nil for a rule of no line.
func (c Completion) matcher() LineMatcher {
	switch c.Type {
	case CompleteOnPattern:
		re := regexp.MustCompile(c.Regex) // validated at registration
		return func(line []byte) bool { return re.Match(line) }
	case CompleteOnJSON:
		return func(line []byte) bool { return matchJSONLine(line, c.Match) }
	}
	return nil
}

// matchJSONLine reports whether line is a JSON object with every field of match.
func matchJSONLine(line []byte, match map[string]any) bool {
	line = bytes.TrimSpace(line)
	if len(line) == 0 || line[0] != '{' {
		return false // not JSON: ignored, and cheap to tell
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	var obj map[string]any
	if dec.Decode(&obj) != nil {
		return false
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return false // more after the object: not one JSON object
	}
	for key, want := range match {
		got, ok := lookup(obj, key)
		if !ok || !matchValue(got, want) {
			return false
		}
	}
	return true
}

// lookup finds a field by its full name first, then by a dotted path.
func lookup(obj map[string]any, key string) (any, bool) {
	if v, ok := obj[key]; ok {
		return v, true
	}
	var v any = obj
	for _, part := range strings.Split(key, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = m[part]; !ok {
			return nil, false
		}
	}
	return v, true
}

func matchValue(got, want any) bool {
	switch w := want.(type) {
	case string:
		if prefix, ok := strings.CutSuffix(w, "*"); ok {
			s, isString := got.(string)
			return isString && strings.HasPrefix(s, prefix)
		}
		if s, isString := got.(string); isString {
			return s == w
		}
		// A string from the command line (answer=42) matches the same JSON value.
		text, err := json.Marshal(got)
		return err == nil && string(text) == w
	case float64, json.Number:
		return sameNumber(got, w)
	default:
		return reflect.DeepEqual(normalize(got), normalize(want))
	}
}

// sameNumber compares two JSON numbers exactly: 1234567890123456789 is not ...788.
func sameNumber(a, b any) bool {
	ra, okA := toRat(a)
	rb, okB := toRat(b)
	return okA && okB && ra.Cmp(rb) == 0
}

func toRat(v any) (*big.Rat, bool) {
	switch n := v.(type) {
	case float64:
		r := new(big.Rat)
		if r.SetFloat64(n) == nil {
			return nil, false
		}
		return r, true
	case json.Number:
		return new(big.Rat).SetString(string(n))
	}
	return nil, false
}

// normalize makes decoded values comparable whichever way their numbers were read.
func normalize(v any) any {
	switch x := v.(type) {
	case json.Number, float64:
		if r, ok := toRat(x); ok {
			return r.RatString()
		}
		return x
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = normalize(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = normalize(e)
		}
		return out
	}
	return v
}
