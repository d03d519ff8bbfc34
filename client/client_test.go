package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/engine/node"
	"github.com/bgtask/bgtask/engine/sinks"
	"github.com/bgtask/bgtask/events/eventstest"
)

// engineOn starts an engine (no worker) and returns a home as a bgtask server
// leaves one: its server.json and a client.nkey. (What the client identity may
// do is the server's to enforce: cmd/bgtask's tests hold it to that.)
func engineOn(t *testing.T) string {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	// The engine's connection comes in without credentials, as a user of its own.
	srv := eventstest.Run(t, func(o *server.Options) {
		o.Users, o.NoAuthUser = []*server.User{{Username: "engine", Password: "not used"}}, "engine"
		o.Nkeys = []*server.NkeyUser{{Nkey: pub}}
	})
	home := t.TempDir()
	seed, _ := kp.Seed()
	if err := os.WriteFile(filepath.Join(home, "client.nkey"), seed, 0o600); err != nil {
		t.Fatal(err)
	}
	discovery, _ := json.Marshal(map[string]string{"url": srv.NATS.ClientURL()})
	if err := os.WriteFile(filepath.Join(home, "server.json"), discovery, 0o600); err != nil {
		t.Fatal(err)
	}
	n, err := node.New(node.Config{Conn: srv.Conn, Writer: "engine", LeaseTTL: time.Minute, Replicas: 1,
		Sinks: sinks.New([]byte("a test secret of enough bytes")), Version: "0.0.0-test"})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Stop)
	return home
}

// A Go program registers a reminder and a command, reads them, waits for the
// reminder's wake-up, and cancels the command, through the home's client identity.
func TestAGoProgramRegistersWaitsAndCancels(t *testing.T) {
	home := engineOn(t)
	nc, err := client.Connect(home)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c := client.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	timer, err := c.Register(ctx, client.Spec{StartAt: "300ms", Prompt: "from Go", Target: "go-program"})
	if err != nil || !timer.Created {
		t.Fatalf("register a timer: %+v, %v", timer, err)
	}
	task, err := c.Wait(ctx, timer.ID[:8]) // a unique start of an id names its task
	if err != nil || task.ID != timer.ID || task.Wakeup == nil || task.Wakeup.Status != engine.StatusSucceeded || task.Wakeup.Prompt != "from Go" {
		t.Fatalf("wait: %+v, %v", task.Wakeup, err)
	}

	cmd, err := c.Register(ctx, client.Spec{Command: "true"}) // no worker runs: it stays armed
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.Get(ctx, cmd.ID); err != nil || got.Phase != engine.PhaseArmed {
		t.Fatalf("get: %s, %v", got.Phase, err)
	}
	if tasks, total, err := c.List(ctx, client.ListQuery{}); err != nil || total != 2 || len(tasks) != 2 || tasks[0].ID != cmd.ID {
		t.Fatalf("list: %d of %d, %v", len(tasks), total, err)
	}
	if tasks, total, err := c.List(ctx, client.ListQuery{Target: "go-program", Status: engine.StatusSucceeded}); err != nil || total != 1 || tasks[0].ID != timer.ID {
		t.Fatalf("list of go-program's succeeded tasks: %d of %d, %v", len(tasks), total, err)
	}
	if _, err := c.Cancel(ctx, cmd.ID, "not needed"); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Wait(ctx, cmd.ID); err != nil || got.Phase != engine.PhaseCancelled {
		t.Fatalf("wait of a cancelled task: %s, %v", got.Phase, err)
	}

	var apiErr *api.Error
	if _, err := c.Register(ctx, client.Spec{Command: "true", Cwd: "relative"}); !errors.As(err, &apiErr) || apiErr.Field != "cwd" {
		t.Fatalf("a bad spec: %v, want an API error naming cwd", err)
	}
	if _, err := c.Wait(ctx, "no-such-task"); !errors.As(err, &apiErr) || apiErr.Code != 404 {
		t.Fatalf("wait of an unknown task: %v, want a 404 at once", err)
	}
}

func TestConnectSaysWhenNoServerRunsInTheHome(t *testing.T) {
	if _, err := client.Connect(t.TempDir()); err == nil {
		t.Fatal("connected to a home with no server")
	}
}
