package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/internal/proc"
)

// The MCP tools of the triggers that need more than a spec's field: a group's
// one wake-up, a task ended from outside, and a process watched by its PID.

func (m *mcpServer) joinTool() mcpTool {
	yes := true
	no := false
	members := map[string]any{"type": "array", "items": map[string]any{"type": "string"}, "minItems": 1,
		"description": "the ids of the member tasks, as add returned them (add them with wake_on [\"none\"] so that they wake nobody themselves)"}
	return mcpTool{
		tool: &mcp.Tool{
			Name:  "join",
			Title: "One wake-up for a group of tasks",
			Description: "Register a task that runs nothing and wakes the session once, when all of the member tasks (mode all) " +
				"or the first of them (mode any) have ended; its wake-up lists each member's id, status and exit code ({{members}} in prompt). " +
				"Returns its task id at once, as add does.",
			InputSchema: schema([]string{"mode", "members"}, map[string]any{
				"mode":            enum("all: once every member has ended; any: once the first has", engine.JoinAll, engine.JoinAny),
				"members":         members,
				"prompt":          prop("string", "template of the wake-up's prompt; {{members}} lists the members (default: a summary)"),
				"target":          prop("string", "the inbox the wake-up goes to (default: the agent session this server runs in, else \"default\")"),
				"kind":            prop("string", "a label for the group"),
				"idempotency_key": prop("string", "the same key registers the same group once and returns its id (default: a key of this call's own)"),
			}),
			Annotations: &mcp.ToolAnnotations{DestructiveHint: &no, IdempotentHint: true, OpenWorldHint: &yes},
		},
		run: m.join,
	}
}

func (m *mcpServer) join(ctx context.Context, _ *mcp.CallToolRequest, args json.RawMessage) (string, any, error) {
	var in struct {
		Mode           string   `json:"mode"`
		Members        []string `json:"members"`
		Prompt         *string  `json:"prompt"`
		Target         *string  `json:"target"`
		Kind           *string  `json:"kind"`
		IdempotencyKey *string  `json:"idempotency_key"`
	}
	if err := decodeArgs(args, &in); err != nil {
		return "", nil, err
	}
	doc := map[string]any{"join": engine.Join{Mode: in.Mode, Members: in.Members}}
	for field, v := range map[string]*string{"prompt": in.Prompt, "target": in.Target, "kind": in.Kind, "idempotency_key": in.IdempotencyKey} {
		if v != nil {
			doc[field] = *v
		}
	}
	text, out, err := m.register(ctx, doc)
	var apiErr *api.Error
	if errors.As(err, &apiErr) && strings.HasPrefix(apiErr.Field, "join.") {
		// The spec's join.mode and join.members are this tool's mode and members.
		named := *apiErr
		named.Field = strings.TrimPrefix(apiErr.Field, "join.")
		named.Message = strings.Replace(apiErr.Message, apiErr.Field, named.Field, 1)
		return "", nil, &named
	}
	return text, out, err
}

func (m *mcpServer) completeTool() mcpTool {
	yes := true
	no := false
	return mcpTool{
		tool: &mcp.Tool{
			Name:  "complete",
			Title: "End a task from outside",
			Description: "End a task from outside with a status and a result: one not started never runs, a running one's command is stopped " +
				"(TERM, then KILL), and its wake-up follows once. Whichever comes first, this, the command's exit or its deadline, decides; " +
				"a task that has ended already is an error. A task added with external true waits only for this.",
			InputSchema: schema([]string{"id"}, map[string]any{
				"id":     idProp,
				"status": enum("the outcome (default succeeded)", engine.CompleteStatuses...),
				"result": prop("string", fmt.Sprintf("the wake-up's {{result}} (at most %d bytes)", engine.MaxExternalResultBytes)),
			}),
			Annotations: &mcp.ToolAnnotations{DestructiveHint: &yes, OpenWorldHint: &no},
		},
		run: m.complete,
	}
}

func (m *mcpServer) complete(ctx context.Context, _ *mcp.CallToolRequest, args json.RawMessage) (string, any, error) {
	var req api.CompleteRequest
	if err := decodeArgs(args, &req); err != nil {
		return "", nil, err
	}
	var t api.TaskView
	// Made once, as cancel is: made again after it took effect, it would say the
	// task has ended.
	err := m.call(ctx, func(ctx context.Context, c *client.Client) (err error) {
		t, err = c.Complete(ctx, req)
		return err
	})
	if err != nil {
		return "", nil, err
	}
	return fmt.Sprintf("completed %s: %s", t.ID, t.Status), t, nil
}

// watchPID turns the MCP add tool's pid into the spec of a process watch, as
// --pid does: the identity read on this host, the task placed on it.
func watchPID(doc map[string]any) error {
	raw, ok := doc["pid"].(json.RawMessage)
	if !ok {
		return nil
	}
	delete(doc, "pid")
	var pid int
	if err := json.Unmarshal(raw, &pid); err != nil || pid <= 0 {
		return &toolError{"pid", "want the id of a running process, above 0"}
	}
	if doc["command"] != nil || doc["argv"] != nil {
		return &toolError{"pid", "give pid or a command, not both"}
	}
	id, err := proc.Of(pid)
	if err != nil {
		return &toolError{"pid", fmt.Sprintf("%d: %v on this host (%s)", pid, err, hostName())}
	}
	doc["process"] = engine.Process(id)
	doc["placement"] = map[string]any{"labels": map[string]string{engine.HostLabel: hostName()}}
	return nil
}
