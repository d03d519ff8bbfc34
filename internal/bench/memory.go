package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/bgtask/bgtask/events"
)

// tickLog records when each task's ticks were seen.
type tickLog struct {
	mu    sync.Mutex
	ticks map[string][]time.Time
}

func (l *tickLog) seen(m *nats.Msg) {
	at := time.Now()
	parts := strings.Split(m.Subject, ".") // bgtask.events.<task>.tick
	if len(parts) != 4 {
		return
	}
	l.mu.Lock()
	l.ticks[parts[2]] = append(l.ticks[parts[2]], at)
	l.mu.Unlock()
}

func (l *tickLog) tasks() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ticks)
}

// gaps returns, for each task, the longest wait for a tick that it had within
// [from, to]: between two ticks, or from its last tick to the end. Ticks seen
// after the end are not counted.
func (l *tickLog) gaps(from, to time.Time) map[string]time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]time.Duration{}
	for id, ts := range l.ticks {
		prev, longest := ts[0], time.Duration(0)
		for _, t := range ts[1:] {
			if t.After(to) {
				break
			}
			if t.After(from) {
				longest = max(longest, t.Sub(prev))
			}
			prev = t
		}
		out[id] = max(longest, to.Sub(prev))
	}
	return out
}

// supervisorMemory is the memory of what supervises the running tasks, summed,
// in MiB, and how many tasks it supervises.
type supervisorMemory struct {
	rss, pss float64
	tasks    int
}

func (m supervisorMemory) perTask() (rss, pss float64) {
	tasks := float64(max(m.tasks, 1))
	return m.rss / tasks, m.pss / tasks
}

func runMemory(ctx context.Context, r *runner, s *Scenario) error {
	sup, err := bgtaskMemory(ctx, r, s)
	if err != nil {
		return err
	}
	var peer *supervisorMemory
	if r.tsp != "" {
		if peer, err = peerMemory(ctx, r, s); err != nil {
			return err
		}
	}
	rss, pss := sup.perTask()
	rssRow := s.add("supervisor RSS per running task: server, worker and shims summed", "MiB", summarize([]float64{rss}, false))
	if peer != nil {
		peerRSS, _ := peer.perTask()
		rssRow.against("task-spooler: its server and the tsp client that is each job's parent, summed", summarize([]float64{peerRSS}, false))
	}
	pssRow := s.add("supervisor PSS per running task: server, worker and shims summed", "MiB", summarize([]float64{pss}, false))
	if peer != nil {
		_, peerPSS := peer.perTask()
		pssRow.against("task-spooler: its server and the tsp client that is each job's parent, summed", summarize([]float64{peerPSS}, false))
	}
	s.target("supervisor PSS ≤ 400 KiB and RSS ≤ 1.2 MiB per running task (issue 23)", pss*1024 <= 400 && rss <= 1.2,
		"PSS %s KiB, RSS %s MiB", num(pss*1024), num(rss))
	return nil
}

// peerMemory runs as many `sleep`s under task-spooler as bgtask ran, or as many
// as one tsp server holds, and reads its memory while they run.
func peerMemory(ctx context.Context, r *runner, s *Scenario) (*supervisorMemory, error) {
	n := min(r.size.concurrent, tspMaxJobs)
	peer, err := r.startTSP(ctx, "memory", n)
	if err != nil {
		return nil, err
	}
	defer peer.stop()
	s.param("peer", peer.describe(fmt.Sprintf("%d `tsp sleep 3600` from 8 concurrent clients; the RSS and PSS of every tsp process once all run", n)))
	if n < r.size.concurrent {
		s.note("task-spooler ran %d sleeps, not %d: a tsp server holds at most about 1,000 jobs, one connection each", n, r.size.concurrent)
	}
	r.progress("memory: %d sleeps under task-spooler", n)
	m, err := peer.memory(ctx, n)
	if err != nil {
		return nil, err
	}
	if m.procs != m.running+1 {
		s.note("task-spooler: %d tsp processes for %d running sleeps, not one each and the server", m.procs, m.running)
	}
	return &supervisorMemory{rss: mib(m.rss), pss: mib(m.pss), tasks: m.running}, nil
}

// bgtaskMemory runs the sleeps on a worker of its own, watches their ticks and
// measures the worker and the shims, and returns what supervised them.
func bgtaskMemory(ctx context.Context, r *runner, s *Scenario) (supervisorMemory, error) {
	n, tick := r.size.concurrent, r.size.tick
	s.param("tasks", n)
	s.param("command", "sleep 3600")
	s.param("worker", fmt.Sprintf("its own process: bgtask worker --max-tasks %d --tick %v", n, tick))
	srv, err := r.startServer(ctx, "memory", "--no-worker")
	if err != nil {
		return supervisorMemory{}, err
	}
	defer srv.stop() // kills the worker, the shims and the commands too: all carry the home's marker
	worker, err := r.spawn(srv.home, "worker", "worker", "--log-level", "warn",
		"--max-tasks", strconv.Itoa(n), "--tick", tick.String(), "--state-dir", filepath.Join(srv.home, "worker"))
	if err != nil {
		return supervisorMemory{}, err
	}
	defer worker.stop(15 * time.Second)
	log := &tickLog{ticks: map[string][]time.Time{}}
	sub, err := srv.nc.Subscribe(events.TypeFilter(events.TypeTick), log.seen)
	if err != nil {
		return supervisorMemory{}, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := srv.nc.Flush(); err != nil {
		return supervisorMemory{}, err
	}
	clients, err := srv.clients(8)
	if err != nil {
		return supervisorMemory{}, err
	}
	start := time.Now()
	if _, err := registerAll(ctx, clients, n, srv.spec("sleep 3600", "bench-memory")); err != nil {
		return supervisorMemory{}, err
	}
	r.progress("memory: %d tasks registered; waiting for all to run", n)
	running, allRunning, err := awaitTicking(ctx, r, s, worker, log, n, start)
	if err != nil {
		return supervisorMemory{}, err
	}
	window := time.Duration(r.size.watchTicks)*tick + tick/2
	r.progress("memory: %d running after %.1f s; watching their ticks for %v", running, allRunning.Seconds(), window)
	from, to, cpu, err := cpuDuring(ctx, worker.pid(), window)
	if err != nil {
		return supervisorMemory{}, err
	}
	wm, err := readMem(worker.pid())
	if err != nil {
		return supervisorMemory{}, err
	}
	sm, err := readMem(srv.pid())
	if err != nil {
		return supervisorMemory{}, err
	}
	shimRSS, shimPSS, cmdRSS, shimSum := shimsAndCommands(srv.home)
	gaps := log.gaps(from, to)
	gapSecs, late := secondsAndLate(gaps, tick)
	total := wm.RSS + shimSum
	s.add("tasks running, each ticking", "tasks", summarize([]float64{float64(len(gaps))}, false))
	s.add("registration → all of them running", "s", summarize([]float64{allRunning.Seconds()}, false))
	s.add("longest wait for a tick, per task", "s", summarize(gapSecs, true))
	s.add("worker CPU while they run (sleep, no output)", "% of a core", summarize([]float64{100 * cpu.Seconds() / to.Sub(from).Seconds()}, false))
	s.add("worker RSS", "MiB", summarize([]float64{mib(wm.RSS)}, false))
	s.add("shim RSS, per shim", "MiB", summarize(shimRSS, true))
	s.add("shim PSS (shared pages divided), per shim", "MiB", summarize(shimPSS, true))
	s.add("worker + shims RSS, summed", "MiB", summarize([]float64{mib(total)}, false))
	s.add("worker + shims RSS per running task", "MiB", summarize([]float64{mib(total) / float64(max(len(gaps), 1))}, false))
	s.add("the commands themselves (sleep) RSS, for scale", "MiB", summarize(cmdRSS, false))
	s.target(fmt.Sprintf("all %d watched with ticks on time (no wait over 1.25 ticks)", n), len(gaps) == n && late == 0,
		"%d ticking, %d late", len(gaps), late)
	s.target("one shim for all the running tasks: no process of bgtask's own per command", len(shimRSS) == 1, "%d shims", len(shimRSS))
	sup := supervisorMemory{rss: mib(sm.RSS + total), pss: mib(sm.PSS + wm.PSS), tasks: len(gaps)}
	for _, p := range shimPSS {
		sup.pss += p
	}
	return sup, nil
}

// awaitTicking waits until each of the n tasks registered at start has ticked
// once: its command has started, with its PID. A worker that cannot start them all
// in time is measured with those it runs, and the scenario says so.
func awaitTicking(ctx context.Context, r *runner, s *Scenario, worker *proc, log *tickLog, n int, start time.Time) (running int, took time.Duration, err error) {
	limit := max(time.Minute, time.Duration(n)*300*time.Millisecond)
	for last := time.Now(); log.tasks() < n && time.Since(start) < limit; {
		if worker.exited() {
			return 0, 0, worker.failure("exited")
		}
		if time.Since(last) > 10*time.Second {
			r.progress("memory: %d of %d running", log.tasks(), n)
			last = time.Now()
		}
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return 0, 0, err
		}
	}
	running, took = log.tasks(), time.Since(start)
	if running < n {
		s.note("only %d of %d tasks were running %v after their registration; measured with those", running, n, limit)
	}
	return running, took, nil
}

// cpuDuring is the CPU time process pid takes in the window that starts now.
func cpuDuring(ctx context.Context, pid int, window time.Duration) (from, to time.Time, cpu time.Duration, err error) {
	cpu0, err := cpuTime(pid)
	if err != nil {
		return from, to, 0, err
	}
	from = time.Now()
	if err := sleepCtx(ctx, window); err != nil {
		return from, to, 0, err
	}
	to = time.Now()
	cpu1, err := cpuTime(pid)
	return from, to, cpu1 - cpu0, err
}

// shimsAndCommands are the memory figures of the shims and commands of home, in
// MiB, and the shims' RSS summed in bytes.
func shimsAndCommands(home string) (shimRSS, shimPSS, cmdRSS []float64, shimSum int64) {
	for pid, argv := range marked(home) {
		m, err := readMem(pid)
		if err != nil {
			continue // ended since
		}
		switch {
		case len(argv) > 0 && filepath.Base(argv[0]) == "bgtask-shim", len(argv) > 1 && argv[1] == "shim":
			shimRSS, shimPSS = append(shimRSS, mib(m.RSS)), append(shimPSS, mib(m.PSS))
			shimSum += m.RSS
		case len(argv) > 0 && filepath.Base(argv[0]) == "sleep":
			cmdRSS = append(cmdRSS, mib(m.RSS))
		}
	}
	return shimRSS, shimPSS, cmdRSS, shimSum
}

// secondsAndLate are the tasks' longest gaps in seconds, and how many were over
// 1.25 ticks.
func secondsAndLate(gaps map[string]time.Duration, tick time.Duration) (secs []float64, late int) {
	for _, g := range gaps {
		secs = append(secs, g.Seconds())
		if g > tick+tick/4 {
			late++
		}
	}
	return secs, late
}
