package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/internal/serverhome"
	"github.com/bgtask/bgtask/internal/testkit"
)

// `bgtask mcp` is tested as a client runtime uses it: a process on stdio, driven
// by the SDK's client, against a real server. The process is this test binary,
// which runs bgtask's main when mcpRunMain is set.
const mcpRunMain = "BGTASK_TEST_RUN_MAIN"

func init() {
	if os.Getenv(mcpRunMain) == "1" {
		main()
		os.Exit(0)
	}
}

// mcpProcess is a running `bgtask mcp` and the client's session with it.
type mcpProcess struct {
	session  *mcp.ClientSession
	cmd      *exec.Cmd
	stderr   *syncBuffer
	mu       sync.Mutex
	progress []*mcp.ProgressNotificationParams
}

// startMCP starts `bgtask --home home mcp` in dir with env added, and initializes
// a session with it; the test's end closes it.
func startMCP(t *testing.T, home, dir string, env ...string) *mcpProcess {
	t.Helper()
	p := &mcpProcess{stderr: &syncBuffer{}}
	p.cmd = exec.Command(os.Args[0], "--home", home, "mcp", "--progress-every", "100ms")
	p.cmd.Dir = dir
	p.cmd.Env = append(append(os.Environ(), mcpRunMain+"=1"), env...)
	p.cmd.Stderr = p.stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "bgtask-test", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			p.mu.Lock()
			defer p.mu.Unlock()
			p.progress = append(p.progress, req.Params)
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	session, err := client.Connect(ctx, &mcp.CommandTransport{Command: p.cmd, TerminateDuration: 20 * time.Second}, nil)
	if err != nil {
		t.Fatalf("connect to bgtask mcp: %v\n%s", err, p.stderr.String())
	}
	p.session = session
	t.Cleanup(func() { p.close(t) })
	return p
}

// close closes the session, which closes the process's stdin, and checks that it
// exited of itself, at once and cleanly.
func (p *mcpProcess) close(t *testing.T) {
	t.Helper()
	if p.session == nil {
		return
	}
	start := time.Now()
	err := p.session.Close()
	p.session = nil
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("bgtask mcp took %s to exit after its input closed (signalled)", took)
	}
	if err != nil {
		t.Errorf("bgtask mcp exited with %v\n%s", err, p.stderr.String())
	}
}

// call calls a tool and returns its result, failing on a protocol error.
func (p *mcpProcess) call(t *testing.T, name string, args any, meta ...string) *mcp.CallToolResult {
	t.Helper()
	params := &mcp.CallToolParams{Name: name, Arguments: args}
	if len(meta) > 0 {
		params.SetProgressToken(meta[0])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := p.session.CallTool(ctx, params)
	if err != nil {
		t.Fatalf("%s: %v\n%s", name, err, p.stderr.String())
	}
	return res
}

// ok is a call's structured content, decoded into a T, failing on a tool error.
func ok[T any](t *testing.T, name string, res *mcp.CallToolResult) T {
	t.Helper()
	if res.IsError {
		t.Fatalf("%s: tool error %s", name, text(res))
	}
	if text(res) == "" {
		t.Errorf("%s: no text content", name)
	}
	data, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	return decode[T](t, string(data))
}

func text(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

type mcpTask struct {
	ID    string       `json:"id"`
	Phase engine.Phase `json:"state"`
	Spec  engine.Spec  `json:"spec"`
}

type mcpWait struct {
	Ended  bool `json:"ended"`
	State  engine.Phase
	Wakeup *struct {
		Status   string   `json:"status"`
		ExitCode *int     `json:"exit_code"`
		Prompt   string   `json:"prompt"`
		Tail     []string `json:"tail"`
		Probes   int      `json:"probes"`
	} `json:"wakeup"`
}

func TestMCPRegistersAndWaits(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("CLAUDE_CODE_SESSION_ID", "")
	t.Setenv("CODEX_THREAD_ID", "")
	startServer(t, home)
	dir := t.TempDir()
	p := startMCP(t, home, dir)

	ctx := context.Background()
	tools, err := p.session.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
		props, _ := tool.InputSchema.(map[string]any)["properties"].(map[string]any)
		if _, has := props["command"]; has != (tool.Name == "add") {
			t.Errorf("tool %s: a command property %v", tool.Name, has)
		}
	}
	slices.Sort(names)
	if want := []string{"add", "cancel", "complete", "join", "list", "logs", "redeliver", "show", "wait"}; !slices.Equal(names, want) {
		t.Errorf("tools %v, want %v", names, want)
	}

	reg := ok[struct {
		ID      string `json:"id"`
		Created bool   `json:"created"`
		Target  string `json:"target"`
	}](t, "add", p.call(t, "add", map[string]any{"command": "sleep 1; echo mcp-round-trip", "kind": "test"}))
	if !reg.Created || reg.Target != engine.DefaultTarget || !strings.Contains(reg.ID, "-") {
		t.Errorf("add: %+v", reg)
	}
	// As `bgtask add` does: the server's directory, on this host.
	task := ok[mcpTask](t, "show", p.call(t, "show", map[string]any{"id": reg.ID}))
	if task.Spec.Cwd != dir || task.Spec.Placement == nil || task.Spec.Placement.Labels[engine.HostLabel] != hostName() || task.Spec.Kind != "test" {
		t.Errorf("the task's spec: cwd %q placement %v kind %q; want cwd %q on host %s", task.Spec.Cwd, task.Spec.Placement, task.Spec.Kind, dir, hostName())
	}

	// A unique start of the id names the task, as everywhere.
	w := ok[mcpWait](t, "wait", p.call(t, "wait", map[string]any{"id": reg.ID[:8]}, "wait-1"))
	if !w.Ended || w.State != engine.PhaseFired || w.Wakeup == nil || w.Wakeup.Status != engine.StatusSucceeded ||
		!slices.Contains(w.Wakeup.Tail, "mcp-round-trip") || !strings.Contains(w.Wakeup.Prompt, reg.ID) {
		t.Errorf("wait: %+v %+v", w, w.Wakeup)
	}
	// The command ran a second: progress came every 100ms meanwhile, counting up.
	p.mu.Lock()
	progress := slices.Clone(p.progress)
	p.mu.Unlock()
	if len(progress) < 3 {
		t.Errorf("%d progress notifications during a wait of a second", len(progress))
	}
	// Each names the task as it was given until the wait has read it.
	for i, n := range progress {
		if n.ProgressToken != "wait-1" || !strings.Contains(n.Message, reg.ID[:8]) || i > 0 && n.Progress <= progress[i-1].Progress {
			t.Errorf("progress notification %d: %+v", i, n)
		}
	}
	if n := len(progress); n > 0 && !strings.Contains(progress[n-1].Message, reg.ID) {
		t.Errorf("the last progress notification does not name %s: %+v", reg.ID, progress[n-1])
	}

	logs := ok[struct {
		Output string `json:"output"`
		Ended  bool   `json:"ended"`
	}](t, "logs", p.call(t, "logs", map[string]any{"id": reg.ID}))
	if logs.Output != "mcp-round-trip\n" || !logs.Ended {
		t.Errorf("logs: %+v", logs)
	}
	tail := ok[struct {
		Output  string `json:"output"`
		Skipped int64  `json:"skipped_bytes"`
	}](t, "logs", p.call(t, "logs", map[string]any{"id": reg.ID, "stream": "stdout", "max_bytes": 6}))
	if tail.Output != "-trip\n" || tail.Skipped != int64(len("mcp-round")) {
		t.Errorf("logs max_bytes 6: %+v", tail)
	}

	// A running task is cancelled; a wait with a timeout returns before a task ends.
	long := ok[struct{ ID string }](t, "add", p.call(t, "add", map[string]any{"command": "sleep 60"}))
	short := ok[mcpWait](t, "wait", p.call(t, "wait", map[string]any{"id": long.ID, "timeout": "300ms"}))
	if short.Ended || short.Wakeup != nil || short.State.Terminal() {
		t.Errorf("wait with a timeout: %+v", short)
	}
	cancelled := ok[mcpTask](t, "cancel", p.call(t, "cancel", map[string]any{"id": long.ID, "reason": "test"}))
	if cancelled.Phase != engine.PhaseCancelled {
		t.Errorf("cancel: state %s", cancelled.Phase)
	}
	w = ok[mcpWait](t, "wait", p.call(t, "wait", map[string]any{"id": long.ID}))
	if !w.Ended || w.Wakeup == nil || w.Wakeup.Status != engine.StatusCancelled {
		t.Errorf("wait of a cancelled task: %+v", w)
	}

	// list pages with its cursor, newest first.
	type page struct {
		Tasks []struct {
			ID string `json:"id"`
		} `json:"tasks"`
		Total      int    `json:"total"`
		NextCursor string `json:"next_cursor"`
	}
	first := ok[page](t, "list", p.call(t, "list", map[string]any{"limit": 1}))
	if len(first.Tasks) != 1 || first.Tasks[0].ID != long.ID || first.Total != 2 || first.NextCursor == "" {
		t.Fatalf("list limit 1: %+v", first)
	}
	second := ok[page](t, "list", p.call(t, "list", map[string]any{"limit": 1, "cursor": first.NextCursor}))
	if len(second.Tasks) != 1 || second.Tasks[0].ID != reg.ID || second.NextCursor != "" {
		t.Errorf("list's second page: %+v", second)
	}
	fired := ok[page](t, "list", p.call(t, "list", map[string]any{"state": "fired"}))
	if len(fired.Tasks) != 1 || fired.Tasks[0].ID != reg.ID {
		t.Errorf("list state fired: %+v", fired)
	}

	// The tasks as resources.
	resources, err := p.session.ListResources(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var uris []string
	for _, r := range resources.Resources {
		uris = append(uris, r.URI)
	}
	if want := []string{"bgtask://tasks/" + long.ID, "bgtask://tasks/" + reg.ID}; !slices.Equal(uris, want) {
		t.Errorf("resources %v, want %v", uris, want)
	}
	read, err := p.session.ReadResource(ctx, &mcp.ReadResourceParams{URI: "bgtask://tasks/" + reg.ID})
	if err != nil {
		t.Fatal(err)
	}
	if len(read.Contents) != 1 || read.Contents[0].MIMEType != "application/json" || decode[mcpTask](t, read.Contents[0].Text).ID != reg.ID {
		t.Errorf("read %s: %+v", reg.ID, read.Contents)
	}
	if _, err := p.session.ReadResource(ctx, &mcp.ReadResourceParams{URI: "bgtask://tasks/no-such-task"}); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("read of no task: %v", err)
	}
}

// A reminder from an agent is an add with start_at and no command: a timer,
// with no directory and no host, that wakes it once at its time.
func TestMCPSetsADurableReminder(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("CLAUDE_CODE_SESSION_ID", "")
	t.Setenv("CODEX_THREAD_ID", "")
	startServer(t, home)
	p := startMCP(t, home, t.TempDir())
	reg := ok[struct {
		ID string `json:"id"`
	}](t, "add", p.call(t, "add", map[string]any{"start_at": "1s", "prompt": "check the deploy"}))
	task := ok[mcpTask](t, "show", p.call(t, "show", map[string]any{"id": reg.ID}))
	if task.Spec.Cwd != "" || task.Spec.Placement != nil || task.Spec.Kind != engine.KindTimer {
		t.Errorf("the reminder's spec: cwd %q placement %v kind %q; want a timer with neither", task.Spec.Cwd, task.Spec.Placement, task.Spec.Kind)
	}
	w := ok[mcpWait](t, "wait", p.call(t, "wait", map[string]any{"id": reg.ID}))
	if !w.Ended || w.Wakeup == nil || w.Wakeup.Status != engine.StatusSucceeded || w.Wakeup.Prompt != "check the deploy" {
		t.Errorf("wait: %+v %+v", w, w.Wakeup)
	}
}

func TestMCPRefusesABadSpecNamingTheField(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	startServer(t, home)
	p := startMCP(t, home, t.TempDir())
	for _, c := range []struct {
		tool  string
		args  map[string]any
		field string
	}{
		{"add", map[string]any{"command": "true", "stall_after": "forever"}, "stall_after"},
		{"add", map[string]any{"command": "true", "on_lost": "retry"}, "on_lost"},
		{"add", map[string]any{"command": "true", "cwd": 7}, "cwd"},
		{"add", map[string]any{"command": "true", "colour": "red"}, "colour"},
		{"add", map[string]any{"kind": "no-command"}, "command"},
		{"show", map[string]any{"id": "no-such-task"}, "id"}, // "no such task: no-such-task"
		{"list", map[string]any{"state": "asleep"}, "state"},
		{"logs", map[string]any{"id": "x", "stream": "stdin"}, "stream"},
		{"wait", map[string]any{"id": "x", "timeout": "soon"}, "timeout"},
		{"cancel", map[string]any{"id": "x", "why": "no"}, "why"},
		{"join", map[string]any{"mode": "some", "members": []string{"x"}}, "mode"},
		{"join", map[string]any{"mode": "all", "members": []string{}}, "members"},
		{"wait", map[string]any{"id": "x", "consume": "yes"}, "consume"},
	} {
		res := p.call(t, c.tool, c.args)
		if !res.IsError || !strings.Contains(text(res), c.field) && !strings.Contains(text(res), "no such task") {
			t.Errorf("%s %v: error %v, text %q; want a tool error naming %q", c.tool, c.args, res.IsError, text(res), c.field)
			continue
		}
		data, _ := json.Marshal(res.StructuredContent)
		obj := decode[errorObject](t, string(data))
		if obj.Error == nil || obj.Error.Field != c.field || obj.Error.Message != text(res) {
			t.Errorf("%s %v: structured error %s", c.tool, c.args, data)
		}
	}
	list := ok[struct{ Total int }](t, "list", p.call(t, "list", nil))
	if list.Total != 0 {
		t.Errorf("%d tasks registered by refused specs", list.Total)
	}
}

func TestMCPInAnAgentSessionWakesThatSession(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("CODEX_THREAD_ID", "")
	startServer(t, home)
	p := startMCP(t, home, t.TempDir(), "CLAUDE_CODE_SESSION_ID=sess-mcp")
	for _, c := range []struct {
		args           map[string]any
		target, origin string
	}{
		{map[string]any{"command": "true"}, "claude-sess-mcp", `{"runtime":"claude-code","session_id":"sess-mcp"}`},
		{map[string]any{"command": "true", "target": "agent-7", "origin": map[string]int{"mine": 1}}, "agent-7", `{"mine":1}`},
	} {
		reg := ok[struct{ ID, Target string }](t, "add", p.call(t, "add", c.args))
		task := ok[mcpTask](t, "show", p.call(t, "show", map[string]any{"id": reg.ID}))
		if task.Spec.Target != c.target || reg.Target != c.target || string(task.Spec.Origin) != c.origin {
			t.Errorf("%v: target %q (add said %q), origin %s; want %q %s", c.args, task.Spec.Target, reg.Target, task.Spec.Origin, c.target, c.origin)
		}
	}

	// A Codex thread's wake-ups reach it through its delivery sink.
	codex := startMCP(t, home, t.TempDir(), "CLAUDE_CODE_SESSION_ID=", "CODEX_THREAD_ID=thread-9")
	reg := ok[struct{ ID, Target string }](t, "add", codex.call(t, "add", map[string]any{"command": "true"}))
	task := ok[mcpTask](t, "show", codex.call(t, "show", map[string]any{"id": reg.ID}))
	if d := task.Spec.Deliver; reg.Target != "codex-thread-9" || len(d) != 1 || d[0].Type != engine.SinkExec ||
		!slices.Contains(d[0].Argv, "deliver") || !slices.Contains(d[0].Argv, "thread-9") || d[0].Timeout != "3m" {
		t.Errorf("a task added in a Codex thread: target %q, deliver %+v", reg.Target, d)
	}
}

func TestMCPCallsWaitThroughARestartOfTheServer(t *testing.T) {
	testkit.FullOnly(t)
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv(serverhome.SupervisedEnv, "test") // a restart is coming
	first := startServer(t, home)
	p := startMCP(t, home, t.TempDir())
	reg := ok[struct{ ID string }](t, "add", p.call(t, "add", map[string]any{"command": "true"}))
	first.stop()

	done := make(chan error, 1)
	var res *mcp.CallToolResult
	go func() {
		var err error
		res, err = p.session.CallTool(context.Background(), &mcp.CallToolParams{Name: "show", Arguments: map[string]any{"id": reg.ID}})
		done <- err
	}()
	awaitText(t, p.stderr, "waiting up to 30s for the server", done)
	startServer(t, home)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if task := ok[mcpTask](t, "show", res); task.ID != reg.ID {
		t.Errorf("show through a restart: %+v", task)
	}
}

// A client that closes the server's input has gone: the server ends, also with a
// call still blocked in a wait. Raw JSON-RPC lines, as the SDK's client would wait
// for its own call before it closed.
func TestMCPExitsWhenItsInputClosesDuringAWait(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	startServer(t, home)
	id := addTask(t, home, "--", "sleep 60")
	cmd := exec.Command(os.Args[0], "--home", home, "mcp")
	cmd.Env = append(os.Environ(), mcpRunMain+"=1")
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	lines := bufio.NewScanner(stdout)
	for _, line := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"wait","arguments":{"id":"` + id + `"},"_meta":{"progressToken":"p"}}}`,
	} {
		if _, err := io.WriteString(stdin, line+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	// The wait's first progress notification says it has begun.
	for lines.Scan() && !strings.Contains(lines.Text(), "notifications/progress") {
	}
	if lines.Err() != nil {
		t.Fatalf("reading bgtask mcp: %v\n%s", lines.Err(), stderr.String())
	}
	stdin.Close()
	go func() {
		io.Copy(io.Discard, stdout)
		exited <- cmd.Wait()
	}()
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("bgtask mcp exited with %v after its input closed\n%s", err, stderr.String())
		}
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-exited
		t.Fatalf("bgtask mcp still ran 10s after its input closed during a wait\n%s", stderr.String())
	}
}

// TestMCPWithTheInspector checks bgtask mcp with a client from outside the project:
// the MCP Inspector's CLI mode lists the tools and calls add.
func TestMCPWithTheInspector(t *testing.T) {
	testkit.FullOnly(t)
	inspector, err := exec.LookPath("mcp-inspector")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("mcp-inspector is not on PATH (npm install @modelcontextprotocol/inspector)")
		}
		t.Skip("mcp-inspector is not on PATH: npm install @modelcontextprotocol/inspector")
	}
	home := t.TempDir()
	t.Setenv("HOME", home)
	startServer(t, home)
	inspect := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		// The inspector gives the server only the environment it is told to.
		cmd := exec.CommandContext(ctx, inspector, append([]string{"--cli", "-e", mcpRunMain + "=1", "-e", "GORACE=" + os.Getenv("GORACE"),
			os.Args[0], "--home", home, "mcp"}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("mcp-inspector %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	var tools struct {
		Tools []struct{ Name string } `json:"tools"`
	}
	err = json.Unmarshal([]byte(inspect("--method", "tools/list", "--strict")), &tools)
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
	}
	if want := "add cancel complete join list logs redeliver show wait"; err != nil || strings.Join(names, " ") != want {
		t.Fatalf("the inspector's tools/list: %v %q, want %s", err, names, want)
	}
	var res struct {
		StructuredContent struct{ ID string } `json:"structuredContent"`
		IsError           bool                `json:"isError"`
	}
	out := inspect("--method", "tools/call", "--tool-name", "add", "--tool-arg", "command=echo from-the-inspector")
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.IsError || res.StructuredContent.ID == "" {
		t.Fatalf("the inspector's add: %v\n%s", err, out)
	}
	r := bgtask(t, home, "wait", res.StructuredContent.ID, "--json", "--timeout", "30s").must(t, 0, "wait")
	if !strings.Contains(r.stdout, "from-the-inspector") {
		t.Errorf("the task the inspector added: %s", r.stdout)
	}
}

// The triggers through MCP: add with after, wake_on and external, a join of
// them, complete, and a wait that consumes the join's wake-up, so that the
// session's inbox holds nothing to wake it again.
func TestMCPJoinsCompletesAndConsumes(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("CLAUDE_CODE_SESSION_ID", "")
	t.Setenv("CODEX_THREAD_ID", "")
	startServer(t, home)
	p := startMCP(t, home, t.TempDir())
	type registered struct {
		ID     string `json:"id"`
		Target string `json:"target"`
	}
	add := func(args map[string]any) string {
		args["target"], args["wake_on"] = "mcp-join", []string{"none"}
		return ok[registered](t, "add", p.call(t, "add", args)).ID
	}
	first := add(map[string]any{"command": "exit 3"})
	ext := add(map[string]any{"external": true, "deadline": "1m"})
	after := add(map[string]any{"command": "true", "after": []string{first}, "after_policy": "ended"})
	join := ok[registered](t, "join", p.call(t, "join", map[string]any{
		"mode": "all", "members": []string{first, ext, after}, "prompt": "group:\n{{members}}", "target": "mcp-join"}))
	if join.Target != "mcp-join" {
		t.Errorf("join: target %q", join.Target)
	}
	if res := p.call(t, "complete", map[string]any{"id": ext, "status": "maybe"}); !res.IsError || !strings.HasPrefix(text(res), "status:") {
		t.Errorf("complete with a bad status: %s", text(res))
	}
	done := ok[mcpTask](t, "complete", p.call(t, "complete", map[string]any{"id": ext, "status": "failed", "result": "from CI"}))
	if done.Phase != engine.PhaseEnded && !done.Phase.Terminal() {
		t.Errorf("complete: the task is %s", done.Phase)
	}
	if res := p.call(t, "complete", map[string]any{"id": ext}); !res.IsError {
		t.Errorf("a second complete: %s", text(res))
	}

	w := ok[struct {
		mcpWait
		Consumed bool `json:"consumed"`
	}](t, "wait", p.call(t, "wait", map[string]any{"id": join.ID, "timeout": "60s", "consume": true}))
	if !w.Ended || !w.Consumed || w.Wakeup == nil {
		t.Fatalf("wait: %+v", w)
	}
	for _, line := range []string{first + " failed (exit code 3)", ext + " failed", after + " succeeded (exit code 0)"} {
		if !strings.Contains(w.Wakeup.Prompt, line) {
			t.Errorf("the join's prompt has no %q:\n%s", line, w.Wakeup.Prompt)
		}
	}
	if inbox := strings.TrimSpace(bgtask(t, home, "inbox", "--target", "mcp-join", "--json").must(t, 0, "inbox").stdout); inbox != "" {
		t.Errorf("the inbox after the consumed join: %s", inbox)
	}
}

// A probe, notices and a process watch through the add tool: each its spec's
// fields, as the CLI's flags give them.
func TestMCPAddsAProbeNoticesAndAProcessWatch(t *testing.T) {
	testkit.FullOnly(t)
	home, dir := t.TempDir(), t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("CLAUDE_CODE_SESSION_ID", "")
	t.Setenv("CODEX_THREAD_ID", "")
	startServer(t, home)
	p := startMCP(t, home, dir)
	id := func(args map[string]any) string {
		return ok[struct {
			ID string `json:"id"`
		}](t, "add", p.call(t, "add", args)).ID
	}
	wait := func(id string) mcpWait {
		return ok[mcpWait](t, "wait", p.call(t, "wait", map[string]any{"id": id, "timeout": "60s"}))
	}

	// The spec is registered as given: a 64-bit id in a json_line match is not
	// rounded through a float.
	matched := id(map[string]any{"command": "true", "completion": map[string]any{"type": "json_line", "match": map[string]any{"id": json.Number("9007199254740993")}}})
	if armed := bgtask(t, home, "history", "--json", matched).must(t, 0, "history").stdout; !strings.Contains(armed, "9007199254740993") {
		t.Errorf("the task's events hold no json_line match of id 9007199254740993: %s", armed)
	}

	probe := id(map[string]any{"command": "n=$(cat n 2>/dev/null || echo 0); echo $((n+1)) > n; [ $n -ge 2 ]", "probe_every": "1s"})
	if w := wait(probe); w.Wakeup == nil || w.Wakeup.Status != "succeeded" || w.Wakeup.Probes != 2 {
		t.Fatalf("the probe's wake-up: %+v", w.Wakeup)
	}

	noted := id(map[string]any{"command": "echo step 1; echo other; echo step 2; sleep 2", "target": "mcp-notes",
		"notify": map[string]any{"type": "line_pattern", "regex": "^step", "batch": "1s"}})
	wait(noted)
	inbox := bgtask(t, home, "inbox", "--target", "mcp-notes", "--json").must(t, 0, "inbox").stdout
	if !strings.Contains(inbox, `"notice":"n1"`) || !strings.Contains(inbox, `"step 2"`) {
		t.Fatalf("the notices' inbox: %s", inbox)
	}

	sleeper := exec.Command("sleep", "1")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	watch := id(map[string]any{"pid": sleeper.Process.Pid})
	_ = sleeper.Wait()
	if w := wait(watch); w.Wakeup == nil || w.Wakeup.Status != "succeeded" || w.Wakeup.ExitCode != nil {
		t.Fatalf("the process watch's wake-up: %+v", w.Wakeup)
	}
	for args, field := range map[string]string{`{"pid": 0}`: "pid", `{"pid": 4194304}`: "pid", `{"pid": 1, "command": "true"}`: "pid"} {
		var a map[string]any
		_ = json.Unmarshal([]byte(args), &a)
		if res := p.call(t, "add", a); !res.IsError || !strings.HasPrefix(text(res), field+":") {
			t.Errorf("add %s: %s", args, text(res))
		}
	}
}
