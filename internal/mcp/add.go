package mcpserver

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/internal/proc"
)

// The tools that register a task: add, a spec with the defaults of `bgtask add`,
// and join, one wake-up for a group.

func (s *server) addRegistrationTools(m *mcp.Server) {
	add := &mcp.Tool{
		Name:  "add",
		Title: "Run a command in the background",
		Description: "Register a command to run in the background and return its task id at once. " +
			"When it ends, its wake-up (status, exit code, output tail, the rendered prompt) goes to the target's inbox" +
			" and wakes the agent session that registered it, exactly once, even across restarts of bgtask. " +
			"Give command (a shell string) or argv; every other argument is a field of the task's spec. " +
			"With start_at and no command it is a durable reminder (a timer): it wakes the session once at that time, even after a restart, " +
			"with the prompt you give. " +
			"The command runs in the agent's environment (this MCP server's), with env set over it. " +
			"The engine validates the spec and a refusal names the field. " +
			"Default cwd: the MCP server's working directory, which runs the task on this host (cwd \"\" runs it in the worker's home," +
			" placement {} on any worker).",
		InputSchema: addSchema(),
		Annotations: &mcp.ToolAnnotations{DestructiveHint: new(false), IdempotentHint: true, OpenWorldHint: new(true)},
	}
	addTool(m, add, s.add)
	addTool(m, &mcp.Tool{
		Name:  "join",
		Title: "One wake-up for a group of tasks",
		Description: "Register a task that runs nothing and wakes the session once, when all of the member tasks (mode all) " +
			"or the first of them (mode any) have ended; its wake-up lists each member's id, status and exit code ({{members}} in prompt). " +
			"Returns its task id at once, as add does.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: new(false), IdempotentHint: true, OpenWorldHint: new(true)},
	}, s.join)
}

// addArgs are add's arguments: a spec, as the engine decodes one (a refusal
// names the field, and what is passed on is what was given), and pid.
type addArgs struct {
	client.Spec
	PID *int `json:"pid,omitempty" jsonschema:"instead of a command, watch this process of the MCP server's host, which bgtask did not start: the task fires when it ends (exit_code null: only its parent can read it)"`
	// cwdGiven: a cwd was given, "" too (the worker's home).
	cwdGiven bool
}

// notAddArgs are the spec's fields that add does not offer: join has a tool of
// its own, pid is the process's, and the others are bgtask's.
var notAddArgs = []string{"join", "process", "rerun_of", "occurrence"}

// addSchema is add's input schema: the spec's, less the fields add does not
// offer, and saying what a field defaults to here where the engine's default
// is another.
func addSchema() *jsonschema.Schema {
	s := inputSchema[addArgs]()
	for _, name := range notAddArgs {
		delete(s.Properties, name)
	}
	s.PropertyOrder = slices.DeleteFunc(s.PropertyOrder, func(name string) bool { return slices.Contains(notAddArgs, name) })
	for name, description := range map[string]string{
		"cwd":             "working directory (default: the MCP server's; a relative one is taken from there; \"\": the worker's home)",
		"environment":     "what the command's environment starts from: caller (default: the MCP server's, which is the agent's: its PATH and exports, env set over it) or login (the worker's login environment, with env)",
		"target":          "the inbox the wake-up goes to (default: the agent session this server runs in, else \"default\")",
		"origin":          "JSON returned as-is in the wake-up: the caller's routing data (default in an agent session: its runtime and id)",
		"idempotency_key": "the same key registers the same task once and returns its id (default: a key of this call's own)",
		"placement":       "which workers may take the task: {\"labels\": {KEY: VALUE}}; {} for any (default with a cwd: this host)",
	} {
		s.Properties[name].Description = description
	}
	return s
}

// UnmarshalJSON reads add's arguments, which decodeArgs has checked as JSON (a
// repeated name among them, read into a map, would keep one of its values).
func (a *addArgs) UnmarshalJSON(data []byte) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		return &argError{"arguments", "want a JSON object"}
	}
	if raw, ok := fields["pid"]; ok {
		delete(fields, "pid")
		if json.Unmarshal(raw, &a.PID) != nil || a.PID == nil || *a.PID <= 0 {
			return &argError{"pid", "want the id of a running process, above 0"}
		}
	}
	_, a.cwdGiven = fields["cwd"]
	spec, err := json.Marshal(fields)
	if err != nil {
		return err
	}
	a.Spec, err = engine.DecodeSpec(spec)
	return err
}

type registration struct {
	client.Registration
	Target string `json:"target" jsonschema:"the inbox the task's wake-up goes to"`
}

// add registers a spec with the defaults of `bgtask add`.
func (s *server) add(ctx context.Context, _ *mcp.CallToolRequest, in addArgs) (string, registration, error) {
	spec := in.Spec
	if in.PID != nil {
		if err := s.watchPID(&spec, *in.PID); err != nil {
			return "", registration{}, err
		}
	}
	if spec.Command != "" || len(spec.Argv) > 0 {
		s.commandDefaults(&spec, in.cwdGiven)
	}
	return s.register(ctx, spec)
}

// watchPID makes spec the watch of process pid, as --pid does: its identity read
// on this host, the task placed on it.
func (s *server) watchPID(spec *client.Spec, pid int) error {
	if spec.Command != "" || len(spec.Argv) > 0 {
		return &argError{"pid", "give pid or a command, not both"}
	}
	id, err := proc.Of(pid)
	if err != nil {
		return &argError{"pid", fmt.Sprintf("%d: %v on this host (%s)", pid, err, s.cfg.Host)}
	}
	spec.Process = new(engine.Process(id))
	spec.Placement = s.thisHost()
	return nil
}

// commandDefaults gives a command what `bgtask add` gives it: the server's
// directory (a relative cwd is taken from it), this host when it has a directory
// (one here means nothing on another machine), and the caller's environment
// unless its spec says login.
func (s *server) commandDefaults(spec *client.Spec, cwdGiven bool) {
	switch {
	case !cwdGiven:
		spec.Cwd = s.cfg.Cwd
	case spec.Cwd != "" && !filepath.IsAbs(spec.Cwd):
		spec.Cwd = filepath.Join(s.cfg.Cwd, spec.Cwd)
	}
	if spec.Placement == nil && spec.Cwd != "" {
		spec.Placement = s.thisHost()
	}
	if spec.Environment != "" && spec.Environment != engine.EnvironmentCaller {
		return
	}
	env := maps.Clone(s.cfg.Env)
	if env == nil {
		env = map[string]string{}
	}
	if spec.Cwd != "" {
		env["PWD"] = spec.Cwd
	}
	maps.Copy(env, spec.Env)
	spec.Env, spec.Environment = env, engine.EnvironmentCaller
}

func (s *server) thisHost() *engine.Placement {
	return &engine.Placement{Labels: map[string]string{engine.HostLabel: s.cfg.Host}}
}

// register registers spec, to the session's target with its origin unless it
// names them, and says where its wake-up goes.
func (s *server) register(ctx context.Context, spec client.Spec) (string, registration, error) {
	if session := s.cfg.Session; session != nil {
		spec.Target = cmp.Or(spec.Target, session.Target)
		if spec.Origin == nil {
			spec.Origin = session.Origin
		}
		if spec.Deliver == nil {
			spec.Deliver = session.Deliver
		}
	}
	ownKey := spec.IdempotencyKey == "" // Register gives it one
	var reg client.Registration
	err := s.call(ctx, func(ctx context.Context, c *client.Client) (err error) {
		reg, err = c.Register(ctx, spec)
		return err
	})
	if err != nil {
		return "", registration{}, err
	}
	// Nobody else has this call's own key: a task already under it is the one an
	// earlier attempt of this very call armed.
	reg.Created = reg.Created || ownKey
	target := cmp.Or(spec.Target, client.DefaultTarget)
	text := fmt.Sprintf("registered task %s; its wake-up goes to target %s", reg.ID, target)
	if !reg.Created {
		text = fmt.Sprintf("task %s was registered before under this idempotency key; its wake-up goes to target %s", reg.ID, target)
	}
	return text, registration{reg, target}, nil
}

type joinArgs struct {
	Mode           string   `json:"mode" jsonschema:"all: once every member has ended; any: once the first has"`
	Members        []string `json:"members" jsonschema:"the ids of the member tasks, as add returned them (add them with wake_on [\"none\"] so that they wake nobody themselves)"`
	Prompt         string   `json:"prompt,omitempty" jsonschema:"template of the wake-up's prompt; {{members}} lists the members (default: a summary)"`
	Target         string   `json:"target,omitempty" jsonschema:"the inbox the wake-up goes to (default: the agent session this server runs in, else \"default\")"`
	Kind           string   `json:"kind,omitempty" jsonschema:"a label for the group"`
	IdempotencyKey string   `json:"idempotency_key,omitempty" jsonschema:"the same key registers the same group once and returns its id (default: a key of this call's own)"`
}

func (s *server) join(ctx context.Context, _ *mcp.CallToolRequest, in joinArgs) (string, registration, error) {
	text, out, err := s.register(ctx, client.Spec{Join: &engine.Join{Mode: in.Mode, Members: in.Members},
		Prompt: in.Prompt, Target: in.Target, Kind: in.Kind, IdempotencyKey: in.IdempotencyKey})
	var apiErr *client.Error
	if errors.As(err, &apiErr) && strings.HasPrefix(apiErr.Field, "join.") {
		// The spec's join.mode and join.members are this tool's mode and members.
		named := *apiErr
		named.Field = strings.TrimPrefix(apiErr.Field, "join.")
		named.Message = strings.Replace(apiErr.Message, apiErr.Field, named.Field, 1)
		return "", out, &named
	}
	return text, out, err
}
