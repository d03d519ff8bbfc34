package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/secretenv"
)

// MaxSpecBytes is the largest spec accepted at registration, its env apart (see
// MaxEnvBytes). A spec is a command and its routing data, not a payload: 64 KiB
// leaves room for long commands and origins while keeping every armed event small.
const MaxSpecBytes = 64 << 10

// DefaultTarget receives wake-ups of specs that name none.
const DefaultTarget = "default"

// Spec is what a caller asks bgtask to run and how to wake it.
type Spec struct {
	// Command is a shell string, run with bash -c.
	Command string `json:"command,omitempty" jsonschema:"the command, a shell string run with bash -c"`
	// Argv runs a program without a shell; argv[0] is looked up in the PATH of the
	// command's environment.
	Argv []string `json:"argv,omitempty" jsonschema:"a program and its arguments, run without a shell instead of command; the program is looked up in the command's PATH"`
	// Cwd is an absolute directory; empty means the worker's home directory.
	Cwd string `json:"cwd,omitempty" jsonschema:"the working directory, absolute (default: the worker's home)"`
	// Env is added to the worker's login environment; with Environment caller it
	// is the whole environment.
	Env map[string]string `json:"env,omitempty" jsonschema:"variables set in the command's environment"`
	// Environment is what the command's environment starts from: login (default,
	// written as none) or caller.
	Environment string `json:"environment,omitempty" jsonschema:"what the command's environment starts from: login (default: the worker's login environment, env set over it) or caller (env is the whole environment)"`
	// Kind is a free label, for people and filters.
	Kind string `json:"kind,omitempty" jsonschema:"a label for the task (build, test, deploy, ...)"`
	// Prompt is the wake-up's template; see Render.
	Prompt string `json:"prompt,omitempty" jsonschema:"template of the wake-up's prompt; placeholders {{result}} {{exit_code}} {{status}} {{reason}} {{task_id}} {{kind}} {{command}} {{tail}} {{duration}} {{origin.KEY}}, each with a default for an empty value if wanted ({{origin.KEY|default}})"`
	// Target names the inbox the wake-up goes to.
	Target string `json:"target,omitempty" jsonschema:"the inbox the wake-up goes to (default \"default\")"`
	// Origin is opaque routing data returned in the wake-up.
	Origin json.RawMessage `json:"origin,omitempty" jsonschema:"JSON returned as-is in the wake-up: the caller's routing data"`
	// IdempotencyKey makes registration idempotent: the same key, the same task.
	IdempotencyKey string `json:"idempotency_key,omitempty" jsonschema:"the same key registers the same task once and returns its id"`

	// Completion decides when the task is done (default: when the command exits).
	Completion *Completion `json:"completion,omitempty" jsonschema:"done before the command exits, when a stdout line matches (default: when it exits)"`
	// KeepRunning leaves the command running after its completion rule matched.
	KeepRunning bool `json:"keep_running,omitempty" jsonschema:"leave the command running after its completion rule matched"`
	// StallAfter is how long the command may print nothing before it is stalled.
	StallAfter string `json:"stall_after,omitempty" jsonschema:"a command that prints nothing for this long (e.g. 5m) is stalled"`
	// OnStall is notify (default), kill or respawn.
	OnStall string `json:"on_stall,omitempty" jsonschema:"what a stall does: notify (default: wake once and keep watching), kill, or respawn"`
	// MaxRespawns bounds on_stall respawn (default 1).
	MaxRespawns *int `json:"max_respawns,omitempty" jsonschema:"how many times on_stall respawn starts the command again (default 1)"`
	// Deadline is a duration from registration or an RFC 3339 time; the engine
	// stores it as a time.
	Deadline string `json:"deadline,omitempty" jsonschema:"stop the command as timed_out after this long (30m) or at this RFC 3339 time"`
	// Result decides the wake-up's {{result}} (default: the last 50 lines).
	Result *Result `json:"result,omitempty" jsonschema:"what the wake-up's {{result}} is (default: the last 50 lines)"`
	// MaxResultBytes truncates the result (default 32 KiB).
	MaxResultBytes int `json:"max_result_bytes,omitempty" jsonschema:"truncate the result to this many bytes (default 32768)"`
	// OnLost is what happens when the task's worker is gone past its lease: fail
	// (default: the outcome is lost) or respawn (another worker runs it again; for
	// idempotent commands only).
	OnLost string `json:"on_lost,omitempty" jsonschema:"when the task's worker is gone: fail (default, outcome lost) or respawn (run it again elsewhere; for idempotent commands)"`

	// Policy is when the wake-up is pushed to the deliver sinks: queue (default),
	// defer_idle or immediate.
	Policy string `json:"policy,omitempty" jsonschema:"when the deliver sinks get the wake-up: queue (default), defer_idle or immediate"`
	// Deliver lists push sinks that get the wake-up besides the inbox.
	Deliver []Sink `json:"deliver,omitempty" jsonschema:"push sinks that get the wake-up besides the inbox"`
	// Placement limits which workers may take the task (default: any worker).
	Placement *Placement `json:"placement,omitempty" jsonschema:"which workers may take the task (default: any)"`

	// StartAt is when the command starts, or, for a spec with no command (a timer),
	// when the task fires: a duration from registration or an RFC 3339 time; the
	// engine stores it as a time.
	StartAt string `json:"start_at,omitempty" jsonschema:"start the command after this long (20m) or at this RFC 3339 time; with no command, a timer that wakes the caller then"`
	// Retry runs the command again after an attempt that ends in one of its statuses.
	Retry *Retry `json:"retry,omitempty" jsonschema:"run an attempt that ended in one of on again, with backoff; one wake-up after the last"`
	// ProbeEvery makes the command a probe, run again this long after each run
	// that does not meet the completion rule (with none: that does not exit 0).
	ProbeEvery string `json:"probe_every,omitempty" jsonschema:"the command is a probe: run it again this long after each run (at least 1s) until a run meets completion (default: exits 0), within the deadline"`
	// Notify sends notices of matching output lines while the command runs.
	Notify *Notify `json:"notify,omitempty" jsonschema:"while the command runs, send the stdout lines that match as notices to the inbox (each a wake-up with notice nK); the final wake-up still comes once"`
	// RerunOf names the task this one runs again.
	RerunOf string `json:"rerun_of,omitempty"`
	// Occurrence names the slot of a schedule that registered the task.
	Occurrence *Occurrence `json:"occurrence,omitempty"`
	// External: the task runs nothing and ends when completed from outside
	// (bgtask complete), or at its deadline.
	External bool `json:"external,omitempty" jsonschema:"run nothing: the task ends when completed from outside (bgtask complete) or at its deadline"`
	// WakeOn lists the outcomes that wake the caller (default: all); another
	// ends the task quietly: no inbox message, no push.
	WakeOn []string `json:"wake_on,omitempty" jsonschema:"the outcomes that wake the caller (default: all); another ends the task quietly"`
	// After lists the tasks this one waits for; AfterPolicy says what they must
	// have done for it to run: succeeded (default; else it is skipped) or ended.
	After       []string `json:"after,omitempty" jsonschema:"task ids this one waits for: it starts once they have ended"`
	AfterPolicy string   `json:"after_policy,omitempty" jsonschema:"what the tasks of after must have done: succeeded (default; else this one is skipped) or ended"`
	// Join makes a task with no command the group of its members: it fires once
	// when all of them (or, mode any, the first) have ended.
	Join *Join `json:"join,omitempty"`
	// Process makes a task with no command the watch of a process bgtask did not
	// start: it fires once when that process ends.
	Process *Process `json:"process,omitempty"`
}

// ParseSpec decodes and validates a spec registered now.
func ParseSpec(data []byte) (Spec, error) { return ParseSpecAt(data, time.Now()) }

// ParseSpecAt decodes and validates a spec registered at now (a relative deadline
// counts from it). Every rejection is a *FieldError.
func ParseSpecAt(data []byte, now time.Time) (Spec, error) {
	s, err := DecodeSpec(data)
	if err != nil {
		return Spec{}, err
	}
	if err := s.Validate(); err != nil {
		return Spec{}, err
	}
	if err := s.validateTiming(now); err != nil {
		return Spec{}, err
	}
	if err := s.validateWatch(now); err != nil {
		return Spec{}, err
	}
	if err := s.validateDelivery(); err != nil {
		return Spec{}, err
	}
	if err := s.validateProbe(); err != nil {
		return Spec{}, err
	}
	if err := s.validateNotify(); err != nil {
		return Spec{}, err
	}
	return s, nil
}

// DecodeSpec reads a spec as the engine reads one, without validating its
// values: it refuses a document over the size limits, JSON that CheckJSON
// refuses, a field it does not know (or spelt in another case) and a value of the
// wrong type, each with a *FieldError naming the field. A front-end that fills in
// a spec's defaults decodes it so: what it sends on is what it was given, a
// 64-bit number in a json_line match included.
func DecodeSpec(data []byte) (Spec, error) {
	if len(data) > MaxSpecWithEnvBytes {
		return Spec{}, fieldErr("spec", "%d bytes is over the limit of %d (%d for its env, %d for the rest)", len(data), MaxSpecWithEnvBytes, MaxEnvBytes, MaxSpecBytes)
	}
	// Also refuses field names that encoding/json would match without regard to case
	// ("Command", "completion.Regex"): a spec uses exactly the documented names.
	if err := checkJSON(data, "spec", specFields); err != nil {
		return Spec{}, err
	}
	if len(data) > MaxSpecBytes {
		if err := checkSizes(data); err != nil {
			return Spec{}, err
		}
	}
	// checkJSON has refused unknown field names, and those spelt in another case.
	s, err := unmarshalSpec(data)
	if errors.Is(err, errAfterSpec) {
		return Spec{}, fieldErr("spec", "unexpected data after the JSON object")
	}
	if err != nil {
		return Spec{}, decodeError(err)
	}
	return s, nil
}

// specFields are the spec's field names as written on the wire.
var specFields = fieldsOf(reflect.TypeFor[Spec]())

func decodeError(err error) error {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) && typeErr.Field != "" {
		return fieldErr(typeErr.Field, "must be %s, not %s", jsonKind(typeErr.Type.Kind().String()), typeErr.Value)
	}
	return fieldErr("spec", "not a JSON object: %v", err)
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "slice":
		return "an array"
	case "map", "struct":
		return "an object"
	}
	return goKind
}

// Validate checks a spec and fills in defaults.
func (s *Spec) Validate() error {
	switch {
	case strings.TrimSpace(s.Command) == "" && len(s.Argv) == 0 && s.StartAt == "" && !s.External && s.Join == nil && s.Process == nil:
		return fieldErr("command", "required: give a shell command or argv (or only start_at, for a timer; external; join; or process)")
	case s.Command != "" && len(s.Argv) > 0:
		return fieldErr("argv", "give command or argv, not both")
	case len(s.Argv) > 0 && s.Argv[0] == "":
		return fieldErr("argv", "argv[0] is empty")
	}
	if err := s.validateProcess(); err != nil {
		return err
	}
	if strings.ContainsRune(s.Command, 0) {
		return fieldErr("command", "contains a NUL byte")
	}
	for i, a := range s.Argv {
		if strings.ContainsRune(a, 0) {
			return fieldErr("argv", "argv[%d] contains a NUL byte", i)
		}
	}
	if s.Result != nil {
		for i, a := range s.Result.Argv {
			if strings.ContainsRune(a, 0) {
				return fieldErr("result.argv", "argv[%d] contains a NUL byte", i)
			}
		}
	}
	if s.Cwd != "" {
		if !filepath.IsAbs(s.Cwd) {
			return fieldErr("cwd", "%q is not an absolute path", s.Cwd)
		}
		info, err := os.Stat(s.Cwd)
		switch {
		case err != nil:
			return fieldErr("cwd", "%q does not exist or cannot be read", s.Cwd)
		case !info.IsDir():
			return fieldErr("cwd", "%q is not a directory", s.Cwd)
		}
	}
	for k, v := range s.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return fieldErr("env", "invalid variable name %q", k)
		}
		if strings.ContainsRune(v, 0) {
			return fieldErr("env", "value of %s contains a NUL byte", k)
		}
		if slices.Contains(secretenv.Names, k) {
			// Stored, it would be read by every identity that reads the stream.
			return fieldErr("env", "%s holds a credential of bgtask's, which no command gets: leave it out", k)
		}
	}
	if err := s.validateEnvironment(); err != nil {
		return err
	}
	if len(s.Kind) > 64 || strings.ContainsAny(s.Kind, "\x00\n\r") {
		return fieldErr("kind", "must be one line of at most 64 bytes")
	}
	if s.Target == "" {
		s.Target = DefaultTarget
	}
	if !events.ValidToken(s.Target) {
		return fieldErr("target", "%q: use 1-128 letters, digits, '-' or '_'", s.Target)
	}
	if len(s.IdempotencyKey) > 256 {
		return fieldErr("idempotency_key", "longer than 256 bytes")
	}
	if len(s.Origin) > 0 && string(s.Origin) == "null" {
		s.Origin = nil
	}
	if len(s.Origin) > MaxOriginBytes {
		return fieldErr("origin", "%d bytes is over the limit of %d", len(s.Origin), MaxOriginBytes)
	}
	if err := checkTemplate(s.Prompt, placeholders); err != nil {
		return fieldErr("prompt", "%v", err)
	}
	return s.Placement.validate()
}

// CommandLine is the command as a person reads it.
func (s Spec) CommandLine() string {
	if s.Command != "" {
		return s.Command
	}
	if s.Process != nil {
		return "pid " + strconv.Itoa(s.Process.PID)
	}
	quoted := make([]string, len(s.Argv))
	for i, a := range s.Argv {
		quoted[i] = shellQuote(a)
	}
	return strings.Join(quoted, " ")
}

func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r == '-' || r == '_' || r == '.' || r == '/' || r == '=' || r == ':' ||
			r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// unmarshalSpec decodes a spec's JSON, which must be all there is: with
// json.Unmarshal, reading the bytes in place, unless it has json_line match
// values, the only values of no fixed type, whose numbers json.Unmarshal would
// make float64 (rounding a 64-bit id) where a decoder with UseNumber keeps every
// digit.
func unmarshalSpec(data []byte) (Spec, error) {
	var s Spec
	if json.Unmarshal(data, &s) == nil && (s.Completion == nil || len(s.Completion.Match) == 0) && (s.Notify == nil || len(s.Notify.Match) == 0) {
		return s, nil
	}
	s = Spec{}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&s); err != nil {
		return Spec{}, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Spec{}, errAfterSpec
	}
	return s, nil
}

// errAfterSpec: a spec's JSON object is followed by more.
var errAfterSpec = errors.New("unexpected data after the JSON object")

// decodeSpec reads a spec back from an armed event (every task's, in a
// restart's replay). It was validated when it was armed; it is not checked
// again, since a cwd may since have gone.
func decodeSpec(raw json.RawMessage) (Spec, error) {
	s, err := unmarshalSpec(raw)
	if err != nil {
		return Spec{}, fmt.Errorf("armed spec: %w", err)
	}
	return s, nil
}
