package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/internal/bench"
	"github.com/bgtask/bgtask/internal/serverhome"
)

// The CLI's contract, through Run with a real server started in-process: exit
// statuses, --json errors, and clients that wait through a restart of the server.

// syncBuffer is a buffer a server or a client command writes while a test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testServer is `bgtask server` running in this process.
type testServer struct {
	stop func()
	out  *syncBuffer
}

// startServer runs a server with home until the test ends (or stop), and returns
// once it serves: its discovery file is written last.
func startServer(t testing.TB, home string) *testServer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, []string{"server", "--home", home, "--listen", "127.0.0.1:0", "--tick", "200ms", "--kill-grace", "1s"}, out, out)
	}()
	var once sync.Once
	s := &testServer{out: out, stop: func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("server: %v\n%s", err, out.String())
			}
		})
	}}
	t.Cleanup(s.stop)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := serverhome.ReadDiscovery(home); err == nil {
			return s
		}
		select {
		case err := <-done:
			t.Fatalf("server exited at start: %v\n%s", err, out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("server not ready after 30s:\n%s", out.String())
		}
	}
}

// result is what a client command did.
type result struct {
	stdout, stderr string
	code           int
}

// bgtask runs a client command against home to its end.
func bgtask(t *testing.T, home string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var stdout, stderr syncBuffer
	err := Run(ctx, append([]string{"--home", home}, args...), &stdout, &stderr)
	return result{stdout: stdout.String(), stderr: stderr.String(), code: exitCode(t, err)}
}

func exitCode(t *testing.T, err error) int {
	t.Helper()
	if err == nil {
		return 0
	}
	var exit *exitError
	if !errors.As(err, &exit) {
		t.Fatalf("Run returned %T %v, not an exit status", err, err)
	}
	return exit.code
}

func (r result) must(t *testing.T, code int, what string) result {
	t.Helper()
	if r.code != code {
		t.Fatalf("%s: exit status %d, want %d\nstdout: %s\nstderr: %s", what, r.code, code, r.stdout, r.stderr)
	}
	return r
}

func decode[T any](t *testing.T, s string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, s)
	}
	return v
}

func addTask(t *testing.T, home string, args ...string) string {
	t.Helper()
	r := bgtask(t, home, append([]string{"add", "--json"}, args...)...).must(t, 0, "add")
	return decode[struct{ ID string }](t, r.stdout).ID
}

// errorObject is the API's error reply, which a --json command prints for its errors.
type errorObject struct {
	Error *struct {
		Code    int    `json:"code"`
		Field   string `json:"field"`
		Message string `json:"message"`
	} `json:"error"`
}

func TestWaitExitStatusIsTheTaskOutcome(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home) // no profile of this machine's in the workers' login shell
	startServer(t, home)
	ok := addTask(t, home, "--", "echo fine")
	failed := addTask(t, home, "--", "echo broken; exit 3")
	slow := addTask(t, home, "--", "sleep 30")
	bgtask(t, home, "cancel", slow).must(t, 0, "cancel")

	for _, c := range []struct {
		id, status string
		code       int
	}{{ok, "succeeded", 0}, {failed, "failed", client.ExitTaskFailed}, {slow, "cancelled", client.ExitTaskCancelled}} {
		r := bgtask(t, home, "wait", c.id, "--json", "--timeout", "30s").must(t, c.code, "wait for a "+c.status+" task")
		if w := decode[struct{ Status string }](t, r.stdout); w.Status != c.status {
			t.Errorf("wait printed status %q, want %q:\n%s", w.Status, c.status, r.stdout)
		}
		if r.stderr != "" {
			t.Errorf("wait for a %s task wrote to stderr: %q", c.status, r.stderr)
		}
		// Without --json the wake-up's prompt is printed, with the same exit status.
		r = bgtask(t, home, "wait", c.id).must(t, c.code, "wait without --json")
		if !strings.Contains(r.stdout, c.id) {
			t.Errorf("wait printed no wake-up for %s:\n%s", c.id, r.stdout)
		}
	}

	running := addTask(t, home, "--", "sleep 30")
	r := bgtask(t, home, "wait", running, "--timeout", "300ms").must(t, client.ExitTimeout, "wait past its --timeout")
	if !strings.Contains(r.stderr, "timed out") {
		t.Errorf("wait past its --timeout says %q", r.stderr)
	}
	bgtask(t, home, "cancel", running).must(t, 0, "cancel")
}

func TestJSONErrorsAreTheAPIErrorObject(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	startServer(t, home)
	const nobody = "00000000-0000-0000-0000-000000000000"

	for _, c := range []struct {
		args  []string
		code  int
		api   int
		field string
	}{
		{[]string{"show", nobody, "--json"}, client.ExitNotFound, 404, "id"},
		{[]string{"history", "--json", nobody}, client.ExitNotFound, 404, "id"},
		{[]string{"cancel", "--json", nobody}, client.ExitNotFound, 404, "id"},
		{[]string{"wait", "--json", nobody}, client.ExitNotFound, 404, "id"},
		// Bad input is one kind of mistake whether the CLI or the engine finds it.
		{[]string{"add", "--json", "--deadline", "tomorrow", "--", "true"}, client.ExitUsage, 400, "deadline"},
		{[]string{"add", "--json", "--label", "pool", "--", "true"}, client.ExitUsage, 400, ""},
		{[]string{"add", "--json", "--no-such-flag", "--", "true"}, client.ExitUsage, 400, ""},
		{[]string{"list", "--json", "--state", "sleeping"}, client.ExitUsage, 400, "state"},
	} {
		what := strings.Join(c.args, " ")
		r := bgtask(t, home, c.args...).must(t, c.code, what)
		e := decode[errorObject](t, r.stdout)
		if e.Error == nil || e.Error.Code != c.api || e.Error.Message == "" || (c.field != "" && e.Error.Field != c.field) {
			t.Errorf("%s printed %s; want an error object with code %d and field %q", what, r.stdout, c.api, c.field)
		}
		if r.stderr != "" {
			t.Errorf("%s wrote %q to stderr besides its JSON error", what, r.stderr)
		}
		// Without --json, the same failure is one line on stderr, with the same status.
		var plain []string
		for _, a := range c.args {
			if a != "--json" {
				plain = append(plain, a)
			}
		}
		r = bgtask(t, home, plain...).must(t, c.code, strings.Join(plain, " "))
		if r.stdout != "" || !strings.HasPrefix(r.stderr, "bgtask: ") || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("%s: stdout %q, stderr %q; want one line on stderr", strings.Join(plain, " "), r.stdout, r.stderr)
		}
	}

	// history --json is the API's reply, as list --json and workers --json are.
	id := addTask(t, home, "--", "true")
	bgtask(t, home, "wait", id, "--timeout", "30s").must(t, 0, "wait")
	h := decode[struct {
		Events []struct{ Type string }
	}](t, bgtask(t, home, "history", id, "--json").must(t, 0, "history").stdout)
	if len(h.Events) == 0 || h.Events[0].Type != "armed" || h.Events[len(h.Events)-1].Type != "fired" {
		t.Errorf("history --json: %+v; want {\"events\": [armed ... fired]}", h)
	}
}

func TestClientWithNoServerEverFailsAtOnce(t *testing.T) {
	home := t.TempDir()
	start := time.Now()
	r := bgtask(t, home, "add", "--", "true").must(t, client.ExitNoServer, "add in a home where no server ran")
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("add took %s to fail in a home where no server ever ran", took)
	}
	if !strings.Contains(r.stderr, "no bgtask server in "+home) || strings.Contains(r.stderr, "waiting") {
		t.Errorf("stderr %q; want the no-server message and no wait", r.stderr)
	}
	e := decode[errorObject](t, bgtask(t, home, "show", "--json", "x").must(t, client.ExitNoServer, "show --json").stdout)
	if e.Error == nil || e.Error.Code != 503 {
		t.Errorf("show --json with no server: %+v; want a 503 error object", e)
	}
}

func TestClientWaitsThroughARestartOfTheServer(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv(serverhome.SupervisedEnv, "test") // a restart is coming
	first := startServer(t, home)
	addTask(t, home, "--", "true")
	first.stop() // a clean stop: the discovery file goes

	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- Run(context.Background(), []string{"--home", home, "add", "--json", "--", "echo after-restart"}, &stdout, &stderr)
	}()
	awaitText(t, &stderr, "waiting up to 30s for the server", done)
	second := startServer(t, home)
	if code := exitCode(t, <-done); code != 0 {
		t.Fatalf("add through a restart: exit status %d\nstdout: %s\nstderr: %s", code, stdout.String(), stderr.String())
	}
	if n := strings.Count(stderr.String(), "waiting"); n != 1 {
		t.Errorf("add said %d times that it waits: %q", n, stderr.String())
	}
	id := decode[struct{ ID string }](t, stdout.String()).ID
	w := decode[struct{ Status string }](t, bgtask(t, home, "wait", id, "--json", "--timeout", "30s").must(t, 0, "wait").stdout)
	if w.Status != "succeeded" {
		t.Errorf("the task added through the restart ended %s", w.Status)
	}

	// A command with a --timeout too short for the restart says that no server answered.
	second.stop()
	r := bgtask(t, home, "show", "--timeout", "300ms", id).must(t, client.ExitNoServer, "show with the server stopped")
	if !strings.Contains(r.stderr, "no bgtask server answered within 300ms") {
		t.Errorf("show with the server stopped: stderr %q", r.stderr)
	}
}

// awaitText waits until w holds text, failing if done reports first.
func awaitText(t *testing.T, w *syncBuffer, text string, done <-chan error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(w.String(), text) {
		select {
		case err := <-done:
			t.Fatalf("ended before it said %q: %v\n%s", text, err, w.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("did not say %q in 30s:\n%s", text, w.String())
		}
	}
}

// dropProxy forwards NATS connections to a server, and cuts the first one right
// after it carried a request on subject: the server gets the request, the client
// never its reply.
type dropProxy struct {
	l       net.Listener
	server  string
	subject []byte
	cut     atomic.Bool
	wg      sync.WaitGroup
}

func startDropProxy(t *testing.T, server, subject string) *dropProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &dropProxy{l: l, server: server, subject: []byte(subject)}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() { l.Close(); p.wg.Wait() })
	return p
}

func (p *dropProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.server)
		if err != nil {
			c.Close()
			continue
		}
		p.wg.Add(2)
		go func() { defer p.wg.Done(); io.Copy(c, s); c.Close() }()
		go func() {
			defer p.wg.Done()
			defer s.Close()
			defer c.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					if _, werr := s.Write(buf[:n]); werr != nil {
						return
					}
					if bytes.Contains(buf[:n], p.subject) && p.cut.CompareAndSwap(false, true) {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

func TestAddMadeAgainAfterADroppedConnectionArmsOnce(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	startServer(t, home)
	d, err := serverhome.ReadDiscovery(home)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := serverhome.ReadCredentials(home)
	if err != nil {
		t.Fatal(err)
	}
	seed := filepath.Join(t.TempDir(), "seed.nk")
	if err := os.WriteFile(seed, []byte(creds.Seed), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startDropProxy(t, strings.TrimPrefix(d.URL, "nats://"), "bgtask.register")

	r := bgtask(t, home, "--nats", "nats://"+p.l.Addr().String(), "--nkey", seed, "add", "--json", "--", "echo once").must(t, 0, "add through a dropped connection")
	if !p.cut.Load() {
		t.Fatal("the proxy never cut the registration")
	}
	if !strings.Contains(r.stderr, "connection to the server dropped") {
		t.Errorf("add did not say why it waited: %q", r.stderr)
	}
	reg := decode[struct {
		ID      string
		Created bool
	}](t, r.stdout)
	if !reg.Created {
		t.Errorf("add says %s; the task was created by this add", r.stdout)
	}
	var tasks []struct{ ID, Command string }
	out := bgtask(t, home, "list", "--json").must(t, 0, "list").stdout
	if err := json.Unmarshal([]byte(out), &tasks); err != nil {
		tasks = decode[struct {
			Tasks []struct{ ID, Command string }
		}](t, out).Tasks
	}
	if len(tasks) != 1 || tasks[0].ID != reg.ID {
		t.Fatalf("tasks after one add made twice: %+v; want only %s", tasks, reg.ID)
	}
}

func TestCancelCutByADroppedConnectionIsNotMadeAgain(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	startServer(t, home)
	id := addTask(t, home, "--", "sleep 30")
	d, err := serverhome.ReadDiscovery(home)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := serverhome.ReadCredentials(home)
	if err != nil {
		t.Fatal(err)
	}
	seed := filepath.Join(t.TempDir(), "seed.nk")
	if err := os.WriteFile(seed, []byte(creds.Seed), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startDropProxy(t, strings.TrimPrefix(d.URL, "nats://"), "bgtask.cancel")

	r := bgtask(t, home, "--nats", "nats://"+p.l.Addr().String(), "--nkey", seed, "cancel", id).must(t, client.ExitNoServer, "cancel through a dropped connection")
	if !strings.Contains(r.stderr, "may or may not have been carried out") {
		t.Errorf("cancel through a dropped connection says %q", r.stderr)
	}
	// It was: the server got the request before the connection dropped.
	bgtask(t, home, "wait", id, "--json", "--timeout", "30s").must(t, client.ExitTaskCancelled, "wait")
}

func TestTimeoutZeroWaitsForEverAndANegativeOneIsRefused(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	startServer(t, home)
	bgtask(t, home, "list", "--timeout", "0").must(t, 0, "list --timeout 0")
	for _, args := range [][]string{{"list", "--timeout", "-1s"}, {"wait", "x", "--timeout", "-1s"}, {"target", "busy", "x", "--timeout", "-5m"}} {
		r := bgtask(t, home, args...).must(t, client.ExitUsage, strings.Join(args, " "))
		if !strings.Contains(r.stderr, "--timeout -") {
			t.Errorf("%s: stderr %q", strings.Join(args, " "), r.stderr)
		}
	}
}

// A busy state's TTL is positive and at most a day: 1,000,000 h would hold the
// target's pushes for a century. The refusal names the flag and sends nothing.
func TestABusyTTLBeyondADayIsRefused(t *testing.T) {
	home := t.TempDir() // no server: nothing may be sent
	for _, ttl := range []string{"1000000h", "25h", "-5m"} {
		r := bgtask(t, home, "target", "busy", "agent", "--ttl", ttl).must(t, client.ExitUsage, "target busy --ttl "+ttl)
		if !strings.Contains(r.stderr, "--ttl ") {
			t.Errorf("--ttl %s: stderr %q; want it to name --ttl", ttl, r.stderr)
		}
	}
}

// A spec file with a key twice is refused before anything is sent: decoded into
// the flags' map, only the last value would reach the engine.
func TestASpecFileWithARepeatedKeyIsRefused(t *testing.T) {
	spec := filepath.Join(t.TempDir(), "spec.json")
	if err := os.WriteFile(spec, []byte(`{"command":"echo FIRST","command":"echo SECOND"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	r := bgtask(t, t.TempDir(), "add", "--spec", spec)
	if r.code != client.ExitUsage || !strings.Contains(r.stderr, "command: the key is given twice") {
		t.Fatalf("add --spec with a repeated key: exit %d, stderr %q; want %d naming the key", r.code, r.stderr, client.ExitUsage)
	}
}

// bgtask bench --help tells every scenario there is.
func TestBenchHelpNamesEveryScenario(t *testing.T) {
	for _, name := range bench.Names() {
		if !strings.Contains(benchLong, "\n  "+name+" ") {
			t.Errorf("bench --help does not tell the scenario %q", name)
		}
	}
}

// homeJetStream is a JetStream context on the server of home, as its client
// identity, for a test that looks into the streams; closed with the test.
func homeJetStream(t *testing.T, home string) jetstream.JetStream {
	t.Helper()
	nc, err := (&globals{home: home}).connect("test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}
