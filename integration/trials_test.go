package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/testkit"
)

// Randomised fault trials. Each trial starts a real server (and, in half of them,
// separate worker processes), registers a handful of real commands that end with
// exit codes chosen by the trial (some hostile: floods of control bytes, a tail of
// 2 MB, a prompt that names the tail thousands of times), injects one fault at a
// random moment while they run (a kill, a crash point, a disk that fills and has
// room again), restarts what it killed, and checks the invariants from outside: no
// lost exit, no double fire, no task stuck, no process left behind, and a clean
// audit.
//
// The trial count, the seed and how many trials run at once come from the
// environment, so a failure can be replayed:
//
//	BGTASK_FAULT_TRIALS=500 go test -race -run TestFaultTrials ./integration
//	BGTASK_FAULT_SEED=1234 BGTASK_FAULT_TRIALS=1 go test -race -run TestFaultTrials ./integration
//
// Trial i of a run with seed S has seed S+i, and its plan (topology, fault, its
// timing, the commands) follows from its seed alone; the fault is the seed's
// modulo the number of faults, so every run of as many trials injects each.
const (
	trialsEnv   = "BGTASK_FAULT_TRIALS"
	seedEnv     = "BGTASK_FAULT_SEED"
	parallelEnv = "BGTASK_FAULT_PARALLEL"

	defaultTrials   = 30
	defaultParallel = 2
)

func envInt(t *testing.T, name string, def int64) int64 {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a number", name, v)
	}
	return n
}

func TestFaultTrials(t *testing.T) {
	t.Parallel()
	trials := envInt(t, trialsEnv, defaultTrials)
	seed := envInt(t, seedEnv, time.Now().UnixNano()%1_000_000_000)
	parallel := max(1, envInt(t, parallelEnv, defaultParallel))
	t.Logf("%d fault trials from seed %d, %d at a time (replay one: %s=<its seed> %s=1)", trials, seed, parallel, seedEnv, trialsEnv)
	// The trials run side by side, parallel at a time, in the one slot of go test's
	// -parallel this test takes. Each starts a dozen race-built processes; more than
	// two at a time on two cores is no faster, and slows the package's other tests.
	slots := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for i := range trials {
		trialSeed := uint64(seed + i)
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			t.Run(fmt.Sprintf("seed=%d", trialSeed), func(t *testing.T) { runTrial(t, trialSeed) })
		}()
	}
	wg.Wait()
}

// The faults a trial injects.
type fault string

const (
	faultServerKill      fault = "server-sigkill"
	faultServerTerm      fault = "server-sigterm"
	faultWorkerKill      fault = "worker-sigkill"
	faultWorkerTerm      fault = "worker-sigterm"
	faultWorkerKillTwice fault = "worker-sigkill-twice"
	faultWorkerGone      fault = "worker-gone-past-its-lease"
	faultEverything      fault = "server-and-workers-sigkill"
	faultCrash           fault = "crash-point"
	faultShimKill        fault = "shim-sigkill"
	faultDiskFull        fault = "disk-full-and-freed"
)

var allFaults = []fault{
	faultServerKill, faultServerTerm, faultWorkerKill, faultWorkerTerm, faultWorkerKillTwice,
	faultWorkerGone, faultEverything, faultCrash, faultShimKill, faultDiskFull,
}

// needsWorkers: the fault is to a worker process of its own.
func (f fault) needsWorkers() bool {
	return f == faultWorkerKill || f == faultWorkerTerm || f == faultWorkerKillTwice || f == faultWorkerGone
}

var crashPoints = []string{engine.CrashAfterSpawn, engine.CrashBeforeExitSave, engine.CrashAfterPersist, engine.CrashAfterDeliver}

// What a trial's command does.
type taskKind string

const (
	exitsWithCode taskKind = "exit"           // waits for its gate, exits with its code
	killsItself   taskKind = "kill-TERM-self" // waits for its gate, kill -TERM $$
	leavesOrphan  taskKind = "orphan"         // setsid sleep 600 &, waits, exits with its code
	splitsItsLine taskKind = "split-line"     // half its completion line, waits, the rest; never exits
	ignoresTerm   taskKind = "ignores-TERM"   // waits, prints its completion line; only KILL stops it
	hitsDeadline  taskKind = "deadline"       // never ends; its deadline stops it
	// The hostile ones: each once took every event or wake-up of its task over the
	// NATS payload limit, or the server's memory, and its task never fired.
	floodsControl taskKind = "control-flood" // 60 lines of 2,000 \001 bytes, waits, exits with its code
	floodsTail    taskKind = "tail-flood"    // result tail:1000 of 1,000 lines of 2,000 bytes, waits, exits
	amplifies     taskKind = "amplify"       // prompt {{tail}} x7,500 over 50 lines of 2,000 bytes, waits, exits
)

var allKinds = []taskKind{exitsWithCode, exitsWithCode, killsItself, leavesOrphan, splitsItsLine, ignoresTerm, hitsDeadline,
	floodsControl, floodsTail, amplifies}

// exits reports whether the command ends by itself once its gate opens.
func (k taskKind) exits() bool {
	switch k {
	case exitsWithCode, killsItself, leavesOrphan, floodsControl, floodsTail, amplifies:
		return true
	}
	return false
}

// exitsWithItsCode reports whether the command's exit code is the task's code.
func (k taskKind) exitsWithItsCode() bool { return k.exits() && k != killsItself }

// gated reports whether the command waits for its gate.
func (k taskKind) gated() bool { return k != hitsDeadline }

// When a task's gate opens, relative to the fault.
type release string

const (
	beforeFault  release = "before"
	whileDown    release = "down"
	afterRestart release = "after"
)

type trialTask struct {
	kind    taskKind
	code    int
	release release
	onLost  string
	late    bool // disk-full: registered while the disk is full
}

type trialPlan struct {
	seed       uint64
	fault      fault
	crashPoint string
	workers    int // separate worker processes; 0: the server's own worker
	leaseTTL   time.Duration
	before     time.Duration // from registration to the release of the "before" gates
	settle     time.Duration // from there to the fault
	again      time.Duration // worker-sigkill-twice: from the restart to the second kill
	shimTarget int           // shim-sigkill: the task whose shim is killed
	disk       diskPart      // disk-full: the part of the home on a tmpfs
	full       time.Duration // disk-full: from the "down" commands' end to the disk freed
	tasks      []trialTask
}

func planTrial(seed uint64) trialPlan {
	r := rand.New(rand.NewPCG(seed, 0x62677461736b))
	// The default lease: a worker's restart must never outlast it, on a busy machine too.
	p := trialPlan{seed: seed, shimTarget: -1, leaseTTL: time.Minute}
	// Every fault in every run of len(allFaults) trials or more.
	p.fault = allFaults[seed%uint64(len(allFaults))]
	if p.fault.needsWorkers() || r.IntN(2) == 0 {
		p.workers = 1 + r.IntN(2)
	}
	if p.fault == faultCrash {
		p.crashPoint = crashPoints[r.IntN(len(crashPoints))]
		switch {
		case p.crashPoint == engine.CrashAfterSpawn:
			p.workers = 1 // a process of its own, started after the tasks are registered
		case p.workers > 0 && strings.HasPrefix(p.crashPoint, "worker-"):
			p.workers = 1 // the one worker that crashes must be the one that runs tasks
		}
	}
	if p.fault == faultWorkerGone {
		p.leaseTTL = 5 * time.Second
	}
	p.before = time.Duration(r.IntN(800)) * time.Millisecond
	p.settle = time.Duration(r.IntN(800)) * time.Millisecond
	p.again = time.Duration(r.IntN(600)) * time.Millisecond
	for range 3 + r.IntN(4) {
		tk := trialTask{
			kind:    allKinds[r.IntN(len(allKinds))],
			release: []release{beforeFault, whileDown, afterRestart}[r.IntN(3)],
			onLost:  []string{engine.OnLostFail, engine.OnLostRespawn}[r.IntN(2)],
		}
		if r.IntN(4) > 0 {
			tk.code = 1 + r.IntN(120)
		}
		p.tasks = append(p.tasks, tk)
	}
	switch p.fault {
	case faultCrash:
		// Something must reach the crash point: a command that ends at once.
		p.tasks[0] = trialTask{kind: exitsWithCode, code: p.tasks[0].code, release: beforeFault, onLost: engine.OnLostFail}
	case faultShimKill:
		// Its gate stays shut until after the kill: the command runs on when its
		// shim dies, most often with a process in a session of its own, and its
		// worker records its exit and then stops what it left.
		p.shimTarget = r.IntN(len(p.tasks))
		kind := leavesOrphan
		if r.IntN(4) == 0 {
			kind = exitsWithCode
		}
		p.tasks[p.shimTarget].kind, p.tasks[p.shimTarget].release = kind, afterRestart
	case faultDiskFull:
		p.planDisk(r)
	}
	return p
}

func (p trialPlan) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "fault %s", p.fault)
	if p.crashPoint != "" {
		fmt.Fprintf(&b, " at %s", p.crashPoint)
	}
	if p.shimTarget >= 0 {
		fmt.Fprintf(&b, " of task %d", p.shimTarget)
	}
	if p.disk != "" {
		fmt.Fprintf(&b, " of the %s, full for %s", p.disk, p.full)
	}
	if p.workers == 0 {
		b.WriteString("; the server's own worker")
	} else {
		fmt.Fprintf(&b, "; %d worker processes", p.workers)
	}
	fmt.Fprintf(&b, "; lease %s; before %s, settle %s", p.leaseTTL, p.before, p.settle)
	if p.fault == faultWorkerKillTwice {
		fmt.Fprintf(&b, ", again %s", p.again)
	}
	b.WriteString("; tasks:")
	for i, tk := range p.tasks {
		fmt.Fprintf(&b, " %d=%s", i, tk.kind)
		if tk.kind.exitsWithItsCode() {
			fmt.Fprintf(&b, "(%d)", tk.code)
		}
		fmt.Fprintf(&b, "/%s/%s", tk.release, tk.onLost)
		if tk.late {
			b.WriteString("/late")
		}
	}
	return b.String()
}

// trial is one trial being run.
type trial struct {
	t       *testing.T
	plan    trialPlan
	home    string
	dir     string // the commands' working directory: their pid files and gates
	server  *proc
	workers []*proc
	ids     []string
	began   time.Time
}

// step logs how far the trial got, for a failure's output.
func (tr *trial) step(what string) {
	tr.t.Helper()
	tr.t.Logf("%6.2fs %s", time.Since(tr.began).Seconds(), what)
}

func runTrial(t *testing.T, seed uint64) {
	p := planTrial(seed)
	t.Logf("seed %d: %s", seed, p)
	tr := &trial{t: t, plan: p, home: t.TempDir(), dir: t.TempDir(), workers: make([]*proc, p.workers), began: time.Now()}
	t.Cleanup(func() {
		tr.killCommands()
		if t.Failed() {
			t.Logf("replay: %s=%d %s=1 go test -race -run TestFaultTrials ./integration\nplan: %s", seedEnv, seed, trialsEnv, p)
		}
	})
	for i := range p.tasks {
		makeGate(t, tr.dir, gateName(i))
	}
	var serverEnv, workerEnv []string
	if p.fault == faultCrash {
		env := []string{engine.CrashEnv + "=" + p.crashPoint}
		if tr.serverCrashes() {
			serverEnv = env
		} else {
			workerEnv = env
		}
	}
	if p.disk != "" {
		mountTmpfs(t, tr.diskDir(), diskBytes)
	}
	tr.startServer(serverEnv)
	tr.step("server started")
	nc, _ := connect(t, tr.home)
	for i, tk := range p.tasks {
		id := ""
		if !tk.late {
			id = tr.register(nc, i)
		}
		tr.ids = append(tr.ids, id)
	}
	nc.Close()
	// Workers come after the tasks: a worker that crashes at its first spawn must
	// not take the server's answer to a registration with it.
	for i := range tr.workers {
		tr.startWorker(i, workerEnv)
	}
	// The fault's clock starts once the workers are connected: one still starting
	// when its server goes away would only fail to start.
	// A server whose crash point is in its dispatcher may reach it first: a task whose
	// deadline passes before a slow worker's start is ended, and delivered, without
	// one. The worker then starts once inject has restarted the server (again, if it
	// gave up).
	var serverCrashed <-chan struct{}
	if tr.serverCrashes() {
		serverCrashed = tr.server.done
	}
	for _, w := range tr.workers {
		testkit.Eventually(t, 60*time.Second, "a worker started", func() bool {
			select {
			case <-w.done: // a crash point at its first spawn
				return true
			case <-serverCrashed:
				return true
			default:
				return strings.Contains(w.out.String(), "worker started")
			}
		})
	}
	tr.step("workers started")

	// The fault comes at a random moment while the commands run: random pauses
	// place it, they wait for nothing.
	time.Sleep(p.before)
	tr.open(beforeFault)
	time.Sleep(p.settle)
	tr.step("fault")
	tr.inject()
	tr.step("restarted")
	tr.open(afterRestart)
	tr.check()
}

// serverCrashes: the crash point is in the server process, not in a worker's.
func (tr *trial) serverCrashes() bool {
	return tr.plan.workers == 0 || strings.HasPrefix(tr.plan.crashPoint, "dispatcher-")
}

func (tr *trial) path(name string, i int) string {
	return filepath.Join(tr.dir, name+"."+strconv.Itoa(i))
}

func gateName(i int) string { return "gate" + strconv.Itoa(i) }

// spec is task i's spec. Every command appends "$$ $PPID" (its shell and its
// shim) to pids.N, and most wait for their gate.
func (tr *trial) spec(i int) map[string]any {
	tk := tr.plan.tasks[i]
	n := strconv.Itoa(i)
	pids := `echo $$ $PPID >> pids.` + n + `; `
	gate := gate(gateName(i))
	spec := map[string]any{"cwd": tr.dir, "on_lost": tk.onLost}
	if tk.late {
		spec["idempotency_key"] = "late-" + n // a refusal for a full disk may come for a task stored all the same
	}
	switch tk.kind {
	case exitsWithCode:
		spec["command"] = pids + `echo start ` + n + `; ` + gate + `echo end ` + n + `; exit ` + strconv.Itoa(tk.code)
	case killsItself:
		spec["command"] = pids + gate + `kill -TERM $$`
	case leavesOrphan:
		spec["command"] = pids + `setsid sleep 600 & echo $! >> orphans.` + n + `; ` + gate + `exit ` + strconv.Itoa(tk.code)
	case splitsItsLine:
		spec["command"] = pids + `printf '{"done":'; ` + gate + `printf ' true, "task": ` + n + `}\n'; exec sleep 600`
		spec["completion"] = map[string]any{"type": "json_line", "match": map[string]any{"done": true}}
	case ignoresTerm:
		spec["command"] = `trap '' TERM; ` + pids + gate + `echo MATCH ` + n + `; exec sleep 600`
		spec["completion"] = map[string]any{"type": "line_pattern", "regex": "^MATCH " + n + "$"}
	case hitsDeadline:
		spec["command"] = pids + `exec sleep 600`
		spec["deadline"] = "3s"
	case floodsControl:
		spec["command"] = pids + `for i in $(seq 60); do head -c 2000 /dev/zero | tr '\0' '\001'; echo; done; ` + gate + `exit ` + strconv.Itoa(tk.code)
	case floodsTail:
		spec["command"] = pids + `yes "$(printf '%2000s' | tr ' ' t)" | head -n 1000; ` + gate + `exit ` + strconv.Itoa(tk.code)
		spec["result"] = map[string]any{"type": "tail", "lines": 1000}
	case amplifies:
		spec["command"] = pids + `yes "$(printf '%2000s' | tr ' ' a)" | head -n 50; ` + gate + `exit ` + strconv.Itoa(tk.code)
		spec["prompt"] = strings.Repeat("{{tail}}", amplifiedTails)
	}
	return spec
}

// amplifiedTails is how many times an amplifying prompt names the tail: a spec
// just under the 64 KiB limit, a prompt of 750 MB if it were rendered whole.
const amplifiedTails = 7500

// register registers task i and returns its id; "" for an amplifying prompt
// refused for its prompt, which registration may do instead of cutting it.
func (tr *trial) register(nc *nats.Conn, i int) string {
	t := tr.t
	t.Helper()
	if tr.plan.tasks[i].kind != amplifies {
		return register(t, nc, tr.spec(i))
	}
	data, err := json.Marshal(tr.spec(i))
	if err != nil {
		t.Fatal(err)
	}
	msg, err := nc.Request("bgtask.register", data, 30*time.Second)
	if err != nil {
		t.Fatalf("register task %d: %v", i, err)
	}
	var reply struct {
		ID    string
		Error *struct {
			Code  int
			Field string
		}
	}
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		t.Fatalf("register task %d: %s", i, msg.Data)
	}
	switch {
	case reply.ID != "":
		return reply.ID
	case reply.Error != nil && reply.Error.Code == 400 && reply.Error.Field == "prompt":
		tr.step(fmt.Sprintf("task %d refused: %s", i, msg.Data))
		return ""
	}
	t.Fatalf("register task %d: %s", i, msg.Data)
	return ""
}

func (tr *trial) startServer(env []string) {
	args := []string{"--kill-grace", "1s", "--lease-ttl", tr.plan.leaseTTL.String()}
	if tr.plan.workers > 0 {
		args = append(args, "--no-worker")
	}
	tr.server = startServerEnv(tr.t, tr.home, env, args...)
}

func (tr *trial) startWorker(i int, env []string) {
	tr.workers[i] = startEnv(tr.t, tr.home, env, "worker", "--worker-id", workerID(i), "--tick", "200ms", "--kill-grace", "1s")
}

func workerID(i int) string { return "w" + strconv.Itoa(i) }

// open opens the gates of the tasks released at r.
func (tr *trial) open(r release) []int {
	var opened []int
	for i, tk := range tr.plan.tasks {
		if tk.release == r && tk.kind.gated() {
			openGate(tr.t, tr.dir, gateName(i))
			opened = append(opened, i)
		}
	}
	return opened
}

// openWhileDown opens the "down" gates (those i with i%parts == part) and waits
// until the commands that started have ended: they end while nothing watches
// them.
func (tr *trial) openWhileDown(part, parts int) {
	var mine []int
	for _, i := range tr.open(whileDown) {
		if i%parts == part {
			mine = append(mine, i)
		}
	}
	for _, i := range mine {
		if !tr.plan.tasks[i].kind.exits() {
			continue
		}
		// A shim whose run is over keeps the worker's other runs, and has let go
		// of this task's run directory.
		for _, run := range tr.runs(i) {
			command, shim := run[0], run[1]
			testkit.Eventually(tr.t, 30*time.Second, fmt.Sprintf("task %d's command ended after its gate opened", i), func() bool {
				return processGone(command) && (processGone(shim) || !holdsFileOf(shim, "/runs/"+tr.ids[i]+"-"))
			})
		}
	}
}

// inject applies the plan's fault and restarts what it stopped.
func (tr *trial) inject() {
	t, p := tr.t, tr.plan
	switch p.fault {
	case faultServerKill, faultServerTerm:
		sig := syscall.SIGKILL
		if p.fault == faultServerTerm {
			sig = syscall.SIGTERM
		}
		tr.server.stop(sig)
		tr.openWhileDown(0, 1)
		tr.startServer(nil)
	case faultWorkerKill, faultWorkerTerm:
		sig := syscall.SIGKILL
		if p.fault == faultWorkerTerm {
			sig = syscall.SIGTERM
		}
		tr.workers[0].stop(sig)
		tr.openWhileDown(0, 1)
		tr.startWorker(0, nil)
	case faultWorkerKillTwice:
		tr.workers[0].stop(syscall.SIGKILL)
		tr.openWhileDown(0, 2)
		tr.startWorker(0, nil)
		time.Sleep(p.again) // before, during or after it finds its runs again
		tr.workers[0].stop(syscall.SIGKILL)
		tr.openWhileDown(1, 2)
		tr.startWorker(0, nil)
	case faultEverything:
		tr.server.signal(syscall.SIGKILL)
		for _, w := range tr.workers {
			w.signal(syscall.SIGKILL)
		}
		tr.server.stop(syscall.SIGKILL)
		for _, w := range tr.workers {
			w.stop(syscall.SIGKILL)
		}
		tr.openWhileDown(0, 1)
		tr.startServer(nil)
		for i := range tr.workers {
			tr.startWorker(i, nil)
		}
	case faultCrash:
		crashing := tr.server
		if !tr.serverCrashes() {
			crashing = tr.workers[0]
		}
		select {
		case <-crashing.done:
		case <-time.After(60 * time.Second):
			t.Fatalf("nothing crashed at %s", p.crashPoint)
		}
		tr.openWhileDown(0, 1)
		if crashing == tr.server {
			tr.startServer(nil)
			// A worker that gave up on the server before it started (the crash point
			// came first) starts again.
			for i, w := range tr.workers {
				select {
				case <-w.done:
					tr.startWorker(i, nil)
				default:
				}
			}
		} else {
			tr.startWorker(0, nil)
		}
	case faultShimKill:
		i := p.shimTarget
		_, shim := waitPIDPair(t, tr.path("pids", i))
		if err := syscall.Kill(shim, syscall.SIGKILL); err != nil {
			t.Fatalf("kill the shim of task %d: %v", i, err)
		}
		testkit.Eventually(t, 30*time.Second, fmt.Sprintf("the shim of task %d gone", i), func() bool { return processGone(shim) })
		tr.openWhileDown(0, 1)
	case faultWorkerGone:
		gone := tr.workers[0]
		gone.stop(syscall.SIGKILL)
		tr.openWhileDown(0, 1)
		// Past its lease, every task it held is lost; then it comes back, fenced.
		tr.follow(60*time.Second, "the gone worker's tasks were not lost", func(sums map[string]*taskSummary) bool {
			for _, s := range sums {
				if s.owner == workerID(0) {
					return false
				}
			}
			return true
		})
		tr.startWorker(0, nil)
	case faultDiskFull:
		tr.fillAndFree()
	}
}

// runs are the command and the shim of each run of task i, a line each of
// pids.N ("$$ $PPID").
func (tr *trial) runs(i int) [][2]int { return pidPairs(tr.path("pids", i)) }

// commands are the commands of task i's runs.
func (tr *trial) commands(i int) []int {
	var out []int
	for _, run := range tr.runs(i) {
		out = append(out, run[0])
	}
	return out
}

// orphans are the processes task i's commands left on purpose, a line each of
// orphans.N.
func (tr *trial) orphans(i int) []int {
	var out []int
	data, _ := os.ReadFile(tr.path("orphans", i))
	for _, f := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// killOrphans ends what task i's commands left on purpose.
func (tr *trial) killOrphans(i int) { killAll(tr.orphans(i)) }

// killCommands ends whatever a failed trial left: its commands and their
// orphans. A shim ends once its worker is gone and its commands have ended.
func (tr *trial) killCommands() {
	for i := range tr.plan.tasks {
		tr.killOrphans(i)
		killAll(tr.commands(i))
	}
}

// killAll kills the processes of pids that are still there.
func killAll(pids []int) {
	for _, pid := range pids {
		if !processGone(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// taskSummary is what the event log says of one task.
type taskSummary struct {
	n      map[events.Type]int
	types  []events.Type
	owner  string // the worker whose run is going, if any
	wakeup *events.Wakeup
	lost   []events.Lost
	err    error
}

// follow folds the event log into a summary per task as it grows, until done holds
// for them (looked at from the log's end when follow began); past the bound it
// fails the trial with what. The server must be up.
func (tr *trial) follow(within time.Duration, what string, done func(map[string]*taskSummary) bool) map[string]*taskSummary {
	t := tr.t
	t.Helper()
	_, js := connect(t, tr.home)
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	store, err := events.ConnectStore(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	last, err := store.LastSeq(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sums := map[string]*taskSummary{}
	reached := false
	err = store.Follow(ctx, "", 0, func(rec events.Record, err error) bool {
		s := sums[rec.TaskID]
		if s == nil {
			s = &taskSummary{n: map[events.Type]int{}}
			sums[rec.TaskID] = s
		}
		if err != nil {
			s.err = err
			return true
		}
		s.add(rec)
		reached = rec.Seq >= last && done(sums)
		return !reached
	})
	if !reached {
		tr.fail(sums, fmt.Sprintf("%s (after %v: %v)", what, within, err))
	}
	return sums
}

// add folds one event into the summary.
func (s *taskSummary) add(rec events.Record) {
	s.n[rec.Type]++
	s.types = append(s.types, rec.Type)
	payload, err := rec.Decode()
	if err != nil {
		s.err = err
		return
	}
	switch p := payload.(type) {
	case *events.Spawned:
		s.owner = rec.Writer
	case *events.Exited, *events.Failed, *events.Cancelled:
		s.owner = ""
	case *events.Lost:
		s.owner = ""
		s.lost = append(s.lost, *p)
	case *events.CompletionPersisted:
		w := p.Wakeup
		s.wakeup = &w
	}
}

// check waits for every task to fire and checks what the trial promises.
func (tr *trial) check() {
	t := tr.t
	sums := tr.follow(90*time.Second, "stuck: not every task fired", func(sums map[string]*taskSummary) bool {
		for _, id := range tr.ids {
			if s := sums[id]; id != "" && (s == nil || s.n[events.TypeFired] == 0) {
				return false
			}
		}
		return true
	})
	tr.step("all fired")
	var problems []string
	registered := 0
	for i, id := range tr.ids {
		if id == "" {
			continue
		}
		registered++
		if err := tr.checkTask(i, sums[id]); err != nil {
			problems = append(problems, fmt.Sprintf("task %d (%s, %s): %v", i, tr.plan.tasks[i].kind, id, err))
		}
	}
	if len(problems) > 0 {
		tr.fail(sums, strings.Join(problems, "\n"))
	}
	for i := range tr.plan.tasks {
		// The commands, not their shims ($PPID in pids), which live as long as their
		// workers. Without a subreaper (bgtask_portable, as on macOS) an orphan in a
		// session of its own outlives a command that exited (docs/platforms.md): only
		// the commands and their groups must be gone, and the trial ends the orphans.
		left := tr.commands(i)
		if portableEnabled {
			defer tr.killOrphans(i)
		} else {
			left = append(left, tr.orphans(i)...)
		}
		for _, pid := range left {
			testkit.Eventually(t, 30*time.Second, fmt.Sprintf("process %d of task %d gone (seed %d)", pid, i, tr.plan.seed),
				func() bool { return processGone(pid) })
		}
	}
	tr.step("no process left")
	r := run(t, tr.home, "audit", "--json")
	report := decodeJSON[struct {
		Fired      int   `json:"fired"`
		Open       []any `json:"open"`
		Violations []any `json:"violations"`
	}](t, r.stdout)
	if r.code != 0 || report.Fired != registered || len(report.Open) != 0 || len(report.Violations) != 0 {
		tr.fail(sums, fmt.Sprintf("audit (exit %d):\n%s%s", r.code, r.stdout, r.stderr))
	}
	tr.step("audit clean")
}

func (tr *trial) fail(sums map[string]*taskSummary, msg string) {
	tr.t.Helper()
	var b strings.Builder
	for i, id := range tr.ids {
		if s := sums[id]; s != nil {
			fmt.Fprintf(&b, "\n  task %d %s: %v", i, id, s.types)
			if s.wakeup != nil {
				data, _ := json.Marshal(s.wakeup)
				fmt.Fprintf(&b, "\n    wake-up %s", data)
			}
		}
	}
	tr.t.Fatalf("seed %d (%s):\n%s\nhistories:%s", tr.plan.seed, tr.plan, msg, b.String())
}

// checkTask checks one fired task against what its command did and what the fault
// may do to it.
func (tr *trial) checkTask(i int, s *taskSummary) error {
	tk := tr.plan.tasks[i]
	if s.err != nil {
		return s.err
	}
	if s.n[events.TypeFired] != 1 || s.n[events.TypeCompletionPersisted] != 1 {
		return fmt.Errorf("%d completion-persisted and %d fired, want one each", s.n[events.TypeCompletionPersisted], s.n[events.TypeFired])
	}
	w := s.wakeup
	if tk.late && tr.plan.runsOnDisk() && w.Status == engine.StatusFailed && noSpace(w.Reason) {
		// Taken while the disk of its run was full: its run could not be written,
		// and it failed to start, which is what it says.
		if s.n[events.TypeSpawned] != 1 || s.n[events.TypeFailed] != 1 || s.n[events.TypeExited] != 0 || len(s.lost) > 0 {
			return fmt.Errorf("failed to start for a full disk after %d spawned, %d failed, %d exited and %d lost, want one spawned and one failed",
				s.n[events.TypeSpawned], s.n[events.TypeFailed], s.n[events.TypeExited], len(s.lost))
		}
		return nil
	}
	if len(s.lost) > 1 || len(s.lost) == 1 && !tr.mayLose(i, s.lost[0]) {
		return fmt.Errorf("lost %d times (%+v); the fault may lose %s", len(s.lost), s.lost, tr.mayLoseWhat())
	}
	if tk.kind == hitsDeadline && (tk.onLost == engine.OnLostRespawn || len(s.lost) == 0) {
		// Its deadline ends it whether a worker takes it in time or not (workers
		// start after the tasks; a lost run is armed again).
		if w.Status != engine.StatusTimedOut || s.n[events.TypeExited]+s.n[events.TypeFailed] != 1 {
			return fmt.Errorf("status %s (%s) after %d exited and %d failed, want timed_out once", w.Status, w.Reason, s.n[events.TypeExited], s.n[events.TypeFailed])
		}
		return nil
	}
	if len(s.lost) > 0 {
		if tk.onLost == engine.OnLostFail {
			if w.Status != engine.StatusLost || s.n[events.TypeExited] != 0 {
				return fmt.Errorf("lost with on_lost fail: status %s with %d exited, want lost and none", w.Status, s.n[events.TypeExited])
			}
			if tr.plan.fault == faultShimKill && !strings.Contains(w.Reason, "shim") {
				return fmt.Errorf("lost when its shim was killed, but the reason says %q", w.Reason)
			}
			return nil
		}
		if s.n[events.TypeSpawned] != 2 {
			return fmt.Errorf("lost with on_lost respawn: %d spawned, want 2", s.n[events.TypeSpawned])
		}
	} else if s.n[events.TypeSpawned] != 1 {
		return fmt.Errorf("%d spawned, want 1", s.n[events.TypeSpawned])
	}
	if s.n[events.TypeExited] != 1 {
		return fmt.Errorf("%d exited, want 1 (failed: %d)", s.n[events.TypeExited], s.n[events.TypeFailed])
	}
	code := func(want int, signal string) error {
		if w.ExitCode == nil || *w.ExitCode != want || w.Signal != signal {
			got := "none"
			if w.ExitCode != nil {
				got = strconv.Itoa(*w.ExitCode)
			}
			return fmt.Errorf("wake-up says exit %s signal %q (%s), the command exited %d signal %q", got, w.Signal, w.Status, want, signal)
		}
		status := engine.StatusFailed
		if want == 0 {
			status = engine.StatusSucceeded
		}
		if w.Status != status {
			return fmt.Errorf("status %s, want %s", w.Status, status)
		}
		return nil
	}
	switch tk.kind {
	case exitsWithCode, leavesOrphan, floodsControl, floodsTail:
		return code(tk.code, "")
	case amplifies:
		if err := code(tk.code, ""); err != nil {
			return err
		}
		// Output printed while the disk of its run is full is lost: the prompt may
		// be short.
		if len(w.Prompt) > 256<<10 || !tr.plan.runsOnDisk() && !strings.HasSuffix(w.Prompt, "cut to fit bgtask's byte budget]") {
			return fmt.Errorf("an amplifying prompt of %d bytes ending %q, want one cut to fit the budget", len(w.Prompt), w.Prompt[max(0, len(w.Prompt)-80):])
		}
	case killsItself:
		return code(143, "TERM")
	case splitsItsLine, ignoresTerm:
		want := fmt.Sprintf(`{"done": true, "task": %d}`, i)
		if tk.kind == ignoresTerm {
			want = fmt.Sprintf("MATCH %d", i)
		}
		if w.Status != engine.StatusSucceeded || w.MatchedLine != want {
			return fmt.Errorf("status %s (%s) with matched line %q, want succeeded with %q", w.Status, w.Reason, w.MatchedLine, want)
		}
	case hitsDeadline:
		if w.Status != engine.StatusTimedOut {
			return fmt.Errorf("status %s (%s), want timed_out", w.Status, w.Reason)
		}
	}
	return nil
}

// mayLoseWhat says what the trial's fault may make lost, for a failure.
func (tr *trial) mayLoseWhat() string {
	switch tr.plan.fault {
	case faultShimKill:
		if portableEnabled {
			return fmt.Sprintf("each task the shim of task %d kept once (the shim is killed)", tr.plan.shimTarget)
		}
		return fmt.Sprintf("each task the shim of task %d was starting when it was killed, once", tr.plan.shimTarget)
	case faultWorkerGone:
		return "each task of the worker kept away past its lease, once"
	}
	return "no task"
}

// mayLose reports whether the trial's fault can make task i lost: its worker was
// gone past its lease, or its shim was killed where the worker cannot adopt its
// command (bgtask_portable), or while it started task i's command, before it
// recorded the PID. A shim keeps all its worker's runs, and the trial kills it
// as the others start: task i's run may have been one.
func (tr *trial) mayLose(i int, lost events.Lost) bool {
	switch tr.plan.fault {
	case faultShimKill:
		if portableEnabled {
			return strings.HasPrefix(lost.Reason, "the shim of its run died")
		}
		return strings.HasPrefix(lost.Reason, "the shim of its run died while it started the command")
	case faultWorkerGone:
		return lost.Worker == workerID(0)
	}
	return false
}
