package workers_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/testkit"
	"github.com/bgtask/bgtask/workers"
)

// faultyStore wraps the real store and fails chosen appends, the faults a real
// server gives only by chance: a write that never arrived, and one that arrived
// but whose ack was lost.
type faultyStore struct {
	events.Store
	mu     sync.Mutex
	faults map[events.Type][]fault // per event type, consumed in order
}

type fault int

const (
	dropWrite fault = iota // the append fails and writes nothing
	loseAck                // the append writes, then fails as if its ack was lost
)

var errInjected = errors.New("injected: nats: timeout")

func (f *faultyStore) inject(t events.Type, faults ...fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.faults == nil {
		f.faults = map[events.Type][]fault{}
	}
	f.faults[t] = append(f.faults[t], faults...)
}

func (f *faultyStore) Append(ctx context.Context, ev events.Event, expect uint64) (uint64, error) {
	f.mu.Lock()
	var next *fault
	if q := f.faults[ev.Type]; len(q) > 0 {
		next, f.faults[ev.Type] = &q[0], q[1:]
	}
	f.mu.Unlock()
	if next == nil {
		return f.Store.Append(ctx, ev, expect)
	}
	if *next == loseAck {
		if _, err := f.Store.Append(ctx, ev, expect); err != nil {
			return 0, err
		}
	}
	return 0, errInjected
}

func TestAppendFaultsDuringARunLoseNoEvent(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		faults map[events.Type][]fault
	}{
		{"the first tick is dropped", map[events.Type][]fault{events.TypeTick: {dropWrite}}},
		{"the first tick's ack is lost", map[events.Type][]fault{events.TypeTick: {loseAck}}},
		{"ticks fail again and again", map[events.Type][]fault{events.TypeTick: {dropWrite, loseAck, dropWrite, loseAck}}},
		{"the exit is dropped, then its ack lost", map[events.Type][]fault{events.TypeExited: {dropWrite, loseAck}}},
		{"the spawn's ack is lost", map[events.Type][]fault{events.TypeSpawned: {loseAck}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			faulty := &faultyStore{Store: b.store}
			for typ, f := range tt.faults {
				faulty.inject(typ, f...)
			}
			startWorker(t, b.srv.Conn, b.srv.JS, faulty, workers.Config{ID: "faulty", TickInterval: 20 * time.Millisecond})
			id := b.arm(t, engine.Spec{Command: "sleep 0.3; echo done", Cwd: t.TempDir()})
			st := b.waitFor(t, id, 30*time.Second, "ended", ended)
			if st.Status != engine.StatusSucceeded || st.Run == nil || !slices.Equal(st.Run.Tail, []string{"done"}) {
				t.Fatalf("ended as %s (reason %q, run %+v), want succeeded with its output", st.Status, st.Reason, st.Run)
			}
			h := b.history(t, id)
			n := map[events.Type]int{}
			for _, rec := range h {
				n[rec.Type]++
			}
			if n[events.TypeSpawned] != 1 || n[events.TypeExited] != 1 {
				t.Fatalf("history %v: want exactly one spawned and one exited", n)
			}
		})
	}
}

func TestARespawnWhoseSpawnFailsOnceStillRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	faulty := &faultyStore{Store: b.store}
	// The first spawned (the take) goes through; the respawn's is dropped, then its
	// ack is lost.
	startWorker(t, b.srv.Conn, b.srv.JS, faulty, workers.Config{ID: "respawner", TickInterval: 50 * time.Millisecond})
	spec := engine.Spec{Command: "echo run; sleep 600", Cwd: t.TempDir(), StallAfter: "300ms", OnStall: engine.OnStallRespawn}
	id := b.arm(t, spec)
	b.waitFor(t, id, 20*time.Second, "started", hasPID)
	faulty.inject(events.TypeSpawned, dropWrite, loseAck)
	st := b.waitFor(t, id, 30*time.Second, "ended", ended)
	if st.Status != engine.StatusStalled || st.Respawns != 1 || st.Epoch != 2 {
		t.Fatalf("ended as %s with %d respawns at epoch %d, want stalled after 1 respawn at epoch 2", st.Status, st.Respawns, st.Epoch)
	}
}

// A run that may respawn keeps its spec's env for the next start: the command
// runs in it again.
func TestARespawnedCommandRunsInTheSpecsEnv(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startWorker(t, workers.Config{TickInterval: 50 * time.Millisecond})
	spec := engine.Spec{Command: `echo "run $MARK"; sleep 600`, Cwd: t.TempDir(), Env: map[string]string{"MARK": "kept"},
		StallAfter: "300ms", OnStall: engine.OnStallRespawn}
	id := b.arm(t, spec)
	st := b.waitFor(t, id, 30*time.Second, "ended", ended)
	if st.Status != engine.StatusStalled || st.Respawns != 1 || st.Run == nil || !slices.Equal(st.Run.Tail, []string{"run kept"}) {
		t.Fatalf("ended as %s after %d respawns with tail %q, want stalled after 1 respawn with [run kept]", st.Status, st.Respawns, st.Run.Tail)
	}
}

func TestATaskPastItsDeadlineIsNotStarted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dir := t.TempDir()
	spec, err := engine.ParseSpecAt([]byte(`{"command":"touch started","cwd":"`+dir+`","deadline":"200ms"}`), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	id := b.arm(t, spec)
	// No worker takes it before its deadline; the one that comes later must not run it.
	// The deadline passing with no worker is what is tested: a sleep.
	time.Sleep(time.Until(spec.DeadlineTime()))
	b.startWorker(t, workers.Config{})
	st := b.waitFor(t, id, 20*time.Second, "ended", ended)
	if st.Status != engine.StatusTimedOut || st.Run == nil || !st.Run.NotStarted {
		t.Fatalf("ended as %s (%q), want timed_out and not started", st.Status, st.Reason)
	}
	if _, err := os.Stat(filepath.Join(dir, "started")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("the command ran after its deadline")
	}
}

// A worker that dies after appending spawned and before starting the command
// leaves only the run's intent on disk, its directory; its next start runs the
// command.
func TestATaskTakenButNotStartedBeforeARestartIsStarted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	state := t.TempDir()
	dir := t.TempDir()
	id := b.arm(t, engine.Spec{Command: "echo ran", Cwd: dir})
	// What the dead worker did: its intent, then its spawn.
	runDir := filepath.Join(state, "runs", id+"-1")
	if err := os.MkdirAll(runDir, 0o700); err != nil {
		t.Fatal(err)
	}
	b.spawnAs(t, id, "stable")

	b.startWorker(t, workers.Config{ID: "stable", StateDir: state})
	end := b.waitFor(t, id, 20*time.Second, "ended", ended)
	if end.Status != engine.StatusSucceeded || !slices.Equal(end.Run.Tail, []string{"ran"}) || end.Epoch != 1 {
		t.Fatalf("ended %s at epoch %d with tail %q, want succeeded at epoch 1 with [ran]", end.Status, end.Epoch, end.Run.Tail)
	}
	testkit.Eventually(t, 10*time.Second, "the run directory was not removed", func() bool {
		_, err := os.Stat(runDir)
		return errors.Is(err, os.ErrNotExist)
	})
}

// A run found with no record of its command's start is started again in the
// same boot of the host, and lost after a restart of the host: its command may
// have started before the host went down (neither run.json nor the starting
// file nor pid.json is durable), and must not run a second time. The worker
// then writes down the boot its runs are made in.
func TestARunStartingWhenTheHostRestartedIsLostNotStartedAgain(t *testing.T) {
	t.Parallel()
	current, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Skip("no boot id here:", err)
	}
	now := strings.TrimSpace(string(current))
	for _, c := range []struct {
		boot       string
		runFile    bool
		status     string
		reason     string
		markerMade bool
	}{
		{"an-earlier-boot", true, engine.StatusLost, workers.ReasonHostRestarted, false},
		{"an-earlier-boot", false, engine.StatusLost, workers.ReasonHostRestarted, false},
		{now, true, engine.StatusSucceeded, "", true},
		{now, false, engine.StatusSucceeded, "", true},
	} {
		b := setup(t)
		state, dir := t.TempDir(), t.TempDir()
		id, runDir := takenBeforeARestart(t, b, state, dir, c.boot)
		if !c.runFile {
			if err := os.Remove(filepath.Join(runDir, "run.json")); err != nil {
				t.Fatal(err)
			}
		}
		b.startWorker(t, workers.Config{ID: "stable", StateDir: state})
		end := b.waitFor(t, id, 20*time.Second, "ended", ended)
		if end.Status != c.status || end.Reason != c.reason {
			t.Fatalf("boot %s, run.json %v: ended %s (%q), want %s (%q)", c.boot, c.runFile, end.Status, end.Reason, c.status, c.reason)
		}
		if _, err := os.Stat(filepath.Join(dir, "marker")); (err == nil) != c.markerMade {
			t.Fatalf("boot %s, run.json %v: the command's marker: %v, want made %v", c.boot, c.runFile, err, c.markerMade)
		}
		if got, _ := os.ReadFile(filepath.Join(state, "boot")); strings.TrimSpace(string(got)) != now {
			t.Fatalf("the state directory's boot file says %q, want this boot's %s", got, now)
		}
	}
}

// A run whose exit file reached the disk and whose pid.json did not (it is not
// durable; the host crashed) ended as its exit file says: its command is not
// started again, and its exit is not lost.
func TestARunWithItsExitOnDiskAndNoPIDsEndsAsItsExitSays(t *testing.T) {
	t.Parallel()
	b := setup(t)
	state, dir := t.TempDir(), t.TempDir()
	id, runDir := takenBeforeARestart(t, b, state, dir, "")
	exit := `{"exit_code":7,"started_at":"2026-12-01T10:00:00Z","ended_at":"2026-12-01T10:00:01Z"}`
	if err := os.WriteFile(filepath.Join(runDir, "exit.json"), []byte(exit), 0o600); err != nil {
		t.Fatal(err)
	}
	b.startWorker(t, workers.Config{ID: "stable", StateDir: state})
	end := b.waitFor(t, id, 20*time.Second, "ended", ended)
	if end.Status != engine.StatusFailed || end.Run == nil || end.Run.ExitCode != 7 {
		t.Fatalf("ended %s with %+v, want failed with exit code 7", end.Status, end.Run)
	}
	if _, err := os.Stat(filepath.Join(dir, "marker")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the command ran again: %v", err)
	}
}

// takenBeforeARestart is what a worker "stable" that died after it wrote the
// run.json of a task's first run (in boot, if not empty) and appended its spawn
// leaves: the task, whose command writes dir/marker, and its run directory in
// state.
func takenBeforeARestart(t *testing.T, b *bundle, state, dir, boot string) (id, runDir string) {
	t.Helper()
	id = b.arm(t, engine.Spec{Command: "echo ran > marker", Cwd: dir})
	runDir = filepath.Join(state, "runs", id+"-1")
	if err := os.MkdirAll(runDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if boot != "" {
		if err := os.WriteFile(filepath.Join(state, "boot"), []byte(boot+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	run := fmt.Sprintf(`{"task_id":%q,"epoch":1,"path":"/bin/sh","args":["sh","-c","echo ran > marker"],"env":[],"dir":%q}`, id, dir)
	if err := os.WriteFile(filepath.Join(runDir, "run.json"), []byte(run), 0o600); err != nil {
		t.Fatal(err)
	}
	b.spawnAs(t, id, "stable")
	return id, runDir
}

// A run directory whose task never got its spawn (the worker died between the
// two) is removed at the next start, and the task is taken again.
func TestARunDirectoryWithoutItsSpawnIsRemoved(t *testing.T) {
	t.Parallel()
	b := setup(t)
	state := t.TempDir()
	dir := t.TempDir()
	id := b.arm(t, engine.Spec{Command: "echo ran", Cwd: dir})
	runDir := filepath.Join(state, "runs", id+"-1")
	if err := os.MkdirAll(runDir, 0o700); err != nil {
		t.Fatal(err)
	}
	b.startWorker(t, workers.Config{ID: "stable", StateDir: state})
	end := b.waitFor(t, id, 20*time.Second, "ended", ended)
	if end.Status != engine.StatusSucceeded || end.Epoch != 1 {
		t.Fatalf("ended %s at epoch %d, want succeeded at epoch 1", end.Status, end.Epoch)
	}
}

// A run watched again after a restart ends in the environment it started in: its
// result command too.
func TestAResultCommandAfterARestartRunsInTheRunsEnvironment(t *testing.T) {
	t.Parallel()
	b := setup(t)
	state, dir := t.TempDir(), t.TempDir()
	first := b.startWorker(t, workers.Config{ID: "stable", StateDir: state})
	id := b.arm(t, engine.Spec{
		Command: `while [ ! -e go ]; do sleep 0.02; done`, Cwd: dir,
		Env:    map[string]string{"BGTASK_TEST_MARK": "kept"},
		Result: &engine.Result{Type: engine.ResultCommand, Argv: []string{"printenv", "BGTASK_TEST_MARK"}},
	})
	b.waitFor(t, id, 20*time.Second, "started", hasPID)
	first.Stop()
	b.startWorker(t, workers.Config{ID: "stable", StateDir: state})
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	st := b.waitFor(t, id, 20*time.Second, "ended", ended)
	if st.Run == nil || strings.TrimSpace(st.Run.Result) != "kept" {
		t.Fatalf("result after the restart: %+v, want kept", st.Run)
	}
}

// A run found again after its worker's restart runs its result command in the
// run's own environment (run.json's), not the worker's.
func TestARunFoundAgainRunsItsResultInItsEnvironment(t *testing.T) {
	t.Parallel()
	b := setup(t)
	state, dir := t.TempDir(), t.TempDir()
	first := b.startWorker(t, workers.Config{ID: "stable", StateDir: state})
	id := b.arm(t, engine.Spec{
		Command: `while [ ! -e go ]; do sleep 0.02; done; echo done`, Cwd: dir,
		Env:    map[string]string{"RUN_ONLY": "the run's own"},
		Result: &engine.Result{Type: engine.ResultCommand, Argv: []string{"printenv", "RUN_ONLY"}},
	})
	b.waitFor(t, id, 20*time.Second, "started", hasPID)
	first.Stop()
	b.startWorker(t, workers.Config{ID: "stable", StateDir: state})
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	st := b.waitFor(t, id, 20*time.Second, "ended", ended)
	if st.Status != engine.StatusSucceeded || st.Run == nil || st.Run.Result != "the run's own\n" {
		t.Fatalf("ended %s with %+v, want succeeded with the result from the run's environment", st.Status, st.Run)
	}
}

// The shim holds the deadline and a kill-on-stall while no worker watches.
func TestTheShimStopsACommandAtItsDeadlineWhileNoWorkerWatches(t *testing.T) {
	testkit.FullOnly(t)
	t.Parallel()
	b := setup(t)
	state := t.TempDir()
	first := b.startWorker(t, workers.Config{ID: "stable", StateDir: state})
	// Long enough for both to start (and tick with their PIDs) before the worker
	// stops, on a loaded machine: a command that has already ended gets no tick.
	spec, err := engine.ParseSpecAt([]byte(`{"command":"exec sleep 600","cwd":"/","deadline":"5s"}`), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	stalling, err := engine.ParseSpecAt([]byte(`{"command":"echo once; exec sleep 600","cwd":"/","stall_after":"3s","on_stall":"kill"}`), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	late, quiet := b.arm(t, spec), b.arm(t, stalling)
	latePID := b.waitFor(t, late, 20*time.Second, "started", hasPID).PID
	quietPID := b.waitFor(t, quiet, 20*time.Second, "started", hasPID).PID
	first.Stop()
	waitGone(t, 20*time.Second, latePID)
	waitGone(t, 20*time.Second, quietPID)

	b.startWorker(t, workers.Config{ID: "stable", StateDir: state})
	if st := b.waitFor(t, late, 20*time.Second, "ended", ended); st.Status != engine.StatusTimedOut {
		t.Fatalf("deadline held by the shim: ended %s (%q), want timed_out", st.Status, st.Reason)
	}
	if st := b.waitFor(t, quiet, 20*time.Second, "ended", ended); st.Status != engine.StatusStalled {
		t.Fatalf("stall held by the shim: ended %s (%q), want stalled", st.Status, st.Reason)
	}
}

// A worker that died while its shim was starting the command finds the run's
// directory without the command's PIDs: it waits for the shim, which is still
// starting, and watches the command to its end, rather than record a failure and
// leave the command running unwatched.
func TestAWorkerThatDiedWhileItsShimStartedWaitsForTheShim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	state, dir := t.TempDir(), t.TempDir()
	spec := engine.Spec{Command: `while [ ! -e done ]; do sleep 0.02; done; exit 9`, Cwd: dir}
	id := b.arm(t, spec)
	b.spawnAs(t, id, "stable")
	// The shim is slow to start: it waits for the file shim-go.
	gate := filepath.Join(dir, "shim-go")
	shim := []string{"sh", "-c", `while [ ! -e "$0" ]; do sleep 0.01; done; exec "$1" shim`, gate, os.Args[0]}
	launched, err := workers.StartRunAndDie(shim, filepath.Join(state, "runs", id+"-1"), id, 1, spec)
	if err != nil {
		t.Fatal(err)
	}

	var logged syncLog
	w := workers.New(b.srv.Conn, b.srv.JS, b.store, workers.Config{
		ID: "stable", StateDir: state, Env: os.Environ(), TickInterval: time.Minute, KillGrace: 300 * time.Millisecond,
		Base: engine.Base{Logger: slog.New(slog.NewTextHandler(io.MultiWriter(&logged, testWriter{t}), nil))},
	})
	started := make(chan error, 1)
	go func() { started <- w.Start(context.Background()) }()
	t.Cleanup(func() {
		// Open first: a worker that fails the test waiting on the gated shim must
		// not hold its Stop, and the test, until the run times out.
		_ = os.WriteFile(gate, nil, 0o600)
		w.Stop()
		killRuns(t, state)
		<-launched
	})
	testkit.Eventually(t, 20*time.Second, "the worker waiting for the shim, or recording the run's end", func() bool {
		h := b.history(t, id)
		return strings.Contains(logged.String(), "still starting") || h[len(h)-1].Type != events.TypeSpawned
	})
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "done"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	end := b.waitFor(t, id, 20*time.Second, "ended", ended)
	if end.Run == nil || end.Run.ExitCode != 9 {
		t.Fatalf("ended %s (%q), want the command's exit 9 recorded", end.Status, end.Reason)
	}
}

// A worker that died after it recorded that the rule matched and the command was
// left running (keep_running), before the run's directory went, finds the directory
// at its next start: it removes it and leaves the command running, as the log says.
func TestARestartedWorkerLeavesAKeptRunningCommandRunning(t *testing.T) {
	t.Parallel()
	b := setup(t)
	state := t.TempDir()
	spec := engine.Spec{Command: "exec sleep 60", Cwd: t.TempDir()}
	id := b.arm(t, spec)
	b.spawnAs(t, id, "stable")
	runDir := filepath.Join(state, "runs", id+"-1")
	launched, err := workers.StartRunAndDie([]string{os.Args[0], "shim"}, runDir, id, 1, spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-launched; err != nil {
		t.Fatal(err)
	}
	pids, err := readRunPIDs(runDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-pids.Command.PID, syscall.SIGKILL)
		waitPIDsGone(t, 10*time.Second, pids.Shim.PID)
	})
	st, err := engine.Load(context.Background(), b.store, id)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	ev, err := engine.Decide(st, engine.Exit{Run: events.Exited{KeptRunning: true, StoppedBy: events.StoppedByMatch, StartedAt: now, EndedAt: now}}, engine.Meta{Writer: "stable", Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Append(context.Background(), ev, st.Seq); err != nil {
		t.Fatal(err)
	}

	b.startWorker(t, workers.Config{ID: "stable", StateDir: state})
	testkit.Eventually(t, 10*time.Second, "the run's directory removed", func() bool {
		_, err := os.Stat(runDir)
		return errors.Is(err, fs.ErrNotExist)
	})
	if !alive(pids.Command.PID) {
		t.Fatal("the command left running on purpose was stopped")
	}
}

// A shim killed once it started the command, before it recorded the command's
// PID, leaves a run nobody can follow: the task is lost, once, and says why, and
// the worker stops what runs of the command.
func TestAShimKilledBeforeItRecordedThePIDLosesTheRun(t *testing.T) {
	t.Parallel()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t)
	b.startWorker(t, workers.Config{Shim: []string{"env", engine.CrashEnv + "=" + engine.CrashShimAfterStart, self, "shim"}})
	dir := t.TempDir()
	id := b.arm(t, engine.Spec{Command: `echo $$ > pid; exec sleep 600`, Cwd: dir})
	st := b.waitFor(t, id, 20*time.Second, "ended", ended)
	if st.Status != engine.StatusLost || st.Reason != workers.ReasonShimDiedStarting {
		t.Fatalf("ended %s (%q), want lost because its shim died while it started the command", st.Status, st.Reason)
	}
	// Not by the PID it writes: killed at once, it may have made the file and
	// never written to it. Its working directory is this test's alone.
	waitNothingRunsIn(t, 10*time.Second, dir)
	n := map[events.Type]int{}
	for _, rec := range b.history(t, id) {
		n[rec.Type]++
	}
	if n[events.TypeLost] != 1 || n[events.TypeExited]+n[events.TypeFailed] != 0 {
		t.Fatalf("history %v, want one lost and no other end", n)
	}
}

// waitNothingRunsIn waits until no process has dir as its working directory.
func waitNothingRunsIn(t *testing.T, timeout time.Duration, dir string) {
	t.Helper()
	testkit.Eventually(t, timeout, "the command gone from "+dir, func() bool {
		entries, err := os.ReadDir("/proc")
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd")); err == nil && cwd == dir {
				return false
			}
		}
		return true
	})
}

// syncLog is a log a test reads while a worker writes it.
type syncLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A completion line whose first half the log holds when the worker stops, and whose
// second half comes while it is away, completes the task after the restart: the
// watch reads the line again from its beginning, not from where the log stands.
func TestACompletionLineSplitAcrossARestartStillMatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	state, dir := t.TempDir(), t.TempDir()
	first := b.startWorker(t, workers.Config{ID: "stable", StateDir: state})
	spec := engine.Spec{
		Command:    `printf '{"done":'; while [ ! -e go ]; do sleep 0.02; done; printf ' true}\n'; exec sleep 600`,
		Cwd:        dir,
		Completion: &engine.Completion{Type: engine.CompleteOnJSON, Match: map[string]any{"done": true}},
	}
	id := b.arm(t, spec)
	b.waitFor(t, id, 20*time.Second, "started", hasPID)
	logs, err := events.ConnectLogs(context.Background(), b.srv.JS)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the first half of the line in the log", func() bool {
		end, err := logs.End(context.Background(), id, events.Stdout)
		return err == nil && end > 0
	})
	first.Stop()
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}

	b.startWorker(t, workers.Config{ID: "stable", StateDir: state})
	st := b.waitFor(t, id, 20*time.Second, "ended", ended)
	if st.Status != engine.StatusSucceeded || st.Run.MatchedLine != `{"done": true}` {
		t.Fatalf("ended %s (%q) with matched line %q, want succeeded with the whole line", st.Status, st.Reason, st.Run.MatchedLine)
	}
}

// A spawn that reached the log but whose ack never came back, while the server
// stays away longer than an event is retried: the worker learns from the log that
// the task is its own and runs it, rather than give it up and leave it held by a
// worker that does not run it (its lease alive, nothing would ever end it).
func TestASpawnWhoseOutcomeStaysUnknownIsSettledByTheLog(t *testing.T) {
	testkit.FullOnly(t)
	t.Parallel()
	b := setup(t)
	faulty := &faultyStore{Store: b.store}
	// The spawn is written, then every retry fails for longer than an append is
	// retried (10s, a retry every 200ms).
	drops := make([]fault, 60)
	for i := range drops {
		drops[i] = dropWrite
	}
	faulty.inject(events.TypeSpawned, append([]fault{loseAck}, drops...)...)
	startWorker(t, b.srv.Conn, b.srv.JS, faulty, workers.Config{ID: "patient"})
	id := b.arm(t, engine.Spec{Command: "exit 3", Cwd: t.TempDir()})
	st := b.waitFor(t, id, 40*time.Second, "ended", ended)
	if st.Run == nil || st.Run.ExitCode != 3 {
		t.Fatalf("ended %s (%q), want exit 3", st.Status, st.Reason)
	}
	n := map[events.Type]int{}
	for _, rec := range b.history(t, id) {
		n[rec.Type]++
	}
	if n[events.TypeSpawned] != 1 || n[events.TypeExited] != 1 {
		t.Fatalf("history %v, want one spawned and one exited", n)
	}
}

// A worker started on another worker's state directory that holds runs is refused:
// it would find none of those runs its own and stop them all, and their tasks would
// end lost. The directory's own worker watches them to their end.
func TestAStateDirectoryKeepsItsWorkersIdentityWhileItHoldsRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	state, dir := t.TempDir(), t.TempDir()
	first := b.startWorker(t, workers.Config{ID: "first", StateDir: state})
	id := b.arm(t, engine.Spec{Command: `while [ ! -e go ]; do sleep 0.02; done; exit 5`, Cwd: dir})
	pid := b.waitFor(t, id, 20*time.Second, "started", hasPID).PID
	first.Stop()

	other := workers.New(b.srv.Conn, b.srv.JS, b.store, workers.Config{ID: "second", StateDir: state, Env: os.Environ()})
	if err := other.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "runs of worker first") {
		other.Stop()
		t.Fatalf("a worker with another id on a state directory holding runs: %v", err)
	}
	if !alive(pid) {
		t.Fatal("the refused worker stopped the command")
	}
	again := b.startWorker(t, workers.Config{ID: "first", StateDir: state})
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if st := b.waitFor(t, id, 20*time.Second, "ended", ended); st.Run == nil || st.Run.ExitCode != 5 {
		t.Fatalf("ended %s (%q), want exit 5", st.Status, st.Reason)
	}

	// Without runs, the directory may change hands.
	testkit.Eventually(t, 10*time.Second, "the run directory removed", func() bool {
		runs, _ := filepath.Glob(filepath.Join(state, "runs", "*"))
		return len(runs) == 0
	})
	again.Stop()
	if w := b.startWorker(t, workers.Config{ID: "second", StateDir: state}); w.ID() != "second" {
		t.Fatalf("worker id %q on an empty state directory, want second", w.ID())
	}
}

// A worker that starts removes what its runs directory holds that no worker made
// for a run (the name of none), files and all, and takes tasks as ever.
func TestAWorkerThatStartsRemovesWhatIsNotARun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	state := t.TempDir()
	var stray []string
	for _, name := range []string{".free-17", "not a run", "task-x"} {
		dir := filepath.Join(state, "runs", name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "exit.json.tmp"), []byte(`{"exit_code":3}`), 0o600); err != nil {
			t.Fatal(err)
		}
		stray = append(stray, dir)
	}
	b.startWorker(t, workers.Config{StateDir: state})
	for _, dir := range stray {
		if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s after the worker started: %v, want it removed", filepath.Base(dir), err)
		}
	}
	id := b.arm(t, engine.Spec{Command: "exit 4", Cwd: t.TempDir()})
	if st := b.waitFor(t, id, 20*time.Second, "ended", ended); st.Run == nil || st.Run.ExitCode != 4 {
		t.Fatalf("ended %s (%q), want exit 4", st.Status, st.Reason)
	}
}

// spawnAs appends the task's spawn as worker did, without anything started: what
// a worker that died right after taking the task leaves in the log.
func (b *bundle) spawnAs(t *testing.T, id, worker string) {
	t.Helper()
	st, err := engine.Load(context.Background(), b.store, id)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := engine.Decide(st, engine.Spawn{Host: "h"}, engine.Meta{Writer: worker, Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Append(context.Background(), ev, st.Seq); err != nil {
		t.Fatal(err)
	}
}
