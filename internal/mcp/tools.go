package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine"
)

// The tools that read a task, or end it from outside.

func (s *server) addTaskTools(m *mcp.Server) {
	addTool(m, &mcp.Tool{
		Name:        "show",
		Title:       "Show a task",
		Description: "A task's current state: its spec, phase, status, exit code, output tail, wake-up and deliveries.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: new(false)},
	}, s.show)
	addTool(m, &mcp.Tool{
		Name:  "list",
		Title: "List tasks",
		Description: fmt.Sprintf("Tasks, newest first, %d at a time unless limit says otherwise: id, state, status, exit code, command. "+
			"next_cursor, when more follow, asks for the next page.", listLimit),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: new(false)},
	}, s.list)
	addTool(m, &mcp.Tool{
		Name:  "logs",
		Title: "Read a task's output",
		Description: fmt.Sprintf("The output the task's command wrote so far, stdout and stderr in the order they were written "+
			"(bgtask keeps the last 4 MiB of each). Only the last max_bytes are returned (default %d, at most %d); "+
			"skipped_bytes says how much came before.", logBytes, maxLogBytes),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: new(false)},
	}, s.logs)
	addTool(m, &mcp.Tool{
		Name:        "cancel",
		Title:       "Cancel a task",
		Description: "Cancel a task: stop its process group (TERM, then KILL). Nothing is delivered.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: new(true), OpenWorldHint: new(false)},
	}, s.cancel)
	addTool(m, &mcp.Tool{
		Name:  "complete",
		Title: "End a task from outside",
		Description: "End a task from outside with a status and a result: one not started never runs, a running one's command is stopped " +
			"(TERM, then KILL), and its wake-up follows once. Whichever comes first, this, the command's exit or its deadline, decides; " +
			"a task that has ended already is an error. A task added with external true waits only for this.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: new(true), OpenWorldHint: new(false)},
	}, s.complete)
	addTool(m, &mcp.Tool{
		Name:  "redeliver",
		Title: "Push a wake-up again",
		Description: "Push a fired task's wake-up again, once, to its push sinks (deliver), with the same Idempotency-Key: " +
			"to each push that gave up, or, if none did, to each one, or only to sink. Each starts over, retried as its sink says. " +
			"A push not done yet (held, in flight, waiting for its retry) or a task with nothing to push again is an error that says where each push is.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: new(false), OpenWorldHint: new(true)},
	}, s.redeliver)
}

// taskArgs name a task.
type taskArgs struct {
	ID string `json:"id" jsonschema:"the task's id, as add returned it, or a unique start of it (at least 6 characters)"`
}

func (s *server) show(ctx context.Context, _ *mcp.CallToolRequest, in taskArgs) (string, client.Task, error) {
	t, err := s.task(ctx, in.ID)
	if err != nil {
		return "", t, err
	}
	return s.describe(t), t, nil
}

func (s *server) task(ctx context.Context, id string) (client.Task, error) {
	var t client.Task
	return t, s.call(ctx, func(ctx context.Context, c *client.Client) (err error) {
		t, err = c.Get(ctx, id)
		return err
	})
}

// describe is show's text of a task.
func (s *server) describe(t client.Task) string {
	if s.cfg.Describe != nil {
		return s.cfg.Describe(t)
	}
	data, _ := json.MarshalIndent(t, "", "  ")
	return string(data)
}

type listArgs struct {
	State    string `json:"state,omitempty" jsonschema:"only tasks in this state: armed, running, ended, persisted, fired, cancelled or archived"`
	Delivery string `json:"delivery,omitempty" jsonschema:"only fired tasks whose pushes (deliver) are pending, delivered or failed (one gave up: redeliver sends it again)"`
	Limit    *int   `json:"limit,omitempty" jsonschema:"at most this many tasks (default 20)"`
	Cursor   string `json:"cursor,omitempty" jsonschema:"the next_cursor of the page before"`
}

type listResult struct {
	Tasks      []taskSummary `json:"tasks"`
	Total      int           `json:"total"`
	NextCursor string        `json:"next_cursor,omitempty"`
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
	Delivery string       `json:"delivery,omitempty"`
}

func (s *server) list(ctx context.Context, _ *mcp.CallToolRequest, in listArgs) (string, listResult, error) {
	q := client.ListQuery{Phase: engine.Phase(in.State), Delivery: in.Delivery, Limit: listLimit}
	if in.Limit != nil {
		if *in.Limit < 1 {
			return "", listResult{}, &argError{"limit", fmt.Sprintf("%d: want at least 1", *in.Limit)}
		}
		q.Limit = *in.Limit
	}
	var page client.ListPage
	err := s.call(ctx, func(ctx context.Context, c *client.Client) (err error) {
		page, err = c.ListPage(ctx, q, in.Cursor)
		return err
	})
	if err != nil {
		return "", listResult{}, err
	}
	out := listResult{Tasks: make([]taskSummary, 0, len(page.Tasks)), Total: page.Total, NextCursor: page.NextCursor}
	var text strings.Builder
	for _, t := range page.Tasks {
		out.Tasks = append(out.Tasks, taskSummary{ID: t.ID, State: t.Phase, Status: t.Status, ExitCode: t.ExitCode, Command: t.Command,
			Kind: t.Spec.Kind, Target: t.Spec.Target, ArmedAt: t.ArmedAt, EndedAt: t.EndedAt, Waiting: t.Waiting, Delivery: t.Delivery})
		gaveUp := ""
		if t.Delivery == engine.DeliveryFailed {
			gaveUp = " (a push gave up)"
		}
		fmt.Fprintf(&text, "%s %s %s%s exit %s: %s\n", t.ID, t.Phase, orDash(t.Status), gaveUp, exitString(t.ExitCode), oneLine(t.Command, 120))
	}
	fmt.Fprintf(&text, "%d of %d tasks", len(page.Tasks), page.Total)
	if page.NextCursor != "" {
		fmt.Fprintf(&text, "; the next page: cursor %s", page.NextCursor)
	}
	return text.String(), out, nil
}

type logsArgs struct {
	taskArgs
	Stream   string `json:"stream,omitempty" jsonschema:"only this stream, stdout or stderr (default: both)"`
	MaxBytes *int   `json:"max_bytes,omitempty" jsonschema:"return at most the last this many bytes (default 32768, at most 1048576)"`
}

type logsResult struct {
	ID     string `json:"id"`
	Output string `json:"output"`
	// SkippedBytes came before Output: dropped by bgtask's limit or past max_bytes.
	SkippedBytes int64 `json:"skipped_bytes"`
	// Ended: the command's output has ended: the task has, or every stream read has
	// its end mark.
	Ended bool `json:"ended"`
}

func (s *server) logs(ctx context.Context, _ *mcp.CallToolRequest, in logsArgs) (string, logsResult, error) {
	var streams []string
	switch in.Stream {
	case "":
	case client.Stdout, client.Stderr:
		streams = []string{in.Stream}
	default:
		return "", logsResult{}, &argError{"stream", fmt.Sprintf("%q: want %s or %s", in.Stream, client.Stdout, client.Stderr)}
	}
	limit := logBytes
	if in.MaxBytes != nil {
		if *in.MaxBytes < 1 || *in.MaxBytes > maxLogBytes {
			return "", logsResult{}, &argError{"max_bytes", fmt.Sprintf("%d: want 1 to %d", *in.MaxBytes, maxLogBytes)}
		}
		limit = *in.MaxBytes
	}
	var out logsResult
	err := s.call(ctx, func(ctx context.Context, c *client.Client) error {
		t, err := c.Get(ctx, in.ID)
		if err != nil {
			return err
		}
		out, err = lastOutput(ctx, c, t.ID, streams, limit)
		// Read after the task was seen ended, the output is whole.
		out.Ended = out.Ended || !t.Phase.Runs()
		return err
	})
	if err != nil {
		return "", logsResult{}, err
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
func lastOutput(ctx context.Context, c *client.Client, id string, streams []string, limit int) (logsResult, error) {
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
		return logsResult{}, err
	}
	for len(buf) > 0 && !utf8.RuneStart(buf[0]) { // start at a character
		buf = buf[1:]
		skipped++
	}
	return logsResult{ID: id, Output: string(buf), SkippedBytes: skipped, Ended: eofs == want}, nil
}

type cancelArgs struct {
	taskArgs
	Reason string `json:"reason,omitempty" jsonschema:"why, kept in the task's history"`
}

// cancel is made once: made again after it took effect, it would say the task
// has ended.
func (s *server) cancel(ctx context.Context, _ *mcp.CallToolRequest, in cancelArgs) (string, client.Task, error) {
	var t client.Task
	err := s.call(ctx, func(ctx context.Context, c *client.Client) (err error) {
		t, err = c.Cancel(ctx, in.ID, in.Reason)
		return err
	})
	if err != nil {
		return "", t, err
	}
	return "cancelled " + t.ID, t, nil
}

type completeArgs struct {
	taskArgs
	Status string `json:"status,omitempty" jsonschema:"the outcome: succeeded (the default) or failed"`
	Result string `json:"result,omitempty" jsonschema:"the wake-up's {{result}} (at most 32768 bytes)"`
}

// complete is made once, as cancel is.
func (s *server) complete(ctx context.Context, _ *mcp.CallToolRequest, in completeArgs) (string, client.Task, error) {
	var t client.Task
	err := s.call(ctx, func(ctx context.Context, c *client.Client) (err error) {
		t, err = c.Complete(ctx, client.CompleteRequest{ID: in.ID, Status: in.Status, Result: in.Result})
		return err
	})
	if err != nil {
		return "", t, err
	}
	return fmt.Sprintf("completed %s: %s", t.ID, t.Status), t, nil
}

type redeliverArgs struct {
	taskArgs
	Sink *int `json:"sink,omitempty" jsonschema:"only this push sink: its place in the spec's deliver, from 0"`
}

// redeliver is made once, as cancel is: each call that succeeds pushes again.
func (s *server) redeliver(ctx context.Context, _ *mcp.CallToolRequest, in redeliverArgs) (string, client.Task, error) {
	var t client.Task
	err := s.call(ctx, func(ctx context.Context, c *client.Client) (err error) {
		t, err = c.Redeliver(ctx, client.RedeliverRequest{ID: in.ID, Sink: in.Sink})
		return err
	})
	if err != nil {
		return "", t, err
	}
	var pushes []string
	for i, k := range t.Deliveries {
		if k.Redelivering {
			pushes = append(pushes, fmt.Sprintf("push %d (%s)", i, t.Spec.Deliver[i].Type))
		}
	}
	return fmt.Sprintf("redelivering %s: %s", t.ID, strings.Join(pushes, ", ")), t, nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func exitString(code *int) string {
	if code == nil {
		return "-"
	}
	return fmt.Sprint(*code)
}

// oneLine is s on one line, cut to at most max bytes at a character's start.
func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= max {
		return s
	}
	cut := max - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
