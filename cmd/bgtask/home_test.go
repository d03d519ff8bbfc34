package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/serverhome"
	"github.com/bgtask/bgtask/internal/testkit"
)

// embedded is a `bgtask server` run in this process, stopped as SIGTERM stops one:
// its context is cancelled.
type embedded struct {
	home   string
	cancel context.CancelFunc
	done   chan error
	log    *lockedBuffer
	once   sync.Once
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startEmbedded starts a server on home and returns once it has written its
// discovery file, its last step before it serves.
func startEmbedded(t *testing.T, home string, args ...string) *embedded {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	e := &embedded{home: home, cancel: cancel, done: make(chan error, 1), log: &lockedBuffer{}}
	go func() {
		e.done <- Run(ctx, append([]string{"server", "--home", home, "--log-level", "warn"}, args...), io.Discard, e.log)
	}()
	t.Cleanup(func() { e.stop(t) })
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := serverhome.ReadDiscovery(home); err == nil {
			return e
		}
		select {
		case err := <-e.done:
			t.Fatalf("server exited at start: %v\n%s", err, e.log)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("server not ready after 60 s:\n%s", e.log)
		}
	}
}

func (e *embedded) stop(t *testing.T) {
	e.once.Do(func() {
		e.cancel()
		select {
		case err := <-e.done:
			if err != nil {
				t.Errorf("server: %v\n%s", err, e.log)
			}
		case <-time.After(60 * time.Second):
			t.Errorf("server did not stop within 60 s")
		}
	})
}

// runHome runs one bgtask command against home, in this process.
func runHome(t *testing.T, home string, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := Run(context.Background(), append([]string{"--home", home}, args...), &out, &errOut)
	if err != nil {
		return out.String(), errors.Join(err, errors.New(errOut.String()))
	}
	return out.String(), nil
}

func mustRunHome(t *testing.T, home string, args ...string) string {
	t.Helper()
	out, err := runHome(t, home, args...)
	if err != nil {
		t.Fatalf("bgtask %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// quietHome gives the test a HOME of its own, so that the worker's login shell
// reads no profile of the machine's.
func quietHome(t *testing.T) {
	t.Setenv("HOME", t.TempDir())
}

func serverURLOf(t *testing.T, home string) string {
	t.Helper()
	d, err := serverhome.ReadDiscovery(home)
	if err != nil {
		t.Fatal(err)
	}
	return d.URL
}

// The recipe of docs/api.md with the real nats CLI: a context saved by bgtask reaches the
// server as the client identity, and still does after a restart.
func TestTheNATSCLIReachesTheServerThroughASavedContext(t *testing.T) {
	natsCLI, err := exec.LookPath("nats")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("the nats CLI is not on PATH (.ci/run installs natscli v0.5.0)")
		}
		t.Skip("the nats CLI is not on PATH: go install github.com/nats-io/natscli/nats@v0.5.0")
	}
	quietHome(t)
	config := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", config)
	home := t.TempDir()
	srv := startEmbedded(t, home)
	if _, err := runHome(t, home, "server", "nats-context", "--name", "../x"); err == nil {
		t.Error("a context name with a slash was accepted")
	}
	mustRunHome(t, home, "server", "nats-context", "--name", "bgtask-test")
	if _, err := os.Stat(filepath.Join(config, "nats", "context", "bgtask-test.json")); err != nil {
		t.Fatal(err)
	}
	nats := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(natsCLI, append([]string{"--context", "bgtask-test"}, args...)...)
		cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+config)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Run(); err != nil {
			t.Fatalf("nats %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), errOut.String())
		}
		return out.String()
	}
	if out := nats("micro", "ls"); !strings.Contains(out, "bgtask") {
		t.Errorf("nats micro ls: %q, want the bgtask service", out)
	}
	srv.stop(t)
	startEmbedded(t, home)
	var reply struct {
		Tasks []json.RawMessage `json:"tasks"`
	}
	if out := nats("req", "bgtask.list", "{}"); json.Unmarshal([]byte(out), &reply) != nil || reply.Tasks == nil {
		t.Errorf("nats req bgtask.list after a restart: %q", out)
	}
}

// serverProcess starts `bgtask server` on home as a process of its own (this test
// binary running main), with env added to its environment, and returns it once it
// serves.
func serverProcess(t *testing.T, home string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "server", "--home", home, "--listen", "127.0.0.1:0")
	cmd.Env = append(append(os.Environ(), mcpRunMain+"=1"), env...)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	testkit.Eventually(t, 30*time.Second, "serving", func() bool {
		d, err := serverhome.ReadDiscovery(home)
		return err == nil && d.PID == cmd.Process.Pid
	})
	return cmd
}

func TestAClientSaysAtOnceThatNothingRestartsAServerGone(t *testing.T) {
	testkit.FullOnly(t)
	killed := t.TempDir()
	p := serverProcess(t, killed)
	pid := p.Process.Pid
	_ = p.Process.Kill()
	_ = p.Wait()
	r := bgtask(t, killed, "add", "--timeout", "60s", "--", "true").must(t, client.ExitNoServer, "add to a server killed")
	if !strings.Contains(r.stderr, "no service restarts it") || !strings.Contains(r.stderr, "pid "+strconv.Itoa(pid)) {
		t.Errorf("add to a killed server did not say that nothing restarts it: %q", r.stderr)
	}

	stopped := t.TempDir()
	startServer(t, stopped).stop()
	r = bgtask(t, stopped, "show", "--timeout", "60s", "x").must(t, client.ExitNoServer, "show with the server stopped")
	if !strings.Contains(r.stderr, "no service restarts it") {
		t.Errorf("show with the server stopped did not say that nothing restarts it: %q", r.stderr)
	}
}

func TestAClientWaitsForAServerItsSupervisorRestarts(t *testing.T) {
	testkit.FullOnly(t)
	home := t.TempDir()
	p := serverProcess(t, home, serverhome.SupervisedEnv+"=test")
	_ = p.Process.Kill()
	_ = p.Wait()
	r := bgtask(t, home, "show", "--timeout", "1s", "x").must(t, client.ExitNoServer, "show with a supervised server killed")
	if !strings.Contains(r.stderr, "no bgtask server answered within 1s") {
		t.Errorf("show did not wait for the supervised server: %q", r.stderr)
	}
	// A server started with no supervisor takes the record back.
	serverProcess(t, home)
	if _, err := os.Stat(filepath.Join(home, serverhome.SupervisorFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a server with no supervisor left %s: %v", serverhome.SupervisorFile, err)
	}
}

// A wait whose server is killed, with nothing to restart it, ends saying so
// rather than waiting for ever.
func TestAWaitEndsWhenItsServerIsGoneForGood(t *testing.T) {
	testkit.FullOnly(t)
	home := t.TempDir()
	p := serverProcess(t, home)
	id := addTask(t, home, "--delay", "1h", "--", "true")
	nc, err := (&globals{home: home}).connect("test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	consumers := func() int {
		info, err := js.Stream(context.Background(), events.StreamName)
		if err != nil {
			t.Fatal(err)
		}
		return info.CachedInfo().State.Consumers
	}
	before := consumers()
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() { done <- Run(context.Background(), []string{"--home", home, "wait", id}, &stdout, &stderr) }()
	testkit.Eventually(t, 30*time.Second, "following the task", func() bool { return consumers() > before })
	nc.Close()
	_ = p.Process.Kill()
	_ = p.Wait()
	select {
	case err := <-done:
		if code := exitCode(t, err); code != client.ExitNoServer || !strings.Contains(stderr.String(), "no service restarts it") {
			t.Errorf("wait: status %d, stderr %q", code, stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("wait still waits 60s after its server was killed with nothing to restart it")
	}
}
