package engine_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// watchSpec parses raw as a spec registered at t0, so that relative deadlines are
// known in advance.
func watchSpec(t *testing.T, raw string) engine.Spec {
	t.Helper()
	spec, err := engine.ParseSpecAt([]byte(raw), t0)
	if err != nil {
		t.Fatalf("ParseSpecAt(%s): %v", raw, err)
	}
	return spec
}

// withRule is a spec of command "make test" with the watch fields in rules, a JSON
// object body without its braces.
func withRule(rules string) string { return `{"command":"make test",` + rules + `}` }

// Completion rules that the tables below use.
const (
	jsonRule    = `"completion":{"type":"json_line","match":{"status":"done"}}`
	patternRule = `"completion":{"type":"line_pattern","regex":"^DONE"}`
)

// checkFieldError fails unless err is a *FieldError on field that the message
// starts with.
func checkFieldError(t *testing.T, err error, field string) *engine.FieldError {
	t.Helper()
	var fe *engine.FieldError
	if !errors.As(err, &fe) {
		t.Fatalf("error %v (%T) is not a *FieldError", err, err)
	}
	if fe.Field != field {
		t.Fatalf("field = %q, want %q (error: %v)", fe.Field, field, err)
	}
	if fe.Reason == "" || !strings.HasPrefix(err.Error(), field+": ") {
		t.Fatalf("error %q does not start with the field and give a reason", err)
	}
	return fe
}

func TestParseSpecRejectsWatchRulesWithTheFieldNamed(t *testing.T) {
	t.Parallel()
	//lint:ignore SA1000 the test needs the error of an invalid pattern
	_, reErr := regexp.Compile("(a")
	if reErr == nil {
		t.Fatal(`regexp "(a" compiled`)
	}
	//lint:ignore SA1000 the test needs the error of a pattern RE2 does not support
	_, lookaheadErr := regexp.Compile("x(?=y)")
	if lookaheadErr == nil {
		t.Fatal(`regexp "x(?=y)" compiled`)
	}
	cases := []struct {
		name   string
		rules  string
		field  string
		reason string // a part of the reason, if it matters
	}{
		// completion
		{"exit with a match", `"completion":{"type":"exit","match":{"a":"b"}}`, "completion", ""},
		{"exit with a regex", `"completion":{"type":"exit","regex":"x"}`, "completion", ""},
		{"untyped with a regex", `"completion":{"regex":"x"}`, "completion", ""},
		{"json_line without a match", `"completion":{"type":"json_line"}`, "completion.match", ""},
		{"json_line with an empty match", `"completion":{"type":"json_line","match":{}}`, "completion.match", ""},
		{"json_line with a regex", `"completion":{"type":"json_line","match":{"a":"b"},"regex":"x"}`, "completion.regex", ""},
		{"line_pattern without a regex", `"completion":{"type":"line_pattern"}`, "completion.regex", ""},
		{"line_pattern with an invalid regex", `"completion":{"type":"line_pattern","regex":"(a"}`, "completion.regex", reErr.Error()},
		{"line_pattern with a Perl-only regex", `"completion":{"type":"line_pattern","regex":"x(?=y)"}`, "completion.regex", lookaheadErr.Error()},
		{"line_pattern with a match", `"completion":{"type":"line_pattern","regex":"x","match":{"a":"b"}}`, "completion.match", ""},
		{"unknown completion type", `"completion":{"type":"exit_code"}`, "completion.type", `"exit_code"`},
		{"completion type in another case", `"completion":{"type":"JSON_LINE","match":{"a":"b"}}`, "completion.type", ""},
		{"completion that is a string", `"completion":"exit"`, "completion", ""},
		{"match that is an array", `"completion":{"type":"json_line","match":["a"]}`, "completion.match", ""},
		// keep_running
		{"keep_running without a completion", `"keep_running":true`, "keep_running", ""},
		{"keep_running with exit completion", `"completion":{"type":"exit"},"keep_running":true`, "keep_running", ""},
		// stall_after and on_stall
		{"stall_after that is not a duration", `"stall_after":"soon"`, "stall_after", `"soon"`},
		{"stall_after without a unit", `"stall_after":"30"`, "stall_after", ""},
		{"stall_after under the minimum", `"stall_after":"99ms"`, "stall_after", "100ms"},
		{"stall_after zero", `"stall_after":"0s"`, "stall_after", ""},
		{"stall_after negative", `"stall_after":"-5m"`, "stall_after", ""},
		{"stall_after that is a number", `"stall_after":30`, "stall_after", ""},
		{"unknown on_stall", `"stall_after":"1m","on_stall":"restart"`, "on_stall", `"restart"`},
		{"on_stall without stall_after", `"on_stall":"kill"`, "on_stall", "stall_after"},
		{"on_stall notify without stall_after", `"on_stall":"notify"`, "on_stall", ""},
		// max_respawns
		{"max_respawns without a stall rule", `"max_respawns":2`, "max_respawns", ""},
		{"max_respawns with the default notify", `"stall_after":"1m","max_respawns":2`, "max_respawns", "respawn"},
		{"max_respawns with kill", `"stall_after":"1m","on_stall":"kill","max_respawns":2`, "max_respawns", ""},
		{"max_respawns negative", `"stall_after":"1m","on_stall":"respawn","max_respawns":-1`, "max_respawns", "-1"},
		{"max_respawns over 100", `"stall_after":"1m","on_stall":"respawn","max_respawns":101`, "max_respawns", "101"},
		{"max_respawns that is a string", `"stall_after":"1m","on_stall":"respawn","max_respawns":"2"`, "max_respawns", ""},
		// deadline: see also TestParseSpecDeadline
		{"deadline that is neither", `"deadline":"tomorrow"`, "deadline", `"tomorrow"`},
		{"deadline in the past", `"deadline":"2025-03-01T11:59:59Z"`, "deadline", "past"},
		// result
		{"result without a type", `"result":{}`, "result.type", ""},
		{"unknown result type", `"result":{"type":"head"}`, "result.type", `"head"`},
		{"tail lines negative", `"result":{"type":"tail","lines":-1}`, "result.lines", "-1"},
		{"tail lines over the limit", `"result":{"type":"tail","lines":1001}`, "result.lines", "1001"},
		{"matched_line without a completion", `"result":{"type":"matched_line"}`, "result", ""},
		{"matched_line with exit completion", `"completion":{"type":"exit"},"result":{"type":"matched_line"}`, "result", ""},
		{"matched_line with lines", jsonRule + `,"result":{"type":"matched_line","lines":5}`, "result.lines", ""},
		{"command without argv", `"result":{"type":"command"}`, "result.argv", ""},
		{"command with an empty argv[0]", `"result":{"type":"command","argv":["","x"]}`, "result.argv", ""},
		{"command with a bad timeout", `"result":{"type":"command","argv":["cat","out"],"timeout":"long"}`, "result.timeout", `"long"`},
		{"command with a timeout under the minimum", `"result":{"type":"command","argv":["cat","out"],"timeout":"10ms"}`, "result.timeout", ""},
		{"command with lines", `"result":{"type":"command","argv":["cat","out"],"lines":5}`, "result.lines", ""},
		{"result argv that is a string", `"result":{"type":"command","argv":"cat out"}`, "result.argv", ""},
		// max_result_bytes
		{"max_result_bytes negative", `"max_result_bytes":-1`, "max_result_bytes", "-1"},
		{"max_result_bytes over the limit", `"max_result_bytes":` + strconv.Itoa(engine.MaxResultBytesLimit+1), "max_result_bytes", strconv.Itoa(engine.MaxResultBytesLimit + 1)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			raw := withRule(tc.rules)
			got, err := engine.ParseSpecAt([]byte(raw), t0)
			if err == nil {
				t.Fatalf("ParseSpecAt accepted %s as %+v", raw, got)
			}
			fe := checkFieldError(t, err, tc.field)
			if !strings.Contains(fe.Reason, tc.reason) {
				t.Fatalf("reason %q does not contain %q", fe.Reason, tc.reason)
			}
			if !reflect.DeepEqual(got, engine.Spec{}) {
				t.Fatalf("rejected spec returned %+v, want the zero Spec", got)
			}
		})
	}
}

// TestParseSpecWatchFieldNamesAreExact: a spec uses exactly the documented names, in
// the watch rules' objects as at the top level, and a rejection names the field by
// its full path.
func TestParseSpecWatchFieldNamesAreExact(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		rules string
		field string
	}{
		{"completion field in another case", `"completion":{"Type":"line_pattern","Regex":"x"}`, "completion.Type"},
		{"result field in another case", `"result":{"TYPE":"tail","Lines":5}`, "result.TYPE"},
		{"unknown completion field", `"completion":{"type":"line_pattern","regexp":"x"}`, "completion.regexp"},
		{"unknown result field", `"result":{"type":"tail","line":5}`, "result.line"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			raw := withRule(tc.rules)
			got, err := engine.ParseSpecAt([]byte(raw), t0)
			if err == nil {
				t.Fatalf("ParseSpecAt accepted %s as completion %+v result %+v", raw, got.Completion, got.Result)
			}
			checkFieldError(t, err, tc.field)
		})
	}
}

func TestParseSpecAcceptsWatchRules(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		rules string
		check func(t *testing.T, s engine.Spec)
	}{
		{"no watch rules", `"kind":"plain"`, func(t *testing.T, s engine.Spec) {
			if s.Completion != nil || s.KeepRunning || s.StallAfter != "" || s.OnStall != "" || s.MaxRespawns != nil ||
				s.Deadline != "" || s.Result != nil || s.MaxResultBytes != 0 {
				t.Fatalf("spec without watch rules has some: %+v", s)
			}
		}},
		{"exit completion is no completion", `"completion":{"type":"exit"}`, func(t *testing.T, s engine.Spec) {
			if s.Completion != nil {
				t.Fatalf("Completion = %+v, want nil", s.Completion)
			}
		}},
		{"untyped completion is exit", `"completion":{}`, func(t *testing.T, s engine.Spec) {
			if s.Completion != nil {
				t.Fatalf("Completion = %+v, want nil", s.Completion)
			}
		}},
		{"exit completion with an empty match", `"completion":{"type":"exit","match":{}}`, func(t *testing.T, s engine.Spec) {
			if s.Completion != nil {
				t.Fatalf("Completion = %+v, want nil", s.Completion)
			}
		}},
		{"null completion", `"completion":null`, func(t *testing.T, s engine.Spec) {
			if s.Completion != nil {
				t.Fatalf("Completion = %+v, want nil", s.Completion)
			}
		}},
		{"json_line keeps its match", `"completion":{"type":"json_line","match":{"status":"done","run.id":"r-*","n":42,"ok":true,"err":null}}`, func(t *testing.T, s engine.Spec) {
			if s.Completion == nil || s.Completion.Type != engine.CompleteOnJSON || s.Completion.Regex != "" {
				t.Fatalf("Completion = %+v, want a json_line rule", s.Completion)
			}
			match, err := json.Marshal(s.Completion.Match)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := string(match), `{"err":null,"n":42,"ok":true,"run.id":"r-*","status":"done"}`; got != want {
				t.Fatalf("Completion.Match = %s, want %s", got, want)
			}
		}},
		{"line_pattern keeps its regex", `"completion":{"type":"line_pattern","regex":"^listening on :\\d+$"}`, func(t *testing.T, s engine.Spec) {
			want := &engine.Completion{Type: engine.CompleteOnPattern, Regex: `^listening on :\d+$`}
			if !reflect.DeepEqual(s.Completion, want) {
				t.Fatalf("Completion = %+v, want %+v", s.Completion, want)
			}
		}},
		{"keep_running with json_line", jsonRule + `,"keep_running":true`, func(t *testing.T, s engine.Spec) {
			if !s.KeepRunning || s.Completion == nil {
				t.Fatalf("KeepRunning %v Completion %+v, want true and the rule", s.KeepRunning, s.Completion)
			}
		}},
		{"keep_running with line_pattern", patternRule + `,"keep_running":true`, func(t *testing.T, s engine.Spec) {
			if !s.KeepRunning {
				t.Fatal("KeepRunning = false, want true")
			}
		}},
		{"keep_running false without a rule", `"keep_running":false`, func(t *testing.T, s engine.Spec) {
			if s.KeepRunning {
				t.Fatal("KeepRunning = true, want false")
			}
		}},
		{"on_stall defaults to notify", `"stall_after":"5m"`, func(t *testing.T, s engine.Spec) {
			if got, want := s.OnStall, engine.OnStallNotify; got != want {
				t.Fatalf("OnStall = %q, want %q", got, want)
			}
			if got, want := s.StallAfter, "5m"; got != want {
				t.Fatalf("StallAfter = %q, want %q", got, want)
			}
		}},
		{"stall_after at the minimum", `"stall_after":"100ms"`, func(t *testing.T, s engine.Spec) {
			if got, want := s.StallDuration(), 100*time.Millisecond; got != want {
				t.Fatalf("StallDuration = %v, want %v", got, want)
			}
		}},
		{"on_stall notify", `"stall_after":"1m","on_stall":"notify"`, func(t *testing.T, s engine.Spec) {
			if got, want := s.OnStall, engine.OnStallNotify; got != want {
				t.Fatalf("OnStall = %q, want %q", got, want)
			}
		}},
		{"on_stall kill", `"stall_after":"1m","on_stall":"kill"`, func(t *testing.T, s engine.Spec) {
			if got, want := s.OnStall, engine.OnStallKill; got != want {
				t.Fatalf("OnStall = %q, want %q", got, want)
			}
		}},
		{"on_stall respawn", `"stall_after":"1m","on_stall":"respawn"`, func(t *testing.T, s engine.Spec) {
			if got, want := s.OnStall, engine.OnStallRespawn; got != want {
				t.Fatalf("OnStall = %q, want %q", got, want)
			}
			if s.MaxRespawns != nil {
				t.Fatalf("MaxRespawns = %d, want unset", *s.MaxRespawns)
			}
		}},
		{"max_respawns 0", `"stall_after":"1m","on_stall":"respawn","max_respawns":0`, func(t *testing.T, s engine.Spec) {
			if s.MaxRespawns == nil || *s.MaxRespawns != 0 {
				t.Fatalf("MaxRespawns = %v, want 0", s.MaxRespawns)
			}
		}},
		{"max_respawns 100", `"stall_after":"1m","on_stall":"respawn","max_respawns":100`, func(t *testing.T, s engine.Spec) {
			if s.MaxRespawns == nil || *s.MaxRespawns != 100 {
				t.Fatalf("MaxRespawns = %v, want 100", s.MaxRespawns)
			}
		}},
		{"result tail", `"result":{"type":"tail","lines":5}`, func(t *testing.T, s engine.Spec) {
			if want := (&engine.Result{Type: engine.ResultTail, Lines: 5}); !reflect.DeepEqual(s.Result, want) {
				t.Fatalf("Result = %+v, want %+v", s.Result, want)
			}
		}},
		{"result tail of the default length", `"result":{"type":"tail"}`, func(t *testing.T, s engine.Spec) {
			if want := (&engine.Result{Type: engine.ResultTail}); !reflect.DeepEqual(s.Result, want) {
				t.Fatalf("Result = %+v, want %+v", s.Result, want)
			}
		}},
		{"result tail at the limit", `"result":{"type":"tail","lines":1000}`, func(t *testing.T, s engine.Spec) {
			if got, want := s.Result.Lines, engine.MaxTailLines; got != want {
				t.Fatalf("Result.Lines = %d, want %d", got, want)
			}
		}},
		{"result matched_line with json_line", jsonRule + `,"result":{"type":"matched_line"}`, func(t *testing.T, s engine.Spec) {
			if got, want := s.Result.Type, engine.ResultMatchedLine; got != want {
				t.Fatalf("Result.Type = %q, want %q", got, want)
			}
		}},
		{"result matched_line with line_pattern", patternRule + `,"result":{"type":"matched_line"}`, func(t *testing.T, s engine.Spec) {
			if got, want := s.Result.Type, engine.ResultMatchedLine; got != want {
				t.Fatalf("Result.Type = %q, want %q", got, want)
			}
		}},
		{"result command", `"result":{"type":"command","argv":["cat","out.txt"],"timeout":"5s"}`, func(t *testing.T, s engine.Spec) {
			want := &engine.Result{Type: engine.ResultCommand, Argv: []string{"cat", "out.txt"}, Timeout: "5s"}
			if !reflect.DeepEqual(s.Result, want) {
				t.Fatalf("Result = %+v, want %+v", s.Result, want)
			}
		}},
		{"result command without a timeout", `"result":{"type":"command","argv":["cat"]}`, func(t *testing.T, s engine.Spec) {
			if got, want := s.Result.Timeout, ""; got != want {
				t.Fatalf("Result.Timeout = %q, want %q", got, want)
			}
		}},
		{"max_result_bytes 1", `"max_result_bytes":1`, func(t *testing.T, s engine.Spec) {
			if got, want := s.MaxResultBytes, 1; got != want {
				t.Fatalf("MaxResultBytes = %d, want %d", got, want)
			}
		}},
		{"max_result_bytes at the limit", `"max_result_bytes":` + strconv.Itoa(engine.MaxResultBytesLimit), func(t *testing.T, s engine.Spec) {
			if got, want := s.MaxResultBytes, engine.MaxResultBytesLimit; got != want {
				t.Fatalf("MaxResultBytes = %d, want %d", got, want)
			}
		}},
		{"every rule at once", `"completion":{"type":"line_pattern","regex":"ready"},"keep_running":true,"stall_after":"2m","on_stall":"respawn","max_respawns":3,` +
			`"deadline":"1h","result":{"type":"matched_line"},"max_result_bytes":4096`, func(t *testing.T, s engine.Spec) {
			if s.Completion == nil || !s.KeepRunning || s.StallAfter != "2m" || s.OnStall != engine.OnStallRespawn ||
				s.Respawns() != 3 || s.Deadline != "2025-03-01T13:00:00Z" || s.Result.Type != engine.ResultMatchedLine || s.MaxResultBytes != 4096 {
				t.Fatalf("spec = %+v", s)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.check(t, watchSpec(t, withRule(tc.rules)))
		})
	}
}

func TestParseSpecDeadline(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		deadline string
		want     string // the stored deadline; "" means rejected
	}{
		{"duration from registration", "10m", "2025-03-01T12:10:00Z"},
		{"compound duration", "1h30m15s", "2025-03-01T13:30:15Z"},
		{"duration at the minimum", "100ms", "2025-03-01T12:00:00.1Z"},
		{"time in the future", "2025-03-02T08:00:00Z", "2025-03-02T08:00:00Z"},
		{"time with fractional seconds", "2025-03-01T12:00:00.5Z", "2025-03-01T12:00:00.5Z"},
		{"time with an offset, stored in UTC", "2025-03-01T14:30:00+02:00", "2025-03-01T12:30:00Z"},
		{"duration under the minimum", "99ms", ""},
		{"zero duration", "0s", ""},
		{"bare zero", "0", ""},
		{"negative duration", "-5m", ""},
		{"time in the past", "2025-02-28T12:00:00Z", ""},
		{"time exactly now", "2025-03-01T12:00:00Z", ""},
		{"time that is now in another zone", "2025-03-01T13:00:00+01:00", ""},
		{"zero time", "0001-01-01T00:00:00Z", ""},
		{"date without a time", "2025-03-02", ""},
		{"time without a zone", "2025-03-02T08:00:00", ""},
		{"garbage", "soon", ""},
		{"number without a unit", "600", ""},
		// The shim and the timers hold a deadline as int64 Unix nanoseconds: one past
		// their range would wrap into the past and fire at once.
		{"the latest representable time", "2262-04-11T23:47:16Z", "2262-04-11T23:47:16Z"},
		{"a second past the representable range", "2262-04-11T23:47:17Z", ""},
		{"a far future meant as never", "9999-12-31T23:59:59Z", ""},
		{"a duration past the representable range", "2200000h", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			raw := withRule(`"deadline":` + jsonString(t, tc.deadline))
			s, err := engine.ParseSpecAt([]byte(raw), t0)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("deadline %q accepted as %q", tc.deadline, s.Deadline)
				}
				checkFieldError(t, err, "deadline")
				return
			}
			if err != nil {
				t.Fatalf("deadline %q: %v", tc.deadline, err)
			}
			if got := s.Deadline; got != tc.want {
				t.Fatalf("Deadline = %q, want %q", got, tc.want)
			}
			want, err := time.Parse(time.RFC3339Nano, tc.want)
			if err != nil {
				t.Fatal(err)
			}
			if got := s.DeadlineTime(); !got.Equal(want) {
				t.Fatalf("DeadlineTime = %v, want %v", got, want)
			}
		})
	}
}

// TestArmedSpecKeepsTheWatchRules: the spec a worker reads back from the armed event
// is the one that was validated, defaults and all.
func TestArmedSpecKeepsTheWatchRules(t *testing.T) {
	t.Parallel()
	spec := watchSpec(t, withRule(`"completion":{"type":"json_line","match":{"status":"done","n":42,"a.b":{"c":[1,"x",null]}}},`+
		`"keep_running":true,"stall_after":"2m","on_stall":"respawn","max_respawns":3,"deadline":"1h",`+
		`"result":{"type":"command","argv":["cat","out"],"timeout":"5s"},"max_result_bytes":4096`))
	f := newFold(t, taskID, spec)
	f.do(engineWriter, engine.Arm{Spec: spec})
	if !reflect.DeepEqual(f.state.Spec, spec) {
		t.Fatalf("armed spec differs from the registered one:\n got %+v\nwant %+v", f.state.Spec, spec)
	}
	replayed, problems := engine.Replay(f.history)
	if len(problems) != 0 || !reflect.DeepEqual(replayed.Spec, spec) {
		t.Fatalf("replayed spec = %+v (problems %v), want %+v", replayed.Spec, problems, spec)
	}
}

// jsonMatcher is the matcher of a json_line rule whose match object is the JSON
// text match, decoded as a spec read from the stream is.
func jsonMatcher(t *testing.T, match string) engine.LineMatcher {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(match), &m); err != nil {
		t.Fatalf("match %s: %v", match, err)
	}
	return engine.Spec{Completion: &engine.Completion{Type: engine.CompleteOnJSON, Match: m}}.Matcher()
}

func TestMatcherJSONLine(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		match string
		line  string
		want  bool
	}{
		// strings
		{"exact string", `{"status":"done"}`, `{"status":"done","n":1}`, true},
		{"other string", `{"status":"done"}`, `{"status":"doing"}`, false},
		{"string is not a prefix match", `{"status":"done"}`, `{"status":"done!"}`, false},
		{"string is case sensitive", `{"status":"done"}`, `{"status":"Done"}`, false},
		{"missing key", `{"status":"done"}`, `{"state":"done"}`, false},
		{"key is case sensitive", `{"status":"done"}`, `{"Status":"done"}`, false},
		{"empty object", `{"status":"done"}`, `{}`, false},
		{"empty string matches empty string", `{"msg":""}`, `{"msg":""}`, true},
		{"unicode string", `{"msg":"fertig ✓"}`, `{"msg":"fertig \u2713"}`, true},
		// prefix
		{"prefix", `{"event":"build.*"}`, `{"event":"build.finished"}`, true},
		{"prefix matches the prefix itself", `{"event":"build.*"}`, `{"event":"build."}`, true},
		{"prefix that does not match", `{"event":"build.*"}`, `{"event":"test.finished"}`, false},
		{"prefix is anchored at the start", `{"event":"build.*"}`, `{"event":"pre-build.finished"}`, false},
		{"bare star matches any string", `{"event":"*"}`, `{"event":""}`, true},
		{"bare star needs the key", `{"event":"*"}`, `{"other":"x"}`, false},
		{"prefix does not match a number", `{"code":"4*"}`, `{"code":42}`, false},
		{"prefix does not match null", `{"code":"*"}`, `{"code":null}`, false},
		// dotted keys
		{"dotted nested key", `{"result.status":"ok"}`, `{"result":{"status":"ok"}}`, true},
		{"deeply nested key", `{"a.b.c":"x"}`, `{"a":{"b":{"c":"x"}}}`, true},
		{"dotted key with another value", `{"result.status":"ok"}`, `{"result":{"status":"failed"}}`, false},
		{"dotted key through a non-object", `{"result.status":"ok"}`, `{"result":"ok"}`, false},
		{"dotted key through an array", `{"result.status":"ok"}`, `{"result":[{"status":"ok"}]}`, false},
		{"dotted key that is missing below", `{"result.status":"ok"}`, `{"result":{}}`, false},
		{"top-level key with a dot", `{"result.status":"ok"}`, `{"result.status":"ok"}`, true},
		{"top-level key with a dot wins over the path", `{"a.b":"top"}`, `{"a.b":"top","a":{"b":"nested"}}`, true},
		{"path is not tried when the dotted key exists", `{"a.b":"nested"}`, `{"a.b":"top","a":{"b":"nested"}}`, false},
		{"prefix on a nested key", `{"job.name":"deploy-*"}`, `{"job":{"name":"deploy-prod"}}`, true},
		// several fields
		{"all fields present", `{"type":"done","code":0}`, `{"type":"done","code":0,"extra":1}`, true},
		{"one field wrong", `{"type":"done","code":0}`, `{"type":"done","code":1}`, false},
		{"one field missing", `{"type":"done","code":0}`, `{"type":"done"}`, false},
		// numbers
		{"number", `{"answer":42}`, `{"answer":42}`, true},
		{"number written as a float", `{"answer":42}`, `{"answer":42.0}`, true},
		{"number in exponent form", `{"answer":42}`, `{"answer":4.2e1}`, true},
		{"other number", `{"answer":42}`, `{"answer":43}`, false},
		{"number against a string", `{"answer":42}`, `{"answer":"42"}`, false},
		{"fraction", `{"ratio":0.5}`, `{"ratio":0.5}`, true},
		{"negative number", `{"delta":-3}`, `{"delta":-3}`, true},
		{"string 42 matches the number 42", `{"answer":"42"}`, `{"answer":42}`, true},
		{"string 42 matches the string 42", `{"answer":"42"}`, `{"answer":"42"}`, true},
		{"string 42 against 43", `{"answer":"42"}`, `{"answer":43}`, false},
		{"string of a large integer exactly", `{"id":"1234567890123456789"}`, `{"id":1234567890123456789}`, true},
		{"string of a large integer, one off", `{"id":"1234567890123456789"}`, `{"id":1234567890123456788}`, false},
		// bool and null
		{"true", `{"ok":true}`, `{"ok":true}`, true},
		{"true against false", `{"ok":true}`, `{"ok":false}`, false},
		{"true against the string", `{"ok":true}`, `{"ok":"true"}`, false},
		{"true against 1", `{"ok":true}`, `{"ok":1}`, false},
		{"false", `{"ok":false}`, `{"ok":false}`, true},
		{"false against a missing key", `{"ok":false}`, `{}`, false},
		{"string true matches true", `{"ok":"true"}`, `{"ok":true}`, true},
		{"null", `{"err":null}`, `{"err":null}`, true},
		{"null needs the key", `{"err":null}`, `{}`, false},
		{"null against a string", `{"err":null}`, `{"err":"null"}`, false},
		{"null against false", `{"err":null}`, `{"err":false}`, false},
		{"string null matches null", `{"err":"null"}`, `{"err":null}`, true},
		// objects and arrays
		{"object equality", `{"r":{"a":1,"b":["x"]}}`, `{"r":{"b":["x"],"a":1.0}}`, true},
		{"object with an extra key", `{"r":{"a":1}}`, `{"r":{"a":1,"b":2}}`, false},
		{"object with another value", `{"r":{"a":1}}`, `{"r":{"a":2}}`, false},
		{"array equality", `{"tags":["a",1,true,null]}`, `{"tags":["a",1,true,null]}`, true},
		{"array in another order", `{"tags":["a","b"]}`, `{"tags":["b","a"]}`, false},
		{"array that is longer", `{"tags":["a"]}`, `{"tags":["a","b"]}`, false},
		{"empty array", `{"tags":[]}`, `{"tags":[]}`, true},
		{"array against an object", `{"tags":[]}`, `{"tags":{}}`, false},
		{"string against an object", `{"r":"{\"a\":1}"}`, `{"r":{"a":1}}`, true},
		// lines that are not JSON objects
		{"plain text", `{"status":"done"}`, `status: done`, false},
		{"text that mentions the JSON", `{"status":"done"}`, `log: {"status":"done"}`, false},
		{"empty line", `{"status":"done"}`, ``, false},
		{"blank line", `{"status":"done"}`, " \t ", false},
		{"truncated JSON", `{"status":"done"}`, `{"status":"done"`, false},
		{"JSON array", `{"status":"done"}`, `[{"status":"done"}]`, false},
		{"JSON string", `{"status":"done"}`, `"status"`, false},
		{"JSON number", `{"status":"done"}`, `42`, false},
		{"JSON null", `{"status":"done"}`, `null`, false},
		{"leading whitespace", `{"status":"done"}`, "  \t{\"status\":\"done\"}", true},
		{"trailing whitespace and CR", `{"status":"done"}`, "{\"status\":\"done\"}  \r", true},
		{"pretty spacing", `{"status":"done"}`, `{ "status" : "done" }`, true},
		{"text after the object", `{"status":"done"}`, `{"status":"done"} not json`, false},
		{"two objects on one line", `{"status":"done"}`, `{"status":"done"}{"status":"done"}`, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := jsonMatcher(t, tc.match)
			if m == nil {
				t.Fatal("Matcher() of a json_line rule is nil")
			}
			if got := m([]byte(tc.line)); got != tc.want {
				t.Fatalf("match %s on line %q = %v, want %v", tc.match, tc.line, got, tc.want)
			}
		})
	}
}

// TestMatcherComparesLargeIntegersExactly: a number in the match is compared exactly,
// as {{origin.*}} keeps it: ids beyond 2^53 (chat ids, snowflakes) must not match
// their neighbours.
func TestMatcherComparesLargeIntegersExactly(t *testing.T) {
	t.Parallel()
	const id = "1234567890123456789"
	spec := watchSpec(t, withRule(`"completion":{"type":"json_line","match":{"id":`+id+`}}`))
	f := newFold(t, taskID, spec)
	f.do(engineWriter, engine.Arm{Spec: spec})
	m := f.state.Spec.Matcher() // as the worker reads it back
	if !m([]byte(`{"id":` + id + `}`)) {
		t.Fatalf("id %s does not match itself", id)
	}
	if m([]byte(`{"id":1234567890123456788}`)) {
		t.Fatalf("id %s matches 1234567890123456788", id)
	}
	if raw, _ := json.Marshal(f.state.Spec.Completion.Match); !strings.Contains(string(raw), id) {
		t.Fatalf("the armed spec's match is %s, want the id %s as given", raw, id)
	}
}

func TestMatcherLinePattern(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		regex string
		line  string
		want  bool
	}{
		{"partial match", `ready`, `server is ready to serve`, true},
		{"no match", `ready`, `server is starting`, false},
		{"start anchor", `^DONE`, `DONE in 3s`, true},
		{"start anchor in the middle", `^DONE`, `not DONE`, false},
		{"end anchor", `passed$`, `all tests passed`, true},
		{"end anchor before more text", `passed$`, `passed: 3, failed: 1`, false},
		{"both anchors", `^ok$`, `ok`, true},
		{"both anchors with more", `^ok$`, `ok then`, false},
		{"class and repetition", `listening on :\d+`, `listening on :8080`, true},
		{"class without a digit", `listening on :\d+`, `listening on :http`, false},
		{"case insensitive flag", `(?i)error`, `ERROR: disk full`, true},
		{"case sensitive by default", `error`, `ERROR: disk full`, false},
		{"alternation", `^(PASS|FAIL)$`, `FAIL`, true},
		{"empty line against an anchored pattern", `^.+$`, ``, false},
		{"JSON line as text", `"status":"done"`, `{"status":"done"}`, true},
		{"unicode", `fertig ✓`, `alles fertig ✓ jetzt`, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			spec := watchSpec(t, withRule(`"completion":{"type":"line_pattern","regex":`+jsonString(t, tc.regex)+`}`))
			m := spec.Matcher()
			if m == nil {
				t.Fatal("Matcher() of a line_pattern rule is nil")
			}
			if got := m([]byte(tc.line)); got != tc.want {
				t.Fatalf("regex %q on line %q = %v, want %v", tc.regex, tc.line, got, tc.want)
			}
		})
	}
}

func TestMatcherOfExitCompletionIsNil(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		spec engine.Spec
	}{
		{"no completion", engine.Spec{Command: "true"}},
		{"exit completion as registered", watchSpec(t, withRule(`"completion":{"type":"exit"}`))},
		{"exit completion built by hand", engine.Spec{Command: "true", Completion: &engine.Completion{Type: engine.CompleteOnExit}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if m := tc.spec.Matcher(); m != nil {
				t.Fatalf("Matcher() = %p, want nil", m)
			}
		})
	}
}

// watchedRun is a run of the watch tests: started at t0+2s, ended 1.5s later.
func watchedRun(code int, signal string, change func(r *events.Exited)) events.Exited {
	r := exitRun(code, signal, "first", "last")
	if change != nil {
		change(&r)
	}
	return r
}

func TestApplyOutcomeOfAWatchedRun(t *testing.T) {
	t.Parallel()
	matched := func(r *events.Exited) {
		r.Matched, r.MatchedLine, r.StoppedBy = true, `{"status":"done"}`, events.StoppedByMatch
	}
	byDeadline := func(r *events.Exited) { r.StoppedBy = events.StoppedByDeadline }
	byStall := func(r *events.Exited) { r.StoppedBy = events.StoppedByStall }
	const deadlineRule = `"deadline":"10m"`
	const deadlineReason = "the deadline 2025-03-01T12:10:00Z passed"
	// A rule's match says which rule matched which line, and that the exit code
	// is of bgtask's stop.
	const jsonMatch = "its completion rule (json_line `{\"status\":\"done\"}`) matched the line `{\"status\":\"done\"}`; "
	cases := []struct {
		name       string
		rules      string
		run        events.Exited
		wantStatus string
		wantReason string
	}{
		{"matched with exit 0", jsonRule, watchedRun(0, "", matched), engine.StatusSucceeded,
			jsonMatch + "the command then ended (exit code 0)"},
		{"matched with a non-zero exit", jsonRule, watchedRun(1, "", matched), engine.StatusSucceeded,
			jsonMatch + "the command then ended (exit code 1)"},
		{"matched and stopped by a signal", jsonRule, watchedRun(-1, "TERM", matched), engine.StatusSucceeded,
			jsonMatch + "bgtask then stopped the command (exit code -1, signal TERM)"},
		{"matched by a pattern, killed", patternRule, watchedRun(-1, "KILL", matched), engine.StatusSucceeded,
			"its completion rule (line_pattern `^DONE`) matched the line `{\"status\":\"done\"}`; bgtask then stopped the command (exit code -1, signal KILL)"},
		{"matched just as the deadline passed", jsonRule + "," + deadlineRule, watchedRun(-1, "TERM", func(r *events.Exited) {
			r.Matched, r.MatchedLine, r.StoppedBy = true, `{"status":"done"}`, events.StoppedByDeadline
		}), engine.StatusSucceeded, jsonMatch + "bgtask then stopped the command (exit code -1, signal TERM)"},
		{"a line that cannot be backquoted", patternRule, watchedRun(-1, "TERM", func(r *events.Exited) {
			r.Matched, r.MatchedLine, r.StoppedBy = true, "DONE `now`", events.StoppedByMatch
		}), engine.StatusSucceeded, "its completion rule (line_pattern `^DONE`) matched the line \"DONE `now`\"; bgtask then stopped the command (exit code -1, signal TERM)"},
		{"matched line without the matched flag", jsonRule, watchedRun(0, "", func(r *events.Exited) {
			r.MatchedLine = `{"status":"done"}`
		}), engine.StatusFailed, engine.ReasonNoMatch},
		{"deadline with exit completion", deadlineRule, watchedRun(-1, "TERM", byDeadline), engine.StatusTimedOut, deadlineReason},
		{"deadline with a rule", patternRule + "," + deadlineRule, watchedRun(-1, "TERM", byDeadline), engine.StatusTimedOut, deadlineReason},
		{"deadline although the command exited 0", deadlineRule, watchedRun(0, "", byDeadline), engine.StatusTimedOut, deadlineReason},
		{"a deadline to the nanosecond, said to the millisecond", `"deadline":"10m0.123456789s"`, watchedRun(-1, "TERM", byDeadline),
			engine.StatusTimedOut, "the deadline 2025-03-01T12:10:00.123Z passed"},
		{"stall with exit completion", `"stall_after":"30s","on_stall":"kill"`, watchedRun(-1, "TERM", byStall), engine.StatusStalled, "no output for 30s"},
		{"stall with a rule", jsonRule + `,"stall_after":"1m","on_stall":"kill"`, watchedRun(-1, "KILL", byStall), engine.StatusStalled, "no output for 1m"},
		{"rule never matched, exit 0", jsonRule, watchedRun(0, "", nil), engine.StatusFailed, engine.ReasonNoMatch},
		{"rule never matched, exit 1", patternRule, watchedRun(1, "", nil), engine.StatusFailed, engine.ReasonNoMatch},
		{"rule never matched, killed", patternRule, watchedRun(-1, "KILL", nil), engine.StatusFailed, engine.ReasonNoMatch},
		{"exit completion, exit 0", "", watchedRun(0, "", nil), engine.StatusSucceeded, ""},
		{"exit completion, exit 0 with every other rule", deadlineRule + `,"stall_after":"1m","result":{"type":"tail","lines":5}`, watchedRun(0, "", nil), engine.StatusSucceeded, ""},
		{"explicit exit completion, exit 0", `"completion":{"type":"exit"}`, watchedRun(0, "", nil), engine.StatusSucceeded, ""},
		{"exit completion, exit 3", "", watchedRun(3, "", nil), engine.StatusFailed, ""},
		{"exit completion, signal", "", watchedRun(-1, "KILL", nil), engine.StatusFailed, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			raw := `{"command":"make test"}`
			if tc.rules != "" {
				raw = withRule(tc.rules)
			}
			w := persist(t, exitedWith(t, watchSpec(t, raw), tc.run))
			if got := w.Status; got != tc.wantStatus {
				t.Fatalf("status = %q, want %q", got, tc.wantStatus)
			}
			if got := w.Reason; got != tc.wantReason {
				t.Fatalf("reason = %q, want %q", got, tc.wantReason)
			}
			if w.ExitCode == nil || *w.ExitCode != tc.run.ExitCode || w.Signal != tc.run.Signal {
				t.Fatalf("exit code %v signal %q, want %d %q", w.ExitCode, w.Signal, tc.run.ExitCode, tc.run.Signal)
			}
			if got, want := w.MatchedLine, tc.run.MatchedLine; got != want {
				t.Fatalf("matched line = %q, want %q", got, want)
			}
			if tc.wantReason != "" && !strings.Contains(w.Prompt, tc.wantReason) {
				t.Fatalf("default prompt does not give the reason %q:\n%s", tc.wantReason, w.Prompt)
			}
		})
	}
}

// TestApplyOutcomeOfAStallNamesTheSilence: a run stopped for a stall reports how long
// it was silent, as the stall event recorded it.
func TestApplyOutcomeOfAStallNamesTheSilence(t *testing.T) {
	t.Parallel()
	spec := watchSpec(t, withRule(`"stall_after":"30s","on_stall":"kill"`))
	f := newFold(t, taskID, spec)
	f.do(engineWriter, engine.Arm{Spec: spec})
	f.do(workerA, engine.Spawn{})
	f.do(workerA, engine.Stall{SilentFor: 31500 * time.Millisecond, Action: engine.OnStallKill})
	if got, want := f.state.Phase, engine.PhaseRunning; got != want {
		t.Fatalf("phase after a kill stall = %q, want %q (the exit follows)", got, want)
	}
	f.do(workerA, engine.Exit{Run: watchedRun(-1, "TERM", func(r *events.Exited) { r.StoppedBy = events.StoppedByStall })})
	if got, want := f.state.Status, engine.StatusStalled; got != want {
		t.Fatalf("status = %q, want %q", got, want)
	}
	if got, want := f.state.Reason, "no output for 31.5s"; got != want {
		t.Fatalf("reason = %q, want %q", got, want)
	}
}

func TestKeptRunningWakeupHasNoExitCode(t *testing.T) {
	t.Parallel()
	spec := watchSpec(t, withRule(patternRule+`,"keep_running":true,"prompt":"{{status}} exit={{exit_code}} result={{result}}"`))
	run := events.Exited{
		Matched: true, MatchedLine: "DONE: listening", KeptRunning: true,
		Tail: []string{"starting", "DONE: listening"}, StartedAt: t0, EndedAt: t0.Add(time.Second),
	}
	s := exitedWith(t, spec, run)
	if got, want := s.Status, engine.StatusSucceeded; got != want {
		t.Fatalf("status = %q, want %q", got, want)
	}
	w := persist(t, s)
	if w.ExitCode != nil {
		t.Fatalf("exit code = %d, want none: the command is still running", *w.ExitCode)
	}
	if got, want := w.Prompt, "succeeded exit=none result=starting\nDONE: listening"; got != want {
		t.Fatalf("prompt = %q, want %q", got, want)
	}
	if got, want := w.MatchedLine, "DONE: listening"; got != want {
		t.Fatalf("matched line = %q, want %q", got, want)
	}

	spec.Prompt = ""
	w = persist(t, exitedWith(t, spec, run))
	if strings.Contains(w.Prompt, "exit code") {
		t.Fatalf("default prompt of a kept-running task gives an exit code:\n%s", w.Prompt)
	}
	if want := "Reason: its completion rule (line_pattern `^DONE`) matched the line `DONE: listening`; the command was left running (keep_running)\n"; !strings.Contains(w.Prompt, want) {
		t.Fatalf("default prompt of a kept-running task does not say %q:\n%s", want, w.Prompt)
	}
}

// stallFold is a task of spec spawned by workerA, with the stalls of actions already
// recorded; a respawn is followed by workerA's next spawn.
func stallFold(t *testing.T, spec engine.Spec, actions ...string) *fold {
	t.Helper()
	f := newFold(t, taskID, spec)
	f.do(engineWriter, engine.Arm{Spec: spec})
	f.do(workerA, engine.Spawn{Host: "host-a"})
	for _, a := range actions {
		f.do(workerA, engine.Stall{SilentFor: time.Minute, Action: a})
		if a == engine.OnStallRespawn {
			f.do(workerA, engine.Spawn{Host: "host-a"})
		}
	}
	return f
}

func TestDecideStall(t *testing.T) {
	t.Parallel()
	const (
		notify      = `"stall_after":"1m"`
		kill        = `"stall_after":"1m","on_stall":"kill"`
		respawn     = `"stall_after":"1m","on_stall":"respawn"`
		respawnNone = `"stall_after":"1m","on_stall":"respawn","max_respawns":0`
		respawn3    = `"stall_after":"1m","on_stall":"respawn","max_respawns":3`
	)
	errAny := errors.New("any error")
	n, k, r := engine.OnStallNotify, engine.OnStallKill, engine.OnStallRespawn
	cases := []struct {
		name    string
		rules   string
		before  []string // stalls already recorded
		writer  string
		action  string
		wantErr error // nil: allowed
	}{
		{"first notify", notify, nil, workerA, n, nil},
		{"second notify", notify, []string{n}, workerA, n, engine.ErrWrongPhase},
		{"kill when the spec says notify", notify, []string{n}, workerA, k, engine.ErrWrongPhase},
		{"kill", kill, nil, workerA, k, nil},
		{"first respawn, default limit", respawn, nil, workerA, r, nil},
		{"second respawn, default limit", respawn, []string{r}, workerA, r, engine.ErrWrongPhase},
		{"kill after the last respawn", respawn, []string{r}, workerA, k, nil},
		{"respawn with max_respawns 0", respawnNone, nil, workerA, r, engine.ErrWrongPhase},
		{"third respawn of 3", respawn3, []string{r, r}, workerA, r, nil},
		{"fourth respawn of 3", respawn3, []string{r, r, r}, workerA, r, engine.ErrWrongPhase},
		{"respawn of a notify spec", notify, nil, workerA, r, engine.ErrWrongPhase},
		{"respawn of a kill spec", kill, nil, workerA, r, engine.ErrWrongPhase},
		{"stall by a worker without the lease", notify, nil, workerB, n, engine.ErrNotOwner},
		{"kill by a worker without the lease", kill, nil, workerB, k, engine.ErrNotOwner},
		{"unknown action", notify, nil, workerA, "ignore", errAny},
		{"no action", notify, nil, workerA, "", errAny},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := stallFold(t, watchSpec(t, withRule(tc.rules)), tc.before...)
			before := f.state
			cmd := engine.Stall{SilentFor: 90 * time.Second, Action: tc.action}
			ev, err := engine.Decide(before, cmd, engine.Meta{Writer: tc.writer, Now: f.now.Add(time.Second)})
			if tc.wantErr != nil {
				if err == nil {
					t.Fatalf("Decide(%+v) allowed %s after stalls %v", cmd, ev.Type, tc.before)
				}
				if tc.wantErr != errAny && !errors.Is(err, tc.wantErr) {
					t.Fatalf("Decide: got %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Decide(%+v) after stalls %v: %v", cmd, tc.before, err)
			}
			if ev.Type != events.TypeStalled || ev.Epoch != before.Epoch || ev.Writer != tc.writer {
				t.Fatalf("event = %s at epoch %d by %q, want %s at epoch %d by %q", ev.Type, ev.Epoch, ev.Writer, events.TypeStalled, before.Epoch, tc.writer)
			}
			p, err := ev.Decode()
			if err != nil {
				t.Fatal(err)
			}
			if got, want := *p.(*events.Stalled), (events.Stalled{SilentFor: "1m30s", Action: tc.action}); got != want {
				t.Fatalf("stalled = %+v, want %+v", got, want)
			}
			if err := f.record(ev); err != nil {
				t.Fatalf("Apply of the decided stall: %v", err)
			}
			if f.state.Stall == nil || *f.state.Stall != (events.Stalled{SilentFor: "1m30s", Action: tc.action}) {
				t.Fatalf("State.Stall = %+v, want this stall", f.state.Stall)
			}
		})
	}
}

// TestDecideStallOutsideARun: only a running task stalls.
func TestDecideStallOutsideARun(t *testing.T) {
	t.Parallel()
	for _, at := range []engine.Phase{"", engine.PhaseArmed, engine.PhaseEnded, engine.PhasePersisted, engine.PhaseFired, engine.PhaseCancelled} {
		name := string(at)
		if at == "" {
			name = "no task"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := build(t, at)
			_, err := engine.Decide(f.state, engine.Stall{SilentFor: time.Minute, Action: engine.OnStallKill}, engine.Meta{Writer: workerA, Now: f.now})
			want := engine.ErrWrongPhase
			if at == "" {
				want = engine.ErrNotFound
			}
			if !errors.Is(err, want) {
				t.Fatalf("Decide(Stall) in phase %q: got %v, want %v", at, err, want)
			}
		})
	}
}

func TestStallNotifyIsRecordedOnce(t *testing.T) {
	t.Parallel()
	f := stallFold(t, watchSpec(t, withRule(`"stall_after":"1m"`)))
	if f.state.StallNotified {
		t.Fatal("StallNotified before any stall")
	}
	f.do(workerA, engine.Stall{SilentFor: time.Minute, Action: engine.OnStallNotify})
	s := f.state
	if !s.StallNotified || s.Phase != engine.PhaseRunning || s.Epoch != 1 || s.Respawns != 0 {
		t.Fatalf("after a notify: notified %v phase %q epoch %d respawns %d, want true running 1 0", s.StallNotified, s.Phase, s.Epoch, s.Respawns)
	}
	if got, want := s.LastType, events.TypeStalled; got != want {
		t.Fatalf("LastType = %q, want %q", got, want)
	}
	// The command goes on: it ticks and exits as before.
	f.do(workerA, engine.Tick{OutputBytes: 100})
	f.do(workerA, engine.Exit{Run: exitRun(0, "", "late output")})
	if got, want := f.state.Status, engine.StatusSucceeded; got != want {
		t.Fatalf("status after the notified task exited 0 = %q, want %q", got, want)
	}
}

func TestStallRespawnKeepsTheTaskForItsWorkersNextEpoch(t *testing.T) {
	t.Parallel()
	spec := watchSpec(t, withRule(`"stall_after":"1m","on_stall":"respawn","max_respawns":2`))
	f := stallFold(t, spec)
	f.do(workerA, engine.Tick{PID: 100, OutputBytes: 5})

	for respawn := 1; respawn <= 2; respawn++ {
		oldEpoch := f.state.Epoch
		f.do(workerA, engine.Stall{SilentFor: time.Minute, Action: engine.OnStallRespawn})
		s := f.state
		// The task stays running and its worker's: no one else can take it between runs.
		if s.Phase != engine.PhaseRunning || !s.RespawnPending || s.Respawns != respawn || s.Epoch != oldEpoch {
			t.Fatalf("respawn %d: phase %q pending %v respawns %d epoch %d, want running true %d %d", respawn, s.Phase, s.RespawnPending, s.Respawns, s.Epoch, respawn, oldEpoch)
		}
		if _, err := engine.Decide(s, engine.Spawn{}, engine.Meta{Writer: "another-worker", Now: time.Now()}); !errors.Is(err, engine.ErrNotOwner) {
			t.Fatalf("respawn %d: another worker's spawn: got %v, want ErrNotOwner", respawn, err)
		}

		ev := f.do(workerA, engine.Spawn{Host: "host-a"})
		if got, want := ev.Epoch, oldEpoch+1; got != want {
			t.Fatalf("respawn %d: spawn epoch = %d, want %d", respawn, got, want)
		}
		s = f.state
		if s.Phase != engine.PhaseRunning || s.Epoch != oldEpoch+1 || s.Worker != workerA || s.Respawns != respawn {
			t.Fatalf("respawn %d: phase %q epoch %d worker %q respawns %d, want running %d %q %d",
				respawn, s.Phase, s.Epoch, s.Worker, s.Respawns, oldEpoch+1, workerA, respawn)
		}
		for _, stale := range []events.Payload{
			&events.Tick{OutputBytes: 7},
			&events.Stalled{SilentFor: "1m0s", Action: engine.OnStallRespawn},
			&events.Exited{ExitCode: 0, StartedAt: t0, EndedAt: t0},
		} {
			if err := f.record(f.event(workerA, oldEpoch, stale)); !errors.Is(err, engine.ErrNotOwner) {
				t.Fatalf("respawn %d: %s of the old epoch %d: got %v, want ErrNotOwner", respawn, stale.EventType(), oldEpoch, err)
			}
		}
		if got, want := f.state.Respawns, respawn; got != want {
			t.Fatalf("respawn %d: a stale stall changed Respawns to %d", respawn, got)
		}
		f.do(workerA, engine.Tick{OutputBytes: 8})
	}

	_, err := engine.Decide(f.state, engine.Stall{SilentFor: time.Minute, Action: engine.OnStallRespawn}, engine.Meta{Writer: workerA, Now: f.now})
	if !errors.Is(err, engine.ErrWrongPhase) {
		t.Fatalf("respawn past max_respawns 2: got %v, want ErrWrongPhase", err)
	}
	f.do(workerA, engine.Stall{SilentFor: 61 * time.Second, Action: engine.OnStallKill})
	f.do(workerA, engine.Exit{Run: watchedRun(-1, "TERM", func(r *events.Exited) { r.StoppedBy = events.StoppedByStall })})
	s := f.state
	if s.Phase != engine.PhaseEnded || s.Status != engine.StatusStalled || s.Epoch != 3 || s.Respawns != 2 {
		t.Fatalf("after the kill: phase %q status %q epoch %d respawns %d, want ended stalled 3 2", s.Phase, s.Status, s.Epoch, s.Respawns)
	}
	if got, want := s.Reason, "no output for 1m1s"; got != want {
		t.Fatalf("reason = %q, want %q", got, want)
	}
	replayed, problems := engine.Replay(f.history)
	if got, want := len(problems), 6; got != want {
		t.Fatalf("Replay reported %d problems, want %d (the stale events): %v", got, want, problems)
	}
	if replayed.Respawns != 2 || replayed.Epoch != 3 || replayed.Phase != engine.PhaseEnded {
		t.Fatalf("replayed respawns %d epoch %d phase %q, want 2 3 ended", replayed.Respawns, replayed.Epoch, replayed.Phase)
	}
}

func TestStallNotice(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		prompt string
		want   []string // in the prompt
	}{
		{"default prompt", "", []string{"Background task " + taskID + " stalled", "Command: make test\n",
			"no output for 1m0s; the command is still running"}},
		{"spec prompt", `"prompt":"{{task_id}} {{status}} ({{reason}}) exit={{exit_code}} [{{origin.key}}]"`,
			[]string{taskID + " stalled (no output for 1m0s; the command is still running) exit=none [chan-1]"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rules := `"stall_after":"2m","kind":"build","target":"agent-1","origin":{"key":"chan-1"}`
			if tc.prompt != "" {
				rules += "," + tc.prompt
			}
			f := stallFold(t, watchSpec(t, withRule(rules)), engine.OnStallNotify)
			w := f.state.StallNotice()
			if w.ID != taskID || w.Status != engine.StatusStalled || w.Notice != "stalled" {
				t.Fatalf("notice id %q status %q notice %q, want %q stalled stalled", w.ID, w.Status, w.Notice, taskID)
			}
			if w.Kind != "build" || w.Target != "agent-1" || w.Command != "make test" || string(w.Origin) != `{"key":"chan-1"}` {
				t.Fatalf("notice routing = %+v, want the spec's", w)
			}
			if w.ExitCode != nil {
				t.Fatalf("notice exit code = %d, want none: the command is still running", *w.ExitCode)
			}
			// The reason gives the silence measured, not the rule's threshold.
			if got, want := w.Reason, "no output for 1m0s; the command is still running"; got != want {
				t.Fatalf("notice reason = %q, want %q", got, want)
			}
			if w.Prompt == "" {
				t.Fatal("notice has no prompt")
			}
			for _, s := range tc.want {
				if !strings.Contains(w.Prompt, s) {
					t.Errorf("notice prompt does not contain %q:\n%s", s, w.Prompt)
				}
			}
			if f.state.Phase != engine.PhaseRunning {
				t.Fatalf("phase after the notice = %q, want running", f.state.Phase)
			}
		})
	}
}

// lines returns "line from" to "line to".
func lines(from, to int) []string {
	var out []string
	for i := from; i <= to; i++ {
		out = append(out, fmt.Sprintf("line %d", i))
	}
	return out
}

func TestResult(t *testing.T) {
	t.Parallel()
	sixty := lines(1, 60)
	cases := []struct {
		name  string
		rules string
		run   func(r *events.Exited)
		want  string
	}{
		{"default is the last 50 lines", `"kind":"x"`, func(r *events.Exited) { r.Tail = sixty },
			strings.Join(lines(11, 60), "\n")},
		{"default with fewer lines", `"kind":"x"`, func(r *events.Exited) { r.Tail = lines(1, 3) },
			"line 1\nline 2\nline 3"},
		{"default with no output", `"kind":"x"`, func(r *events.Exited) { r.Tail = nil }, ""},
		{"tail without lines is 50", `"result":{"type":"tail"}`, func(r *events.Exited) { r.Tail = sixty },
			strings.Join(lines(11, 60), "\n")},
		{"tail 3", `"result":{"type":"tail","lines":3}`, func(r *events.Exited) { r.Tail = sixty },
			"line 58\nline 59\nline 60"},
		{"tail 1", `"result":{"type":"tail","lines":1}`, func(r *events.Exited) { r.Tail = sixty }, "line 60"},
		{"tail longer than the output", `"result":{"type":"tail","lines":100}`, func(r *events.Exited) { r.Tail = sixty },
			strings.Join(sixty, "\n")},
		{"tail 200 of 300 lines kept", `"result":{"type":"tail","lines":200}`, func(r *events.Exited) { r.Tail = lines(1, 300) },
			strings.Join(lines(101, 300), "\n")},
		{"matched_line", jsonRule + `,"result":{"type":"matched_line"}`, func(r *events.Exited) {
			r.Tail, r.Matched, r.MatchedLine = sixty, true, `{"status":"done","url":"https://x"}`
		}, `{"status":"done","url":"https://x"}`},
		{"command", `"result":{"type":"command","argv":["cat","report.txt"]}`, func(r *events.Exited) {
			r.Tail, r.Result = sixty, "coverage: 87%\n"
		}, "coverage: 87%\n"},
		{"command that failed", `"result":{"type":"command","argv":["cat","report.txt"]}`, func(r *events.Exited) {
			r.Tail, r.Result, r.ResultError = sixty, "partial", "exit status 1"
		}, "(result command failed: exit status 1)\npartial"},
		{"command that failed with no output", `"result":{"type":"command","argv":["cat","report.txt"]}`, func(r *events.Exited) {
			r.Tail, r.ResultError = sixty, "timed out after 1m0s"
		}, "(result command failed: timed out after 1m0s)\n"},
		{"cut at max_result_bytes", `"max_result_bytes":10,"result":{"type":"tail","lines":1}`, func(r *events.Exited) {
			r.Tail = []string{"0123456789abcdef"}
		}, "0123456789\n[result truncated: 10 of 16 bytes]"},
		{"exactly max_result_bytes is not cut", `"max_result_bytes":10,"result":{"type":"tail","lines":1}`, func(r *events.Exited) {
			r.Tail = []string{"0123456789"}
		}, "0123456789"},
		{"cut counts the newlines", `"max_result_bytes":8`, func(r *events.Exited) { r.Tail = []string{"abcd", "efgh"} },
			"abcd\nefg\n[result truncated: 8 of 9 bytes]"},
		{"command result cut", `"max_result_bytes":4,"result":{"type":"command","argv":["cat"]}`, func(r *events.Exited) {
			r.Result = "abcdefgh"
		}, "abcd\n[result truncated: 4 of 8 bytes]"},
		{"matched line cut", patternRule + `,"max_result_bytes":6,"result":{"type":"matched_line"}`, func(r *events.Exited) {
			r.Matched, r.MatchedLine = true, "DONE and more"
		}, "DONE a\n[result truncated: 6 of 13 bytes]"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			run := exitRun(0, "")
			tc.run(&run)
			w := persist(t, exitedWith(t, watchSpec(t, withRule(tc.rules)), run))
			if w.Result != tc.want {
				t.Fatalf("result = %q, want %q", w.Result, tc.want)
			}
			if !reflect.DeepEqual(w.Tail, run.Tail) {
				t.Fatalf("wake-up tail = %q, want the run's whole tail %q", w.Tail, run.Tail)
			}
		})
	}
}

func TestResultOfTheDefaultSizeIsCutAt32KiB(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", engine.DefaultMaxResultBytes+1)
	w := persist(t, exitedWith(t, watchSpec(t, withRule(`"result":{"type":"command","argv":["cat"]}`)), watchedRun(0, "", func(r *events.Exited) { r.Result = big })))
	want := big[:engine.DefaultMaxResultBytes] + fmt.Sprintf("\n[result truncated: %d of %d bytes]", engine.DefaultMaxResultBytes, len(big))
	if w.Result != want {
		t.Fatalf("result of %d bytes is %d bytes ending %q, want %d bytes", len(big), len(w.Result), w.Result[len(w.Result)-60:], len(want))
	}
}

// TestResultCutKeepsValidUTF8: a cut in the middle of a character drops the
// character's first bytes, and the note counts the bytes kept.
func TestResultCutKeepsValidUTF8(t *testing.T) {
	t.Parallel()
	const text = "aé€😀z" // 1 + 2 + 3 + 4 + 1 bytes
	cases := []struct {
		limit int
		want  string
	}{
		{1, "a"},
		{2, "a"},
		{3, "aé"},
		{4, "aé"},
		{5, "aé"},
		{6, "aé€"},
		{7, "aé€"},
		{8, "aé€"},
		{9, "aé€"},
		{10, "aé€😀"},
	}
	for _, tc := range cases {
		t.Run(strconv.Itoa(tc.limit), func(t *testing.T) {
			t.Parallel()
			spec := watchSpec(t, withRule(`"max_result_bytes":`+strconv.Itoa(tc.limit)+`,"result":{"type":"command","argv":["cat"]}`))
			w := persist(t, exitedWith(t, spec, watchedRun(0, "", func(r *events.Exited) { r.Result = text })))
			if !utf8.ValidString(w.Result) {
				t.Fatalf("result %q is not valid UTF-8", w.Result)
			}
			want := tc.want + fmt.Sprintf("\n[result truncated: %d of %d bytes]", len(tc.want), len(text))
			if w.Result != want {
				t.Fatalf("result = %q, want %q", w.Result, want)
			}
		})
	}
}

func TestResultInThePrompt(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		rules string
		run   func(r *events.Exited)
		want  string
	}{
		{"tail", `"result":{"type":"tail","lines":2}`, func(r *events.Exited) { r.Tail = lines(1, 5) },
			"Result:\nline 4\nline 5\n--"},
		{"matched line", jsonRule + `,"result":{"type":"matched_line"}`, func(r *events.Exited) {
			r.Matched, r.MatchedLine = true, `{"status":"done"}`
		}, "Result:\n{\"status\":\"done\"}\n--"},
		{"command", `"result":{"type":"command","argv":["cat"]}`, func(r *events.Exited) { r.Result = "artifact.tgz" },
			"Result:\nartifact.tgz\n--"},
		{"cut", `"max_result_bytes":3,"result":{"type":"command","argv":["cat"]}`, func(r *events.Exited) { r.Result = "abcdef" },
			"Result:\nabc\n[result truncated: 3 of 6 bytes]\n--"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			spec := watchSpec(t, withRule(tc.rules+`,"prompt":"Result:\n{{result}}\n--"`))
			run := exitRun(0, "")
			tc.run(&run)
			w := persist(t, exitedWith(t, spec, run))
			if w.Prompt != tc.want {
				t.Fatalf("prompt = %q, want %q", w.Prompt, tc.want)
			}
		})
	}
}

func TestSpecStallDurationAndDeadlineTime(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name         string
		spec         engine.Spec
		wantStall    time.Duration
		wantDeadline time.Time
	}{
		{"no rules", engine.Spec{}, 0, time.Time{}},
		{"stall_after", engine.Spec{StallAfter: "1m30s"}, 90 * time.Second, time.Time{}},
		{"deadline", engine.Spec{Deadline: "2025-03-01T12:10:00.25Z"}, 0, t0.Add(10*time.Minute + 250*time.Millisecond)},
		{"both, as registered", watchSpec(t, withRule(`"stall_after":"250ms","deadline":"2h"`)), 250 * time.Millisecond, t0.Add(2 * time.Hour)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := tc.spec.StallDuration(); got != tc.wantStall {
				t.Fatalf("StallDuration = %v, want %v", got, tc.wantStall)
			}
			if got := tc.spec.DeadlineTime(); !got.Equal(tc.wantDeadline) {
				t.Fatalf("DeadlineTime = %v, want %v", got, tc.wantDeadline)
			}
		})
	}
}

func TestSpecRespawns(t *testing.T) {
	t.Parallel()
	intp := func(n int) *int { return &n }
	cases := []struct {
		name string
		spec engine.Spec
		want int
	}{
		{"no stall rule", engine.Spec{}, 0},
		{"notify", engine.Spec{StallAfter: "1m", OnStall: engine.OnStallNotify}, 0},
		{"kill", engine.Spec{StallAfter: "1m", OnStall: engine.OnStallKill}, 0},
		{"respawn defaults to 1", engine.Spec{StallAfter: "1m", OnStall: engine.OnStallRespawn}, engine.DefaultMaxRespawns},
		{"respawn with max 0", engine.Spec{StallAfter: "1m", OnStall: engine.OnStallRespawn, MaxRespawns: intp(0)}, 0},
		{"respawn with max 7", engine.Spec{StallAfter: "1m", OnStall: engine.OnStallRespawn, MaxRespawns: intp(7)}, 7},
		{"max without respawn", engine.Spec{StallAfter: "1m", OnStall: engine.OnStallKill, MaxRespawns: intp(7)}, 0},
		{"respawn as registered", watchSpec(t, withRule(`"stall_after":"1m","on_stall":"respawn","max_respawns":4`)), 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := tc.spec.Respawns(); got != tc.want {
				t.Fatalf("Respawns() = %d, want %d", got, tc.want)
			}
		})
	}
	if got, want := engine.DefaultMaxRespawns, 1; got != want {
		t.Fatalf("DefaultMaxRespawns = %d, want %d", got, want)
	}
}

func TestSpecTailLines(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		result *engine.Result
		want   int
	}{
		{"no result rule", nil, engine.DefaultTailLines},
		{"tail of the default", &engine.Result{Type: engine.ResultTail}, engine.DefaultTailLines},
		{"tail under the default", &engine.Result{Type: engine.ResultTail, Lines: 10}, engine.DefaultTailLines},
		{"tail of exactly the default", &engine.Result{Type: engine.ResultTail, Lines: 50}, 50},
		{"tail over the default", &engine.Result{Type: engine.ResultTail, Lines: 51}, 51},
		{"tail at the limit", &engine.Result{Type: engine.ResultTail, Lines: engine.MaxTailLines}, engine.MaxTailLines},
		{"matched_line", &engine.Result{Type: engine.ResultMatchedLine}, engine.DefaultTailLines},
		{"command", &engine.Result{Type: engine.ResultCommand, Argv: []string{"cat"}}, engine.DefaultTailLines},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := (engine.Spec{Result: tc.result}).TailLines(); got != tc.want {
				t.Fatalf("TailLines() = %d, want %d", got, tc.want)
			}
		})
	}
	if got, want := engine.DefaultTailLines, 50; got != want {
		t.Fatalf("DefaultTailLines = %d, want %d", got, want)
	}
}

func TestResultTimeout(t *testing.T) {
	t.Parallel()
	cases := []struct {
		timeout string
		want    time.Duration
	}{
		{"", engine.DefaultResultTimeout},
		{"5s", 5 * time.Second},
		{"1m30s", 90 * time.Second},
		{"100ms", 100 * time.Millisecond},
		{"0s", engine.DefaultResultTimeout},
		{"-5s", engine.DefaultResultTimeout},
		{"soon", engine.DefaultResultTimeout},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%q", tc.timeout), func(t *testing.T) {
			t.Parallel()
			r := engine.Result{Type: engine.ResultCommand, Argv: []string{"cat"}, Timeout: tc.timeout}
			if got := r.ResultTimeout(); got != tc.want {
				t.Fatalf("ResultTimeout() of %q = %v, want %v", tc.timeout, got, tc.want)
			}
		})
	}
	if got, want := engine.DefaultResultTimeout, time.Minute; got != want {
		t.Fatalf("DefaultResultTimeout = %v, want %v", got, want)
	}
}
