package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/client/clienttest"
	"github.com/bgtask/bgtask/engine"
)

// The examples share one engine, whose home is $BGTASK_HOME while they run.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "bgtask-client-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	srv, err := clienttest.Start(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "start an engine:", err)
		os.Exit(1)
	}
	os.Setenv("BGTASK_HOME", dir)
	code := m.Run()
	srv.Stop()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func connect(t *testing.T, dir string) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Connect(ctx, client.Config{Home: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// A Go program registers a reminder and a command, reads them, waits for the
// reminder's wake-up, and cancels the command, through the home's client identity.
func TestAGoProgramRegistersWaitsAndCancels(t *testing.T) {
	dir := t.TempDir()
	clienttest.Run(t, dir)
	c := connect(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	timer, err := c.Register(ctx, client.Spec{StartAt: "300ms", Prompt: "from Go", Target: "go-program"})
	if err != nil || !timer.Created {
		t.Fatalf("register a timer: %+v, %v", timer, err)
	}
	task, err := c.Wait(ctx, timer.ID[:8]) // a unique start of an id names its task
	if w := client.WakeupOf(task); err != nil || task.ID != timer.ID || w.Status != client.StatusSucceeded || w.Prompt != "from Go" {
		t.Fatalf("wait: %+v, %v", w, err)
	}

	cmd, err := c.Register(ctx, client.Spec{Command: "true"}) // no worker runs: it stays armed
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.Get(ctx, cmd.ID); err != nil || got.Phase != engine.PhaseArmed {
		t.Fatalf("get: %s, %v", got.Phase, err)
	}
	if page, err := c.List(ctx, client.ListQuery{}); err != nil || page.Total != 2 || len(page.Tasks) != 2 || page.Tasks[0].ID != cmd.ID {
		t.Fatalf("list: %+v, %v", page, err)
	}
	if page, err := c.List(ctx, client.ListQuery{Target: "go-program", Status: client.StatusSucceeded}); err != nil || page.Total != 1 || page.Tasks[0].ID != timer.ID {
		t.Fatalf("list of go-program's succeeded tasks: %+v, %v", page, err)
	}
	if _, err := c.Cancel(ctx, cmd.ID, "not needed"); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Wait(ctx, cmd.ID); err != nil || got.Phase != engine.PhaseCancelled || client.WakeupOf(got).Status != client.StatusCancelled {
		t.Fatalf("wait of a cancelled task: %s, %v", got.Phase, err)
	}

	var apiErr *client.Error
	if _, err := c.Register(ctx, client.Spec{Command: "true", Cwd: "relative"}); !errors.As(err, &apiErr) || apiErr.Field != "cwd" || client.ExitStatus(err) != client.ExitUsage {
		t.Fatalf("a bad spec: %v, want an API error naming cwd", err)
	}
	if _, err := c.Wait(ctx, "no-such-task"); !errors.As(err, &apiErr) || apiErr.Code != 404 || client.ExitStatus(err) != client.ExitNotFound {
		t.Fatalf("wait of an unknown task: %v, want a 404 at once", err)
	}
}

func TestConnectSaysAtOnceWhenNoServerEverRanInTheHome(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := client.Connect(ctx, client.Config{Home: t.TempDir()})
	var absent *client.NoServerError
	if !errors.As(err, &absent) || !absent.Never || client.ExitStatus(err) != client.ExitNoServer || ctx.Err() != nil {
		t.Fatalf("connect to an empty home: %v, want a NoServerError at once", err)
	}
}

// A registration made again with the key the client gave it is the same task.
func TestRegisteringTheSameKeyedSpecAgainIsTheSameTask(t *testing.T) {
	c := connect(t, os.Getenv("BGTASK_HOME"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	spec := client.Spec{StartAt: "1h", IdempotencyKey: client.NewIdempotencyKey()}
	first, err := c.Register(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(spec)
	again, err := c.RegisterJSON(ctx, raw)
	if err != nil || again.ID != first.ID || again.Created {
		t.Fatalf("the same keyed spec again: %+v, %v; first %+v", again, err, first)
	}
}
