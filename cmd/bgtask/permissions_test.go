package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/serverhome"
	"github.com/bgtask/bgtask/internal/testkit"
)

// connectAs connects to the server of home with the nkey seed of file.
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
	nc, err := nats.Connect(serverURLOf(t, home), auth, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
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

// The whole CLI runs as the client identity (credentials.json) that it connects
// as: nothing it does is refused. What the identity may not do around the API is
// engine/server's test.
func TestTheClientIdentityRunsTheCLI(t *testing.T) {
	quietHome(t)
	home := t.TempDir()
	srv := startEmbedded(t, home)

	var added struct{ ID string }
	if err := json.Unmarshal([]byte(mustRunHome(t, home, "add", "--json", "--target", "idt", "--", "echo out-line")), &added); err != nil {
		t.Fatal(err)
	}
	id := added.ID
	if _, err := runHome(t, home, "wait", id, "--timeout", "60s"); err != nil {
		t.Fatalf("wait: %v", err)
	}
	for _, args := range [][]string{
		{"list"}, {"show", id}, {"history", id}, {"audit"}, {"workers"},
		{"target", "busy", "idt"}, {"target", "idle", "idt"},
	} {
		mustRunHome(t, home, args...)
	}
	if out := mustRunHome(t, home, "logs", id); !strings.Contains(out, "out-line") {
		t.Errorf("logs: %q, want the command's output", out)
	}
	if out := mustRunHome(t, home, "inbox", "--target", "idt", "--json"); !strings.Contains(out, id) {
		t.Errorf("inbox: %q, want the wake-up of %s", out, id)
	}
	follow := make(chan string, 1)
	ctx, stopFollow := context.WithCancel(context.Background())
	go func() {
		var out bytes.Buffer
		_ = Run(ctx, []string{"--home", home, "inbox", "--follow", "--target", "idt2", "--json"}, &out, io.Discard)
		follow <- out.String()
	}()
	second := strings.TrimSpace(mustRunHome(t, home, "add", "--target", "idt2", "--", "true"))
	if _, err := runHome(t, home, "wait", second, "--timeout", "60s"); err != nil {
		t.Fatalf("wait: %v", err)
	}
	// inbox --follow acks a wake-up once it printed it.
	testkit.Eventually(t, 30*time.Second, "the followed wake-up acked", func() bool { return !inboxUnacked(t, home, "idt2") })
	stopFollow()
	if followed := <-follow; !strings.Contains(followed, second) {
		t.Errorf("inbox --follow printed %q, want the wake-up of %s", followed, second)
	}
	sleeper := strings.TrimSpace(mustRunHome(t, home, "add", "--", "sleep 600"))
	mustRunHome(t, home, "cancel", sleeper)
	if log := srv.log.String(); strings.Contains(log, "Violation") {
		t.Fatalf("a CLI command was refused something it needs:\n%s", log)
	}

	// Last, as it leaves the server without a worker: drain is the user's too.
	var workers struct {
		Workers []struct{ ID string } `json:"workers"`
	}
	if err := json.Unmarshal([]byte(mustRunHome(t, home, "workers", "--json")), &workers); err != nil || len(workers.Workers) != 1 {
		t.Fatalf("workers --json: %+v, %v", workers, err)
	}
	mustRunHome(t, home, "worker", "drain", workers.Workers[0].ID)
}

// inboxUnacked reports whether target's inbox consumer has a wake-up not acked
// yet, or does not exist yet.
func inboxUnacked(t *testing.T, home, target string) bool {
	t.Helper()
	nc := connectAs(t, home, filepath.Join(home, serverhome.ClientSeedFile), nil)
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cons, err := js.Consumer(ctx, events.InboxStreamName, events.InboxConsumerName(target))
	if err != nil {
		return true
	}
	info, err := cons.Info(ctx)
	return err != nil || info.NumPending+uint64(info.NumAckPending) > 0
}
