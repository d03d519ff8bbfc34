package mcpserver

import (
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/bgtask/bgtask/client"
)

// session connects the SDK's client to a server of cfg, over an in-memory
// transport, until the test ends.
func session(t *testing.T, cfg Config) *mcp.ClientSession {
	t.Helper()
	ctx := context.Background()
	clientEnd, serverEnd := mcp.NewInMemoryTransports()
	ss, err := New(cfg).Connect(ctx, serverEnd, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, clientEnd, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cs.Close()
		ss.Wait()
	})
	return cs
}

// homeWithNoServer is a Config whose home has no server: a call that gets as far as
// connecting fails at once (503), so a test sees what was refused before.
func homeWithNoServer(t *testing.T) Config {
	return Config{Client: client.Config{Home: t.TempDir()}, Timeout: 10 * time.Second}
}

// callTool calls a tool with args, as raw JSON, failing on a protocol error.
func callTool(t *testing.T, cs *mcp.ClientSession, name, args string) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: json.RawMessage(args)})
	if err != nil {
		t.Fatalf("%s %s: %v", name, args, err)
	}
	return res
}

// toolError is a failed call's text and error object, failing if it succeeded.
func toolError(t *testing.T, res *mcp.CallToolResult) (string, client.Error) {
	t.Helper()
	if !res.IsError {
		t.Fatalf("not a tool error: %+v", res)
	}
	var text string
	if len(res.Content) == 1 {
		if tc, ok := res.Content[0].(*mcp.TextContent); ok {
			text = tc.Text
		}
	}
	data, _ := json.Marshal(res.StructuredContent)
	var obj struct{ Error *client.Error }
	if err := json.Unmarshal(data, &obj); err != nil || obj.Error == nil {
		t.Fatalf("structured content %s: not an error object (%v)", data, err)
	}
	return text, *obj.Error
}

// A bad argument is refused, before any call to the server, with the API's error
// object naming it; the SDK's typed tools would answer with a message of their
// own and no error object.
func TestMCPToolsRefuseABadArgumentNamingIt(t *testing.T) {
	cs := session(t, homeWithNoServer(t))
	for _, c := range []struct{ tool, args, field, message string }{
		{"show", `{"id": "x", "why": 1}`, "why", "why: not an argument of this tool"},
		{"cancel", `{"id": "x", "ID": "y"}`, "ID", "ID: not an argument of this tool"},
		{"cancel", `{"id": "x", "id": "y"}`, "id", "id: the key is given twice; each key may appear once"},
		{"wait", `{"id": "x", "consume": "yes"}`, "consume", "consume: want a bool, not a JSON string"},
		{"wait", `{"id": "x", "timeout": "soon"}`, "timeout", `timeout: "soon": want a positive duration such as 90s or 10m`},
		{"list", `{"limit": 0}`, "limit", "limit: 0: want at least 1"},
		{"list", `[1]`, "arguments", "arguments: want a JSON object, not a JSON array"},
		{"logs", `{"id": "x", "stream": "stdin"}`, "stream", `stream: "stdin": want stdout or stderr`},
		{"logs", `{"id": "x", "max_bytes": 1048577}`, "max_bytes", "max_bytes: 1048577: want 1 to 1048576"},
		{"join", `{"mode": "all", "members": "x"}`, "members", "members: want a []string, not a JSON string"},
		{"complete", `{"id": "x", "status": 1}`, "status", "status: want a string, not a JSON number"},
		{"redeliver", `{"id": "x", "sink": "0"}`, "sink", "sink: want a int, not a JSON string"},
		// add's arguments are a spec, which the engine's decoding reads.
		{"add", `{"command": "true", "colour": "red"}`, "colour", "colour: unknown field"},
		{"add", `{"command": "true", "completion": {"type": "line_pattern", "colour": 1}}`, "completion.colour", "completion.colour: unknown field"},
		{"add", `{"Command": "true"}`, "Command", "Command: unknown field"},
		{"add", `{"command": "true", "cwd": 7}`, "cwd", "cwd: must be a string, not number"},
		{"add", `{"command": "true", "command": "rm -rf ~"}`, "command", "command: the key is given twice; each key may appear once"},
		{"add", `{"pid": 0}`, "pid", "pid: want the id of a running process, above 0"},
		{"add", `{"pid": 1, "command": "true"}`, "pid", "pid: give pid or a command, not both"},
	} {
		text, obj := toolError(t, callTool(t, cs, c.tool, c.args))
		if obj.Code != 400 || obj.Field != c.field || obj.Message != c.message || text != c.message {
			t.Errorf("%s %s: text %q, error %+v; want a 400 on %s: %q", c.tool, c.args, text, obj, c.field, c.message)
		}
	}
}

// A call the server cannot be reached for says so, as the API's 503.
func TestMCPCallWithNoServerSaysSo(t *testing.T) {
	cfg := homeWithNoServer(t)
	text, obj := toolError(t, callTool(t, session(t, cfg), "show", `{"id": "abcdef"}`))
	if obj.Code != 503 || !strings.Contains(text, "no bgtask server in "+cfg.Client.Home) || obj.Message != text {
		t.Errorf("show with no server: text %q, error %+v", text, obj)
	}
}

// add's schema is the spec's, less what add does not offer, and pid; every
// argument of every tool is described, and none takes null.
func TestMCPToolSchemasAreTheirArgumentTypes(t *testing.T) {
	tools, err := session(t, homeWithNoServer(t)).ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
		data, _ := json.Marshal(tool.InputSchema)
		var s jsonschema.Schema
		if err := json.Unmarshal(data, &s); err != nil {
			t.Fatalf("%s: %v", tool.Name, err)
		}
		checkDescribed(t, tool.Name, &s)
		if tool.Name != "add" {
			continue
		}
		want := []string{"pid"}
		for _, f := range reflect.VisibleFields(reflect.TypeFor[client.Spec]()) {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if !slices.Contains(notAddArgs, name) {
				want = append(want, name)
			}
		}
		if got := slices.Sorted(func(yield func(string) bool) {
			for name := range s.Properties {
				yield(name)
			}
		}); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
			t.Errorf("add's arguments %v, want %v", got, slices.Sorted(slices.Values(want)))
		}
	}
	if want := []string{"add", "cancel", "complete", "join", "list", "logs", "redeliver", "show", "wait"}; !slices.Equal(slices.Sorted(slices.Values(names)), want) {
		t.Errorf("tools %v, want %v", names, want)
	}
}

// checkDescribed checks that an object schema refuses arguments it does not
// have and describes each of its own, the objects among them too.
func checkDescribed(t *testing.T, path string, s *jsonschema.Schema) {
	t.Helper()
	if s.AdditionalProperties == nil || s.AdditionalProperties.Not == nil {
		t.Errorf("%s: additionalProperties is not false", path)
	}
	for name, p := range s.Properties {
		if p.Description == "" {
			t.Errorf("%s.%s: no description", path, name)
		}
		if p.Types != nil {
			t.Errorf("%s.%s: types %v", path, name, p.Types)
		}
		for _, object := range []*jsonschema.Schema{p, p.Items} {
			if object != nil && object.Properties != nil {
				checkDescribed(t, path+"."+name, object)
			}
		}
	}
}

// The spec add passes on is the one it was given: a 64-bit number in a
// json_line match is not rounded through a float.
func TestMCPAddKeepsTheSpecAsGiven(t *testing.T) {
	var in addArgs
	err := decodeArgs(json.RawMessage(`{"command": "x", "cwd": "", "completion": {"type": "json_line", "match": {"id": 9007199254740993}}}`), &in, nil)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(in.Spec)
	if !strings.Contains(string(data), `"id":9007199254740993`) || !in.cwdGiven {
		t.Errorf("add's spec %s, cwd given %v", data, in.cwdGiven)
	}
}
