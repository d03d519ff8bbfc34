package bench

import (
	"context"
	"fmt"
	"os/exec"
	"sync"
	"time"

	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/workers"
)

func runThroughput(ctx context.Context, r *runner, s *Scenario) error {
	n, parallel := r.size.throughput, workers.DefaultMaxTasks
	s.param("tasks", n)
	s.param("command", "true (run by bash -c, in bgtask and in the baseline)")
	s.param("parallelism", parallel)
	s.param("clock", "from the first registration (8 clients) to the last wake-up in the inbox")
	var peer *tspServer
	if r.tsp != "" {
		var err error
		if peer, err = r.startTSP(ctx, "throughput", parallel); err != nil {
			return err
		}
		defer peer.stop()
		s.param("peer", peer.describe("`tsp bash -c true` from 8 concurrent clients, from the first submission to the last job's end; interleaved with --sync always"))
	}
	for _, mode := range []string{"always", "interval"} {
		if err := throughputOf(ctx, r, s, mode, peer); err != nil {
			return err
		}
		peer = nil // measured beside the durable default only
	}
	return nil
}

// throughputOf measures the shared server of a --sync mode in repeats, each
// followed by the plain program and the peer, when there is one.
func throughputOf(ctx context.Context, r *runner, s *Scenario, mode string, peer *tspServer) error {
	n, parallel := r.size.throughput, workers.DefaultMaxTasks
	srv, err := r.sharedServer(ctx, mode, "interval")
	if err != nil {
		return err
	}
	clients, err := srv.clients(8)
	if err != nil {
		return err
	}
	var rates, base, peerRates, serverCPU, wakes []float64
	var machine, peerMachine machineUse
	for i := range r.repeats {
		r.progress("throughput, --sync %s: repeat %d of %d", mode, i+1, r.repeats)
		err := machine.measure(n, func() error {
			rate, cpu, wake, err := tasksRate(ctx, srv, clients, n, fmt.Sprintf("bench-tp-%d", i))
			rates, serverCPU = append(rates, rate), append(serverCPU, ms(cpu)/float64(n))
			wakes = append(wakes, wake...)
			return err
		})
		if err != nil {
			return err
		}
		rate, err := plainRate(ctx, n, parallel)
		if err != nil {
			return err
		}
		base = append(base, rate)
		if peer != nil {
			err := peerMachine.measure(n, func() error {
				rate, err := peer.rate(ctx, n)
				peerRates = append(peerRates, rate)
				return err
			})
			if err != nil {
				return err
			}
		}
	}
	row := s.compare("tasks to wake-up, --sync "+mode, "tasks/s", summarize(rates, false),
		fmt.Sprintf("Go program: bash -c true, %d at a time", parallel), summarize(base, false))
	if peer != nil {
		row.against(fmt.Sprintf("tsp -S %d: bash -c true from 8 clients, to the last job's end", parallel), summarize(peerRates, false))
	}
	ratio, vsPeer := *row.Ratio, row.Peer // row is not to be read after the next add
	s.add("  server CPU per task (its own threads: engine, projector, dispatcher, worker, NATS)", "ms", summarize(serverCPU, false))
	s.add("  exit → wake-up meanwhile (the shim's ended_at → the wake-up seen), every task", "ms", summarize(wakes, true))
	// Both sides' whole cost: bgtask's server, shims and commands and this client;
	// tsp's server, clients and commands. Idle time is what they wait for besides.
	s.add("  the machine's busy CPU per task, bgtask (every process)", "ms", summarize(machine.busy, false))
	s.add("  the machine's idle CPU per task, bgtask", "ms", summarize(machine.idle, false))
	if peer != nil {
		s.add("  the machine's busy CPU per task, tsp", "ms", summarize(peerMachine.busy, false))
		s.add("  the machine's idle CPU per task, tsp", "ms", summarize(peerMachine.idle, false))
	}
	if mode == "always" {
		s.target("≥ 70% of the plain program's throughput (--sync always, the default)", ratio >= 0.7, "%.0f%%; %s", ratio*100, r.processStart)
	}
	if vsPeer != nil && vsPeer.Ratio != nil {
		s.target(fmt.Sprintf("≥ 1.0× task-spooler's throughput, tsp -S %d (--sync always, issue 23)", parallel), *vsPeer.Ratio >= 1, "%s×; %s", num(*vsPeer.Ratio), r.processStart)
	}
	return nil
}

// tasksRate registers n tasks running `true` and returns tasks per second from
// the first registration to the last wake-up, the CPU the server used, and each
// task's exit → wake-up in milliseconds.
func tasksRate(ctx context.Context, srv *server, clients []*api.Client, n int, target string) (rate float64, cpu time.Duration, wake []float64, err error) {
	w, err := watchInbox(srv.nc, target)
	if err != nil {
		return 0, 0, nil, err
	}
	defer w.close()
	cpu0, err := cpuTime(srv.pid())
	if err != nil {
		return 0, 0, nil, err
	}
	start := time.Now()
	if _, err = registerAll(ctx, clients, n, srv.spec("true", target)); err != nil {
		return 0, 0, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	last, err := w.waitCount(ctx, n)
	if err != nil {
		return 0, 0, nil, err
	}
	cpu1, err := cpuTime(srv.pid())
	if err != nil {
		return 0, 0, nil, err
	}
	return float64(n) / last.Sub(start).Seconds(), cpu1 - cpu0, w.sinceExit(), nil
}

// plainRate runs `bash -c true` n times, parallel at a time, and returns commands
// per second.
func plainRate(ctx context.Context, n, parallel int) (float64, error) {
	jobs := make(chan struct{}, n)
	for range n {
		jobs <- struct{}{}
	}
	close(jobs)
	errs := make([]error, parallel)
	var wg sync.WaitGroup
	start := time.Now()
	for p := range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				if err := exec.CommandContext(ctx, "bash", "-c", "true").Run(); err != nil {
					errs[p] = fmt.Errorf("baseline bash -c true: %w", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return 0, err
		}
	}
	return float64(n) / time.Since(start).Seconds(), nil
}
