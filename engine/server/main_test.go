package server

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/serverhome"
	"github.com/bgtask/bgtask/internal/testkit"
	"github.com/bgtask/bgtask/workers"
	"github.com/bgtask/bgtask/workers/shim"
)

// TestMain doubles as the shim: a server started by a test starts its commands
// through its own binary, which in a test is this test binary, run as
// `server.test shim ARGS`.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testkit.ShimOrTests(shim.Main)) }

// syncBuffer is a log a server writes while a test reads it.
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

// testOptions are the options `bgtask server --home home` runs with by default,
// with a faster tick and kill grace, logging to w.
func testOptions(home string, w io.Writer) Options {
	return Options{
		Deployment: Deployment{Home: home},
		Listen:     "127.0.0.1:0", Sync: "always", LeaseTTL: DefaultLeaseTTL, Replicas: 1,
		Worker:        WorkerOptions{MaxTasks: workers.DefaultMaxTasks, Tick: 200 * time.Millisecond, KillGrace: time.Second},
		Delivery:      DeliveryOptions{RetryBase: engine.DefaultRetryBase},
		ArchiveAfter:  engine.DefaultArchiveAfter,
		SnapshotEvery: 100_000,
		HTTP:          HTTPOptions{Addr: "127.0.0.1:0"},
		Logger:        slog.New(slog.NewTextHandler(w, nil)),
		Version:       "0.0.0-dev", Build: "0.0.0-dev+test",
	}
}

// running is a server run by a test.
type running struct {
	log  *syncBuffer
	stop func()
}

// startServer runs Run(o) with a log of its own until the test ends (or stop),
// and returns once it serves: its discovery file is written last.
func startServer(t testing.TB, home string, change ...func(*Options)) *running {
	t.Helper()
	log := &syncBuffer{}
	o := testOptions(home, log)
	for _, c := range change {
		c(&o)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, o) }()
	var once sync.Once
	r := &running{log: log, stop: func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("server: %v\n%s", err, log.String())
			}
		})
	}}
	t.Cleanup(r.stop)
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := serverhome.ReadDiscovery(home); err == nil {
			return r
		}
		select {
		case err := <-done:
			t.Fatalf("server exited at start: %v\n%s", err, log.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("server not ready after 60s:\n%s", log.String())
		}
	}
}

// awaitLog waits until log holds text, failing if done reports first.
func awaitLog(t *testing.T, log *syncBuffer, text string, done <-chan error) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(log.String(), text) {
		select {
		case err := <-done:
			t.Fatalf("ended before it said %q: %v\n%s", text, err, log.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("did not say %q in 60s:\n%s", text, log.String())
		}
	}
}

// newClient is a client of the server of home, as its client identity, closed
// with the test.
func newClient(t testing.TB, home string) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Connect(ctx, client.Config{Home: home})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// register registers spec and returns the task's id.
func register(t testing.TB, c *client.Client, spec client.Spec) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reg, err := c.Register(ctx, spec)
	if err != nil {
		t.Fatalf("register %+v: %v", spec, err)
	}
	return reg.ID
}

// exitCodeOf waits up to within for the task id to end, and returns its
// command's exit code.
func exitCodeOf(t testing.TB, c *client.Client, id string, within time.Duration) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	task, err := c.Wait(ctx, id)
	if err != nil {
		t.Fatalf("wait for %s: %v", id, err)
	}
	if task.ExitCode == nil {
		t.Fatalf("task %s ended with no exit code: %+v", id, task)
	}
	return *task.ExitCode
}

// connectAs connects to the server of home with the nkey seed of file; a
// permissions violation goes to violations, if given.
func connectAs(t *testing.T, home, file string, violations chan<- error) *nats.Conn {
	t.Helper()
	creds, err := serverhome.ReadSeedFile(file)
	if err != nil {
		t.Fatal(err)
	}
	auth, err := creds.NATSOption()
	if err != nil {
		t.Fatal(err)
	}
	d, err := serverhome.ReadDiscovery(home)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(d.URL, auth, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if violations != nil && errors.Is(err, nats.ErrPermissionViolation) {
			violations <- err
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// refused publishes on subject and awaits the server's permissions violation.
func refused(t *testing.T, nc *nats.Conn, violations <-chan error, subject string) {
	t.Helper()
	if err := nc.Publish(subject, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case err := <-violations:
			if strings.Contains(err.Error(), `"`+subject+`"`) {
				return
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("publish to %s was not refused", subject)
		}
	}
}

// jsPublish publishes into the event stream and says whether it was stored.
func jsPublish(t *testing.T, nc *nats.Conn, subject string) error {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = js.Publish(ctx, subject, []byte(`{}`), jetstream.WithExpectStream(events.StreamName))
	return err
}
