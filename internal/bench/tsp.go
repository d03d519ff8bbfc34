package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The peer is task-spooler (Debian's package task-spooler, whose client and server
// are both `tsp`): the plainest queue of background commands with a limit on how
// many run at once, not durable. The throughput, start and memory scenarios run the
// same work through it in the same run, when it is installed, and give bgtask's
// ratio to it beside their baselines.

// tspMaxJobs is how many jobs one tsp server holds at once, queued or running:
// each keeps a connection to the server, which serves at most 1,000 (its MAXCONN,
// under select's FD_SETSIZE) and blocks the clients past that.
const tspMaxJobs = 900

// peerNote is the report's line about the peer in the scenarios that run it:
// which peer ran, or that none did.
func peerNote(path string, scenarios []string) string {
	names := strings.Join(scenarios, ", ")
	if path == "" {
		return "task-spooler is not installed (no tsp in PATH): " + names + " ran without the peer"
	}
	version := "unknown version"
	if out, err := exec.Command(path, "-V").CombinedOutput(); err == nil {
		if f := strings.Fields(string(out)); len(f) >= 3 {
			version = f[2]
		}
	}
	return fmt.Sprintf("task-spooler %s (%s), run beside bgtask in %s", version, path, names)
}

// tspServer is one task-spooler server of the run, with its socket, its list and
// its jobs' output files in a directory of its own under the run's root. Every
// process of it (the server, and the client that stays behind as the parent of
// each job) carries the run's marker for that directory: `tsp -K` ends the server
// but not its jobs, and stop, or the run's cleanup, kills whatever is left.
type tspServer struct {
	r     *runner
	dir   string
	env   []string
	slots int
}

// startTSP starts a task-spooler server that runs slots jobs at a time.
func (r *runner) startTSP(ctx context.Context, name string, slots int) (*tspServer, error) {
	dir, err := r.newHome("tsp-" + name)
	if err != nil {
		return nil, err
	}
	// The caller's TS_* settings (an on-finish hook, a saved list, a socket) are not
	// the bench's: only its own are passed.
	env := []string{markerEnv + "=" + dir, "TS_SOCKET=" + filepath.Join(dir, "socket"), "TMPDIR=" + dir, "TS_MAXFINISHED=1000000"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TS_") && !strings.HasPrefix(kv, "TMPDIR=") && !strings.HasPrefix(kv, markerEnv+"=") {
			env = append(env, kv)
		}
	}
	t := &tspServer{r: r, dir: dir, env: env, slots: slots}
	// The first client forks the server, which keeps the client's stdout: no pipe
	// here, or reading it would wait for the server's end.
	cmd := exec.CommandContext(ctx, r.tsp, "-S", strconv.Itoa(slots))
	cmd.Env = env
	if out, err := os.Create(filepath.Join(dir, "server.log")); err == nil {
		defer out.Close()
		cmd.Stdout, cmd.Stderr = out, out
	}
	if err := cmd.Run(); err != nil {
		t.stop()
		return nil, fmt.Errorf("start tsp -S %d: %w", slots, err)
	}
	return t, nil
}

// describe says how the peer runs, for a scenario's parameters.
func (t *tspServer) describe(what string) string {
	return fmt.Sprintf("task-spooler: tsp -S %d, its own socket and TMPDIR, %s", t.slots, what)
}

// stop ends the server, kills its jobs' processes and removes its directory.
func (t *tspServer) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = t.run(ctx, "-K")
	if err := sweep(t.dir); err != nil {
		t.r.progress("tsp: %v", err)
	}
	if err := os.RemoveAll(t.dir); err != nil {
		t.r.progress("tsp: %v", err)
	}
}

// run runs one tsp client with args and returns what it printed.
func (t *tspServer) run(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, t.r.tsp, args...)
	cmd.Env = t.env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	// A client that had to start a server again (one killed under it) would leave
	// the server holding its output: its own exit is the end of the call.
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("tsp %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// add queues command as a job and returns its id.
func (t *tspServer) add(ctx context.Context, command ...string) (int, error) {
	out, err := t.run(ctx, command...)
	if err != nil {
		return 0, err
	}
	id, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		return 0, fmt.Errorf("tsp %s printed %q, not a job id", strings.Join(command, " "), out)
	}
	return id, nil
}

// submit queues n jobs of command from 8 concurrent clients, as
// `seq n | xargs -P 8 -n 1 tsp command` does, and returns their ids.
func (t *tspServer) submit(ctx context.Context, n int, command ...string) ([]int, error) {
	jobs := make(chan struct{}, n)
	for range n {
		jobs <- struct{}{}
	}
	close(jobs)
	const submitters = 8
	ids := make([][]int, submitters)
	errs := make([]error, submitters)
	var wg sync.WaitGroup
	for i := range submitters {
		wg.Go(func() {
			for range jobs {
				id, err := t.add(ctx, command...)
				if err != nil {
					errs[i] = err
					return
				}
				ids[i] = append(ids[i], id)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return slices.Concat(ids...), nil
}

// list counts the server's jobs that are still to end (queued, allocating,
// running) and those finished.
func (t *tspServer) list(ctx context.Context) (busy, finished int, err error) {
	out, err := t.run(ctx, "-l")
	if err != nil {
		return 0, 0, err
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	for _, line := range lines[1:] { // the first is the header
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[1] {
		case "queued", "allocating", "running":
			busy++
		case "finished":
			finished++
		}
	}
	return busy, finished, nil
}

// clear forgets the finished jobs and removes their output files.
func (t *tspServer) clear(ctx context.Context) error {
	if _, err := t.run(ctx, "-C"); err != nil {
		return err
	}
	outs, _ := filepath.Glob(filepath.Join(t.dir, "ts-out.*"))
	for _, f := range outs {
		_ = os.Remove(f)
	}
	return nil
}

// rate runs n jobs of `bash -c true` and returns jobs per second from the first
// submission to the last job's end, seen as /work/shared/acceptance/performance
// sees it: `tsp -w` on the highest id, then no job queued or running.
func (t *tspServer) rate(ctx context.Context, n int) (float64, error) {
	start := time.Now()
	ids, err := t.submit(ctx, n, "bash", "-c", "true")
	if err != nil {
		return 0, err
	}
	if _, err := t.run(ctx, "-w", strconv.Itoa(slices.Max(ids))); err != nil {
		return 0, err
	}
	finished := 0
	for busy := 1; busy > 0; {
		if busy, finished, err = t.list(ctx); err != nil {
			return 0, err
		}
		if busy > 0 {
			if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
				return 0, err
			}
		}
	}
	took := time.Since(start)
	if finished != n {
		return 0, fmt.Errorf("tsp: %d of %d jobs finished", finished, n)
	}
	if err := t.clear(ctx); err != nil {
		return 0, err
	}
	return float64(n) / took.Seconds(), nil
}

// start runs one job printing its start time and returns how long it took from
// before the `tsp` client's exec to the time the command printed: the client's
// own start is part of it, as `bgtask add` would be.
func (t *tspServer) start(ctx context.Context) (time.Duration, error) {
	called := time.Now()
	id, err := t.add(ctx, "bash", "-c", startCommand)
	if err != nil {
		return 0, err
	}
	if _, err := t.run(ctx, "-w", strconv.Itoa(id)); err != nil {
		return 0, err
	}
	file, err := t.run(ctx, "-o", strconv.Itoa(id))
	if err != nil {
		return 0, err
	}
	out, err := os.ReadFile(strings.TrimSpace(string(file)))
	if err != nil {
		return 0, fmt.Errorf("tsp job %d: %w", id, err)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("tsp job %d printed %q, not a time", id, out)
	}
	return time.Unix(0, ns).Sub(called), nil
}

// tspMemory is the memory of a tsp server and its jobs' processes while its jobs
// run, the commands themselves not counted.
type tspMemory struct {
	rss, pss int64 // bytes, summed
	procs    int   // tsp processes: the server and one per job
	running  int   // commands running
}

// memory runs n `sleep 3600` jobs at once and, once all run, reads the memory of
// every tsp process of the server.
func (t *tspServer) memory(ctx context.Context, n int) (tspMemory, error) {
	if _, err := t.submit(ctx, n, "sleep", "3600"); err != nil {
		return tspMemory{}, err
	}
	var m tspMemory
	limit := max(time.Minute, time.Duration(n)*100*time.Millisecond)
	for start := time.Now(); ; {
		m = tspMemory{}
		for pid, argv := range marked(t.dir) {
			switch name := filepath.Base(argv[0]); {
			case name == "sleep":
				m.running++
			case name == "tsp":
				if mem, err := readMem(pid); err == nil {
					m.rss, m.pss, m.procs = m.rss+mem.RSS, m.pss+mem.PSS, m.procs+1
				}
			}
		}
		if m.running >= n {
			return m, nil
		}
		if time.Since(start) > limit {
			return m, fmt.Errorf("tsp: %d of %d sleeps running after %v", m.running, n, limit)
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return m, err
		}
	}
}
