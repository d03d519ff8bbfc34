package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/events"
	osproc "github.com/bgtask/bgtask/internal/proc"
)

// pidRound is one measurement of n processes waited for: watched by PID, or run
// by bgtask as its own commands (the baseline).
type pidRound struct {
	emptyRSS, serverRSS, workerRSS, shimsRSS float64 // MiB
	serverCPU, workerCPU                     float64 // % of a core while waiting
	endToWakeup                              []float64
}

const pidsTarget = "bench-pids"

// runPIDs measures n watched PIDs (bgtask add --pid): the server's and the
// worker's CPU and RSS while they wait, and the time from each process's end to
// its wake-up; against n `sleep` commands bgtask runs itself on the same kind of
// server and worker, and the empty server's RSS.
func runPIDs(ctx context.Context, r *runner, s *Scenario) error {
	n, window := r.size.pids, r.size.pidsWindow
	s.param("processes", n)
	s.param("watched", "`sleep 3600` started by the bench, each registered with its process identity (as add --pid)")
	s.param("baseline", "the same number of `sleep 3600` commands bgtask runs itself")
	s.param("server", fmt.Sprintf("--no-worker, and its own bgtask worker --max-tasks %d; CPU over %v while all wait", n, window))
	s.param("ends", "one process killed (TERM) every 20 ms, within what the server persists and delivers; end → its wake-up seen on bgtask.deliver.<target>")
	var watched, commands []pidRound
	for i := range r.repeats {
		for _, watch := range []bool{true, false} {
			r.progress("pids: %d %s, repeat %d of %d", n, map[bool]string{true: "watched PIDs", false: "commands"}[watch], i+1, r.repeats)
			round, err := r.pidRound(ctx, n, window, watch)
			if err != nil {
				return err
			}
			if watch {
				watched = append(watched, round)
			} else {
				commands = append(commands, round)
			}
		}
	}
	field := func(rounds []pidRound, f func(pidRound) float64) Stat {
		var xs []float64
		for _, x := range rounds {
			xs = append(xs, f(x))
		}
		return summarize(xs, false)
	}
	var lat, base []float64
	for i := range watched {
		lat, base = append(lat, watched[i].endToWakeup...), append(base, commands[i].endToWakeup...)
	}
	what := fmt.Sprintf("%d commands", n)
	s.compare("server RSS while waiting", "MiB", field(watched, func(x pidRound) float64 { return x.serverRSS }), what, field(commands, func(x pidRound) float64 { return x.serverRSS }))
	s.add("empty server RSS, for scale", "MiB", field(watched, func(x pidRound) float64 { return x.emptyRSS }))
	s.compare("server CPU while waiting", "% of a core", field(watched, func(x pidRound) float64 { return x.serverCPU }), what, field(commands, func(x pidRound) float64 { return x.serverCPU }))
	s.compare("worker RSS while waiting", "MiB", field(watched, func(x pidRound) float64 { return x.workerRSS }), what, field(commands, func(x pidRound) float64 { return x.workerRSS }))
	s.compare("worker CPU while waiting", "% of a core", field(watched, func(x pidRound) float64 { return x.workerCPU }), what, field(commands, func(x pidRound) float64 { return x.workerCPU }))
	s.compare("shims RSS, summed", "MiB", field(watched, func(x pidRound) float64 { return x.shimsRSS }), what, field(commands, func(x pidRound) float64 { return x.shimsRSS }))
	s.compare("process end → wake-up", "ms", summarize(lat, true), what, summarize(base, true))
	return nil
}

// pidRound starts a server and a worker, has n processes waited for on them
// (watched, or run as commands), measures them while they wait, then ends them
// one by one and times each end to its wake-up.
func (r *runner) pidRound(ctx context.Context, n int, window time.Duration, watch bool) (pidRound, error) {
	var res pidRound
	srv, err := r.startServer(ctx, "pids", "--no-worker")
	if err != nil {
		return res, err
	}
	defer srv.stop() // kills the worker, the shims and the commands too: all carry the home's marker
	worker, err := r.spawn(srv.home, "worker", "worker", "--log-level", "warn",
		"--max-tasks", strconv.Itoa(n), "--state-dir", srv.home+"/worker")
	if err != nil {
		return res, err
	}
	defer worker.stop(15 * time.Second)
	inbox, err := watchInbox(srv.nc, pidsTarget)
	if err != nil {
		return res, err
	}
	defer inbox.close()
	started := &startLog{pids: map[string]int{}}
	// A watch's spawn says it is watched; a command's first tick carries its PID.
	typ := map[bool]events.Type{true: events.TypeSpawned, false: events.TypeTick}[watch]
	sub, err := srv.nc.Subscribe(events.TypeFilter(typ), started.seen)
	if err != nil {
		return res, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := srv.nc.Flush(); err != nil {
		return res, err
	}
	if res.emptyRSS, err = rssAfter(ctx, srv.pid(), r.size.pidsSettle); err != nil {
		return res, err
	}
	clients, err := srv.clients(8)
	if err != nil {
		return res, err
	}
	var ends func(id string) error
	if watch {
		ends, err = r.registerWatches(ctx, srv, clients, n)
	} else {
		ends, err = registerCommands(ctx, srv, clients, n, started)
	}
	if err != nil {
		return res, err
	}
	if err := started.await(ctx, n, worker); err != nil {
		return res, err
	}
	if err := res.measure(ctx, srv, worker, r.size.pidsSettle, window); err != nil {
		return res, err
	}
	res.endToWakeup, err = endEach(ctx, inbox, started.ids(), ends)
	return res, err
}

// startLog records the tasks seen started (and a command's PID).
type startLog struct {
	mu   sync.Mutex
	pids map[string]int
}

func (l *startLog) seen(m *nats.Msg) {
	var ev struct {
		TaskID  string      `json:"task_id"`
		Payload events.Tick `json:"payload"`
	}
	if json.Unmarshal(m.Data, &ev) != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.pids[ev.TaskID]; !ok || ev.Payload.PID != 0 {
		l.pids[ev.TaskID] = ev.Payload.PID
	}
}

func (l *startLog) ids() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := make([]string, 0, len(l.pids))
	for id := range l.pids {
		ids = append(ids, id)
	}
	return ids
}

func (l *startLog) pid(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pids[id]
}

// await waits until n tasks started.
func (l *startLog) await(ctx context.Context, n int, worker *proc) error {
	for limit := time.Now().Add(max(time.Minute, time.Duration(n)*100*time.Millisecond)); ; {
		l.mu.Lock()
		got := len(l.pids)
		l.mu.Unlock()
		switch {
		case got >= n:
			return nil
		case worker.exited():
			return worker.failure("exited")
		case time.Now().After(limit):
			return fmt.Errorf("%d of %d tasks started", got, n)
		}
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
}

// registerWatches starts n `sleep` processes of the bench's own and registers a
// watch of each; ends ends a task's process.
func (r *runner) registerWatches(ctx context.Context, srv *server, clients []*api.Client, n int) (ends func(string) error, err error) {
	host, _ := os.Hostname()
	specs := make([][]byte, n)
	procs := make([]*exec.Cmd, n)
	for i := range n {
		cmd := exec.Command("sleep", "3600")
		cmd.Env = append(environWithout(markerEnv), markerEnv+"="+srv.home)
		cmd.SysProcAttr = childAttr()
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		go func() { _ = cmd.Wait() }() // reaped by the bench, its parent
		procs[i] = cmd
		id, err := osproc.Of(cmd.Process.Pid)
		if err != nil {
			return nil, err
		}
		specs[i], _ = json.Marshal(map[string]any{
			"process": engine.Process(id), "target": pidsTarget,
			"placement": map[string]any{"labels": map[string]string{engine.HostLabel: host}},
		})
	}
	ids, err := registerSpecs(ctx, clients, specs)
	if err != nil {
		return nil, err
	}
	byID := map[string]*exec.Cmd{}
	for i, id := range ids {
		byID[id] = procs[i]
	}
	return func(id string) error { return byID[id].Process.Signal(syscall.SIGTERM) }, nil
}

// registerCommands registers n `sleep` commands; ends ends a task's command.
func registerCommands(ctx context.Context, srv *server, clients []*api.Client, n int, started *startLog) (ends func(string) error, err error) {
	if _, err := registerAll(ctx, clients, n, srv.spec("exec sleep 3600", pidsTarget)); err != nil {
		return nil, err
	}
	return func(id string) error { return syscall.Kill(started.pid(id), syscall.SIGTERM) }, nil
}

// measure reads the server's and the worker's memory, and their CPU over window,
// while every process is waited for, once they have settled.
func (res *pidRound) measure(ctx context.Context, srv *server, worker *proc, settle, window time.Duration) error {
	if err := sleepCtx(ctx, settle); err != nil {
		return err
	}
	s0, err0 := cpuTime(srv.pid())
	w0, err1 := cpuTime(worker.pid())
	from := time.Now()
	if err := sleepCtx(ctx, window); err != nil {
		return err
	}
	s1, err2 := cpuTime(srv.pid())
	w1, err3 := cpuTime(worker.pid())
	took := time.Since(from).Seconds()
	sm, err4 := readMem(srv.pid())
	wm, err5 := readMem(worker.pid())
	for _, err := range []error{err0, err1, err2, err3, err4, err5} {
		if err != nil {
			return err
		}
	}
	_, _, _, shims := shimsAndCommands(srv.home)
	res.serverCPU, res.workerCPU = 100*(s1-s0).Seconds()/took, 100*(w1-w0).Seconds()/took
	res.serverRSS, res.workerRSS, res.shimsRSS = mib(sm.RSS), mib(wm.RSS), mib(shims)
	return nil
}

// endEach ends each task's process, one every 20 ms (50 a second, fewer than the
// server can persist and deliver, so that the time is each end's, not a queue's), and returns for each the time
// from its end to its wake-up, in ms.
func endEach(ctx context.Context, inbox *inboxWatch, ids []string, ends func(string) error) ([]float64, error) {
	endedAt := make(map[string]time.Time, len(ids))
	for _, id := range ids {
		endedAt[id] = time.Now()
		if err := ends(id); err != nil {
			return nil, fmt.Errorf("end the process of %s: %w", id, err)
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return nil, err
		}
	}
	wait, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out := make([]float64, 0, len(ids))
	for _, id := range ids {
		a, err := inbox.wait(wait, id)
		if err != nil {
			return nil, fmt.Errorf("task %s: %w", id, err)
		}
		out = append(out, ms(a.at.Sub(endedAt[id])))
	}
	return out, nil
}

// rssAfter is pid's RSS in MiB once it has idled for settle.
func rssAfter(ctx context.Context, pid int, settle time.Duration) (float64, error) {
	if err := sleepCtx(ctx, settle); err != nil {
		return 0, err
	}
	m, err := readMem(pid)
	return mib(m.RSS), err
}
