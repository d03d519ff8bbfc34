package server

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/serverhome"
	"github.com/bgtask/bgtask/internal/testkit"
)

// The client identity calls the API, around which it writes no event, no
// wake-up and no stream of its own.
func TestTheClientIdentityWritesNoEvent(t *testing.T) {
	t.Setenv("HOME", t.TempDir()) // no profile of this machine's in the worker's login shell
	home := t.TempDir()
	startServer(t, home)
	c := newClient(t, home)
	ctx := context.Background()
	victim := register(t, c, client.Spec{Command: "sleep 600"})
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
	testkit.Eventually(t, 30*time.Second, "the victim running", func() bool {
		task, err := c.Get(ctx, victim)
		if err != nil || task.Phase.Terminal() {
			t.Fatalf("the victim: %v, %v; want it running", task.Phase, err)
		}
		return task.Phase == engine.PhaseRunning
	})
	if _, err := c.Cancel(ctx, victim, "test"); err != nil {
		t.Fatal(err)
	}
}

var seedPattern = regexp.MustCompile(`SU[A-Z2-7]{56}`)

// The home holds the client's seed (credentials.json and client.nkey, the same
// user) and the worker's; the engine's seed is in no file of the home.
func TestTheEnginesIdentityIsInNoFileOfTheHome(t *testing.T) {
	home := t.TempDir()
	startServer(t, home).stop()
	creds, err := serverhome.ReadCredentials(home)
	if err != nil {
		t.Fatal(err)
	}
	clientSeed, _ := serverhome.ReadSeedFile(filepath.Join(home, serverhome.ClientSeedFile))
	workerSeed, _ := serverhome.ReadSeedFile(filepath.Join(home, serverhome.WorkerSeedFile))
	if creds.Seed != clientSeed.Seed {
		t.Error("the credentials file and client.nkey hold different identities")
	}
	err = filepath.WalkDir(home, func(path string, d os.DirEntry, err error) error {
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
			for _, seed := range seedPattern.FindAll(data, -1) {
				if s := string(seed); s != clientSeed.Seed && s != workerSeed.Seed {
					t.Errorf("%s holds a seed other than the client's and the worker's", path)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestTheWorkerIdentityAppendsARunsEventsButNoOutcome(t *testing.T) {
	t.Setenv("HOME", t.TempDir()) // no profile of this machine's in the worker's login shell
	home := t.TempDir()
	startServer(t, home, func(o *Options) { o.NoWorker = true })

	violations := make(chan error, 16)
	nc := connectAs(t, home, filepath.Join(home, serverhome.WorkerSeedFile), violations)
	const task = "01a00000-0000-7000-8000-000000000000"
	for _, typ := range []events.Type{events.TypeSpawned, events.TypeTick, events.TypeExited} {
		if err := jsPublish(t, nc, events.TaskSubject(task, typ)); err != nil {
			t.Errorf("the worker identity cannot append %s: %v", typ, err)
		}
	}
	for _, typ := range []events.Type{events.TypeCancelled, events.TypeCompletionPersisted, events.TypeFired, events.TypeArmed,
		events.TypeDue, events.TypeRetryScheduled, events.TypePaused, events.TypeResumed, events.TypeCompleted, events.TypeSkipped, events.TypeJoined, events.TypeConsumed,
		events.TypeRedeliveryRequested} {
		refused(t, nc, violations, events.TaskSubject(task, typ))
	}
	refused(t, nc, violations, "bgtask.register")
	refused(t, nc, violations, "bgtask.rerun")
	refused(t, nc, violations, events.InboxSubject("default"))

	// The process of `bgtask worker --home` connects as it, and runs tasks.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- RunWorker(ctx, Deployment{Home: home}, WorkerOptions{MaxTasks: 4, Tick: time.Second, KillGrace: time.Second}, nil)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("worker: %v", err)
		}
	}()
	c := newClient(t, home)
	id := register(t, c, client.Spec{Command: "echo from-worker"})
	if code := exitCodeOf(t, c, id, 60*time.Second); code != 0 {
		t.Fatalf("the task of the worker exited %d", code)
	}
	if _, err := os.Stat(filepath.Join(home, "workers", "default")); err != nil {
		t.Errorf("the worker kept its runs elsewhere than HOME/workers/default: %v", err)
	}
}

// The client identity may call every schedule endpoint: each gets a reply of
// the API (whatever the engine answers), not a permission violation.
func TestTheClientIdentityCallsTheScheduleEndpoints(t *testing.T) {
	home := t.TempDir()
	srv := startServer(t, home)
	violations := make(chan error, 16)
	nc := connectAs(t, home, filepath.Join(home, serverhome.ClientSeedFile), violations)
	for _, subject := range []string{
		api.SubjectScheduleAdd, api.SubjectScheduleList, api.SubjectScheduleShow, api.SubjectSchedulePause,
		api.SubjectScheduleResume, api.SubjectScheduleDelete, api.SubjectScheduleTrigger,
	} {
		if _, err := nc.Request(subject, []byte(`{"name":"perm"}`), 10*time.Second); err != nil {
			t.Errorf("%s: %v", subject, err)
		}
	}
	select {
	case err := <-violations:
		t.Fatalf("refused: %v", err)
	default:
	}
	if log := srv.log.String(); strings.Contains(log, "Violation") {
		t.Fatalf("a schedule subject was refused:\n%s", log)
	}
}
