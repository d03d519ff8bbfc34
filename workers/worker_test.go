package workers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/events/eventstest"
	"github.com/bgtask/bgtask/internal/testkit"
	"github.com/bgtask/bgtask/projections"
	"github.com/bgtask/bgtask/workers"
	"github.com/bgtask/bgtask/workers/shim"
)

// bundle is one test's JetStream server with the streams a bgtask server creates:
// the event store and the task logs.
type bundle struct {
	srv   *eventstest.Server
	store *events.JetStreamStore
}

func setup(t *testing.T) *bundle {
	t.Helper()
	ctx := context.Background()
	srv := eventstest.Run(t)
	store, err := events.OpenStore(ctx, srv.JS, events.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	// Workers write command output to the log stream and heartbeats to the
	// liveness bucket; the server creates both.
	if _, err := events.OpenLogs(ctx, srv.JS, events.LogConfig{}); err != nil {
		t.Fatal(err)
	}
	liveness, err := events.OpenLiveness(ctx, srv.JS, time.Minute, 1)
	if err != nil {
		t.Fatal(err)
	}
	startScheduler(t, srv.Conn, store, liveness)
	return &bundle{srv: srv, store: store}
}

// startScheduler runs the engine's part that offers armed tasks to workers, with
// the projector it reads the tasks from, until the test ends.
func startScheduler(t *testing.T, nc *nats.Conn, store *events.JetStreamStore, liveness *events.Liveness) {
	t.Helper()
	var sched *engine.Scheduler
	proj := projections.New(store, func(s engine.State, _ events.Record) { sched.Notify(s) }, engine.Base{})
	sched = engine.NewScheduler(proj, liveness, func(ctx context.Context, worker string, o events.Offer) (events.OfferReply, error) {
		return events.OfferTask(ctx, nc, worker, o)
	}, engine.Base{})
	if err := proj.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := sched.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		proj.Stop()
		sched.Stop()
	})
}

// startWorker starts a worker on the bundle's own connection.
func (b *bundle) startWorker(t *testing.T, cfg workers.Config) *workers.Worker {
	t.Helper()
	return startWorker(t, b.srv.Conn, b.srv.JS, b.store, cfg)
}

// startWorker starts a worker stopped when the test ends. Unless the test says
// otherwise, it runs commands in this process's environment (not the machine's login
// shell), ticks rarely so that histories hold only the events a test expects, and
// kills after a short grace.
func startWorker(t *testing.T, nc *nats.Conn, js jetstream.JetStream, store events.Store, cfg workers.Config) *workers.Worker {
	t.Helper()
	if cfg.ID == "" {
		cfg.ID = "test-worker"
	}
	if cfg.Env == nil {
		cfg.Env = os.Environ()
	}
	if cfg.TickInterval == 0 {
		cfg.TickInterval = time.Minute
	}
	if cfg.KillGrace == 0 {
		cfg.KillGrace = 300 * time.Millisecond
	}
	if cfg.StateDir == "" {
		cfg.StateDir = t.TempDir()
	}
	if cfg.Base.Logger == nil {
		// The worker's log goes with the test's output: a failure shows what it did.
		cfg.Base.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	w := workers.New(nc, js, store, cfg)
	if err := w.Start(context.Background()); err != nil {
		t.Fatalf("start worker %s: %v", cfg.ID, err)
	}
	t.Cleanup(func() {
		w.Stop()
		killRuns(t, cfg.StateDir)
	})
	return w
}

// killRuns ends the commands and shims a stopped worker left running (a stopped
// worker leaves them on purpose), and waits until its shims are gone.
func killRuns(t *testing.T, stateDir string) {
	runs, _ := filepath.Glob(filepath.Join(stateDir, "runs", "*"))
	for _, dir := range runs {
		pids, err := readRunPIDs(dir)
		if err != nil {
			continue
		}
		_ = syscall.Kill(-pids.Command.PID, syscall.SIGKILL)
		_ = syscall.Kill(pids.Shim.PID, syscall.SIGKILL)
		testkit.Eventually(t, 10*time.Second, "a shim outlived its test", func() bool { return !alive(pids.Shim.PID) })
	}
}

// runPIDs are the PIDs a shim recorded in its run's pid.json.
type runPIDs struct{ Shim, Command struct{ PID int } }

func readRunPIDs(dir string) (runPIDs, error) {
	var pids runPIDs
	data, err := os.ReadFile(filepath.Join(dir, shim.PIDFile))
	if err == nil {
		err = json.Unmarshal(data, &pids)
	}
	return pids, err
}

// testWriter writes to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// arm registers a task the way the engine does: an armed event as its first event.
func (b *bundle) arm(t *testing.T, spec engine.Spec) string {
	t.Helper()
	return arm(t, b.store, spec)
}

func arm(t *testing.T, store events.Store, spec engine.Spec) string {
	t.Helper()
	if spec.Target == "" {
		spec.Target = engine.DefaultTarget
	}
	id, err := engine.TaskID(spec)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := engine.Decide(engine.State{ID: id}, engine.Arm{Spec: spec}, engine.Meta{Writer: "test", Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Append(context.Background(), ev, 0); err != nil {
		t.Fatalf("arm %q: %v", spec.CommandLine(), err)
	}
	return id
}

// waitFor follows a task's events until cond holds for its state, and fails the test
// if it does not within timeout. Every event must fit the state machine.
func (b *bundle) waitFor(t *testing.T, id string, timeout time.Duration, what string, cond func(engine.State) bool) engine.State {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var (
		st       engine.State
		problems []error
		reached  bool
	)
	err := b.store.Follow(ctx, id, 0, func(rec events.Record, err error) bool {
		if err != nil {
			problems = append(problems, err)
			return true
		}
		if st, err = engine.Apply(st, rec); err != nil {
			problems = append(problems, err)
		}
		reached = cond(st)
		return !reached
	})
	for _, p := range problems {
		t.Errorf("task %s: bad event: %v", id, p)
	}
	if !reached {
		t.Fatalf("task %s: not %s within %v (follow: %v); phase %q after %d events", id, what, timeout, err, st.Phase, st.Events)
	}
	return st
}

func ended(s engine.State) bool { return s.Phase == engine.PhaseEnded }

func hasPID(s engine.State) bool { return s.PID != 0 }

func (b *bundle) history(t *testing.T, id string) []events.Record {
	t.Helper()
	return history(t, b.store, id)
}

func history(t *testing.T, store events.Store, id string) []events.Record {
	t.Helper()
	h, err := store.History(context.Background(), id)
	if err != nil {
		t.Fatalf("history of %s: %v", id, err)
	}
	return h
}

func types(h []events.Record) []events.Type {
	out := make([]events.Type, len(h))
	for i, rec := range h {
		out[i] = rec.Type
	}
	return out
}

func payload[T events.Payload](t *testing.T, rec events.Record) T {
	t.Helper()
	p, err := rec.Decode()
	if err != nil {
		t.Fatalf("decode %s at seq %d: %v", rec.Type, rec.Seq, err)
	}
	v, ok := p.(T)
	if !ok {
		t.Fatalf("event at seq %d is %s (%T), want %T", rec.Seq, rec.Type, p, v)
	}
	return v
}

// cancel appends a cancelled event the way the engine does: decided on the task's
// state and conditional on its last event. A tick that lands in between only
// means deciding again.
func (b *bundle) cancel(t *testing.T, id string) {
	t.Helper()
	ctx := context.Background()
	for range 20 {
		st, err := engine.Load(ctx, b.store, id)
		if err != nil {
			t.Fatal(err)
		}
		ev, err := engine.Decide(st, engine.Cancel{Reason: "test"}, engine.Meta{Writer: "engine", Now: time.Now()})
		if err != nil {
			t.Fatalf("cancel %s in phase %s: %v", id, st.Phase, err)
		}
		_, err = b.store.Append(ctx, ev, st.Seq)
		if err == nil {
			return
		}
		if !errors.Is(err, events.ErrConflict) {
			t.Fatalf("cancel %s: %v", id, err)
		}
	}
	t.Fatalf("cancel %s: lost the race 20 times", id)
}

func TestWorkerRunsACommandAndRecordsItsHistory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := b.startWorker(t, workers.Config{ID: "worker-e2e"})
	id := b.arm(t, engine.Spec{Command: "echo out; echo err >&2; exit 7", Cwd: t.TempDir()})

	st := b.waitFor(t, id, 20*time.Second, "ended", ended)
	if got, want := st.Status, engine.StatusFailed; got != want {
		t.Errorf("status = %q, want %q", got, want)
	}
	h := b.history(t, id)
	// The first tick is written unless the command has ended by then.
	if got, want := types(h), []events.Type{events.TypeArmed, events.TypeSpawned, events.TypeTick, events.TypeExited}; !slices.Equal(got, want) &&
		!slices.Equal(got, slices.Delete(slices.Clone(want), 2, 3)) {
		t.Fatalf("history = %v, want %v (the tick only if the command still ran)", got, want)
	}
	for _, rec := range h[1:] {
		if rec.Writer != w.ID() || rec.Epoch != 1 {
			t.Errorf("%s written by %q at epoch %d, want %q at epoch 1", rec.Type, rec.Writer, rec.Epoch, w.ID())
		}
	}
	if got, want := payload[*events.Spawned](t, h[1]).Worker, w.ID(); got != want {
		t.Errorf("spawned worker = %q, want %q", got, want)
	}
	if h[2].Type == events.TypeTick {
		if pid := payload[*events.Tick](t, h[2]).PID; pid <= 0 {
			t.Errorf("first tick pid = %d, want the command's pid", pid)
		}
	}
	exited := payload[*events.Exited](t, h[len(h)-1])
	if got, want := exited.ExitCode, 7; got != want {
		t.Errorf("exit code = %d, want %d", got, want)
	}
	if exited.Signal != "" {
		t.Errorf("signal = %q, want none", exited.Signal)
	}
	// stdout and stderr are read from two pipes: each keeps its order, their
	// interleaving is the order bgtask read them in.
	if got := exited.Tail; len(got) != 2 || !slices.Contains(got, "out") || !slices.Contains(got, "err") {
		t.Errorf("tail = %q, want out and err", got)
	}
	if exited.StartedAt.IsZero() || exited.EndedAt.Before(exited.StartedAt) {
		t.Errorf("run from %v to %v, want a start and an end after it", exited.StartedAt, exited.EndedAt)
	}
	testkit.Eventually(t, 10*time.Second, "the run is still listed after its exit", func() bool { return len(w.Running()) == 0 })
}

func TestWorkerRecordsHowCommandsEnd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startWorker(t, workers.Config{})
	tests := []struct {
		name    string
		spec    engine.Spec
		code    int
		signal  string
		tail    []string
		success bool
		// sortByStream compares the tail with odd lines (stdout) before even ones
		// (stderr): two pipes keep each stream's order, not their interleaving.
		sortByStream bool
	}{
		{name: "success", spec: engine.Spec{Command: "echo hi"}, code: 0, tail: []string{"hi"}, success: true},
		{name: "exit code", spec: engine.Spec{Command: "exit 3"}, code: 3, tail: nil},
		{name: "killed by TERM", spec: engine.Spec{Command: "echo before; kill -TERM $$; echo after"}, code: 143, signal: "TERM", tail: []string{"before"}},
		{name: "killed by KILL", spec: engine.Spec{Command: "kill -KILL $$"}, code: 137, signal: "KILL"},
		{name: "last line without newline", spec: engine.Spec{Command: `printf 'a\nb'`}, code: 0, tail: []string{"a", "b"}, success: true},
		{name: "stdout and stderr each in order", spec: engine.Spec{Command: "echo 1; echo 2 >&2; echo 3; echo 4 >&2"}, tail: []string{"1", "3", "2", "4"}, sortByStream: true, success: true},
		{name: "stdin is empty", spec: engine.Spec{Command: "cat; echo done"}, tail: []string{"done"}, success: true},
		{name: "argv runs without a shell", spec: engine.Spec{Argv: []string{"printf", "%s", "a b"}}, tail: []string{"a b"}, success: true},
		{name: "argv does not expand", spec: engine.Spec{Argv: []string{"printf", `%s\n`, "$HOME; echo injected `id`"}}, tail: []string{"$HOME; echo injected `id`"}, success: true},
		{name: "argv exit code", spec: engine.Spec{Argv: []string{"false"}}, code: 1},
		{name: "cwd", spec: engine.Spec{Command: "pwd", Cwd: "/"}, tail: []string{"/"}, success: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if tt.spec.Cwd == "" {
				tt.spec.Cwd = t.TempDir()
			}
			id := b.arm(t, tt.spec)
			st := b.waitFor(t, id, 20*time.Second, "ended", ended)
			if st.Run == nil {
				t.Fatalf("ended without a run (reason %q), want an exit", st.Reason)
			}
			if got, want := st.Run.ExitCode, tt.code; got != want {
				t.Errorf("exit code = %d, want %d", got, want)
			}
			if got, want := st.Run.Signal, tt.signal; got != want {
				t.Errorf("signal = %q, want %q", got, want)
			}
			got := st.Run.Tail
			if tt.sortByStream {
				got = slices.Clone(got)
				slices.SortStableFunc(got, func(a, b string) int { return oddFirst(a) - oddFirst(b) })
			}
			if want := tt.tail; !slices.Equal(got, want) {
				t.Errorf("tail = %q, want %q", st.Run.Tail, want)
			}
			if got, want := st.Status == engine.StatusSucceeded, tt.success; got != want {
				t.Errorf("status = %q, want succeeded: %v", st.Status, want)
			}
		})
	}
}

func TestWorkerRecordsACommandThatCannotStartAsFailed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := b.startWorker(t, workers.Config{ID: "worker-failed"})
	notExecutable := filepath.Join(t.TempDir(), "not-executable")
	if err := os.WriteFile(notExecutable, []byte("echo no\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "gone")
	tests := []struct {
		name   string
		spec   engine.Spec
		reason string // the reason names what was wrong
	}{
		// Validated at registration, but a directory can go before the task runs.
		{name: "missing cwd", spec: engine.Spec{Command: "true", Cwd: missing}, reason: missing},
		{name: "argv program not in PATH", spec: engine.Spec{Argv: []string{"bgtask-no-such-program", "x"}}, reason: "bgtask-no-such-program"},
		{name: "argv path does not exist", spec: engine.Spec{Argv: []string{"/nonexistent/bgtask-prog"}}, reason: "/nonexistent/bgtask-prog"},
		{name: "argv path not executable", spec: engine.Spec{Argv: []string{notExecutable}}, reason: notExecutable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if tt.spec.Cwd == "" {
				tt.spec.Cwd = t.TempDir()
			}
			id := b.arm(t, tt.spec)
			st := b.waitFor(t, id, 20*time.Second, "ended", ended)
			if got, want := st.Status, engine.StatusFailed; got != want {
				t.Errorf("status = %q, want %q", got, want)
			}
			if st.Run != nil {
				t.Errorf("run = %+v, want none: the command never started", st.Run)
			}
			if !strings.Contains(st.Reason, tt.reason) {
				t.Errorf("reason = %q, want it to name %q", st.Reason, tt.reason)
			}
			h := b.history(t, id)
			if got, want := types(h), []events.Type{events.TypeArmed, events.TypeSpawned, events.TypeFailed}; !slices.Equal(got, want) {
				t.Fatalf("history = %v, want %v", got, want)
			}
			if rec := h[2]; rec.Writer != w.ID() || rec.Epoch != 1 {
				t.Errorf("failed written by %q at epoch %d, want %q at epoch 1", rec.Writer, rec.Epoch, w.ID())
			}
		})
	}
}

func TestWorkerRunsCommandsInItsEnvPlusTheSpecsEnv(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A tool only the worker's environment can find: not in this process's PATH.
	tools := t.TempDir()
	echo, err := exec.LookPath("echo")
	if err != nil {
		t.Skip("no echo program")
	}
	// A symlink, not a written script: a script being written while another test
	// forks can fail to exec with "text file busy".
	if err := os.Symlink(echo, filepath.Join(tools, "bgtask-test-tool")); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(),
		"BGTASK_FROM_WORKER=worker",
		"BGTASK_OVERRIDDEN=worker",
		"PATH="+tools+":"+os.Getenv("PATH"))
	b.startWorker(t, workers.Config{Env: env})

	tests := []struct {
		name string
		spec engine.Spec
		// want is the tail; "$ID" stands for the task id.
		want []string
	}{
		{
			name: "worker env, spec env, spec wins, task id",
			spec: engine.Spec{
				Command: `echo "$BGTASK_FROM_WORKER"; echo "$BGTASK_FROM_SPEC"; echo "$BGTASK_OVERRIDDEN"; echo "$BGTASK_TASK_ID"`,
				Env:     map[string]string{"BGTASK_FROM_SPEC": "spec", "BGTASK_OVERRIDDEN": "spec"},
			},
			want: []string{"worker", "spec", "spec", "$ID"},
		},
		{
			name: "spec cannot forge the task id",
			spec: engine.Spec{Command: `echo "$BGTASK_TASK_ID"`, Env: map[string]string{"BGTASK_TASK_ID": "forged"}},
			want: []string{"$ID"},
		},
		{
			name: "argv found in the worker env's PATH",
			spec: engine.Spec{Argv: []string{"bgtask-test-tool", "from", "the", "tool"}},
			want: []string{"from the tool"},
		},
		{
			name: "argv env",
			spec: engine.Spec{Argv: []string{"printenv", "BGTASK_FROM_SPEC"}, Env: map[string]string{"BGTASK_FROM_SPEC": "argv"}},
			want: []string{"argv"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.spec.Cwd = t.TempDir()
			id := b.arm(t, tt.spec)
			st := b.waitFor(t, id, 20*time.Second, "ended", ended)
			if st.Run == nil {
				t.Fatalf("no run: %q", st.Reason)
			}
			want := slices.Clone(tt.want)
			for i := range want {
				want[i] = strings.ReplaceAll(want[i], "$ID", id)
			}
			if got := st.Run.Tail; !slices.Equal(got, want) {
				t.Errorf("tail = %q, want %q", got, want)
			}
		})
	}
}

func TestEachTaskIsSpawnedExactlyOnceByCompetingWorkers(t *testing.T) {
	t.Parallel()
	const tasks = 60 // 200 race in the integration suite; each start here execs a race-built shim twice
	b := setup(t)
	for i := range 3 {
		nc, js := b.srv.Connect(t)
		store, err := events.ConnectStore(context.Background(), js)
		if err != nil {
			t.Fatal(err)
		}
		startWorker(t, nc, js, store, workers.Config{ID: fmt.Sprintf("worker-%d", i), MaxTasks: 2})
	}
	ids := make([]string, tasks)
	for i := range ids {
		ids[i] = b.arm(t, engine.Spec{Command: "true", Cwd: "/"})
	}

	// Follow the whole log until every task has ended.
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	endedN := 0
	err := b.store.Follow(ctx, "", 0, func(rec events.Record, err error) bool {
		if err != nil {
			t.Errorf("bad event: %v", err)
			return true
		}
		if rec.Type == events.TypeExited || rec.Type == events.TypeFailed {
			endedN++
		}
		return endedN < tasks
	})
	if err != nil {
		t.Fatalf("%d of %d tasks ended: %v", endedN, tasks, err)
	}

	spawnsBy := map[string]int{}
	for _, id := range ids {
		h := b.history(t, id)
		count := map[events.Type]int{}
		var spawner string
		for _, rec := range h {
			count[rec.Type]++
			switch rec.Type {
			case events.TypeSpawned:
				spawner = rec.Writer
				spawnsBy[rec.Writer]++
			case events.TypeExited, events.TypeTick:
				if rec.Writer != spawner {
					t.Errorf("task %s: %s by %q, but %q spawned it", id, rec.Type, rec.Writer, spawner)
				}
			}
		}
		if count[events.TypeSpawned] != 1 || count[events.TypeExited] != 1 || count[events.TypeFailed] != 0 {
			t.Errorf("task %s: history %v, want exactly one spawned and one exited", id, types(h))
		}
		if _, problems := engine.Replay(h); len(problems) > 0 {
			t.Errorf("task %s: history does not replay: %v", id, problems)
		}
	}
	if len(spawnsBy) < 2 {
		t.Errorf("spawns by worker = %v, want the workers to share the tasks", spawnsBy)
	}
	t.Logf("spawns by worker: %v", spawnsBy)
}

func TestWorkerRunsNoMoreThanMaxTasksAtOnce(t *testing.T) {
	t.Parallel()
	const maxTasks, tasks = 2, 4
	b := setup(t)
	w := b.startWorker(t, workers.Config{MaxTasks: maxTasks, TickInterval: 50 * time.Millisecond})
	dir := t.TempDir()
	gate := filepath.Join(dir, "go")

	// Sample Running() the whole time, not only at the moments the test looks.
	var maxRunning atomic.Int64
	sampling, stopSampling := context.WithCancel(context.Background())
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-sampling.Done():
				return
			case <-tick.C:
				if n := int64(len(w.Running())); n > maxRunning.Load() {
					maxRunning.Store(n)
				}
			}
		}
	}()
	defer func() { stopSampling(); <-sampled }()

	ids := make([]string, tasks)
	for i := range ids {
		ids[i] = b.arm(t, engine.Spec{
			Command: `while [ ! -e "$GATE" ]; do sleep 0.05; done`,
			Env:     map[string]string{"GATE": gate},
			Cwd:     dir,
		})
	}

	testkit.Eventually(t, 20*time.Second, fmt.Sprintf("%d tasks running", maxTasks), func() bool { return len(w.Running()) >= maxTasks })
	running := w.Running()
	// Let the running tasks tick a few times: the others must still be waiting.
	for _, id := range running {
		b.waitFor(t, id, 20*time.Second, "ticking", func(s engine.State) bool { return s.Events >= 6 })
	}
	waiting := 0
	for _, id := range ids {
		st, err := engine.Load(context.Background(), b.store, id)
		if err != nil {
			t.Fatal(err)
		}
		if st.Phase == engine.PhaseArmed {
			waiting++
		}
	}
	if got, want := waiting, tasks-maxTasks; got != want {
		t.Errorf("%d tasks still armed while %d run, want %d", got, len(running), want)
	}

	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		st := b.waitFor(t, id, 20*time.Second, "ended", ended)
		if st.Run == nil || st.Run.ExitCode != 0 {
			t.Errorf("task %s: run %+v, reason %q; want exit 0", id, st.Run, st.Reason)
		}
	}
	stopSampling()
	<-sampled
	if got := maxRunning.Load(); got > maxTasks {
		t.Errorf("Running() showed up to %d tasks at once, want at most %d", got, maxTasks)
	}

	// In the log's own order, no more than maxTasks runs were ever open at once.
	var all []events.Record
	for _, id := range ids {
		all = append(all, b.history(t, id)...)
	}
	slices.SortFunc(all, func(a, b events.Record) int { return int(a.Seq) - int(b.Seq) })
	open, maxOpen := 0, 0
	for _, rec := range all {
		switch rec.Type {
		case events.TypeSpawned:
			open++
			maxOpen = max(maxOpen, open)
		case events.TypeExited, events.TypeFailed:
			open--
		}
	}
	if maxOpen > maxTasks {
		t.Errorf("the log has up to %d runs open at once, want at most %d", maxOpen, maxTasks)
	}
}

// An event the state machine would not accept (a spawn on a running task, written
// around the API) does not take the task from its worker: the worker follows the
// state the log implies, as every reader does, and keeps its run.
func TestAnEventThatDoesNotFitDoesNotFenceTheWorker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startWorker(t, workers.Config{ID: "worker-kept", TickInterval: 50 * time.Millisecond})
	dir := t.TempDir()
	id := b.arm(t, engine.Spec{Command: `while [ ! -e go ]; do sleep 0.05; done; echo done`, Cwd: dir})
	st := b.waitFor(t, id, 20*time.Second, "started", hasPID)

	ctx := context.Background()
	var forged uint64
	for range 20 {
		last, err := b.store.Last(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		ev, err := events.New(id, "usurper", st.Epoch+1, time.Now(), &events.Spawned{Worker: "usurper"})
		if err != nil {
			t.Fatal(err)
		}
		if forged, err = b.store.Append(ctx, ev, last.Seq); err == nil {
			break
		} else if !errors.Is(err, events.ErrConflict) {
			t.Fatal(err)
		}
	}
	if forged == 0 {
		t.Fatal("could not append the forged spawn")
	}
	// The worker's ticks go on after it; then the command ends normally.
	load := func() engine.State {
		s, err := engine.Load(ctx, b.store, id)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	testkit.Eventually(t, 20*time.Second, "no tick after the forged event", func() bool {
		s := load()
		return s.Seq > forged && s.LastType == events.TypeTick
	})
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, "the command did not end", func() bool { return load().Phase == engine.PhaseEnded })
	if end := load(); end.Worker != "worker-kept" || end.Status != engine.StatusSucceeded {
		t.Fatalf("ended as %s by %s, want succeeded by worker-kept", end.Status, end.Worker)
	}
}

// A worker that stops (an upgrade, a restart, kill -9) leaves its commands running
// under their shims; the next worker on the same state directory watches them
// again and records each exit once, including one that happened while no worker
// was there.
func TestARestartedWorkerWatchesItsRunsAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	state := t.TempDir()
	dir := t.TempDir()
	first := b.startWorker(t, workers.Config{ID: "stable", StateDir: state, TickInterval: 50 * time.Millisecond})
	// One command ends while the worker is away, one goes on after it is back.
	endsAway := b.arm(t, engine.Spec{Command: `echo before; while [ ! -e away ]; do sleep 0.02; done; echo after; exit 7`, Cwd: dir})
	endsLater := b.arm(t, engine.Spec{Command: `echo one; while [ ! -e back ]; do sleep 0.02; done; echo two`, Cwd: dir})
	b.waitFor(t, endsAway, 20*time.Second, "started", hasPID)
	later := b.waitFor(t, endsLater, 20*time.Second, "started", hasPID)
	testkit.Eventually(t, 10*time.Second, "output not yet in the log", func() bool {
		st, _ := engine.Load(context.Background(), b.store, endsLater)
		return st.OutputBytes > 0 || st.LastTickAt != nil
	})
	first.Stop()
	if !alive(later.PID) {
		t.Fatal("stopping the worker stopped its command")
	}
	if err := os.WriteFile(filepath.Join(dir, "away"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitGone(t, 10*time.Second, b.waitFor(t, endsAway, time.Second, "pid", hasPID).PID)

	b.startWorker(t, workers.Config{ID: "stable", StateDir: state, TickInterval: 50 * time.Millisecond})
	away := b.waitFor(t, endsAway, 20*time.Second, "ended", ended)
	if away.Run.ExitCode != 7 || !slices.Equal(away.Run.Tail, []string{"before", "after"}) {
		t.Fatalf("exit recorded after the restart: code %d tail %q, want 7 [before after]", away.Run.ExitCode, away.Run.Tail)
	}
	if err := os.WriteFile(filepath.Join(dir, "back"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	back := b.waitFor(t, endsLater, 20*time.Second, "ended", ended)
	if back.Status != engine.StatusSucceeded || !slices.Equal(back.Run.Tail, []string{"one", "two"}) {
		t.Fatalf("the run watched again ended %s with tail %q", back.Status, back.Run.Tail)
	}
	for _, id := range []string{endsAway, endsLater} {
		n := map[events.Type]int{}
		for _, rec := range b.history(t, id) {
			n[rec.Type]++
			if rec.Type != events.TypeArmed && rec.Writer != "stable" {
				t.Errorf("%s written by %s", rec.Type, rec.Writer)
			}
		}
		if n[events.TypeSpawned] != 1 || n[events.TypeExited] != 1 {
			t.Fatalf("task %s: %v, want one spawn and one exit", id, n)
		}
	}
	// The log holds each output once, across the restart.
	logs, err := events.ConnectLogs(context.Background(), b.srv.JS)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := logs.Read(context.Background(), endsLater, []string{events.Stdout}, func(c events.LogChunk) error {
		out.Write(c.Data)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if out.String() != "one\ntwo\n" {
		t.Fatalf("log across the restart = %q, want each line once", out.String())
	}
}

// A finished run's log holds its output and nothing more: an end mark rides on
// the last chunk of an output that had one left, and an empty output (or one whose
// chunks all went out before the end) writes none: the task's end says the output
// is complete, and each message would be one more append to the disk per task.
func TestAFinishedRunsLogHoldsItsOutputAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startWorker(t, workers.Config{})
	quiet := b.arm(t, engine.Spec{Command: "true", Cwd: t.TempDir()})
	echo := b.arm(t, engine.Spec{Command: "echo out", Cwd: t.TempDir()})
	b.waitFor(t, quiet, 20*time.Second, "ended", ended)
	b.waitFor(t, echo, 20*time.Second, "ended", ended)
	stream, err := b.srv.JS.Stream(context.Background(), events.LogStreamName)
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]uint64{quiet: 0, echo: 1} {
		info, err := stream.Info(context.Background(), jetstream.WithSubjectFilter(events.LogSubject(id, ">")))
		if err != nil {
			t.Fatal(err)
		}
		var n uint64
		for _, c := range info.State.Subjects {
			n += c
		}
		if n != want {
			t.Errorf("task %s: %d log messages (%v), want %d", id, n, info.State.Subjects, want)
		}
	}
	logs, err := events.ConnectLogs(context.Background(), b.srv.JS)
	if err != nil {
		t.Fatal(err)
	}
	var got []events.LogChunk
	if err := logs.Read(context.Background(), echo, nil, func(c events.LogChunk) error {
		got = append(got, c)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Its end mark, unless the line went out on a tick before the end.
	if len(got) == 0 || string(got[0].Data) != "out\n" || len(got) == 2 && (!got[1].EOF || got[1].Offset != 4) || len(got) > 2 {
		t.Fatalf("log of echo = %+v, want its line, then perhaps its end mark at 4", got)
	}
}

func TestARestartedWorkerStopsARunCancelledWhileItWasAway(t *testing.T) {
	t.Parallel()
	b := setup(t)
	state := t.TempDir()
	first := b.startWorker(t, workers.Config{ID: "stable", StateDir: state})
	id := b.arm(t, engine.Spec{Command: "sleep 600", Cwd: t.TempDir()})
	pid := b.waitFor(t, id, 20*time.Second, "started", hasPID).PID
	first.Stop()
	b.cancel(t, id)
	b.startWorker(t, workers.Config{ID: "stable", StateDir: state})
	waitGone(t, 10*time.Second, pid)
	h := b.history(t, id)
	if last := h[len(h)-1]; last.Type != events.TypeCancelled {
		t.Fatalf("history ends with %s, want the cancel", last.Type)
	}
}

func TestTwoWorkersCannotShareAStateDirectory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	state := t.TempDir()
	b.startWorker(t, workers.Config{StateDir: state})
	w := workers.New(b.srv.Conn, b.srv.JS, b.store, workers.Config{StateDir: state, Env: os.Environ()})
	if err := w.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "in use") {
		w.Stop()
		t.Fatalf("a second worker on the same state directory: %v", err)
	}
}

func TestStopOfAWorkerNeverStartedReturns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := workers.New(b.srv.Conn, b.srv.JS, b.store, workers.Config{Env: os.Environ()})
	w.Stop()
	if got := w.Running(); len(got) != 0 {
		t.Errorf("Running() = %q", got)
	}
}

// oddFirst orders lines "1".."9" with the odd ones first.
func oddFirst(line string) int {
	if len(line) == 1 && (line[0]-'0')%2 == 1 {
		return 0
	}
	return 1
}

// A run's first tick, with the command's PID, is written once the command has
// run a second; a command that has ended by then gets none, and its exit
// follows its spawn at once.
func TestTheFirstTickIsLeftOutWhenTheCommandHasEnded(t *testing.T) {
	t.Parallel()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Run("ended", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// The wrapper keeps the shim's output pipe open until the shim has ended, so
		// the worker learns that the command started only after its exit is written.
		b.startWorker(t, workers.Config{Shim: []string{"sh", "-c", `"$0" shim "$@"; exit $?`, self}})
		id := b.arm(t, engine.Spec{Command: "exit 3", Cwd: t.TempDir()})
		st := b.waitFor(t, id, 20*time.Second, "ended", ended)
		if st.Run == nil || st.Run.ExitCode != 3 {
			t.Fatalf("ended %s (%q), want exit 3 recorded", st.Status, st.Reason)
		}
		if got, want := types(b.history(t, id)), []events.Type{events.TypeArmed, events.TypeSpawned, events.TypeExited}; !slices.Equal(got, want) {
			t.Fatalf("history = %v, want %v", got, want)
		}
	})
	t.Run("short", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.startWorker(t, workers.Config{})
		id := b.arm(t, engine.Spec{Command: "sleep 0.1", Cwd: t.TempDir()})
		b.waitFor(t, id, 20*time.Second, "ended", ended)
		if got, want := types(b.history(t, id)), []events.Type{events.TypeArmed, events.TypeSpawned, events.TypeExited}; !slices.Equal(got, want) {
			t.Fatalf("history = %v, want %v", got, want)
		}
	})
	t.Run("running", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.startWorker(t, workers.Config{})
		dir := t.TempDir()
		id := b.arm(t, engine.Spec{Command: "echo $$ > pid; while [ ! -e gate ]; do sleep 0.02; done", Cwd: dir})
		st := b.waitFor(t, id, 20*time.Second, "ticking", func(s engine.State) bool { return s.LastType == events.TypeTick })
		if err := os.WriteFile(filepath.Join(dir, "gate"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		b.waitFor(t, id, 20*time.Second, "ended", ended)
		h := b.history(t, id)
		if got, want := types(h), []events.Type{events.TypeArmed, events.TypeSpawned, events.TypeTick, events.TypeExited}; !slices.Equal(got, want) {
			t.Fatalf("history = %v, want %v", got, want)
		}
		if got, want := payload[*events.Tick](t, h[2]).PID, readPID(t, filepath.Join(dir, "pid")); got != want || st.Seq != h[2].Seq {
			t.Fatalf("first tick's PID = %d, want the command's %d", got, want)
		}
	})
}

// One shim is the parent of all the worker's commands that run at once: no
// process of bgtask's own runs per command. Killed, it loses no run's exit where
// the worker is their subreaper and learns how each ends (elsewhere each is
// lost, once); and the next run goes to a shim started for it.
func TestOneShimRunsAllTheWorkersCommands(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startWorker(t, workers.Config{StateDir: t.TempDir()})
	gate := filepath.Join(t.TempDir(), "go")
	parentOf := func(dir string) int {
		t.Helper()
		var pid int
		testkit.Eventually(t, 20*time.Second, "the command's parent written", func() bool {
			data, err := os.ReadFile(filepath.Join(dir, "ppid"))
			if err != nil || !bytes.HasSuffix(data, []byte("\n")) {
				return false
			}
			pid, err = strconv.Atoi(strings.TrimSpace(string(data)))
			return err == nil
		})
		return pid
	}
	var ids []string
	shims := map[int]bool{}
	for code := range 3 {
		dir := t.TempDir()
		ids = append(ids, b.arm(t, engine.Spec{Command: fmt.Sprintf(`echo $PPID > ppid; while [ ! -e %q ]; do sleep 0.02; done; exit %d`, gate, code+3), Cwd: dir}))
		shims[parentOf(dir)] = true
	}
	if len(shims) != 1 {
		t.Fatalf("the running commands' parents are %v, want one shim", shims)
	}
	for shim := range shims {
		if err := syscall.Kill(shim, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, 10*time.Second, "the killed shim gone", func() bool { return !alive(shim) })
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		st := b.waitFor(t, id, 20*time.Second, "ended", ended)
		switch {
		case !workers.CanAdopt && st.Status != engine.StatusLost:
			t.Errorf("task %d ended %s, want lost: no subreaper here learns how a dead shim's command ends", i, st.Status)
		case workers.CanAdopt && (st.Run == nil || st.Run.ExitCode != i+3):
			t.Errorf("task %d ended %s %+v, want exit code %d", i, st.Status, st.Run, i+3)
		}
	}
	dir := t.TempDir()
	id := b.arm(t, engine.Spec{Command: "echo $PPID > ppid", Cwd: dir})
	if st := b.waitFor(t, id, 20*time.Second, "ended", ended); st.Run == nil || st.Run.ExitCode != 0 {
		t.Fatalf("the run after the shim's death ended %s %+v, want exit code 0", st.Status, st.Run)
	}
	if next := parentOf(dir); shims[next] {
		t.Fatalf("the run after the shim's death ran under the killed shim %d", next)
	}
}

// A task whose command runs and prints nothing costs its worker one goroutine,
// its watch: its output and its exit are looked at when they change, by none
// that waits for them.
func TestAQuietTaskCostsItsWorkerOneGoroutine(t *testing.T) {
	if runtime.GOOS == "darwin" {
		t.Skip("macOS waits for each process's end on a goroutine of its own (kqueue): two a task more")
	}
	b := setup(t)
	b.startWorker(t, workers.Config{TickInterval: time.Hour})
	running := func(s engine.State) bool { return s.PID > 0 }
	// The first task starts what the worker keeps for all (its shim's, its watches').
	first := b.arm(t, engine.Spec{Command: "sleep 600"})
	b.waitFor(t, first, 20*time.Second, "running", running)
	t.Cleanup(func() { b.cancel(t, first) })
	base := runtime.NumGoroutine()
	const tasks = 20
	var ids []string
	for range tasks {
		id := b.arm(t, engine.Spec{Command: "sleep 600"})
		t.Cleanup(func() { b.cancel(t, id) })
		ids = append(ids, id)
	}
	for _, id := range ids {
		b.waitFor(t, id, 20*time.Second, "running", running)
	}
	testkit.Eventually(t, 10*time.Second, fmt.Sprintf("%d quiet tasks more with a goroutine more each, at most", tasks), func() bool {
		return runtime.NumGoroutine()-base <= tasks
	})
}
