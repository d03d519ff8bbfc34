package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/bgtask/bgtask/events"
)

// runTimers measures what pending timers cost a server (memory, start time) and
// how late a burst of timers due in the same second fires, against
// time.AfterFunc in this process.
func runTimers(ctx context.Context, r *runner, s *Scenario) error {
	pending, burst := r.size.timers, r.size.timerBurst
	s.param("pending timers", pending)
	s.param("burst", fmt.Sprintf("%d timers due in the same second", burst))
	s.param("server", "--no-worker; memory read 2s after the last registration")
	var emptyRSS, fullRSS, emptyStart, fullStart []float64
	for i := range r.repeats {
		r.progress("timers: %d pending, repeat %d of %d", pending, i+1, r.repeats)
		e, f, es, fs, err := r.pendingTimers(ctx, pending)
		if err != nil {
			return err
		}
		emptyRSS, fullRSS = append(emptyRSS, e), append(fullRSS, f)
		emptyStart, fullStart = append(emptyStart, es), append(fullStart, fs)
	}
	s.compare("server RSS with the pending timers", "MiB", summarize(fullRSS, false), "empty server", summarize(emptyRSS, false))
	s.compare("server start to serving, with the pending timers", "ms", summarize(fullStart, false), "empty server", summarize(emptyStart, false))
	var late, seen, base []float64
	for i := range r.repeats {
		r.progress("timers: a burst of %d, repeat %d of %d", burst, i+1, r.repeats)
		l, sn, err := r.timerBurst(ctx, burst)
		if err != nil {
			return err
		}
		late, seen = append(late, l...), append(seen, sn...)
		base = append(base, afterFuncLateness(burst)...)
	}
	lateStat := summarize(late, true)
	s.compare("late_by of a timer in the burst", "ms", lateStat, "time.AfterFunc in-process", summarize(base, true))
	s.add("due event seen by a client after the timer's time", "ms", summarize(seen, true))
	s.target(fmt.Sprintf("p99 late_by of %d timers due in the same second ≤ 1 s", burst), *lateStat.P99 <= 1000, "p99 %s ms", num(*lateStat.P99))
	return nil
}

// pendingTimers measures an empty server's RSS and start, then registers n timers
// due in an hour and measures them again, with the timers pending.
func (r *runner) pendingTimers(ctx context.Context, n int) (emptyRSS, fullRSS, emptyStart, fullStart float64, err error) {
	begin := time.Now()
	srv, err := r.startServer(ctx, "timers", "--no-worker")
	if err != nil {
		return 0, 0, 0, 0, err
	}
	emptyStart = ms(time.Since(begin))
	home := srv.home
	measure := func(srv *server) (float64, error) {
		if err := sleepCtx(ctx, 2*time.Second); err != nil {
			return 0, err
		}
		mem, err := readMem(srv.pid())
		return mib(mem.RSS), err
	}
	if emptyRSS, err = measure(srv); err != nil {
		srv.stop()
		return 0, 0, 0, 0, err
	}
	clients, err := srv.clients(8)
	if err == nil {
		spec, _ := json.Marshal(map[string]any{"start_at": "1h", "target": "bench-timers"})
		_, err = registerAll(ctx, clients, n, spec)
	}
	srv.stop()
	if err != nil {
		return 0, 0, 0, 0, err
	}
	begin = time.Now()
	srv, err = r.startServerIn(ctx, home, "timers", "--no-worker")
	if err != nil {
		return 0, 0, 0, 0, err
	}
	defer srv.stop()
	fullStart = ms(time.Since(begin))
	if total, err := srv.listTotal(ctx); err != nil || total != n {
		return 0, 0, 0, 0, fmt.Errorf("the restarted server holds %d tasks, want %d: %v", total, n, err)
	}
	fullRSS, err = measure(srv)
	return emptyRSS, fullRSS, emptyStart, fullStart, err
}

// timerBurst registers n timers due at one instant a little ahead and returns,
// for each, its late_by and how long after its time a client saw its due event.
func (r *runner) timerBurst(ctx context.Context, n int) (late, seen []float64, err error) {
	srv, err := r.startServer(ctx, "timer-burst", "--no-worker")
	if err != nil {
		return nil, nil, err
	}
	defer srv.stop()
	due := time.Now().Add(3*time.Second + time.Duration(n)*2*time.Millisecond).Truncate(time.Second)
	var mu sync.Mutex
	all := make(chan struct{})
	sub, err := srv.nc.Subscribe(events.TypeFilter(events.TypeDue), func(m *nats.Msg) {
		at := time.Now()
		var ev struct {
			Payload events.Due `json:"payload"`
		}
		d, perr := time.Duration(0), json.Unmarshal(m.Data, &ev)
		if perr == nil {
			d, perr = time.ParseDuration(ev.Payload.LateBy)
		}
		mu.Lock()
		defer mu.Unlock()
		if perr == nil && len(late) < n {
			late, seen = append(late, ms(d)), append(seen, ms(at.Sub(due)))
			if len(late) == n {
				close(all)
			}
		}
	})
	if err != nil {
		return nil, nil, err
	}
	defer sub.Unsubscribe()
	clients, err := srv.clients(8)
	if err != nil {
		return nil, nil, err
	}
	spec, _ := json.Marshal(map[string]any{"start_at": due.Format(time.RFC3339Nano), "target": "bench-burst"})
	if _, err := registerAll(ctx, clients, n, spec); err != nil {
		return nil, nil, err
	}
	if time.Now().After(due) {
		return nil, nil, fmt.Errorf("registering %d timers took past their time", n)
	}
	select {
	case <-all:
	case <-time.After(time.Until(due) + time.Minute):
		mu.Lock()
		defer mu.Unlock()
		return nil, nil, fmt.Errorf("%d of %d timers fired within a minute of their time", len(late), n)
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
	mu.Lock()
	defer mu.Unlock()
	return late, seen, nil
}

// afterFuncLateness is how late n time.AfterFunc timers set for one instant run,
// in ms: the plainest timers there are.
func afterFuncLateness(n int) []float64 {
	due := time.Now().Add(100 * time.Millisecond)
	out := make([]float64, n)
	var wg sync.WaitGroup
	for i := range out {
		wg.Add(1)
		time.AfterFunc(time.Until(due), func() {
			out[i] = ms(time.Since(due))
			wg.Done()
		})
	}
	wg.Wait()
	return out
}
