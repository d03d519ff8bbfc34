package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/internal/testkit"
)

type shown struct {
	State       string `json:"state"`
	Status      string `json:"status"`
	Reason      string `json:"reason"`
	ExitCode    *int   `json:"exit_code"`
	MatchedLine string `json:"matched_line"`
	Result      string `json:"result"`
	Respawns    int    `json:"respawns"`
	PID         int    `json:"pid"`
}

func show(t *testing.T, home, id string) shown {
	t.Helper()
	return decodeJSON[shown](t, ok(t, home, "show", id, "--json"))
}

// pidFile is a file a command writes its shell's pid to, so the test can check the
// process is gone.
func readPID(t *testing.T, path string) int {
	t.Helper()
	var pid int
	testkit.Eventually(t, 30*time.Second, "a pid in "+path, func() bool {
		data, err := os.ReadFile(path)
		if err != nil {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(data)))
		return err == nil
	})
	return pid
}

func TestJSONLineCompletionStopsALingeringWatcher(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home)
	dir := t.TempDir()
	watcher := `echo $$ > pid; echo '{"type":"watch.tick","n":1}'; echo 'not json'; ` +
		`echo '{"type":"watch.complete","job":{"state":"done-ok"},"answer":42}'; exec sleep 600`
	id := add(t, home, "--cwd", dir, "--complete-on-json", "type=watch.complete",
		"--complete-on-json", "job.state=done*", "--complete-on-json", "answer=42", "--result", "matched-line", "--", watcher)
	w := waitFor(t, home, id)
	if w.Status != "succeeded" {
		t.Fatalf("status %q, want succeeded: %+v", w.Status, w)
	}
	s := show(t, home, id)
	if !strings.Contains(s.MatchedLine, `"watch.complete"`) || s.Result != s.MatchedLine {
		t.Fatalf("matched line %q, result %q", s.MatchedLine, s.Result)
	}
	pid := readPID(t, filepath.Join(dir, "pid"))
	testkit.Eventually(t, 15*time.Second, "the watcher gone after its completion line", func() bool { return processGone(pid) })
}

func TestJSONLineThatDoesNotMatchEveryFieldIsIgnored(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home)
	id := add(t, home, "--complete-on-json", "type=watch.complete", "--complete-on-json", "job.state=ok",
		"--", `echo '{"type":"watch.complete","job":{"state":"failed"}}'; echo '{"type":"watch.completed"}'; exit 0`)
	w := waitFor(t, home, id)
	if w.Status != "failed" || !strings.Contains(show(t, home, id).Reason, "exited before the completion rule matched") {
		t.Fatalf("a command whose lines never matched: %+v", w)
	}
}

func TestRegexCompletionAndKeepRunning(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home)
	dir := t.TempDir()
	id := add(t, home, "--cwd", dir, "--complete-on-regex", `^BUILD (OK|DONE)$`, "--keep-running",
		"--", `echo $$ > pid; echo compiling; echo "BUILD OK"; exec sleep 600`)
	w := waitFor(t, home, id)
	if w.Status != "succeeded" || w.ExitCode != nil {
		t.Fatalf("wake-up %+v: want succeeded with no exit code (still running)", w)
	}
	pid := readPID(t, filepath.Join(dir, "pid"))
	if processGone(pid) {
		t.Fatal("--keep-running: the command was stopped")
	}
	t.Cleanup(func() { _ = killGroup(pid) })
	if s := show(t, home, id); s.MatchedLine != "BUILD OK" {
		t.Fatalf("matched line %q", s.MatchedLine)
	}
}

func TestStallKillDeadlineAndRespawn(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home)
	stalled := add(t, home, "--stall-after", "500ms", "--on-stall", "kill", "--", "echo start; sleep 600")
	timedOut := add(t, home, "--deadline", "1s", "--", "echo start; sleep 600")
	respawned := add(t, home, "--stall-after", "500ms", "--on-stall", "respawn", "--max-respawns", "2", "--", "echo run; sleep 600")

	if w := waitFor(t, home, stalled); w.Status != "stalled" {
		t.Fatalf("stall kill: %+v", w)
	}
	if w := waitFor(t, home, timedOut); w.Status != "timed_out" {
		t.Fatalf("deadline: %+v", w)
	}
	w := waitFor(t, home, respawned)
	if w.Status != "stalled" {
		t.Fatalf("respawn past its limit: %+v", w)
	}
	n := countTypes(history(t, home, respawned))
	if n["spawned"] != 3 || n["stalled"] != 3 || n["exited"] != 1 || n["fired"] != 1 {
		t.Fatalf("respawn history: %v, want 3 runs, 3 stalls, one exit and one fire", n)
	}
	if s := show(t, home, respawned); s.Respawns != 2 {
		t.Fatalf("respawns = %d, want 2", s.Respawns)
	}
	if out := ok(t, home, "logs", respawned); out != "run\nrun\nrun\n" {
		t.Fatalf("the log of three runs = %q", out)
	}
	// The output ends once, after the last run: follow reads all three.
	if out := ok(t, home, "logs", respawned, "--follow"); out != "run\nrun\nrun\n" {
		t.Fatalf("logs --follow of three runs = %q", out)
	}
}

func TestStallNotifyWakesOnceAndKeepsWatching(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home)
	dir := t.TempDir()
	id := add(t, home, "--cwd", dir, "--stall-after", "300ms", "--",
		`echo start; while [ ! -e go ]; do sleep 0.05; done; echo resumed; exit 0`)
	notice := decodeJSON[struct {
		ID     string `json:"id"`
		Status string `json:"status"`
		Notice string `json:"notice"`
	}](t, firstInboxLine(t, home))
	if notice.ID != id || notice.Status != "stalled" || notice.Notice != "stalled" {
		t.Fatalf("stall notice = %+v", notice)
	}
	if s := show(t, home, id); s.State != "running" {
		t.Fatalf("after a notify stall the task is %s, want running", s.State)
	}
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if w := waitFor(t, home, id); w.Status != "succeeded" {
		t.Fatalf("final wake-up after a notify stall: %+v", w)
	}
	n := countTypes(history(t, home, id))
	if n["stalled"] != 1 || n["fired"] != 1 {
		t.Fatalf("history %v: want one stall notice and one fire", n)
	}
}

// firstInboxLine waits for the first wake-up in the default inbox and returns it.
func firstInboxLine(t *testing.T, home string) string {
	t.Helper()
	var line string
	testkit.Eventually(t, 30*time.Second, "a wake-up in the inbox", func() bool {
		line, _, _ = strings.Cut(ok(t, home, "inbox", "--json"), "\n")
		return line != ""
	})
	return line
}

func TestResultCommandAndTruncation(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home)
	id := add(t, home, "--result", `command:["sh","-c","echo \"result for $BGTASK_TASK_ID in $(pwd)\""]`, "--cwd", "/tmp",
		"--prompt", "R={{result}}", "--", "true")
	w := waitFor(t, home, id)
	if want := "R=result for " + id + " in /tmp\n"; w.Prompt != want {
		t.Fatalf("prompt %q, want %q", w.Prompt, want)
	}
	spec := `{"command":"seq 1 100000","max_result_bytes":100,"result":{"type":"tail","lines":500}}`
	path := filepath.Join(t.TempDir(), "spec.json")
	if err := os.WriteFile(path, []byte(spec), 0o600); err != nil {
		t.Fatal(err)
	}
	id = add(t, home, "--spec", path)
	waitFor(t, home, id)
	s := show(t, home, id)
	if !strings.Contains(s.Result, "[result truncated: 100 of") || !strings.HasPrefix(s.Result, "99501\n") {
		t.Fatalf("truncated result = %q", s.Result)
	}
}

func TestLogsKeepEveryLineAndFollow(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home)
	dir := t.TempDir()
	id := add(t, home, "--cwd", dir, "--", `for i in $(seq 1 3000); do echo line-$i; done; echo err-line >&2; while [ ! -e go ]; do sleep 0.05; done; echo last`)
	followed := make(chan result, 1)
	go func() { followed <- run(t, home, "logs", id, "--follow", "--stdout") }()
	testkit.Eventually(t, 30*time.Second, "the first lines in the log", func() bool {
		return strings.Contains(ok(t, home, "logs", id), "line-3000\n")
	})
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r := <-followed
	var want strings.Builder
	for i := 1; i <= 3000; i++ {
		fmt.Fprintf(&want, "line-%d\n", i)
	}
	want.WriteString("last\n")
	if r.code != 0 || r.stdout != want.String() {
		t.Fatalf("logs --follow --stdout: exit %d, %d bytes, want %d (stderr %q)", r.code, len(r.stdout), want.Len(), r.stderr)
	}
	if got := ok(t, home, "logs", id, "--stderr"); got != "err-line\n" {
		t.Fatalf("logs --stderr = %q", got)
	}
	var chunks int
	for _, line := range strings.Split(strings.TrimSpace(ok(t, home, "logs", id, "--json")), "\n") {
		var c struct {
			Stream string `json:"stream"`
		}
		if json.Unmarshal([]byte(line), &c) != nil || (c.Stream != "stdout" && c.Stream != "stderr") {
			t.Fatalf("logs --json line %q", line)
		}
		chunks++
	}
	if chunks < 2 {
		t.Fatalf("logs --json printed %d chunks", chunks)
	}
}

func TestHugeLinesBinaryOutputAndFloodsDoNotBlock(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home)
	big := add(t, home, "--complete-on-regex", "^tail-ok$", "--", `head -c 10000000 /dev/zero | tr "\0" a; echo; echo tail-ok; sleep 600`)
	binary := add(t, home, "--", `head -c 100000 /dev/urandom; echo; echo done`)
	flood := add(t, home, "--", `yes flood | head -c 48000000; echo flood-end`)
	if w := waitFor(t, home, big); w.Status != "succeeded" {
		t.Fatalf("10 MB line then a match: %+v", w)
	}
	if w := waitFor(t, home, binary); w.Status != "succeeded" || w.Tail[len(w.Tail)-1] != "done" {
		t.Fatalf("binary output: %+v", w)
	}
	w := waitFor(t, home, flood)
	if w.Status != "succeeded" || w.Tail[len(w.Tail)-1] != "flood-end" {
		t.Fatalf("flood: %+v", w)
	}
	logged := ok(t, home, "logs", flood)
	if !strings.HasSuffix(logged, "flood\nflood-end\n") || len(logged) > 4<<20 {
		t.Fatalf("flood log: %d bytes ending %q; want at most 4 MiB ending with the last line", len(logged), logged[max(0, len(logged)-20):])
	}
}

func TestWatchFlagsAreValidated(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home)
	for _, tc := range []struct {
		args  []string
		field string
	}{
		{[]string{"--complete-on-regex", "("}, "completion.regex"},
		{[]string{"--deadline", "-5s"}, "deadline"},
		{[]string{"--deadline", "2001-01-01T00:00:00Z"}, "deadline"},
		{[]string{"--stall-after", "soon"}, "stall_after"},
		{[]string{"--on-stall", "explode", "--stall-after", "1s"}, "on_stall"},
		{[]string{"--keep-running"}, "keep_running"},
		{[]string{"--result", "matched-line"}, "result"},
	} {
		r := run(t, home, append(append([]string{"add"}, tc.args...), "--", "true")...)
		if r.code == 0 || !strings.Contains(r.stderr, tc.field) {
			t.Errorf("add %v: exit %d, stderr %q; want an error naming %s", tc.args, r.code, r.stderr, tc.field)
		}
	}
	if n := len(decodeJSON[struct{ Tasks []any }](t, ok(t, home, "list", "--json")).Tasks); n != 0 {
		t.Fatalf("rejected specs registered %d tasks", n)
	}
}

func TestADeadlineEndsATaskNoWorkerTook(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home, "--no-worker")
	id := add(t, home, "--deadline", "500ms", "--", "echo never")
	w := waitFor(t, home, id)
	if w.Status != "timed_out" || w.ExitCode != nil || !strings.Contains(show(t, home, id).Reason, "before a worker took the task") {
		t.Fatalf("wake-up of a task no worker took: %+v", w)
	}
	auditClean(t, home)
}
