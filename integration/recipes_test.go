package integration

import (
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/internal/testkit"
)

// recorder is a stand-in for an agent runtime's CLI: it records its arguments (each
// ended by a NUL: a prompt has newlines), its stdin and the BGTASK_ part of its environment under $RECORD_DIR,
// named after itself.
const recorder = `#!/bin/sh
name=$(basename "$0")
printf '%s\0' "$@" > "$RECORD_DIR/$name.args.tmp"
cat > "$RECORD_DIR/$name.stdin"
env | grep '^BGTASK_' | sort > "$RECORD_DIR/$name.env"
mv "$RECORD_DIR/$name.args.tmp" "$RECORD_DIR/$name.args"
`

// Each exec recipe of examples/ registers as it is written, and its exec sink calls
// the runtime's CLI the way the recipe says; the CLIs are stand-ins that record what
// they were given, since none of them is installed here.
func TestRecipesWakeTheirRuntimes(t *testing.T) {
	t.Parallel()
	stand, records := t.TempDir(), t.TempDir()
	for _, name := range []string{"claude", "codex", "cli-jaw"} {
		if err := os.WriteFile(filepath.Join(stand, name), []byte(recorder), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	home := t.TempDir()
	startServerEnv(t, home, []string{"PATH=" + stand + ":" + os.Getenv("PATH"), "RECORD_DIR=" + records})
	examples, err := filepath.Abs("../examples")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		recipe, runtime string
		args            []string // what the runtime's CLI must get; PROMPT stands for the prompt
	}{
		{"claude-code.json", "claude", []string{"--resume", "sess-42", "-p"}},
		{"codex.json", "codex", []string{"exec", "resume", "sess-42", "-"}},
		{"cli-jaw.json", "cli-jaw", []string{"chat", "send", "PROMPT"}},
	} {
		data, err := os.ReadFile(filepath.Join(examples, tc.recipe))
		if err != nil {
			t.Fatal(err)
		}
		spec := strings.ReplaceAll(string(data), "SESSION_ID", "sess-42")
		id := add(t, home, "--spec", writeSpec(t, spec), "--", "echo recipe output from "+tc.runtime)
		var recorded string
		testkit.Eventually(t, 60*time.Second, tc.recipe+": the runtime called", func() bool {
			out, err := os.ReadFile(filepath.Join(records, tc.runtime+".args"))
			recorded = string(out)
			return err == nil
		})
		stdin, err := os.ReadFile(filepath.Join(records, tc.runtime+".stdin"))
		if err != nil {
			t.Fatal(err)
		}
		env, err := os.ReadFile(filepath.Join(records, tc.runtime+".env"))
		if err != nil {
			t.Fatal(err)
		}
		w := waitFor(t, home, id)
		if !strings.Contains(w.Prompt, "recipe output from "+tc.runtime) || !strings.Contains(string(env), "BGTASK_TASK_ID="+id+"\n") {
			t.Fatalf("%s: prompt %q, environment:\n%s", tc.recipe, w.Prompt, env)
		}
		got := strings.Split(strings.TrimSuffix(recorded, "\x00"), "\x00")
		want := make([]string, len(tc.args))
		for i, a := range tc.args {
			want[i] = strings.ReplaceAll(a, "PROMPT", w.Prompt)
		}
		if strings.Join(got, "\x00") != strings.Join(want, "\x00") {
			t.Fatalf("%s: %s got %q, want %q", tc.recipe, tc.runtime, got, want)
		}
		if string(stdin) != w.Prompt {
			t.Fatalf("%s: stdin %q, want the prompt %q", tc.recipe, stdin, w.Prompt)
		}
	}
	auditClean(t, home)
}

// The OpenClaw recipe runs a turn through a gateway's /hooks/agent, with the
// token the server reads from its own file: a stand-in gateway that answers 401
// without it, and 400 to an empty sessionKey as OpenClaw does, gets exactly one
// request per task, whose message is the prompt, whatever the output held, in
// the persistent session the task's origin.session names (agent:main:main when
// it has none), answered once the turn ran, its reply kept in that session. A
// spec cannot name an undeclared token or send one elsewhere, and the token is
// in neither the stream nor what show and history print.
func TestOpenClawRecipeWakesTheGatewayOnce(t *testing.T) {
	t.Parallel()
	const token = "oc-hook-token-5f0e8a7c1d"
	type turn struct {
		Message, Name, SessionMode string
		SessionKey                 *string
		WaitForCompletion          bool
		Deliver                    *bool
	}
	var mu sync.Mutex
	turns := map[string]turn{} // by Idempotency-Key
	unauthorized := 0
	gateway := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/hooks/agent" {
			http.NotFound(w, r)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer "+token {
			unauthorized++
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		var body turn
		if r.Header.Get("Content-Type") != "application/json" || json.NewDecoder(r.Body).Decode(&body) != nil || body.Message == "" ||
			body.SessionKey != nil && *body.SessionKey == "" {
			http.Error(w, `{"ok":false,"error":"sessionKey must be a non-empty string"}`, http.StatusBadRequest)
			return
		}
		key := r.Header.Get("Idempotency-Key")
		if _, ok := turns[key]; ok {
			t.Errorf("a second request for %s", key)
		}
		turns[key] = body
		io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(gateway.Close)
	tokenFile := filepath.Join(t.TempDir(), "openclaw-token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	server := startServer(t, home, "--webhook-bearer", "openclaw=file:"+tokenFile+"@"+gateway.URL+"/hooks/")
	data, err := os.ReadFile("../examples/openclaw.json")
	if err != nil {
		t.Fatal(err)
	}
	recipe := strings.ReplaceAll(string(data), "http://127.0.0.1:18789", gateway.URL)

	for _, bad := range []struct{ from, to, field string }{
		{`"bearer": "openclaw"`, `"bearer": "github"`, "deliver[0].bearer"},
		{gateway.URL + "/hooks/agent", gateway.URL + "/admin", "deliver[0].url"},
	} {
		r := run(t, home, "add", "--spec", writeSpec(t, strings.ReplaceAll(recipe, bad.from, bad.to)), "--", "true")
		if r.code != 2 || !strings.Contains(r.stderr, bad.field) {
			t.Fatalf("a recipe with %s: exit %d, %s; want it refused on %s", bad.to, r.code, r.stderr, bad.field)
		}
	}
	// Without the bearer, the gateway refuses the wake-up: a 401 is not retried.
	anonymous := add(t, home, "--spec", writeSpec(t, strings.ReplaceAll(recipe, `"bearer": "openclaw",`, "")), "--origin", "{}", "--", "true")
	id := add(t, home, "--spec", writeSpec(t, recipe), "--origin", "{}", "--", `printf 'deploy "staging" done\n\tlast line \033[0m\n'`)
	routed := add(t, home, "--spec", writeSpec(t, recipe), "--origin", `{"session":"agent:ops:thread-7","agent":"ops"}`, "--", "true")
	w := waitFor(t, home, id)
	for _, task := range []struct {
		id, end string
	}{{anonymous, "delivery-failed"}, {id, "delivery-result"}, {routed, "delivery-result"}} {
		testkit.Eventually(t, 60*time.Second, task.id+": "+task.end+" in its history", func() bool { return countTypes(history(t, home, task.id))[task.end] == 1 })
	}
	mu.Lock()
	got, refused := maps.Clone(turns), unauthorized
	mu.Unlock()
	if main, ok := got[id]; len(got) != 2 || !ok || main.Message != w.Prompt || main.Name != "bgtask" || main.SessionKey == nil ||
		*main.SessionKey != "agent:main:main" || main.SessionMode != "persistent" || !main.WaitForCompletion ||
		main.Deliver == nil || *main.Deliver || refused != 1 {
		t.Fatalf("the gateway got %+v and refused %d; want a turn of %s {message: %q, sessionKey: agent:main:main, persistent, deliver false} and one refused", got, refused, id, w.Prompt)
	}
	if r := got[routed]; r.SessionKey == nil || *r.SessionKey != "agent:ops:thread-7" || r.SessionMode != "persistent" {
		t.Fatalf("the routed task's turn %+v, want sessionKey agent:ops:thread-7, persistent", r)
	}
	if !strings.Contains(w.Prompt, `deploy "staging" done`) {
		t.Fatalf("prompt %q does not hold the output", w.Prompt)
	}
	_, js := connect(t, home)
	for _, rec := range allEvents(t, js) {
		raw, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(raw), token) {
			t.Fatalf("the token is in the event stream: %s", raw)
		}
	}
	for _, args := range [][]string{{"show", id}, {"show", id, "--json"}, {"history", id, "--json"}} {
		out := ok(t, home, args...)
		if strings.Contains(out, token) || args[len(args)-1] == "--json" && !strings.Contains(strings.ReplaceAll(out, " ", ""), `"bearer":"openclaw"`) {
			t.Fatalf("bgtask %s: the token is printed, or the bearer's name is not:\n%s", strings.Join(args, " "), out)
		}
	}
	if strings.Contains(server.out.String(), token) {
		t.Fatal("the token is in the server's log")
	}
	auditClean(t, home)
}

// The Slack recipe posts {"text": prompt} to the webhook URL from the server's
// environment, with real curl when this machine has it (else a stand-in that records
// what curl was given).
func TestSlackRecipePostsThePrompt(t *testing.T) {
	t.Parallel()
	posts := make(chan string, 4)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		posts <- r.Header.Get("Idempotency-Key") + " " + string(body)
	}))
	t.Cleanup(hook.Close)
	path, records := os.Getenv("PATH"), t.TempDir()
	_, err := exec.LookPath("curl")
	realCurl := err == nil
	if !realCurl {
		stand := t.TempDir()
		if err := os.WriteFile(filepath.Join(stand, "curl"), []byte(recorder), 0o755); err != nil {
			t.Fatal(err)
		}
		path = stand + ":" + path
	}
	home := t.TempDir()
	startServerEnv(t, home, []string{"PATH=" + path, "RECORD_DIR=" + records, "SLACK_WEBHOOK_URL=" + hook.URL + "/services/T0/B0/x"})
	examples, err := filepath.Abs("../examples")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(examples, "slack.json"))
	if err != nil {
		t.Fatal(err)
	}
	spec := strings.ReplaceAll(string(data), `"examples/slack-notify.sh"`, `"`+filepath.Join(examples, "slack-notify.sh")+`"`)
	id := add(t, home, "--spec", writeSpec(t, spec), "--", "echo nightly done")
	w := waitFor(t, home, id)
	var got string
	if realCurl {
		select {
		case got = <-posts:
		case <-time.After(60 * time.Second):
			t.Fatal("the Slack recipe posted nothing")
		}
	} else {
		var stdin []byte
		testkit.Eventually(t, 60*time.Second, "the Slack recipe calling curl", func() bool {
			_, err := os.Stat(filepath.Join(records, "curl.args"))
			return err == nil
		})
		stdin, _ = os.ReadFile(filepath.Join(records, "curl.stdin"))
		args, _ := os.ReadFile(filepath.Join(records, "curl.args"))
		if !strings.Contains(string(args), hook.URL) {
			t.Fatalf("curl arguments %q", args)
		}
		got = id + " " + string(stdin)
	}
	key, body, _ := strings.Cut(got, " ")
	var post struct{ Text string }
	if err := json.Unmarshal([]byte(body), &post); err != nil || key != id || post.Text != w.Prompt {
		t.Fatalf("the hook got %q, want Idempotency-Key %s and {\"text\": %q}", got, id, w.Prompt)
	}
	auditClean(t, home)
}

// The shell-loop recipe prints each wake-up of its target as it arrives.
func TestInboxLoopRecipe(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home)
	path := t.TempDir()
	if err := os.Symlink(bin, filepath.Join(path, "bgtask")); err != nil {
		t.Fatal(err)
	}
	loop := exec.Command("sh", "../examples/inbox-loop.sh", "loop-target")
	loop.Env = append(childEnv(home), "PATH="+path+":"+os.Getenv("PATH"))
	out := &syncBuffer{}
	loop.Stdout, loop.Stderr = out, out
	loop.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // the loop and its bgtask inbox
	if err := loop.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = killGroup(loop.Process.Pid)
		_ = loop.Wait()
	})
	first := add(t, home, "--target", "loop-target", "--", "true")
	second := add(t, home, "--target", "loop-target", "--", "exit 3")
	testkit.Eventually(t, 60*time.Second, "the loop printing both wake-ups", func() bool {
		return strings.Contains(out.String(), "task "+first+" succeeded\n") && strings.Contains(out.String(), "task "+second+" failed\n")
	})
}
