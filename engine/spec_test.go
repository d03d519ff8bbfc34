package engine_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/bgtask/bgtask/engine"
)

// jsonString quotes s as a JSON string.
func jsonString(t *testing.T, s string) string {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestParseSpecRejectsWithTheFieldNamed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "does-not-exist")
	cases := []struct {
		name  string
		spec  string
		field string
	}{
		{"unknown field", `{"command":"true","comand":"x"}`, "comand"},
		{"data after the spec", `{"command":"true"} {"command":"rm -rf /"}`, "spec"},
		{"data after a spec with match values", `{"command":"true","completion":{"type":"json_line","match":{"id":1}}} x`, "spec"},
		{"field name in another case", `{"Command":"true"}`, "Command"},
		{"no command at all", `{}`, "command"},
		{"empty command", `{"command":""}`, "command"},
		{"whitespace command", `{"command":" \t\n "}`, "command"},
		{"empty argv", `{"argv":[]}`, "command"},
		{"both command and argv", `{"command":"ls","argv":["ls"]}`, "argv"},
		{"argv[0] empty", `{"argv":["","x"]}`, "argv"},
		{"relative cwd", `{"command":"ls","cwd":"src/app"}`, "cwd"},
		{"missing cwd", `{"command":"ls","cwd":` + jsonString(t, missing) + `}`, "cwd"},
		{"cwd that is a file", `{"command":"ls","cwd":` + jsonString(t, file) + `}`, "cwd"},
		{"env name with =", `{"command":"ls","env":{"A=B":"1"}}`, "env"},
		{"empty env name", `{"command":"ls","env":{"":"1"}}`, "env"},
		{"NUL in env name", `{"command":"ls","env":{"A\u0000":"1"}}`, "env"},
		{"NUL in env value", `{"command":"ls","env":{"A":"1\u0000"}}`, "env"},
		{"a credential of bgtask's in env", `{"command":"ls","env":{"BGTASK_WORKER_PASSWORD":"x"}}`, "env"},
		{"unknown environment", `{"command":"ls","environment":"shell"}`, "environment"},
		{"environment of a timer", `{"start_at":"1h","environment":"caller"}`, "environment"},
		{"env over its budget", `{"command":"ls","environment":"caller","env":{"A":"` + strings.Repeat("x", engine.MaxEnvBytes) + `"}}`, "env"},
		{"spec over its budget beside an env", `{"command":"` + strings.Repeat("x", engine.MaxSpecBytes) + `","env":{"A":"1"}}`, "spec"},
		{"over both budgets", `{"command":"` + strings.Repeat("x", engine.MaxSpecBytes) + `","env":{"A":"` + strings.Repeat("x", engine.MaxEnvBytes) + `"}}`, "spec"},
		{"NUL in command", `{"command":"ls\u0000 -la"}`, "command"},
		{"NUL in argv", `{"argv":["ls","a\u0000b"]}`, "argv"},
		{"oversized spec", `{"command":"` + strings.Repeat("x", engine.MaxSpecBytes) + `"}`, "spec"},
		{"target with a dot", `{"command":"ls","target":"a.b"}`, "target"},
		{"target with a space", `{"command":"ls","target":"a b"}`, "target"},
		{"target wildcard *", `{"command":"ls","target":"*"}`, "target"},
		{"target wildcard >", `{"command":"ls","target":">"}`, "target"},
		{"target too long", `{"command":"ls","target":"` + strings.Repeat("t", 129) + `"}`, "target"},
		{"idempotency key too long", `{"command":"ls","idempotency_key":"` + strings.Repeat("k", 257) + `"}`, "idempotency_key"},
		{"kind too long", `{"command":"ls","kind":"` + strings.Repeat("k", 65) + `"}`, "kind"},
		{"kind on two lines", `{"command":"ls","kind":"a\nb"}`, "kind"},
		{"argv that is a string", `{"argv":"x"}`, "argv"},
		{"argv with a number", `{"argv":["ls",1]}`, "argv"},
		{"command that is a number", `{"command":1}`, "command"},
		{"env that is an array", `{"command":"ls","env":["A=1"]}`, "env"},
		{"env value that is a number", `{"command":"ls","env":{"A":1}}`, "env"},
		{"target that is a bool", `{"command":"ls","target":true}`, "target"},
		{"trailing object", `{"command":"ls"} {"command":"rm"}`, "spec"},
		{"trailing garbage", `{"command":"ls"}x`, "spec"},
		{"not an object", `["ls"]`, "spec"},
		{"a bare string", `"ls"`, "spec"},
		{"truncated JSON", `{"command":"ls"`, "spec"},
		{"empty input", ``, "spec"},
		{"unknown placeholder", `{"command":"ls","prompt":"done: {{exitcode}}"}`, "prompt"},
		{"bare origin placeholder", `{"command":"ls","prompt":"{{origin}}"}`, "prompt"},
		{"origin placeholder without a key", `{"command":"ls","prompt":"{{origin.}}"}`, "prompt"},
		{"empty placeholder", `{"command":"ls","prompt":"{{}}"}`, "prompt"},
		{"unclosed placeholder", `{"command":"ls","prompt":"{{status}} and {{tail"}`, "prompt"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := engine.ParseSpec([]byte(tc.spec))
			if err == nil {
				t.Fatalf("ParseSpec accepted %s as %+v", tc.spec, got)
			}
			var fe *engine.FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("error %v (%T) is not a *FieldError", err, err)
			}
			if fe.Field != tc.field {
				t.Fatalf("field = %q, want %q (error: %v)", fe.Field, tc.field, err)
			}
			if fe.Reason == "" || !strings.HasPrefix(err.Error(), tc.field+": ") {
				t.Fatalf("error %q does not start with the field and give a reason", err)
			}
			if !reflect.DeepEqual(got, engine.Spec{}) {
				t.Fatalf("rejected spec returned %+v, want the zero Spec", got)
			}
		})
	}
}

func TestParseSpecAccepts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cases := []struct {
		name  string
		spec  string
		check func(t *testing.T, s engine.Spec)
	}{
		{"defaults the target", `{"command":"make test"}`, func(t *testing.T, s engine.Spec) {
			if got, want := s.Target, engine.DefaultTarget; got != want {
				t.Fatalf("Target = %q, want %q", got, want)
			}
			if got, want := s.Command, "make test"; got != want {
				t.Fatalf("Command = %q, want %q", got, want)
			}
		}},
		{"keeps a named target", `{"command":"true","target":"agent_7-b"}`, func(t *testing.T, s engine.Spec) {
			if got, want := s.Target, "agent_7-b"; got != want {
				t.Fatalf("Target = %q, want %q", got, want)
			}
		}},
		{"keeps the origin as given", `{"command":"true","origin":{"chat": "c1", "thread":{"id":7}}}`, func(t *testing.T, s engine.Spec) {
			if got, want := string(s.Origin), `{"chat": "c1", "thread":{"id":7}}`; got != want {
				t.Fatalf("Origin = %s, want %s", got, want)
			}
		}},
		{"drops a null origin", `{"command":"true","origin":null}`, func(t *testing.T, s engine.Spec) {
			if s.Origin != nil {
				t.Fatalf("Origin = %s, want nil", s.Origin)
			}
		}},
		{"accepts argv", `{"argv":["printf","%s\n","it's here"]}`, func(t *testing.T, s engine.Spec) {
			if got, want := s.Argv, []string{"printf", "%s\n", "it's here"}; !reflect.DeepEqual(got, want) {
				t.Fatalf("Argv = %q, want %q", got, want)
			}
			if got, want := s.CommandLine(), `printf '%s`+"\n"+`' 'it'\''s here'`; got != want {
				t.Fatalf("CommandLine = %q, want %q", got, want)
			}
		}},
		{"accepts an absolute cwd that exists", `{"command":"ls","cwd":` + jsonString(t, dir) + `}`, func(t *testing.T, s engine.Spec) {
			if got, want := s.Cwd, dir; got != want {
				t.Fatalf("Cwd = %q, want %q", got, want)
			}
		}},
		{"accepts env, kind and idempotency key at their limits", `{"command":"ls","env":{"CI":"1","EMPTY":""},"kind":"` +
			strings.Repeat("k", 64) + `","idempotency_key":"` + strings.Repeat("i", 256) + `"}`, func(t *testing.T, s engine.Spec) {
			if got, want := s.Env, map[string]string{"CI": "1", "EMPTY": ""}; !reflect.DeepEqual(got, want) {
				t.Fatalf("Env = %v, want %v", got, want)
			}
			if len(s.Kind) != 64 || len(s.IdempotencyKey) != 256 {
				t.Fatalf("kind %d bytes, key %d bytes; want 64 and 256", len(s.Kind), len(s.IdempotencyKey))
			}
		}},
		{"accepts every placeholder", `{"command":"ls","prompt":"{{result}}{{exit_code}}{{status}}{{reason}}{{task_id}}{{kind}}{{command}}{{tail}}{{duration}}{{origin.a.b}}{{ status }}"}`, func(t *testing.T, s engine.Spec) {
			if !strings.HasPrefix(s.Prompt, "{{result}}") {
				t.Fatalf("Prompt = %q", s.Prompt)
			}
		}},
		{"accepts a prompt without placeholders", `{"command":"ls","prompt":"look at the build } {"}`, func(t *testing.T, s engine.Spec) {
			if got, want := s.Prompt, "look at the build } {"; got != want {
				t.Fatalf("Prompt = %q, want %q", got, want)
			}
		}},
		{"accepts a caller's environment of its own budget", `{"command":"` + strings.Repeat("x", engine.MaxSpecBytes-100) + `","environment":"caller","env":{"A":"` +
			strings.Repeat("y", engine.MaxEnvBytes-100) + `"}}`, func(t *testing.T, s engine.Spec) {
			if s.Environment != engine.EnvironmentCaller || len(s.Env["A"]) != engine.MaxEnvBytes-100 {
				t.Fatalf("Environment = %q, env A %d bytes", s.Environment, len(s.Env["A"]))
			}
		}},
		{"writes the login environment as none", `{"command":"ls","environment":"login"}`, func(t *testing.T, s engine.Spec) {
			if s.Environment != "" {
				t.Fatalf("Environment = %q, want none", s.Environment)
			}
		}},
		{"accepts trailing whitespace", "{\"command\":\"ls\"}\n\t ", func(t *testing.T, s engine.Spec) {
			if got, want := s.Command, "ls"; got != want {
				t.Fatalf("Command = %q, want %q", got, want)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := engine.ParseSpec([]byte(tc.spec))
			if err != nil {
				t.Fatalf("ParseSpec(%s): %v", tc.spec, err)
			}
			tc.check(t, s)
		})
	}
}

func TestParseSpecSizeLimitIsInclusive(t *testing.T) {
	t.Parallel()
	// Pad inside the object with whitespace so the spec stays valid at any size.
	spec := func(size int) []byte {
		head, tail := `{"command":"true"`, `}`
		return []byte(head + strings.Repeat(" ", size-len(head)-len(tail)) + tail)
	}
	if _, err := engine.ParseSpec(spec(engine.MaxSpecBytes)); err != nil {
		t.Fatalf("a spec of exactly MaxSpecBytes was rejected: %v", err)
	}
	_, err := engine.ParseSpec(spec(engine.MaxSpecBytes + 1))
	var fe *engine.FieldError
	if !errors.As(err, &fe) || fe.Field != "spec" {
		t.Fatalf("a spec one byte over the limit: got %v, want a FieldError on spec", err)
	}
}

func TestCommandLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		spec engine.Spec
		want string
	}{
		{"shell command as given", engine.Spec{Command: "make -j4 test && echo ok"}, "make -j4 test && echo ok"},
		{"plain argv unquoted", engine.Spec{Argv: []string{"go", "test", "./...", "-run=X"}}, "go test ./... -run=X"},
		{"argv with spaces quoted", engine.Spec{Argv: []string{"echo", "hello world"}}, "echo 'hello world'"},
		{"empty argument quoted", engine.Spec{Argv: []string{"printf", ""}}, "printf ''"},
		{"single quote escaped", engine.Spec{Argv: []string{"echo", "it's"}}, `echo 'it'\''s'`},
		{"shell metacharacters quoted", engine.Spec{Argv: []string{"echo", "$HOME;rm"}}, `echo '$HOME;rm'`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := tc.spec.CommandLine(); got != tc.want {
				t.Fatalf("CommandLine() = %q, want %q", got, tc.want)
			}
		})
	}
}
