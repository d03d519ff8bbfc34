package node_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/engine/node"
	"github.com/bgtask/bgtask/engine/sinks"
	"github.com/bgtask/bgtask/events/eventstest"
	"github.com/bgtask/bgtask/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func config(t *testing.T) node.Config {
	t.Helper()
	srv := eventstest.Run(t)
	return node.Config{
		Conn: srv.Conn, Writer: "engine-1", LeaseTTL: time.Minute, Replicas: 1,
		Sinks: sinks.New([]byte("a test secret of enough bytes")), Version: "0.0.0-test",
	}
}

// A config that cannot make an engine is refused with the field that is wrong.
func TestConfigNamesTheBadField(t *testing.T) {
	t.Parallel()
	good := config(t)
	if err := good.Validate(); err != nil {
		t.Fatalf("a good config: %v", err)
	}
	cases := []struct {
		field  string
		change func(*node.Config)
	}{
		{"Conn", func(c *node.Config) { c.Conn = nil }},
		{"Writer", func(c *node.Config) { c.Writer = "" }},
		{"LeaseTTL", func(c *node.Config) { c.LeaseTTL = 0 }},
		{"Replicas", func(c *node.Config) { c.Replicas = 6 }},
		{"Sinks", func(c *node.Config) { c.Sinks = nil }},
		{"RetryBase", func(c *node.Config) { c.RetryBase = -time.Second }},
		{"ArchiveAfter", func(c *node.Config) { c.ArchiveAfter = -time.Hour }},
		{"Version", func(c *node.Config) { c.Version = "" }},
	}
	for _, c := range cases {
		cfg := good
		c.change(&cfg)
		n, err := node.New(cfg)
		if err == nil || !strings.Contains(err.Error(), c.field+" ") {
			t.Errorf("%s: New = %v, %v; want an error naming %s", c.field, n, err, c.field)
		}
	}
}

// The node follows engine.Component, as each of its parts does.
func TestNodeFollowsTheLifecycle(t *testing.T) {
	cfg := config(t)
	unstarted, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	unstarted.Stop()
	unstarted.Stop()
	// A first engine creates the streams, whose goroutines in the NATS server
	// outlive it.
	first, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	first.Stop()

	before := goleak.IgnoreCurrent()
	n, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err == nil {
		t.Error("a second Start succeeded")
	}
	n.Stop()
	n.Stop()
	// The NATS server removes the consumers of a client that went on a schedule
	// of its own: what is checked is that nothing of the engine runs.
	var serverSide []goleak.Option
	for _, f := range []string{"loopAndGatherMsgs", "processInboundAcks", "processInboundNextMsgReqs"} {
		serverSide = append(serverSide, goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*consumer)."+f))
	}
	goleak.VerifyNone(t, append(serverSide, before)...)
}

// A node wires its parts: a task registered through the API that no worker takes
// is ended by the timers at its deadline, and fired by the dispatcher, as the
// projector reads the stream.
func TestNodeEndsAndFiresATaskNoWorkerTakes(t *testing.T) {
	t.Parallel()
	cfg := config(t)
	n, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer n.Stop()
	client := api.NewClient(cfg.Conn)
	reg, err := client.Register(ctx, []byte(`{"command":"true","deadline":"200ms"}`))
	if err != nil {
		t.Fatal(err)
	}
	var v api.TaskView
	testkit.Eventually(t, 20*time.Second, "the task fired", func() bool {
		if v, err = client.Get(ctx, reg.ID); err != nil {
			t.Fatal(err)
		}
		return v.Phase == engine.PhaseFired
	})
	if v.Status != engine.StatusTimedOut {
		t.Fatalf("status %q, want timed_out", v.Status)
	}
}
