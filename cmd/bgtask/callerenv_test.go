package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/internal/serverhome"
)

// callerSetup starts a server, and gives this process (the caller of the client
// commands, which run in it) a PATH with a tool of its own, an exported variable,
// a shell's bookkeeping and a credential of bgtask's.
func callerSetup(t *testing.T) (home string) {
	t.Helper()
	home = t.TempDir()
	t.Setenv("HOME", home) // no profile of this machine's in the workers' login shell
	startServer(t, home)
	tools := t.TempDir()
	if err := os.WriteFile(filepath.Join(tools, "t3tool"), []byte("#!/bin/sh\necho tool-ok\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", tools+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("T_VALUE", "v-of-the-caller")
	t.Setenv("OLDPWD", "/old")
	t.Setenv("SHLVL", "3")
	t.Setenv("BGTASK_WORKER_PASSWORD", "s3cr3t-client")
	return home
}

// waitTail waits for task id to succeed and returns its output's last lines.
func waitTail(t *testing.T, home, id string) []string {
	t.Helper()
	r := bgtask(t, home, "wait", id, "--json", "--timeout", "30s").must(t, 0, "wait for "+id)
	return decode[struct{ Tail []string }](t, r.stdout).Tail
}

// A command added from a shell runs in that shell's environment, kept with the
// task: its PATH and exports, PWD its cwd, without the shell's bookkeeping or a
// credential of bgtask's. --env sets variables over it; --environment login, and
// a --spec that says nothing, run it in the worker's login environment instead.
func TestAddRunsTheCommandInItsCallersEnvironment(t *testing.T) {
	home := callerSetup(t)
	dir := t.TempDir()
	report := `t3tool; echo "value=$T_VALUE pwd=$PWD password=$BGTASK_WORKER_PASSWORD"`
	caller := addTask(t, home, "--cwd", dir, "--", report)
	if got, want := waitTail(t, home, caller), []string{"tool-ok", "value=v-of-the-caller pwd=" + dir + " password="}; !slices.Equal(got, want) {
		t.Errorf("in the caller's environment the command printed %q, want %q", got, want)
	}
	shown := decode[struct {
		Spec struct {
			Env         map[string]string
			Environment string
		}
	}](t, bgtask(t, home, "show", caller, "--json").must(t, 0, "show").stdout)
	if human := bgtask(t, home, "show", caller).must(t, 0, "show").stdout; !strings.Contains(human, "environment:  the caller's") {
		t.Errorf("show does not say the command runs in the caller's environment:\n%s", human)
	}
	if shown.Spec.Environment != "caller" {
		t.Errorf("the spec's environment is %q, want caller", shown.Spec.Environment)
	}
	for _, name := range []string{"PATH", "T_VALUE", "PWD", "HOME"} {
		if _, ok := shown.Spec.Env[name]; !ok {
			t.Errorf("the spec's env lacks %s: %q", name, shown.Spec.Env)
		}
	}
	for _, name := range []string{"OLDPWD", "SHLVL", "_", "BGTASK_WORKER_PASSWORD"} {
		if _, ok := shown.Spec.Env[name]; ok {
			t.Errorf("the spec's env holds %s", name)
		}
	}

	over := addTask(t, home, "--env", "T_VALUE=given", "--", `echo "value=$T_VALUE"`)
	login := addTask(t, home, "--environment", "login", "--", `command -v t3tool || echo no-tool; echo "value=$T_VALUE"`)
	spec := filepath.Join(dir, "spec.json")
	if err := os.WriteFile(spec, []byte(`{"command": "echo \"value=$T_VALUE\""}`), 0o600); err != nil {
		t.Fatal(err)
	}
	fromSpec := addTask(t, home, "--spec", spec)
	for id, want := range map[string][]string{over: {"value=given"}, login: {"no-tool", "value="}, fromSpec: {"value="}} {
		if got := waitTail(t, home, id); !slices.Equal(got, want) {
			t.Errorf("task %s printed %q, want %q", id, got, want)
		}
	}
}

// The environment is the task's: a retry, a rerun, a line of --each-line and a
// schedule's occurrence run in the one captured when they were added.
func TestTheCallersEnvironmentStaysWithTheTask(t *testing.T) {
	home := callerSetup(t)
	dir := t.TempDir()
	retried := addTask(t, home, "--cwd", dir, "--retry", "1", "--retry-backoff", "100ms", "--",
		`echo "attempt value=$T_VALUE"; test -e marker || { touch marker; exit 1; }`)
	if got := waitTail(t, home, retried); !slices.Equal(got, []string{"attempt value=v-of-the-caller"}) {
		t.Errorf("the retry printed %q", got)
	}
	rerun := strings.TrimSpace(bgtask(t, home, "rerun", retried).must(t, 0, "rerun").stdout)
	if got := waitTail(t, home, rerun); !slices.Equal(got, []string{"attempt value=v-of-the-caller"}) {
		t.Errorf("the rerun printed %q", got)
	}
	r := addEachLine(t, home, "echo \"line value=$T_VALUE\"\n")
	if r.code != 0 {
		t.Fatalf("add --each-line: %d %s", r.code, r.stderr)
	}
	if got := waitTail(t, home, strings.TrimSpace(r.stdout)); !slices.Equal(got, []string{"line value=v-of-the-caller"}) {
		t.Errorf("the line's task printed %q", got)
	}
	bgtask(t, home, "schedule", "add", "hourly", "--every", "1h", "--", `echo "slot value=$T_VALUE"`).must(t, 0, "schedule add")
	slot := decode[struct{ ID string }](t, bgtask(t, home, "schedule", "trigger", "hourly", "--json").must(t, 0, "schedule trigger").stdout).ID
	if got := waitTail(t, home, slot); !slices.Equal(got, []string{"slot value=v-of-the-caller"}) {
		t.Errorf("the schedule's occurrence printed %q", got)
	}
}

// An environment over its budget is refused, naming env and what to do.
func TestAnEnvironmentOverItsBudgetIsRefused(t *testing.T) {
	home := callerSetup(t)
	t.Setenv("HUGE", strings.Repeat("x", 130<<10))
	r := bgtask(t, home, "add", "--", "true")
	if r.code == 0 || !strings.Contains(r.stderr, "env: ") || !strings.Contains(r.stderr, "environment login") {
		t.Fatalf("add with a 130 KiB environment: exit %d, %q", r.code, r.stderr)
	}
	bgtask(t, home, "add", "--environment", "login", "--", "true").must(t, 0, "add --environment login")
}

// No read path of a task or a schedule shows the values of its env, the caller's
// captured by add or given with --env: show, list, history and audit (human and
// JSON), the schedules' listing, the HTTP API (its task routes and its event
// stream), the dashboard's page and the MCP tools give the names alone.
func TestNoReadPathShowsTheEnvironmentsValues(t *testing.T) {
	home := callerSetup(t)
	const captured, given = "v-captured-8f3a", "v-given-41c2"
	t.Setenv("T_SECRET", captured)
	caller := addTask(t, home, "--", "echo done")
	login := addTask(t, home, "--environment", "login", "--env", "T_GIVEN="+given, "--", "echo done")
	for _, id := range []string{caller, login} {
		waitTail(t, home, id)
	}
	bgtask(t, home, "schedule", "add", "hourly", "--every", "1h", "--", "echo done").must(t, 0, "schedule add")
	outputs := map[string]string{}
	for _, args := range [][]string{
		{"show", caller}, {"show", caller, "--json"}, {"show", login, "--json"},
		{"list"}, {"list", "--json"}, {"history", caller}, {"history", caller, "--json"}, {"history", login, "--json"},
		{"audit"}, {"audit", "--json"}, {"schedule", "list", "--json"}, {"schedule", "show", "hourly", "--json"},
	} {
		outputs["bgtask "+strings.Join(args, " ")] = bgtask(t, home, args...).must(t, 0, strings.Join(args, " ")).stdout
	}
	info, err := serverhome.ReadHTTPInfo(home)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/v1/tasks/" + caller, "/v1/tasks", "/v1/tasks/" + caller + "/history", "/v1/tasks/" + login + "/history", "/tasks/" + caller} {
		status, body := httpCall(t, info, "GET", path, "")
		if status != 200 {
			t.Fatalf("GET %s: %d %s", path, status, body)
		}
		outputs["GET "+path] = body
	}
	outputs["GET /v1/events?task="+caller] = eventStreamUntil(t, info, "/v1/events?task="+caller, `"type":"fired"`)
	mcp := startMCP(t, home, t.TempDir())
	outputs["MCP show"] = mcpText(t, mcp.call(t, "show", map[string]any{"id": caller}))
	outputs["MCP list"] = mcpText(t, mcp.call(t, "list", map[string]any{}))

	for what, out := range outputs {
		for _, value := range []string{captured, given} {
			if strings.Contains(out, value) {
				t.Errorf("%s shows the value %s of the env", what, value)
			}
		}
	}
	for what, name := range map[string]string{"bgtask show " + caller + " --json": "T_SECRET", "bgtask show " + login + " --json": "T_GIVEN", "bgtask schedule show hourly --json": "T_SECRET"} {
		if !regexp.MustCompile(`"` + name + `":\s*"` + regexp.QuoteMeta(engine.HiddenValue) + `"`).MatchString(outputs[what]) {
			t.Errorf("%s does not name %s:\n%s", what, name, outputs[what])
		}
	}
}

// eventStreamUntil reads an event stream of the HTTP API until it has sent want.
func eventStreamUntil(t *testing.T, info serverhome.HTTPInfo, path, want string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", info.URL+path, nil)
	req.Header.Set("Authorization", "Bearer "+info.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		got.WriteString(sc.Text() + "\n")
		if strings.Contains(sc.Text(), want) {
			return got.String()
		}
	}
	t.Fatalf("GET %s ended before %s: %v\n%s", path, want, sc.Err(), got.String())
	return ""
}

// mcpText is a tool call's whole answer: its text and its structured content.
func mcpText(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	if res.IsError {
		t.Fatalf("tool error: %s", text(res))
	}
	data, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	return text(res) + "\n" + string(data)
}

// The MCP add runs the command in the environment of `bgtask mcp`, which is the
// agent's, with env set over it; environment login runs it in the worker's.
func TestMCPAddRunsTheCommandInTheAgentsEnvironment(t *testing.T) {
	home := callerSetup(t)
	t.Setenv("CLAUDE_CODE_SESSION_ID", "")
	t.Setenv("CODEX_THREAD_ID", "")
	p := startMCP(t, home, t.TempDir(), "T_AGENT=of-the-agent")
	for _, c := range []struct {
		args map[string]any
		want []string
	}{
		{map[string]any{"command": `t3tool; echo "agent=$T_AGENT given=$T_GIVEN"`, "env": map[string]string{"T_GIVEN": "set"}},
			[]string{"tool-ok", "agent=of-the-agent given=set"}},
		{map[string]any{"command": `command -v t3tool || echo no-tool; echo "agent=$T_AGENT"`, "environment": "login"},
			[]string{"no-tool", "agent="}},
	} {
		reg := ok[struct{ ID string }](t, "add", p.call(t, "add", c.args))
		w := ok[mcpWait](t, "wait", p.call(t, "wait", map[string]any{"id": reg.ID}))
		if w.Wakeup == nil || !slices.Equal(w.Wakeup.Tail, c.want) {
			t.Errorf("add %v: the command printed %+v, want %q", c.args, w.Wakeup, c.want)
		}
	}
}

// The password a client connects with stays out of the environment it captures,
// under any name, though the capture comes before the connection.
func TestTheCallersEnvironmentHoldsNoneOfItsCredentials(t *testing.T) {
	t.Setenv("MY_NATS_PASSWORD", "pw-of-the-client-7d1e")
	g := &globals{natsURL: "nats://127.0.0.1:4222", auth: natsAuth{user: "client", password: "pw-of-the-client-7d1e"}}
	doc := map[string]any{"command": "true"}
	if err := withCallerEnv(g, doc); err != nil {
		t.Fatal(err)
	}
	env := doc["env"].(map[string]string)
	if _, ok := env["MY_NATS_PASSWORD"]; ok || env["PATH"] == "" {
		t.Errorf("the captured environment holds the client's password, or lacks PATH: %q", env)
	}
}
