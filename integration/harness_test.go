package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"go.uber.org/goleak"

	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/testkit"
)

// bin is the bgtask binary built from this checkout, with bgtask-shim beside it.
var bin string

func TestMain(m *testing.M) {
	if !testkit.Full() {
		fmt.Printf("integration: every test here is of the full lane: run them with %s=1\n", testkit.Env)
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "bgtask-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "bgtask")
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	if raceEnabled {
		args = append(args, "-race")
	}
	if portableEnabled {
		args = append(args, "-tags", "bgtask_portable")
	}
	build := exec.Command("go", append(args, "../cmd/bgtask", "../cmd/bgtask-shim")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build bgtask:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// childEnv is the environment of the bgtask processes a test starts. HOME is the
// test's own, so that a worker's login shell reads no profile of the machine's: a
// slow or stuck one (a stale pyenv lock) would hold every worker's start. A binary
// built with -race waits a second at exit by default; a race must fail the test at
// once.
func childEnv(home string) []string {
	return append(os.Environ(), "BGTASK_HOME="+home, "HOME="+home, "GORACE=atexit_sleep_ms=0 halt_on_error=1")
}

// proc is a bgtask process started by a test: a server or a worker.
type proc struct {
	t    *testing.T
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

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

// start runs bgtask with args in the background; it is killed when the test ends.
func start(t *testing.T, home string, args ...string) *proc {
	t.Helper()
	return startEnv(t, home, nil, args...)
}

// startEnv is start with more environment variables.
func startEnv(t *testing.T, home string, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"--home", home}, args...)...)
	cmd.Env = append(childEnv(home), env...)
	return startCmd(t, cmd, home, "bgtask "+strings.Join(args, " "))
}

// startCmd starts cmd (its environment set) in the background, with its output
// kept for the test's log if it fails. When the test ends it is killed, and so are
// the runs it left in home.
func startCmd(t *testing.T, cmd *exec.Cmd, home, what string) *proc {
	t.Helper()
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, cmd: cmd, out: out, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.signal(syscall.SIGKILL)
		<-p.done
		killRuns(home)
		if t.Failed() {
			t.Logf("output of %s:\n%s", what, out.String())
		}
	})
	return p
}

func (p *proc) signal(sig syscall.Signal) {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Signal(sig)
	}
}

// stop sends sig and waits for the process to end.
func (p *proc) stop(sig syscall.Signal) {
	p.t.Helper()
	p.signal(sig)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.t.Fatalf("bgtask did not stop after %v:\n%s", sig, p.out.String())
	}
}

// startServer starts `bgtask server` on home and waits until it serves requests.
func startServer(t *testing.T, home string, args ...string) *proc {
	t.Helper()
	return startServerEnv(t, home, nil, args...)
}

// startServerEnv is startServer with more environment variables.
func startServerEnv(t *testing.T, home string, env []string, args ...string) *proc {
	t.Helper()
	return awaitServer(t, startEnv(t, home, env, serverArgs(args...)...), home)
}

// serverArgs are the arguments of a test's `bgtask server`, then args.
func serverArgs(args ...string) []string {
	return append([]string{"server", "--listen", "127.0.0.1:0", "--tick", "200ms", "--kill-grace", "2s"}, args...)
}

// awaitServer waits until the server p started on home serves requests.
func awaitServer(t *testing.T, p *proc, home string) *proc {
	t.Helper()
	serving := false
	defer func() { // as a failure ends the test too
		if !serving {
			t.Logf("the server's output:\n%s", p.out.String())
		}
	}()
	// A server finds its worker's runs again before it serves: on a busy machine,
	// with many runs, that takes a while.
	testkit.Eventually(t, 60*time.Second, "the server serving", func() bool {
		// The discovery file is written once the API serves; it must be this process's.
		data, err := os.ReadFile(filepath.Join(home, "server.json"))
		var d struct{ PID int }
		if serving = err == nil && json.Unmarshal(data, &d) == nil && d.PID == p.cmd.Process.Pid; serving {
			return true
		}
		select {
		case <-p.done:
			t.Fatal("server exited at start")
		default:
		}
		return false
	})
	return p
}

// result is what a CLI command did.
type result struct {
	stdout, stderr string
	code           int
}

// run runs a bgtask client command to its end.
func run(t *testing.T, home string, args ...string) result {
	t.Helper()
	return runBin(t, 60*time.Second, childEnv(home), append([]string{"--home", home}, args...)...)
}

// runBin runs bin with args in env to its end, or until timeout.
func runBin(t *testing.T, timeout time.Duration, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("bgtask %v: %v", args, err)
	}
	return result{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// ok runs a command that must succeed and returns its stdout.
func ok(t *testing.T, home string, args ...string) string {
	t.Helper()
	r := run(t, home, args...)
	if r.code != 0 {
		t.Fatalf("bgtask %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

func decodeJSON[T any](t *testing.T, s string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, s)
	}
	return v
}

// add registers a command through the CLI and returns its id.
func add(t *testing.T, home string, args ...string) string {
	t.Helper()
	out := ok(t, home, append([]string{"add", "--json"}, args...)...)
	return decodeJSON[struct{ ID string }](t, out).ID
}

// wakeup is the JSON of `wait --json` and of an inbox message.
type wakeup struct {
	ID          string   `json:"id"`
	Status      string   `json:"status"`
	ExitCode    *int     `json:"exit_code"`
	Signal      string   `json:"signal"`
	Reason      string   `json:"reason"`
	MatchedLine string   `json:"matched_line"`
	Prompt      string   `json:"prompt"`
	Tail        []string `json:"tail"`
	Target      string   `json:"target"`
	Origin      any      `json:"origin"`
}

// waitFor waits for a task to finish, whatever its outcome: wait exits 0 for a
// task that succeeded, 3 for one that ended otherwise and 4 for a cancelled one.
func waitFor(t *testing.T, home, id string) wakeup {
	t.Helper()
	r := run(t, home, "wait", id, "--json", "--timeout", "45s")
	if r.code != 0 && r.code != 3 && r.code != 4 {
		t.Fatalf("bgtask wait %s: exit %d\nstdout: %s\nstderr: %s", id, r.code, r.stdout, r.stderr)
	}
	return decodeJSON[wakeup](t, r.stdout)
}

type historyEvent struct {
	Seq    uint64          `json:"seq"`
	Type   string          `json:"type"`
	Time   time.Time       `json:"time"`
	Writer string          `json:"writer"`
	Epoch  uint64          `json:"epoch"`
	Raw    json.RawMessage `json:"payload"`
}

func history(t *testing.T, home, id string) []historyEvent {
	t.Helper()
	return decodeJSON[struct{ Events []historyEvent }](t, ok(t, home, "history", id, "--json")).Events
}

func countTypes(h []historyEvent) map[string]int {
	n := map[string]int{}
	for _, e := range h {
		n[e.Type]++
	}
	return n
}

// register registers a spec over NATS and returns the task's id.
func register(t *testing.T, nc *nats.Conn, spec any) string {
	t.Helper()
	data, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msg, err := nc.RequestWithContext(ctx, "bgtask.register", data)
	if err != nil {
		t.Fatalf("register: %v", err)
	}
	var reply struct{ ID string }
	if err := json.Unmarshal(msg.Data, &reply); err != nil || reply.ID == "" {
		t.Fatalf("register: %s", msg.Data)
	}
	return reply.ID
}

// connect opens a NATS connection to a running server the way a program would: the
// URL from server.json, the nkey from credentials.json.
func connect(t *testing.T, home string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	var c struct {
		Seed string `json:"nkey_seed"`
	}
	readJSONFile(t, filepath.Join(home, "credentials.json"), &c)
	kp, err := nkeys.FromSeed([]byte(c.Seed))
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(serverURL(t, home), nats.Nkey(pub, kp.Sign), nats.Timeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// serverURL is where the server of home listens, from its discovery file.
func serverURL(t *testing.T, home string) string {
	t.Helper()
	var d struct{ URL string }
	readJSONFile(t, filepath.Join(home, "server.json"), &d)
	return d.URL
}

func readJSONFile(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatal(err)
	}
}

// allEvents reads the whole event stream.
func allEvents(t *testing.T, js jetstream.JetStream) []events.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, err := events.ConnectStore(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	last, err := store.LastSeq(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []events.Record
	if last == 0 {
		return nil
	}
	err = store.Follow(ctx, "", 0, func(rec events.Record, err error) bool {
		if err != nil {
			t.Errorf("undecodable event at %d: %v", rec.Seq, err)
		}
		out = append(out, rec)
		return rec.Seq < last
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// processGone reports whether pid has exited: no such process, or a zombie that
// only waits for a parent that is not ours to reap it.
func processGone(pid int) bool {
	if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// pid (comm) state ...: the state follows the last ')'.
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	return len(fields) > 0 && fields[0] == "Z"
}

// holdsFileOf reports whether process pid has a file or directory open whose
// path holds part.
func holdsFileOf(pid int, part string) bool {
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && strings.Contains(target, part) {
			return true
		}
	}
	return false
}

// killGroup ends a process group a test left running on purpose.
func killGroup(pgid int) error { return syscall.Kill(-pgid, syscall.SIGKILL) }

// auditClean runs `bgtask audit` as the oracle: no invariant may be broken.
func auditClean(t *testing.T, home string) {
	t.Helper()
	r := run(t, home, "audit")
	if r.code != 0 {
		t.Fatalf("audit found violations (exit %d):\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// killRuns ends the commands and shims a test's workers left running: stopping a
// worker leaves its commands running on purpose, and a test leaves no process
// behind.
func killRuns(home string) {
	files, _ := filepath.Glob(filepath.Join(home, "worker*", "runs", "*", "pid.json"))
	more, _ := filepath.Glob(filepath.Join(home, "workers", "*", "runs", "*", "pid.json"))
	for _, f := range append(files, more...) {
		var pids struct {
			Shim, Command struct{ PID int }
		}
		data, err := os.ReadFile(f)
		if err != nil || json.Unmarshal(data, &pids) != nil {
			continue
		}
		_ = syscall.Kill(-pids.Command.PID, syscall.SIGKILL)
		_ = syscall.Kill(pids.Shim.PID, syscall.SIGKILL)
	}
}

// gate is shell for a command that waits until the test opens the gate name in its
// working directory (openGate). It blocks reading a FIFO, without polling, unless
// the gate is open already; it looks again once the FIFO is open, so an opening
// between its two looks is not missed.
func gate(name string) string {
	return `[ -e ` + name + `.open ] || { exec 3<>` + name + `.fifo; [ -e ` + name + `.open ] || read -r _ <&3; }; `
}

// makeGate makes the gate name in dir, before a command waits on it.
func makeGate(t *testing.T, dir, name string) {
	t.Helper()
	if err := syscall.Mkfifo(filepath.Join(dir, name+".fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// openGate opens the gate name in dir for good: the commands waiting on it go on,
// and any that comes to it later passes.
func openGate(t *testing.T, dir, name string) {
	t.Helper()
	touch(t, filepath.Join(dir, name+".open"))
	// ENXIO: nobody reads the FIFO (yet, or any more); they find the .open file.
	// A line for each command that may wait on it: two runs of a task can (one
	// being stopped as the other starts), and each read takes one.
	if f, err := os.OpenFile(filepath.Join(dir, name+".fifo"), os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
		_, _ = f.WriteString(strings.Repeat("\n", 64))
		f.Close()
	}
}

// pidPairs reads the "$$ $PPID" lines commands wrote to path: each run's shell and
// its shim.
func pidPairs(path string) [][2]int {
	var pairs [][2]int
	data, _ := os.ReadFile(path)
	for _, line := range strings.Split(string(data), "\n") {
		var pair [2]int
		if _, err := fmt.Sscan(line, &pair[0], &pair[1]); err == nil {
			pairs = append(pairs, pair)
		}
	}
	return pairs
}

// waitPIDPair waits for the first "$$ $PPID" line in path and returns the
// command's shell and its shim.
func waitPIDPair(t *testing.T, path string) (command, shim int) {
	t.Helper()
	testkit.Eventually(t, 30*time.Second, "pids in "+path, func() bool { return len(pidPairs(path)) > 0 })
	p := pidPairs(path)[0]
	return p[0], p[1]
}

// openStore opens the JetStream store of a home whose server is stopped with a
// nats-server of the test's own, in process and with no credentials: as one who
// can write the store, and no identity of bgtask's, could. close shuts it down,
// which must come before a bgtask server starts on the home again; it is safe to
// call twice, and the test's end calls it too.
func openStore(t *testing.T, home string) (js jetstream.JetStream, close func()) {
	t.Helper()
	ns, err := server.NewServer(&server.Options{
		ServerName: "bgtask", DontListen: true, JetStream: true, NoLog: true, NoSigs: true,
		StoreDir: filepath.Join(home, "jetstream"),
	})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	var nc *nats.Conn
	var once sync.Once
	close = func() {
		once.Do(func() {
			if nc != nil {
				nc.Close()
			}
			ns.Shutdown()
			ns.WaitForShutdown()
		})
	}
	t.Cleanup(close)
	if !ns.ReadyForConnections(30 * time.Second) {
		t.Fatal("the store's own nats-server did not start")
	}
	if nc, err = nats.Connect("", nats.InProcessServer(ns)); err != nil {
		t.Fatal(err)
	}
	if js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	return js, close
}
