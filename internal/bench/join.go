package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/bgtask/bgtask/events"
)

// joinTarget is the inbox of the join scenario's wake-ups.
const joinTarget = "bench-join"

// joinSingles are the lone tasks a join round times its baseline with, after one
// that warms the worker up.
const joinSingles = 5

// runJoin measures a join over many running members: what the members and the
// waiting join cost the server, and how long after the last member's end the
// join wakes its caller, against a lone task's end to its own wake-up on the same
// server, and against the same server empty and idle.
func runJoin(ctx context.Context, r *runner, s *Scenario) error {
	n, window := r.size.joinMembers, r.size.joinWindow
	s.param("members", fmt.Sprintf("%d tasks running `cat FIFO`, --wake-on none, ended at once by opening and closing the FIFO", n))
	s.param("join", "one join --all over them")
	s.param("server", fmt.Sprintf("--no-worker, its worker a process of its own with --max-tasks %d; CPU over %v", n+1, window))
	var rounds []joinRound
	for i := range r.repeats {
		r.progress("join: %d members, repeat %d of %d", n, i+1, r.repeats)
		round, err := r.joinRound(ctx, n, window)
		if err != nil {
			return err
		}
		rounds = append(rounds, round)
	}
	pick := func(f func(joinRound) []float64) []float64 {
		var out []float64
		for _, round := range rounds {
			out = append(out, f(round)...)
		}
		return out
	}
	last := summarize(pick(func(j joinRound) []float64 { return []float64{j.lastToJoin} }), false)
	s.compare(fmt.Sprintf("the last of %d members' end → the join's wake-up", n), "ms", last,
		"a lone task's end → its own wake-up, same server", summarize(pick(func(j joinRound) []float64 { return j.singles }), true))
	s.compare(fmt.Sprintf("server RSS while %d members run and the join waits", n), "MiB",
		summarize(pick(func(j joinRound) []float64 { return []float64{j.waitRSS} }), false),
		"the same server empty", summarize(pick(func(j joinRound) []float64 { return []float64{j.emptyRSS} }), false))
	s.compare("server CPU while they run and the join waits", "% of a core",
		summarize(pick(func(j joinRound) []float64 { return []float64{j.waitCPU} }), false),
		"the same server idle, its worker started", summarize(pick(func(j joinRound) []float64 { return []float64{j.idleCPU} }), false))
	for i, part := range []string{"the last member's end → the last member's (quiet) fired", "the last member's fired → the join's joined", "the join's joined → its wake-up"} {
		s.add("  of which "+part, "ms", summarize(pick(func(j joinRound) []float64 { return j.split[i : i+1] }), false))
	}
	s.add("registration of the members and the join → all members running", "s",
		summarize(pick(func(j joinRound) []float64 { return []float64{j.allRunning} }), false))
	return nil
}

// joinRound is one round's figures: times in ms, memory in MiB, CPU in % of a core.
type joinRound struct {
	singles           []float64
	lastToJoin        float64
	emptyRSS, waitRSS float64
	idleCPU, waitCPU  float64
	allRunning        float64 // s
	// split is lastToJoin's parts: the last member's end → the last member's
	// fired, → the join's joined, → its wake-up.
	split []float64
}

// joinRound runs one round on a server of its own: the empty server's RSS, the
// lone tasks, the idle CPU, then the members and the join.
func (r *runner) joinRound(ctx context.Context, n int, window time.Duration) (joinRound, error) {
	var out joinRound
	srv, err := r.startServer(ctx, "join", "--no-worker")
	if err != nil {
		return out, err
	}
	defer srv.stop() // kills the worker, the shims and the commands too: all carry the home's marker
	if err := sleepCtx(ctx, 2*time.Second); err != nil {
		return out, err
	}
	mem, err := readMem(srv.pid())
	if err != nil {
		return out, err
	}
	out.emptyRSS = mib(mem.RSS)
	worker, err := r.spawn(srv.home, "worker", "worker", "--log-level", "warn",
		"--max-tasks", strconv.Itoa(n+1), "--state-dir", filepath.Join(srv.home, "worker"))
	if err != nil {
		return out, err
	}
	defer worker.stop(15 * time.Second)
	ends, err := watchRuns(srv.nc)
	if err != nil {
		return out, err
	}
	defer ends.close()
	inbox, err := watchInbox(srv.nc, joinTarget)
	if err != nil {
		return out, err
	}
	defer inbox.close()
	if out.singles, err = joinSinglesOn(ctx, srv, inbox, ends); err != nil {
		return out, err
	}
	_, _, cpu, err := cpuDuring(ctx, srv.pid(), window)
	if err != nil {
		return out, err
	}
	out.idleCPU = 100 * cpu.Seconds() / window.Seconds()
	err = r.joinMembers(ctx, srv, inbox, ends, n, window, &out)
	return out, err
}

// joinSinglesOn runs lone tasks one after the other and returns, for each but
// the first (the worker resolves its login environment then), the time from its
// end as the shim recorded it to its wake-up's publish.
func joinSinglesOn(ctx context.Context, srv *server, inbox *inboxWatch, ends *runWatch) ([]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	var out []float64
	for i := range joinSingles + 1 {
		reg, err := srv.api.Register(ctx, srv.spec("true", joinTarget))
		if err != nil {
			return nil, err
		}
		a, err := inbox.wait(ctx, reg.ID)
		if err != nil {
			return nil, srv.failure("lone task %s: %v", reg.ID, err)
		}
		end, err := ends.last(ctx, events.TypeExited, []string{reg.ID}, 30*time.Second)
		if err != nil {
			return nil, err
		}
		if i > 0 {
			out = append(out, ms(a.at.Sub(end)))
		}
	}
	return out, nil
}

// joinMembers registers n members blocked on a FIFO and a join over them, measures
// the server while they run, opens the FIFO to end them at once, and times the
// join's wake-up from the last member's end.
func (r *runner) joinMembers(ctx context.Context, srv *server, inbox *inboxWatch, ends *runWatch, n int, window time.Duration, out *joinRound) error {
	gate := filepath.Join(srv.home, "gate")
	if err := syscall.Mkfifo(gate, 0o600); err != nil {
		return err
	}
	clients, err := srv.clients(8)
	if err != nil {
		return err
	}
	member, _ := json.Marshal(map[string]any{
		"command": "cat " + gate + " >/dev/null", "cwd": srv.home, "target": joinTarget,
		"wake_on": []string{"none"}, "env": map[string]string{markerEnv: srv.home},
	})
	start := time.Now()
	ids, err := registerAll(ctx, clients, n, member)
	if err != nil {
		return err
	}
	spec, _ := json.Marshal(map[string]any{"join": map[string]any{"mode": "all", "members": ids}, "target": joinTarget})
	join, err := srv.api.Register(ctx, spec)
	if err != nil {
		return fmt.Errorf("register the join: %w", err)
	}
	r.progress("join: %d members and the join registered; waiting for all to run", n)
	if _, err := ends.last(ctx, events.TypeSpawned, ids, 10*time.Minute); err != nil {
		return err
	}
	out.allRunning = time.Since(start).Seconds()
	_, _, cpu, err := cpuDuring(ctx, srv.pid(), window)
	if err != nil {
		return err
	}
	out.waitCPU = 100 * cpu.Seconds() / window.Seconds()
	mem, err := readMem(srv.pid())
	if err != nil {
		return err
	}
	out.waitRSS = mib(mem.RSS)
	r.progress("join: %d members running; ending them", n)
	woken, err := openGate(ctx, gate, inbox, join.ID)
	if err != nil {
		return err
	}
	var at [3]time.Time // the last member's end, the last member's fired, the join's joined
	for i, step := range []struct {
		t   events.Type
		ids []string
	}{{events.TypeExited, ids}, {events.TypeFired, ids}, {events.TypeJoined, []string{join.ID}}} {
		if at[i], err = ends.last(ctx, step.t, step.ids, 30*time.Second); err != nil {
			return err
		}
	}
	out.lastToJoin = ms(woken.Sub(at[0]))
	out.split = []float64{ms(at[1].Sub(at[0])), ms(at[2].Sub(at[1])), ms(woken.Sub(at[2]))}
	return nil
}

// openGate opens and closes the FIFO the members read, which ends every member
// that has it open, until the join's wake-up comes: a member whose `cat` had not
// opened it yet is ended by the next opening.
func openGate(ctx context.Context, gate string, inbox *inboxWatch, joinID string) (time.Time, error) {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		// Non-blocking: with no reader left, the open fails at once (ENXIO).
		if f, err := os.OpenFile(gate, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			_ = f.Close()
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		a, err := inbox.wait(wctx, joinID)
		cancel()
		if err == nil {
			return a.at, nil
		}
		if ctx.Err() != nil {
			return time.Time{}, ctx.Err()
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("the join %s did not wake within 5 minutes of its members' end", joinID)
		}
	}
}

// runWatch sees the runs of every task: when each started, ended (as its shim
// recorded it), fired, and, for a group, joined, by the events' own times.
type runWatch struct {
	subs    []*nats.Subscription
	mu      sync.Mutex
	at      map[events.Type]map[string]time.Time
	changed chan struct{} // closed and replaced on each event
}

// runEvents are the events a runWatch records.
var runEvents = []events.Type{events.TypeSpawned, events.TypeExited, events.TypeFired, events.TypeJoined}

func watchRuns(nc *nats.Conn) (*runWatch, error) {
	w := &runWatch{at: map[events.Type]map[string]time.Time{}, changed: make(chan struct{})}
	for _, t := range runEvents {
		w.at[t] = map[string]time.Time{}
		sub, err := nc.Subscribe(events.TypeFilter(t), w.seen)
		if err != nil {
			w.close()
			return nil, err
		}
		w.subs = append(w.subs, sub)
	}
	if err := nc.Flush(); err != nil {
		w.close()
		return nil, err
	}
	return w, nil
}

func (w *runWatch) seen(m *nats.Msg) {
	var ev events.Event
	if json.Unmarshal(m.Data, &ev) != nil {
		return
	}
	at := ev.Time
	if ev.Type == events.TypeExited {
		var exit events.Exited
		if json.Unmarshal(ev.Payload, &exit) != nil {
			return
		}
		at = exit.EndedAt
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if times := w.at[ev.Type]; times != nil {
		times[ev.TaskID] = at
	}
	close(w.changed)
	w.changed = make(chan struct{})
}

func (w *runWatch) close() {
	for _, sub := range w.subs {
		_ = sub.Unsubscribe()
	}
}

// last waits, up to timeout, until an event of type t of every task of ids was
// seen, and returns the latest time of them.
func (w *runWatch) last(ctx context.Context, t events.Type, ids []string, timeout time.Duration) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		w.mu.Lock()
		var last time.Time
		seen := 0
		for _, id := range ids {
			if at, ok := w.at[t][id]; ok {
				seen++
				if at.After(last) {
					last = at
				}
			}
		}
		changed := w.changed
		w.mu.Unlock()
		if seen == len(ids) {
			return last, nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("%d of %d tasks %s: %w", seen, len(ids), t, ctx.Err())
		case <-changed:
		}
	}
}
