package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/events"
)

// The MCP server: the client commands as tools and the tasks as resources, for an
// agent runtime that starts `bgtask mcp` and talks JSON-RPC to it on stdio.

// defaultProgressEvery is often enough that no client's idle timer on a call runs
// out while a wait blocks (Claude Code's is 30 minutes for a stdio server).
const defaultProgressEvery = 10 * time.Second

// Limits of the tools' answers, which end up in a model's context.
const (
	mcpListLimit = 20       // tasks of a list call that gives no limit
	mcpLogBytes  = 32 << 10 // bytes of output of a logs call that gives no max_bytes
	mcpMaxLog    = 1 << 20  // the most max_bytes may ask for
	mcpPageSize  = 50       // tasks per resources/list page
)

const taskURIPrefix = "bgtask://tasks/"

// privateNow: a task is the user's, and may have changed by the next read.
var privateNow = mcp.Cacheable{CacheScope: "private"}

func mcpCmd(g *globals) *cobra.Command {
	var progressEvery time.Duration
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve bgtask to an agent as an MCP server on stdin and stdout",
		Long: `Serve the Model Context Protocol on stdin and stdout, for an agent runtime that
starts it ('claude mcp add bgtask -- bgtask mcp'; docs/mcp.md). It ends when its
input closes. A line that is not a JSON-RPC message gets its JSON-RPC error
(-32700 or -32600), and the session goes on.

Tools: add (register a task: a command and any other spec field), join (one
wake-up for a group), show, list, logs, cancel, complete (end a task from
outside) and wait (with consume: the wake-up it returns wakes nobody again).
Resources: each task as bgtask://tasks/ID, its view as JSON.

add does what 'bgtask add' does: the default cwd is this server's working
directory, which places the task on this host; inside an agent session
(CLAUDE_CODE_SESSION_ID or CODEX_THREAD_ID set) a task that names no target
wakes that session. Each call waits for the server as a client command does,
through a restart of it, up to --timeout. A wait sends a progress notification
every --progress-every to a client that asked for them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if progressEvery <= 0 {
				return usageErr("--progress-every %s: want a positive duration", progressEvery)
			}
			cwd, err := os.Getwd()
			if err != nil {
				return err
			}
			session, inSession := currentSession(os.Getenv, g.home, g.stderr)
			m := &mcpServer{g: g, cwd: cwd, progressEvery: progressEvery}
			if inSession {
				m.session = &session
			}
			err = m.server().Run(cmd.Context(), &stdioTransport{r: cmd.InOrStdin(), w: g.stdout})
			if errors.Is(err, context.Canceled) {
				return nil // interrupted
			}
			return err
		},
	}
	g.timeoutFlag(cmd)
	cmd.Flags().DurationVar(&progressEvery, "progress-every", defaultProgressEvery, "how often a wait sends a progress notification to a client that gave a progress token")
	return cmd
}

// mcpServer serves the tools over the API, one connection per call as the client
// commands make them.
type mcpServer struct {
	g             *globals
	cwd           string        // the default cwd of a registration
	session       *agentSession // the agent session this server runs in, if any
	progressEvery time.Duration
}

func (m *mcpServer) server() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "bgtask", Title: "bgtask", Version: version()}, &mcp.ServerOptions{
		Instructions: "bgtask runs commands in the background and wakes the agent that registered them exactly once when they end, " +
			"with the exit code and the output's tail. Register long work with add instead of blocking on it; " +
			"the wake-up comes on its own, so wait only when the result is needed now.",
		// No list-changed notifications: the tasks change all the time, and the
		// tools not at all.
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}, Resources: &mcp.ResourceCapabilities{}},
	})
	for _, t := range m.tools() {
		s.AddTool(t.tool, m.handler(t.run))
	}
	s.AddResourceTemplate(&mcp.ResourceTemplate{
		URITemplate: taskURIPrefix + "{id}",
		Name:        "task",
		Title:       "A bgtask task",
		Description: "A task's current view: its spec, state, run, exit code and wake-up (what show returns).",
		MIMEType:    "application/json",
	}, m.readTask)
	// The tasks are listed from the API as they are now, not from a set the server
	// was given.
	s.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if r, ok := req.(*mcp.ListResourcesRequest); ok && method == "resources/list" {
				return m.listResources(ctx, r)
			}
			return next(ctx, method, req)
		}
	})
	return s
}

// toolRun does a tool's work: the text a model reads, and the same as structured
// content. An *api.Error or a *toolError is the tool's error; any other error is
// too, with its message.
type toolRun func(ctx context.Context, req *mcp.CallToolRequest, args json.RawMessage) (text string, out any, err error)

type mcpTool struct {
	tool *mcp.Tool
	run  toolRun
}

// toolError is a call's bad argument, named like the API's field errors.
type toolError struct{ field, reason string }

func (e *toolError) Error() string { return e.field + ": " + e.reason }

func (m *mcpServer) handler(run toolRun) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		text, out, err := run(ctx, req, req.Params.Arguments)
		if err != nil {
			return errorResult(err), nil
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}, StructuredContent: out}, nil
	}
}

// errorResult is a failed call: the API's message, and its error object as
// `bgtask --json` prints it.
func errorResult(err error) *mcp.CallToolResult {
	obj := &api.Error{Code: 500, Message: err.Error()}
	var apiErr *api.Error
	var argErr *toolError
	var fieldErr *engine.FieldError
	var exit *exitError
	switch {
	case errors.As(err, &apiErr):
		obj = apiErr
	case errors.As(err, &argErr):
		obj = &api.Error{Code: 400, Field: argErr.field, Message: argErr.Error()}
	case errors.As(err, &fieldErr):
		obj = &api.Error{Code: 400, Field: fieldErr.Field, Message: fieldErr.Error()}
	case errors.As(err, &exit) && exit.code == client.ExitNoServer:
		obj.Code = 503
	}
	res := &mcp.CallToolResult{
		Content:           []mcp.Content{&mcp.TextContent{Text: obj.Message}},
		StructuredContent: map[string]*api.Error{"error": obj},
	}
	res.SetError(err)
	return res
}

// call makes one tool's API calls as a client command makes its own: within
// --timeout, again through a restart of the server when they may be made twice.
func (m *mcpServer) call(ctx context.Context, fn func(context.Context, *client.Client) error) error {
	g := m.callGlobals() // a call of its own says once that it waits, on stderr
	return g.noServer(g.withClient(ctx, fn))
}

// callGlobals are the globals of one tool call: it prints nothing.
func (m *mcpServer) callGlobals() *globals {
	g := *m.g
	g.stdout = io.Discard
	return &g
}

// decodeArgs reads a tool's arguments into v, refusing a name it does not know.
func decodeArgs(args json.RawMessage, v any) error {
	if len(bytes.TrimSpace(args)) == 0 || string(bytes.TrimSpace(args)) == "null" {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(args))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var typeErr *json.UnmarshalTypeError
		switch {
		case errors.As(err, &typeErr):
			return &toolError{typeErr.Field, fmt.Sprintf("want a %s, not a JSON %s", typeErr.Type, typeErr.Value)}
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
			return &toolError{field, "not an argument of this tool"}
		}
		return &toolError{"arguments", err.Error()}
	}
	return nil
}

func schema(required []string, props map[string]any) map[string]any {
	s := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if len(required) > 0 {
		s["required"] = required
	}
	return s
}

func prop(typ, description string) map[string]any {
	return map[string]any{"type": typ, "description": description}
}

func enum(description string, values ...string) map[string]any {
	return map[string]any{"type": "string", "enum": values, "description": description}
}

var idProp = prop("string", "the task's id, as add returned it, or a unique start of it (at least 6 characters)")

func (m *mcpServer) tools() []mcpTool {
	return []mcpTool{m.addTool(), m.joinTool(), m.showTool(), m.listTool(), m.logsTool(), m.cancelTool(), m.completeTool(), m.waitTool()}
}

func (m *mcpServer) addTool() mcpTool {
	yes := true
	no := false
	return mcpTool{
		tool: &mcp.Tool{
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
			InputSchema: m.specSchema(),
			Annotations: &mcp.ToolAnnotations{DestructiveHint: &no, IdempotentHint: true, OpenWorldHint: &yes},
		},
		run: m.add,
	}
}

func (m *mcpServer) showTool() mcpTool {
	no := false
	return mcpTool{
		tool: &mcp.Tool{
			Name:        "show",
			Title:       "Show a task",
			Description: "A task's current state: its spec, phase, status, exit code, output tail, wake-up and deliveries.",
			InputSchema: schema([]string{"id"}, map[string]any{"id": idProp}),
			Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: &no},
		},
		run: m.show,
	}
}

func (m *mcpServer) listTool() mcpTool {
	no := false
	return mcpTool{
		tool: &mcp.Tool{
			Name:  "list",
			Title: "List tasks",
			Description: fmt.Sprintf("Tasks, newest first, %d at a time unless limit says otherwise: id, state, status, exit code, command. "+
				"next_cursor, when more follow, asks for the next page.", mcpListLimit),
			InputSchema: schema(nil, map[string]any{
				"state":  enum("only tasks in this state", phases()...),
				"limit":  prop("integer", fmt.Sprintf("at most this many tasks (default %d)", mcpListLimit)),
				"cursor": prop("string", "the next_cursor of the page before"),
			}),
			Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: &no},
		},
		run: m.list,
	}
}

func (m *mcpServer) logsTool() mcpTool {
	no := false
	return mcpTool{
		tool: &mcp.Tool{
			Name:  "logs",
			Title: "Read a task's output",
			Description: fmt.Sprintf("The output the task's command wrote so far, stdout and stderr in the order they were written "+
				"(bgtask keeps the last 4 MiB of each). Only the last max_bytes are returned (default %d); "+
				"skipped_bytes says how much came before.", mcpLogBytes),
			InputSchema: schema([]string{"id"}, map[string]any{
				"id":        idProp,
				"stream":    enum("only this stream (default: both)", events.Stdout, events.Stderr),
				"max_bytes": prop("integer", fmt.Sprintf("return at most the last this many bytes (default %d, at most %d)", mcpLogBytes, mcpMaxLog)),
			}),
			Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: &no},
		},
		run: m.logs,
	}
}

func (m *mcpServer) cancelTool() mcpTool {
	yes := true
	no := false
	return mcpTool{
		tool: &mcp.Tool{
			Name:        "cancel",
			Title:       "Cancel a task",
			Description: "Cancel a task: stop its process group (TERM, then KILL). Nothing is delivered.",
			InputSchema: schema([]string{"id"}, map[string]any{
				"id":     idProp,
				"reason": prop("string", "why, kept in the task's history"),
			}),
			Annotations: &mcp.ToolAnnotations{DestructiveHint: &yes, OpenWorldHint: &no},
		},
		run: m.cancel,
	}
}

func (m *mcpServer) waitTool() mcpTool {
	no := false
	return mcpTool{
		tool: &mcp.Tool{
			Name:  "wait",
			Title: "Wait for a task to end",
			Description: "Block until the task has fired (or was cancelled) and return its wake-up: status, exit_code, prompt, result. " +
				"With timeout, return after that long with ended false if it is still running. " +
				"The wake-up comes to the session by itself; wait only when the result is needed before anything else, " +
				"and then give consume true, so that the same wake-up does not wake the session again. " +
				"A long wait sends progress notifications.",
			InputSchema: schema([]string{"id"}, map[string]any{
				"id":      idProp,
				"timeout": prop("string", "give up after this long, a Go duration such as 90s or 10m (default: wait until the task ends)"),
				"consume": prop("boolean", "remove the returned wake-up from the target's inbox, so it wakes nobody again (a task that woke nobody: nothing to do)"),
			}),
			// Not read-only: with consume, it removes the wake-up from the inbox.
			Annotations: &mcp.ToolAnnotations{DestructiveHint: &no, IdempotentHint: true, OpenWorldHint: &no},
		},
		run: m.wait,
	}
}

func phases() []string {
	return []string{string(engine.PhaseArmed), string(engine.PhaseRunning), string(engine.PhaseEnded), string(engine.PhasePersisted),
		string(engine.PhaseFired), string(engine.PhaseCancelled), string(engine.PhaseArchived)}
}

// specSchema describes the spec's fields to the model. It is loose where the
// engine is strict: the engine's own errors name the field.
func (m *mcpServer) specSchema() map[string]any {
	stringList := map[string]any{"type": "array", "items": map[string]any{"type": "string"}}
	stringMap := map[string]any{"type": "object", "additionalProperties": map[string]any{"type": "string"}}
	with := func(base map[string]any, description string) map[string]any {
		out := map[string]any{"description": description}
		for k, v := range base {
			out[k] = v
		}
		return out
	}
	sink := map[string]any{"type": "object", "properties": map[string]any{
		"type":         enum("webhook or exec", engine.SinkWebhook, engine.SinkExec),
		"url":          prop("string", "webhook: the http(s) URL the wake-up is POSTed to, signed"),
		"argv":         with(stringList, "exec: the program and its arguments, which may use the prompt's placeholders and {{prompt}}; the prompt is on its stdin"),
		"timeout":      prop("string", "bound of one attempt (default 30s for a webhook, 10m for exec)"),
		"max_attempts": prop("integer", "attempts before delivery fails (default 8)"),
	}, "required": []string{"type"}}
	return schema(nil, map[string]any{
		"command":         prop("string", "the command, a shell string run with bash -c"),
		"argv":            with(stringList, "a program and its arguments run without a shell, instead of command"),
		"cwd":             prop("string", "working directory (default: the MCP server's; a relative one is taken from there; \"\": the worker's home)"),
		"env":             with(stringMap, "variables set in the command's environment"),
		"environment":     enum("what the command's environment starts from: caller (default: the MCP server's, which is the agent's: its PATH and exports) or login (the worker's login environment)", engine.EnvironmentCaller, engine.EnvironmentLogin),
		"kind":            prop("string", "a label for the task (build, test, deploy, ...)"),
		"prompt":          prop("string", "template of the wake-up's prompt; placeholders {{result}} {{exit_code}} {{status}} {{reason}} {{task_id}} {{kind}} {{command}} {{tail}} {{duration}} {{origin.KEY}}"),
		"target":          prop("string", "the inbox the wake-up goes to (default: the agent session this server runs in, else \"default\")"),
		"origin":          map[string]any{"type": "object", "additionalProperties": true, "description": "JSON returned as-is in the wake-up (the caller's routing data; default in an agent session: its runtime and id)"},
		"idempotency_key": prop("string", "the same key registers the same task once and returns its id (default: a key of this call's own)"),
		"completion": map[string]any{"type": "object", "description": "done before the command exits, when a stdout line matches (default: when it exits)", "properties": map[string]any{
			"type":  enum("json_line: a JSON line with the fields of match; line_pattern: a line matching regex", engine.CompleteOnJSON, engine.CompleteOnPattern),
			"match": map[string]any{"type": "object", "description": "json_line: fields the line's object must have (a value ending in * matches a prefix, a.b reaches nested keys)"},
			"regex": prop("string", "line_pattern: a Go RE2 regular expression"),
		}, "required": []string{"type"}},
		"keep_running": prop("boolean", "leave the command running after its completion rule matched"),
		"stall_after":  prop("string", "a command that prints nothing for this long (e.g. 5m) is stalled"),
		"on_stall":     enum("what a stall does: notify (default: wake once and keep watching), kill, or respawn", engine.OnStallNotify, engine.OnStallKill, engine.OnStallRespawn),
		"max_respawns": prop("integer", fmt.Sprintf("how many times on_stall respawn starts the command again (default %d)", engine.DefaultMaxRespawns)),
		"deadline":     prop("string", "stop the command as timed_out after this long (30m) or at this RFC 3339 time"),
		"result": map[string]any{"type": "object", "description": "what the wake-up's {{result}} is (default: the last 50 lines)", "properties": map[string]any{
			"type":    enum("tail, matched_line or command", engine.ResultTail, engine.ResultMatchedLine, engine.ResultCommand),
			"lines":   prop("integer", "tail: how many lines"),
			"argv":    with(stringList, "command: a program run after the task in its cwd and env; its stdout is the result"),
			"timeout": prop("string", "command: its bound (default 60s)"),
		}, "required": []string{"type"}},
		"max_result_bytes": prop("integer", "truncate the result to this many bytes (default 32768)"),
		"on_lost":          enum("when the task's worker is gone: fail (default, outcome lost) or respawn (run it again elsewhere; for idempotent commands)", engine.OnLostFail, engine.OnLostRespawn),
		"policy":           enum("when the deliver sinks get the wake-up: queue (default), defer_idle or immediate", "queue", "defer_idle", "immediate"),
		"deliver":          map[string]any{"type": "array", "items": sink, "description": "push sinks that get the wake-up besides the inbox"},
		"placement": map[string]any{"type": "object", "description": "which workers may take the task: {\"labels\": {KEY: VALUE}}; {} for any (default with a cwd: this host)", "properties": map[string]any{
			"labels": with(stringMap, "labels a worker must have"),
		}},
		"after":        with(stringList, "task ids this one waits for: it starts once they have ended"),
		"after_policy": enum("what the tasks of after must have done: succeeded (default; else this one is skipped) or ended", "succeeded", "ended"),
		"external":     prop("boolean", "run nothing: the task ends when completed from outside (bgtask complete, bgtask.complete) or at its deadline"),
		"wake_on":      with(stringList, "the outcomes that wake the caller (default: all); another ends the task quietly"),
		"start_at":     prop("string", "start the command after this long (20m) or at this RFC 3339 time; with no command, a timer that wakes the caller then"),
		"probe_every":  prop("string", "the command is a probe: run it again this long after each run (at least 1s) until a run meets completion (default: exits 0), within the deadline"),
		"notify": map[string]any{"type": "object", "description": "while the command runs, send the stdout lines that match as notices to the inbox (each notice a wake-up with notice nK); the final wake-up still comes once", "properties": map[string]any{
			"type":         enum("json_line: a JSON line with the fields of match; line_pattern: a line matching regex", engine.CompleteOnJSON, engine.CompleteOnPattern),
			"match":        map[string]any{"type": "object", "description": "json_line: fields the line's object must have"},
			"regex":        prop("string", "line_pattern: a Go RE2 regular expression"),
			"batch":        prop("string", "gather the lines of this long after the first into one notice"),
			"min_interval": prop("string", "at least this long between two notices"),
			"max":          prop("integer", fmt.Sprintf("at most this many notices (default %d)", engine.DefaultNoticesMax)),
		}, "required": []string{"type"}},
		"pid": prop("integer", "instead of a command, watch this process of the MCP server's host, which bgtask did not start: the task fires when it ends (exit_code null: only its parent can read it)"),
		"retry": map[string]any{"type": "object", "description": "run an attempt that ended in one of on again, with backoff; one wake-up after the last", "properties": map[string]any{
			"max":         prop("integer", "how many more attempts, 1 to 100"),
			"backoff":     prop("string", "the wait before the first retry (default 1s), doubled for each next"),
			"max_backoff": prop("string", "the longest wait (default 5m)"),
			"on":          with(stringList, "statuses retried (default: failed, timed_out, stalled, lost)"),
		}, "required": []string{"max"}},
	})
}

// add registers a spec: the arguments as the engine's spec, with the defaults of
// `bgtask add`.
func (m *mcpServer) add(ctx context.Context, _ *mcp.CallToolRequest, args json.RawMessage) (string, any, error) {
	if len(bytes.TrimSpace(args)) == 0 {
		args = []byte("{}")
	}
	// Decoded into a map, a repeated key would keep only its last value before the
	// engine could refuse it.
	if err := engine.CheckJSON(args, "spec"); err != nil {
		return "", nil, err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(args, &fields); err != nil || fields == nil {
		return "", nil, &toolError{"spec", "the arguments are not a JSON object"}
	}
	doc := make(map[string]any, len(fields)+4)
	for k, v := range fields {
		doc[k] = v
	}
	if err := watchPID(doc); err != nil {
		return "", nil, err
	}
	if err := m.defaultCwd(doc); err != nil {
		return "", nil, err
	}
	if err := callerEnvUnlessLogin(m.g, doc); err != nil {
		return "", nil, err
	}
	return m.register(ctx, doc)
}

// register registers the spec doc, with the session's target and origin and a key
// of this call's own unless it names them, and says where its wake-up goes.
func (m *mcpServer) register(ctx context.Context, doc map[string]any) (string, any, error) {
	if m.session != nil {
		applySession(doc, *m.session)
	}
	ownKey := !givenKey(doc["idempotency_key"])
	if ownKey {
		doc["idempotency_key"] = "mcp-" + uuid.NewString()
	}
	raw, err := json.Marshal(doc)
	if err != nil {
		return "", nil, err
	}
	var reg api.Registered
	err = m.call(ctx, func(ctx context.Context, c *client.Client) (err error) {
		reg, err = c.RegisterJSON(ctx, raw)
		return err
	})
	if err != nil {
		return "", nil, err
	}
	// Nobody else has this call's own key: a task already under it is the one an
	// earlier attempt of this very call armed.
	reg.Created = reg.Created || ownKey
	target := engine.DefaultTarget
	if t, ok := doc["target"].(string); ok {
		target = t
	} else if raw, ok := doc["target"].(json.RawMessage); ok {
		_ = json.Unmarshal(raw, &target)
	}
	text := fmt.Sprintf("registered task %s; its wake-up goes to target %s", reg.ID, target)
	if !reg.Created {
		text = fmt.Sprintf("task %s was registered before under this idempotency key; its wake-up goes to target %s", reg.ID, target)
	}
	return text, struct {
		api.Registered
		Target string `json:"target"`
	}{reg, target}, nil
}

// defaultCwd gives a spec without a cwd the server's, and a task with a cwd that
// names no placement this host's, as `bgtask add` does: a directory here means
// nothing on another machine. A relative cwd is taken from the server's.
func (m *mcpServer) defaultCwd(doc map[string]any) error {
	if doc["command"] == nil && doc["argv"] == nil {
		return nil // a timer or an external task runs nothing: no directory, no host
	}
	raw, given := doc["cwd"].(json.RawMessage)
	var cwd string
	switch {
	case !given:
		cwd = m.cwd
		doc["cwd"] = cwd
	case json.Unmarshal(raw, &cwd) != nil:
		return nil // not a string: the engine says so
	case cwd != "" && !filepath.IsAbs(cwd):
		cwd = filepath.Join(m.cwd, cwd)
		doc["cwd"] = cwd
	}
	if _, placed := doc["placement"]; !placed && cwd != "" {
		doc["placement"] = map[string]any{"labels": map[string]string{engine.HostLabel: hostName()}}
	}
	return nil
}

func (m *mcpServer) show(ctx context.Context, _ *mcp.CallToolRequest, args json.RawMessage) (string, any, error) {
	var in struct {
		ID string `json:"id"`
	}
	if err := decodeArgs(args, &in); err != nil {
		return "", nil, err
	}
	var t api.TaskView
	err := m.call(ctx, func(ctx context.Context, c *client.Client) (err error) {
		t, err = c.Get(ctx, in.ID)
		return err
	})
	if err != nil {
		return "", nil, err
	}
	var text bytes.Buffer
	if err := printTask(&text, t); err != nil {
		return "", nil, err
	}
	return text.String(), t, nil
}

// taskSummary is a task in a list: enough to pick one to show.
type taskSummary struct {
	ID       string       `json:"id"`
	State    engine.Phase `json:"state"`
	Status   string       `json:"status,omitempty"`
	ExitCode *int         `json:"exit_code"`
	Command  string       `json:"command"`
	Kind     string       `json:"kind,omitempty"`
	Target   string       `json:"target,omitempty"`
	ArmedAt  time.Time    `json:"armed_at"`
	EndedAt  *time.Time   `json:"ended_at,omitempty"`
	Waiting  string       `json:"waiting,omitempty"`
}

type listOut struct {
	Tasks      []taskSummary `json:"tasks"`
	Total      int           `json:"total"`
	NextCursor string        `json:"next_cursor,omitempty"`
}

func (m *mcpServer) list(ctx context.Context, _ *mcp.CallToolRequest, args json.RawMessage) (string, any, error) {
	var in struct {
		State  string `json:"state"`
		Limit  *int   `json:"limit"`
		Cursor string `json:"cursor"`
	}
	if err := decodeArgs(args, &in); err != nil {
		return "", nil, err
	}
	q := client.ListQuery{Phase: engine.Phase(in.State), Limit: mcpListLimit}
	if in.Limit != nil {
		if *in.Limit < 1 {
			return "", nil, &toolError{"limit", fmt.Sprintf("%d: want at least 1", *in.Limit)}
		}
		q.Limit = *in.Limit
	}
	var page client.ListPage
	err := m.call(ctx, func(ctx context.Context, c *client.Client) (err error) {
		page, err = c.ListPage(ctx, q, in.Cursor)
		return err
	})
	if err != nil {
		return "", nil, err
	}
	out := listOut{Tasks: make([]taskSummary, 0, len(page.Tasks)), Total: page.Total, NextCursor: page.NextCursor}
	var text strings.Builder
	for _, t := range page.Tasks {
		out.Tasks = append(out.Tasks, taskSummary{ID: t.ID, State: t.Phase, Status: t.Status, ExitCode: t.ExitCode, Command: t.Command,
			Kind: t.Spec.Kind, Target: t.Spec.Target, ArmedAt: t.ArmedAt, EndedAt: t.EndedAt, Waiting: t.Waiting})
		fmt.Fprintf(&text, "%s %s %s exit %s: %s\n", t.ID, t.Phase, dash(t.Status), exitString(t.ExitCode), oneLine(t.Command, 120))
	}
	fmt.Fprintf(&text, "%d of %d tasks", len(page.Tasks), page.Total)
	if page.NextCursor != "" {
		fmt.Fprintf(&text, "; the next page: cursor %s", page.NextCursor)
	}
	return text.String(), out, nil
}

type logsOut struct {
	ID     string `json:"id"`
	Output string `json:"output"`
	// SkippedBytes came before Output: dropped by bgtask's limit or past max_bytes.
	SkippedBytes int64 `json:"skipped_bytes"`
	// Ended: the command's output has ended: the task has, or every stream read has
	// its end mark.
	Ended bool `json:"ended"`
}

func (m *mcpServer) logs(ctx context.Context, _ *mcp.CallToolRequest, args json.RawMessage) (string, any, error) {
	var in struct {
		ID       string `json:"id"`
		Stream   string `json:"stream"`
		MaxBytes *int   `json:"max_bytes"`
	}
	if err := decodeArgs(args, &in); err != nil {
		return "", nil, err
	}
	var streams []string
	switch in.Stream {
	case "":
	case events.Stdout, events.Stderr:
		streams = []string{in.Stream}
	default:
		return "", nil, &toolError{"stream", fmt.Sprintf("%q: want %s or %s", in.Stream, events.Stdout, events.Stderr)}
	}
	limit := mcpLogBytes
	if in.MaxBytes != nil {
		if *in.MaxBytes < 1 || *in.MaxBytes > mcpMaxLog {
			return "", nil, &toolError{"max_bytes", fmt.Sprintf("%d: want 1 to %d", *in.MaxBytes, mcpMaxLog)}
		}
		limit = *in.MaxBytes
	}
	var out logsOut
	err := m.call(ctx, func(ctx context.Context, c *client.Client) error {
		t, err := c.Get(ctx, in.ID)
		if err != nil {
			return err
		}
		out, err = lastOutput(ctx, c, t.ID, streams, limit)
		// Read after the task was seen ended, the output is whole (events.LogEOFHeader).
		out.Ended = out.Ended || !t.Phase.Runs()
		return err
	})
	if err != nil {
		return "", nil, err
	}
	text := out.Output
	if out.SkippedBytes > 0 {
		text = fmt.Sprintf("[%d bytes before this left out]\n", out.SkippedBytes) + text
	}
	if text == "" {
		text = "(no output yet)"
		if out.Ended {
			text = "(no output)"
		}
	}
	return text, out, nil
}

// lastOutput reads the task's output of streams (nil: both) and keeps its last
// limit bytes, from the start of a character.
func lastOutput(ctx context.Context, c *client.Client, id string, streams []string, limit int) (logsOut, error) {
	var buf []byte
	// What bgtask dropped of a stream is where its first chunk starts.
	seen := map[string]bool{}
	var skipped int64
	eofs, want := 0, 2
	if len(streams) > 0 {
		want = len(streams)
	}
	err := c.Logs(ctx, id, client.LogOptions{Streams: streams}, func(chunk client.LogChunk) error {
		if !seen[chunk.Stream] {
			seen[chunk.Stream] = true
			skipped += chunk.Offset
		}
		if chunk.EOF {
			eofs++
			return nil
		}
		buf = append(buf, chunk.Data...)
		if over := len(buf) - limit; over > 0 {
			buf = buf[over:]
			skipped += int64(over)
		}
		return nil
	})
	if err != nil {
		return logsOut{}, err
	}
	for len(buf) > 0 && !utf8.RuneStart(buf[0]) { // start at a character
		buf = buf[1:]
		skipped++
	}
	return logsOut{ID: id, Output: string(buf), SkippedBytes: skipped, Ended: eofs == want}, nil
}

func (m *mcpServer) cancel(ctx context.Context, _ *mcp.CallToolRequest, args json.RawMessage) (string, any, error) {
	var in struct {
		ID     string `json:"id"`
		Reason string `json:"reason"`
	}
	if err := decodeArgs(args, &in); err != nil {
		return "", nil, err
	}
	var t api.TaskView
	err := m.call(ctx, func(ctx context.Context, c *client.Client) (err error) {
		t, err = c.Cancel(ctx, in.ID, in.Reason)
		return err
	})
	if err != nil {
		return "", nil, err
	}
	return "cancelled " + t.ID, t, nil
}

type waitOut struct {
	ID string `json:"id"`
	// Ended: the task fired or was cancelled, and Wakeup is its wake-up; else the
	// timeout passed in State.
	Ended  bool           `json:"ended"`
	State  engine.Phase   `json:"state"`
	Wakeup *events.Wakeup `json:"wakeup,omitempty"`
	// Consumed: the wake-up was removed from the inbox, as consume asked.
	Consumed bool `json:"consumed,omitempty"`
}

func (m *mcpServer) wait(ctx context.Context, req *mcp.CallToolRequest, args json.RawMessage) (_ string, _ any, err error) {
	var in struct {
		ID      string `json:"id"`
		Timeout string `json:"timeout"`
		Consume bool   `json:"consume"`
	}
	if err := decodeArgs(args, &in); err != nil {
		return "", nil, err
	}
	var timeout time.Duration
	if in.Timeout != "" {
		d, err := time.ParseDuration(in.Timeout)
		if err != nil || d <= 0 {
			return "", nil, &toolError{"timeout", fmt.Sprintf("%q: want a positive duration such as 90s or 10m", in.Timeout)}
		}
		timeout = d
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	var seen atomic.Value // the task, as the wait last saw it: its id as given until it is read
	seen.Store(waitSeen{id: in.ID})
	if token := req.Params.GetProgressToken(); token != nil {
		stop := m.sendProgress(ctx, req.Session, token, &seen)
		defer stop()
	}
	g := m.callGlobals()
	defer func() { err = g.noServer(err) }()
	c, err := g.open(ctx, timeout)
	if err != nil {
		return "", nil, err
	}
	defer c.Close()
	t, err := c.Get(ctx, in.ID)
	if err != nil {
		return "", nil, err
	}
	if in.Consume {
		release, err := c.HoldWakeup(t.ID)
		if err != nil {
			return "", nil, err
		}
		defer release()
	}
	seen.Store(waitSeen{t.ID, t.Phase})
	if !client.Ended(t) {
		t, err = c.Follow(ctx, t.ID, func(t client.Task) bool {
			seen.Store(waitSeen{t.ID, t.Phase})
			return client.Ended(t)
		})
		if errors.Is(err, context.DeadlineExceeded) {
			out := waitOut{ID: t.ID, State: t.Phase}
			return fmt.Sprintf("task %s is still %s after %s; wait again, or let its wake-up come", t.ID, t.Phase, timeout), out, nil
		}
		if err != nil {
			return "", nil, err
		}
	}
	w := client.WakeupOf(t)
	out := waitOut{ID: t.ID, Ended: true, State: t.Phase, Wakeup: &w}
	if in.Consume {
		if out.Consumed, err = c.ConsumeWakeup(ctx, t); err != nil {
			return "", nil, err
		}
	}
	text := fmt.Sprintf("task %s %s, exit code %s\n\n%s", w.ID, w.Status, exitString(w.ExitCode), strings.TrimRight(w.Prompt, "\n"))
	return text, out, nil
}

// waitSeen is a waited task as a wait last saw it.
type waitSeen struct {
	id    string
	phase engine.Phase // "": not read yet
}

// sendProgress tells the client every progressEvery, from now until stop, that
// the wait goes on: the seconds waited so far and the task as seen holds it.
func (m *mcpServer) sendProgress(ctx context.Context, session *mcp.ServerSession, token any, seen *atomic.Value) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		start := time.Now()
		tick := time.NewTicker(m.progressEvery)
		defer tick.Stop()
		for {
			waited := time.Since(start)
			task := seen.Load().(waitSeen)
			msg := fmt.Sprintf("waiting for task %s for %s", task.id, waited.Round(time.Second))
			if task.phase != "" {
				msg += " (" + string(task.phase) + ")"
			}
			// A notification the client does not get is no reason to stop waiting.
			_ = session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: waited.Seconds(), Message: msg})
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() { cancel(); <-done }
}

func (m *mcpServer) readTask(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	id := strings.TrimPrefix(uri, taskURIPrefix)
	var t api.TaskView
	err := m.call(ctx, func(ctx context.Context, c *client.Client) (err error) {
		t, err = c.Get(ctx, id)
		return err
	})
	var apiErr *api.Error
	if errors.As(err, &apiErr) && apiErr.Code == 404 {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	if err != nil {
		return nil, err
	}
	data, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return nil, err
	}
	return &mcp.ReadResourceResult{
		Cacheable: privateNow,
		Contents:  []*mcp.ResourceContents{{URI: uri, MIMEType: "application/json", Text: string(data)}},
	}, nil
}

// listResources lists the tasks, newest first, a page of the API's at a time.
func (m *mcpServer) listResources(ctx context.Context, req *mcp.ListResourcesRequest) (*mcp.ListResourcesResult, error) {
	cursor := ""
	if req.Params != nil {
		cursor = req.Params.Cursor
	}
	var page client.ListPage
	err := m.call(ctx, func(ctx context.Context, c *client.Client) (err error) {
		page, err = c.ListPage(ctx, client.ListQuery{Limit: mcpPageSize}, cursor)
		return err
	})
	if err != nil {
		return nil, err
	}
	res := &mcp.ListResourcesResult{Cacheable: privateNow, Resources: make([]*mcp.Resource, 0, len(page.Tasks)), NextCursor: page.NextCursor}
	for _, t := range page.Tasks {
		state := string(t.Phase)
		if t.Status != "" {
			state += ", " + t.Status
		}
		res.Resources = append(res.Resources, &mcp.Resource{
			URI:         taskURIPrefix + t.ID,
			Name:        t.ID,
			Title:       oneLine(t.Command, 80),
			Description: fmt.Sprintf("task %s (%s): %s", t.ID, state, oneLine(t.Command, 200)),
			MIMEType:    "application/json",
		})
	}
	return res, nil
}
