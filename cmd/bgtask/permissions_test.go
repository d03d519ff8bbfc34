package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/serverhome"
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

// refused publishes data on subject and awaits the server's permissions violation.
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

// jsPublish publishes into a stream and reports whether it was stored.
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

func TestTheClientIdentityRunsTheCLIButWritesNoEvent(t *testing.T) {
	quietHome(t)
	home := t.TempDir()
	srv := startEmbedded(t, home)

	// The whole CLI, as the client identity (credentials.json) that it connects as.
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
	for deadline := time.Now().Add(30 * time.Second); inboxUnacked(t, home, "idt2") && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	stopFollow()
	if followed := <-follow; !strings.Contains(followed, second) {
		t.Errorf("inbox --follow printed %q, want the wake-up of %s", followed, second)
	}
	sleeper := strings.TrimSpace(mustRunHome(t, home, "add", "--", "sleep 600"))
	mustRunHome(t, home, "cancel", sleeper)
	if log := srv.log.String(); strings.Contains(log, "Violation") {
		t.Fatalf("a CLI command was refused something it needs:\n%s", log)
	}

	// Around the API: no event, no wake-up, no stream of its own.
	victim := strings.TrimSpace(mustRunHome(t, home, "add", "--", "sleep 600"))
	violations := make(chan error, 16)
	nc := connectAs(t, home, filepath.Join(home, serverhome.ClientSeedFile), violations)
	for _, typ := range []events.Type{events.TypeCancelled, events.TypeExited, events.TypeFired, events.TypeArmed} {
		refused(t, nc, violations, events.TaskSubject(victim, typ))
	}
	refused(t, nc, violations, events.InboxSubject("idt"))
	refused(t, nc, violations, "$JS.API.STREAM.CREATE.MINE")
	if err := jsPublish(t, nc, events.TaskSubject(victim, events.TypeCancelled)); err == nil {
		t.Error("a JetStream publish of a cancelled event was stored")
	}
	var shown struct{ State string }
	if err := json.Unmarshal([]byte(mustRunHome(t, home, "show", victim, "--json")), &shown); err != nil {
		t.Fatal(err)
	}
	if shown.State != string(engine.PhaseRunning) {
		t.Fatalf("the victim is %s, want running", shown.State)
	}
	mustRunHome(t, home, "cancel", victim)

	// Last, as it leaves the server without a worker: drain is the user's too.
	var workers struct {
		Workers []struct{ ID string } `json:"workers"`
	}
	if err := json.Unmarshal([]byte(mustRunHome(t, home, "workers", "--json")), &workers); err != nil || len(workers.Workers) != 1 {
		t.Fatalf("workers --json: %+v, %v", workers, err)
	}
	mustRunHome(t, home, "worker", "drain", workers.Workers[0].ID)

	// credentials.json and client.nkey are the same user; the engine's seed is in
	// no file of the home.
	creds, err := serverhome.ReadCredentials(home)
	if err != nil {
		t.Fatal(err)
	}
	client, _ := serverhome.ReadSeedFile(filepath.Join(home, serverhome.ClientSeedFile))
	worker, _ := serverhome.ReadSeedFile(filepath.Join(home, serverhome.WorkerSeedFile))
	if creds.Seed != client.Seed {
		t.Error("credentials.json and client.nkey hold different identities")
	}
	for _, seed := range seedsIn(t, home) {
		if seed != client.Seed && seed != worker.Seed {
			t.Errorf("a seed other than the client's and the worker's is on disk")
		}
	}
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

var seedPattern = regexp.MustCompile(`SU[A-Z2-7]{56}`)

// seedsIn lists the user nkey seeds in the files of home, the store aside.
func seedsIn(t *testing.T, home string) []string {
	t.Helper()
	var seeds []string
	err := filepath.WalkDir(home, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == serverhome.StoreDir {
			return filepath.SkipDir
		}
		if d.Type().IsRegular() {
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range seedPattern.FindAll(data, -1) {
				seeds = append(seeds, string(m))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return seeds
}

func TestTheWorkerIdentityAppendsARunsEventsButNoOutcome(t *testing.T) {
	quietHome(t)
	home := t.TempDir()
	startEmbedded(t, home, "--no-worker")

	violations := make(chan error, 16)
	nc := connectAs(t, home, filepath.Join(home, serverhome.WorkerSeedFile), violations)
	const task = "01a00000-0000-7000-8000-000000000000"
	for _, typ := range []events.Type{events.TypeSpawned, events.TypeTick, events.TypeExited} {
		if err := jsPublish(t, nc, events.TaskSubject(task, typ)); err != nil {
			t.Errorf("the worker identity cannot append %s: %v", typ, err)
		}
	}
	for _, typ := range []events.Type{events.TypeCancelled, events.TypeCompletionPersisted, events.TypeFired, events.TypeArmed,
		events.TypeDue, events.TypeRetryScheduled, events.TypePaused, events.TypeResumed, events.TypeCompleted, events.TypeSkipped, events.TypeJoined, events.TypeConsumed} {
		refused(t, nc, violations, events.TaskSubject(task, typ))
	}
	refused(t, nc, violations, "bgtask.register")
	refused(t, nc, violations, "bgtask.rerun")
	refused(t, nc, violations, events.InboxSubject("default"))

	// A `bgtask worker --home` process connects as it, and runs tasks.
	wnc, err := (&globals{home: home}).connectWorker()
	if err != nil {
		t.Fatal(err)
	}
	w, err := newWorker(context.Background(), wnc, workerOptions{stateDir: t.TempDir(), maxTasks: 4, tick: time.Second, killGrace: time.Second}, engine.Base{})
	if err != nil {
		wnc.Close()
		t.Fatal(err)
	}
	defer w.Stop()
	id := strings.TrimSpace(mustRunHome(t, home, "add", "--", "echo from-worker"))
	if out, err := runHome(t, home, "wait", id, "--timeout", "60s"); err != nil {
		t.Fatalf("wait on a task of the worker: %v\n%s", err, out)
	}
}
