package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/bgtask/bgtask/events"
)

// burstTarget is the inbox of the burst scenario's wake-ups.
const burstTarget = "bench-burst-tasks"

// burstSettle is how the burst scenario reads a settled RSS: a sample every
// interval until the last quiet+1 samples lie within 1% of each other, or until
// limit.
type burstSettle struct {
	interval time.Duration
	quiet    int
	limit    time.Duration
}

// runBurst measures whether a server gives back the memory a burst of tasks took:
// its RSS idle, at the burst's peak and once it has stopped falling after it,
// against the same server idle before it and a server restarted on the same home,
// which holds what the finished tasks need (the projector keeps a summary of
// every settled task).
func runBurst(ctx context.Context, r *runner, s *Scenario) error {
	n, st := r.size.burst, r.size.burstSettle
	s.param("tasks", fmt.Sprintf("%d running `true`, registered by 8 clients, to the last one's fired event", n))
	s.param("server", "with its worker, after one task ran (the worker has its login environment)")
	s.param("settled", fmt.Sprintf("RSS sampled every %v until %d samples in a row lie within 1%%, at most %v", st.interval, st.quiet+1, st.limit))
	s.param("restarted", "the same server stopped and started on the same home, settled the same way")
	var rounds []burstRound
	for i := range r.repeats {
		r.progress("burst: %d tasks, repeat %d of %d", n, i+1, r.repeats)
		round, err := r.burstRound(ctx, n, st)
		if err != nil {
			return err
		}
		rounds = append(rounds, round)
	}
	pick := func(f func(burstRound) float64) Stat {
		var out []float64
		for _, round := range rounds {
			out = append(out, f(round))
		}
		return summarize(out, false)
	}
	idle := pick(func(b burstRound) float64 { return mib(b.idle.RSS) })
	restarted := pick(func(b burstRound) float64 { return mib(b.restarted.RSS) })
	s.add("server RSS idle, settled", "MiB", idle)
	s.add("server peak RSS in the burst (VmHWM)", "MiB", pick(func(b burstRound) float64 { return mib(b.after.HWM) }))
	ratio := *s.compare(fmt.Sprintf("server RSS after the burst of %d, settled", n), "MiB", pick(func(b burstRound) float64 { return mib(b.after.RSS) }),
		"the same server idle before it", idle).Ratio
	s.compare("  the same, against a server restarted on the same home", "MiB", pick(func(b burstRound) float64 { return mib(b.after.RSS) }),
		"restarted: what the finished tasks hold", restarted)
	s.compare("server PSS after the burst, settled", "MiB", pick(func(b burstRound) float64 { return mib(b.after.PSS) }),
		"the same server idle before it", pick(func(b burstRound) float64 { return mib(b.idle.PSS) }))
	s.compare("  restarted server RSS (its PSS: "+num(pick(func(b burstRound) float64 { return mib(b.restarted.PSS) }).Median)+" MiB)", "MiB", restarted,
		"the same server idle before the burst", idle)
	s.add("restarted server RSS per finished task, over the idle server's", "bytes", pick(func(b burstRound) float64 {
		return float64(b.restarted.RSS-b.idle.RSS) / float64(n)
	}))
	s.add("registration → the last task fired", "tasks/s", pick(func(b burstRound) float64 { return float64(n) / b.took.Seconds() }))
	s.add("the last task fired → RSS settled", "s", pick(func(b burstRound) float64 { return b.settled.Seconds() }))
	for i, round := range rounds {
		if !round.stable {
			s.note("repeat %d: the RSS after the burst had not settled %v after it; measured then", i+1, st.limit)
		}
	}
	s.target(fmt.Sprintf("server RSS after a burst of %d tasks ≤ 1.2× its idle RSS (issue 23)", n), ratio <= 1.2, "%s×", num(ratio))
	return nil
}

// burstRound is one round's figures.
type burstRound struct {
	idle, after, restarted memInfo
	took                   time.Duration // the first registration → the last fired
	settled                time.Duration // the last fired → the RSS settled
	stable                 bool          // the RSS after the burst settled within the limit
}

// burstRound runs a burst on a server of its own: its settled RSS idle, the
// burst, its RSS until it stops falling, then the same of a server restarted on
// its home.
func (r *runner) burstRound(ctx context.Context, n int, st burstSettle) (burstRound, error) {
	var out burstRound
	srv, err := r.startServer(ctx, "burst")
	if err != nil {
		return out, err
	}
	stopped := false
	defer func() {
		if !stopped {
			srv.stop()
		}
	}()
	if err := srv.warmUp(ctx); err != nil {
		return out, err
	}
	if out.idle, _, err = settleRSS(ctx, srv.pid(), st); err != nil {
		return out, err
	}
	if out.took, err = burst(ctx, srv, n); err != nil {
		return out, err
	}
	done := time.Now()
	if out.after, out.stable, err = settleRSS(ctx, srv.pid(), st); err != nil {
		return out, err
	}
	out.settled = time.Since(done)
	srv.stop()
	stopped = true
	again, err := r.startServerIn(ctx, srv.home, "burst-restarted")
	if err != nil {
		return out, err
	}
	defer again.stop()
	if total, err := again.listTotal(ctx); err != nil || total != n+1 {
		return out, fmt.Errorf("the restarted server holds %d tasks, want %d: %v", total, n+1, err)
	}
	out.restarted, _, err = settleRSS(ctx, again.pid(), st)
	return out, err
}

// burst registers n tasks running `true` through 8 clients and waits until every
// one's wake-up is in the inbox and it fired; it returns the time from the first
// registration to the last fired.
func burst(ctx context.Context, srv *server, n int) (time.Duration, error) {
	inbox, err := watchInbox(srv.nc, burstTarget)
	if err != nil {
		return 0, err
	}
	defer inbox.close()
	runs, err := watchRuns(srv.nc)
	if err != nil {
		return 0, err
	}
	defer runs.close()
	clients, err := srv.clients(8)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	ids, err := registerAll(ctx, clients, n, srv.spec("true", burstTarget))
	if err != nil {
		return 0, err
	}
	timeout := max(5*time.Minute, time.Duration(n)*100*time.Millisecond)
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := inbox.waitCount(wctx, n); err != nil {
		return 0, srv.failure("burst: %v", err)
	}
	if _, err := runs.last(ctx, events.TypeFired, ids, time.Minute); err != nil {
		return 0, srv.failure("burst: %v", err)
	}
	return time.Since(start), nil
}

// settleRSS samples the memory of pid until its RSS is stable: the last
// st.quiet+1 samples within 1% of the highest of them. It returns the last
// sample, and false if the RSS was still moving at st.limit.
func settleRSS(ctx context.Context, pid int, st burstSettle) (memInfo, bool, error) {
	var rss []int64
	for start := time.Now(); ; {
		m, err := readMem(pid)
		if err != nil {
			return memInfo{}, false, err
		}
		rss = append(rss, m.RSS)
		if settled(rss, st.quiet) {
			return m, true, nil
		}
		if time.Since(start) >= st.limit {
			return m, false, nil
		}
		if err := sleepCtx(ctx, st.interval); err != nil {
			return memInfo{}, false, err
		}
	}
}

// settled says whether the last quiet+1 samples lie within 1% of the highest of
// them.
func settled(samples []int64, quiet int) bool {
	if len(samples) < quiet+1 {
		return false
	}
	last := samples[len(samples)-quiet-1:]
	lo, hi := last[0], last[0]
	for _, v := range last {
		lo, hi = min(lo, v), max(hi, v)
	}
	return hi-lo <= hi/100
}
