// Package bench measures bgtask against its own baselines, side by side in one run
// on one machine: the machines bgtask runs on are shared and noisy, so a figure
// means something only as a ratio to a baseline measured at the same time.
//
// Each scenario starts real `bgtask server` (and `bgtask worker`) processes in a
// temporary home, drives them through their NATS API as any client would, and
// measures the same work done the plainest way (raw JetStream publishes, a Go loop
// of exec.Command) as its baseline. Everything it starts is killed when it ends,
// on an error or Ctrl-C too: the processes, the shims and commands they left
// running, and the temporary homes.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// Options configure a run.
type Options struct {
	// Exe is the bgtask binary the servers and workers run.
	Exe string
	// Connect opens a client connection to the server of a home, as the CLI does.
	Connect func(home string) (*nats.Conn, error)
	// ServerPID is the PID in a home's discovery file, which a server writes once
	// it serves requests. An error means none yet.
	ServerPID func(home string) (int, error)
	// StoreDir is where in a home the server keeps its JetStream store, and
	// SnapshotFile the snapshot of its projection.
	StoreDir     string
	SnapshotFile string
	// Quick runs every scenario at a small size, in well under a minute.
	Quick bool
	// Scenarios to run, by name; none: all.
	Scenarios []string
	// Repeats of each measurement; 0: 2 quick, 3 full.
	Repeats int
	// Progress receives a line per step, for a person watching.
	Progress io.Writer
}

// scenario is one measurement of the issue, with its baseline.
type scenario struct {
	name, title string
	run         func(ctx context.Context, r *runner, s *Scenario) error
}

// scenarios, in the order they run.
var scenarios = []scenario{
	{"register", "register throughput: tasks armed per second through bgtask.register, against synchronous JetStream publishes with a per-subject expected-sequence check", runRegister},
	{"latency", "exit → wake-up latency: from the shim's record of the exit to the wake-up readable in the inbox, against sequential conditional JetStream appends, with and without the output's last chunk published before them", runLatency},
	{"start", "register → command started latency, against a Go loop that starts the same command with exec.Command, and task-spooler's submit → started when it is installed", runStart},
	{"throughput", "end-to-end throughput: tasks running `true` with the worker's default parallelism, against a Go program running the same commands as parallel, and task-spooler (tsp -S 64) when it is installed", runThroughput},
	{"restart", "restart: `bgtask server` start to serving queries on a long stream of finished tasks, against a raw ordered-consumer read of the stream", runRestart},
	{"memory", "concurrency and memory: concurrently running `sleep` commands on one worker, RSS of the worker and its shims, ticks on time; the supervisor's memory per running task, against task-spooler's when it is installed", runMemory},
	{"loginenv", "login environment: starting a task in the user's login environment the worker's way, against `bash -lc true` per task", runLoginEnv},
	{"growth", "stream growth: server memory with many finished tasks in the stream, against an empty server", runGrowth},
	{"timers", "timers: server memory and start with pending timers, against an empty server; how late a burst of timers due in one second fires, against time.AfterFunc", runTimers},
	{"join", "join: server CPU and memory while many members run and one join --all waits for them, against the same server idle and empty; the last member's end to the join's wake-up, against a lone task's end to its own", runJoin},
	{"burst", "burst: server RSS idle, at its peak and once it stops falling after a burst of tasks running `true`, against the same server idle before it and one restarted on the same home", runBurst},
	{"pids", "watched PIDs: server and worker CPU and RSS while processes bgtask did not start are watched, and each end to its wake-up, against as many commands bgtask runs itself", runPIDs},
}

// Names lists the scenarios, in the order they run.
func Names() []string {
	names := make([]string, len(scenarios))
	for i, s := range scenarios {
		names[i] = s.name
	}
	return names
}

// sizes are how much work each scenario does: the sizes, or small ones for
// a quick run.
type sizes struct {
	registers    int // registrations per measurement
	sequential   int // tasks of the latency and start scenarios, per server
	throughput   int // tasks of the throughput scenario
	restartTasks int // finished tasks in the restart scenario's stream
	restartTicks int // ticks per task there: each task has ticks+5 events
	// snapshotEvery is the servers' --snapshot-every there: the default at full size.
	snapshotEvery int
	concurrent    int           // running commands in the memory scenario
	tick          time.Duration // the worker's tick interval there
	watchTicks    int           // tick intervals watched there
	loginShells   int           // `bash -lc true` runs (each takes as long as the profile)
	loginTasks    int           // `bash -c true` runs in the resolved environment
	growthTasks   int           // finished tasks in the growth scenario's stream
	growthTicks   int           // ticks per task there
	settle        time.Duration // how long a server idles before its memory is read again
	timers        int           // pending timers in the timers scenario
	timerBurst    int           // timers due in the same second there
	joinMembers   int           // members of the join scenario's group
	joinWindow    time.Duration // how long its server's CPU is measured
	pids          int           // processes watched by PID in the pids scenario
	pidsWindow    time.Duration // how long their CPU is measured there
	pidsSettle    time.Duration // how long a server idles before each measure there
	burst         int           // tasks of the burst scenario
	burstSettle   burstSettle   // how it reads a settled RSS
}

var (
	fullSizes = sizes{
		registers: 2000, sequential: 1000, throughput: 1000,
		restartTasks: 100_000, restartTicks: 5, snapshotEvery: 100_000,
		concurrent: 1000, tick: 10 * time.Second, watchTicks: 2,
		loginShells: 9, loginTasks: 300,
		growthTasks: 200_000, growthTicks: 2, settle: 30 * time.Second,
		timers: 10_000, timerBurst: 1000,
		joinMembers: 1000, joinWindow: 10 * time.Second,
		pids: 1000, pidsWindow: 10 * time.Second, pidsSettle: 2 * time.Second,
		burst: 10_000, burstSettle: burstSettle{interval: time.Second, quiet: 30, limit: 2 * time.Minute},
	}
	quickSizes = sizes{
		registers: 200, sequential: 20, throughput: 30,
		restartTasks: 2000, restartTicks: 5, snapshotEvery: 10_000,
		concurrent: 20, tick: time.Second, watchTicks: 2,
		loginShells: 1, loginTasks: 20,
		growthTasks: 2000, growthTicks: 2, settle: 2 * time.Second,
		timers: 500, timerBurst: 100,
		joinMembers: 20, joinWindow: 2 * time.Second,
		pids: 20, pidsWindow: time.Second, pidsSettle: 500 * time.Millisecond,
		burst: 100, burstSettle: burstSettle{interval: 200 * time.Millisecond, quiet: 5, limit: 5 * time.Second},
	}
)

// runner holds what the scenarios of one run share: the options, the temporary
// root of their homes, and the servers two scenarios use alike.
type runner struct {
	opts    Options
	size    sizes
	repeats int
	root    string

	shared  map[string]*server    // servers with a worker, by --sync mode
	samples map[string]*seqResult // the sequential tasks of latency and start, by mode
	tsp     string                // the peer's binary, task-spooler's tsp; "" when not installed
	// processStart is the machine's, which each ratio against the peer is
	// printed beside.
	processStart ProcessStart
}

// Run runs the selected scenarios and returns their report. A scenario that fails
// is reported with its error and the others still run; the error says which failed.
func Run(ctx context.Context, opts Options) (*Report, error) {
	if err := supported(); err != nil {
		return nil, err
	}
	for _, name := range opts.Scenarios {
		if !slices.Contains(Names(), name) {
			return nil, fmt.Errorf("%w %q: want some of %s", ErrUnknownScenario, name, strings.Join(Names(), ", "))
		}
	}
	if opts.Progress == nil {
		opts.Progress = io.Discard
	}
	r := &runner{opts: opts, size: fullSizes, repeats: opts.Repeats, shared: map[string]*server{}, samples: map[string]*seqResult{}}
	if opts.Quick {
		r.size = quickSizes
	}
	if r.repeats <= 0 {
		r.repeats = 3
		if opts.Quick {
			r.repeats = 2
		}
	}
	root, err := os.MkdirTemp("", "bgtask-bench-")
	if err != nil {
		return nil, err
	}
	r.root = root
	defer r.cleanup()

	rep := &Report{Quick: opts.Quick, Repeats: r.repeats, Machine: machine(), Started: time.Now().UTC()}
	if r.processStart, err = processStart(ctx); err != nil {
		return nil, err
	}
	rep.Machine.ProcessStart = r.processStart
	rep.Peer = r.findPeer()
	var failed []string
	for _, sc := range scenarios {
		if !r.selected(sc.name) {
			continue
		}
		if ctx.Err() != nil {
			break
		}
		r.progress("%s: starting", sc.name)
		s := Scenario{Name: sc.name, Title: sc.title}
		// The load of a shared machine changes within a run: each scenario says
		// what it ran under.
		s.param("load_average", loadAverage())
		start := time.Now()
		err := sc.run(ctx, r, &s)
		s.Seconds = time.Since(start).Seconds()
		if err != nil {
			s.Error = err.Error()
			failed = append(failed, sc.name)
			r.progress("%s: failed: %v", sc.name, err)
		}
		for _, row := range s.Rows {
			line := fmt.Sprintf("%s: %s: %s %s", sc.name, row.Name, num(row.Bgtask.Median), row.Unit)
			if row.Ratio != nil {
				line += fmt.Sprintf(" (%s: %s, ratio %s)", row.Against, num(row.Baseline.Median), num(*row.Ratio))
			}
			if row.Peer != nil && row.Peer.Ratio != nil {
				line += fmt.Sprintf(" (peer: %s, ratio %s)", num(row.Peer.Stat.Median), num(*row.Peer.Ratio))
			}
			r.progress("%s", line)
		}
		rep.Scenarios = append(rep.Scenarios, s)
		r.releaseShared(sc.name)
	}
	rep.Seconds = time.Since(rep.Started).Seconds()
	rep.Machine.LoadAfter = loadAverage()
	if ctx.Err() != nil {
		return rep, errors.New("interrupted: every process the bench started is stopped and its temporary homes removed")
	}
	if len(failed) > 0 {
		return rep, fmt.Errorf("%d scenario(s) failed: %s", len(failed), strings.Join(failed, ", "))
	}
	return rep, nil
}

// findPeer looks for the peer when a scenario that runs it is selected, and
// returns the report's line about it.
func (r *runner) findPeer() string {
	var withPeer []string
	for _, name := range []string{"start", "throughput", "memory"} {
		if r.selected(name) {
			withPeer = append(withPeer, name)
		}
	}
	if len(withPeer) == 0 {
		return ""
	}
	r.tsp, _ = exec.LookPath("tsp")
	return peerNote(r.tsp, withPeer)
}

// selected says whether the run measures the scenario of that name.
func (r *runner) selected(name string) bool {
	return len(r.opts.Scenarios) == 0 || slices.Contains(r.opts.Scenarios, name)
}

func (r *runner) progress(format string, args ...any) {
	fmt.Fprintf(r.opts.Progress, "bench: "+format+"\n", args...)
}

// newHome makes a temporary home for one server.
func (r *runner) newHome(name string) (string, error) {
	return os.MkdirTemp(r.root, name+"-")
}

// cleanup stops every server, kills whatever they left running and removes the
// homes.
func (r *runner) cleanup() {
	r.stopShared()
	if err := sweep(r.root); err != nil {
		r.progress("cleanup: %v", err)
	}
	if err := os.RemoveAll(r.root); err != nil {
		r.progress("cleanup: %v", err)
	}
}

// releaseShared stops the shared servers once no scenario still to run needs
// them, so they cost nothing while the others measure.
func (r *runner) releaseShared(after string) {
	later := false
	for _, sc := range scenarios[slices.IndexFunc(scenarios, func(s scenario) bool { return s.name == after })+1:] {
		if usesShared(sc.name) && r.selected(sc.name) {
			later = true
		}
	}
	if !later {
		r.stopShared()
	}
}

func (r *runner) stopShared() {
	for mode, s := range r.shared {
		s.stop()
		delete(r.shared, mode)
	}
}

func usesShared(name string) bool {
	return name == "latency" || name == "start" || name == "throughput"
}

// ErrUnknownScenario: a scenario asked for by a name that is not one.
var ErrUnknownScenario = errors.New("unknown scenario")

// processStart measures what a start of bash -c true costs on this machine.
func processStart(ctx context.Context) (ProcessStart, error) {
	wall, cpu, err := startCost(ctx, 21, "bash", "-c", "true")
	if err != nil {
		return ProcessStart{}, fmt.Errorf("measure a process start: %w", err)
	}
	return ProcessStart{CPU: summarize(cpu, false).Median, Wall: summarize(wall, false).Median}, nil
}
