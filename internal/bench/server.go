package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/events"
)

// server is a `bgtask server` child process with a client connection to it.
type server struct {
	*proc
	r     *runner
	nc    *nats.Conn
	api   *api.Client
	js    jetstream.JetStream
	conns []*nats.Conn  // more clients, for concurrent requests
	raw   *rawJetStream // the baselines' own JetStream, once a scenario asked for it
}

// rawBaseline returns the baselines' JetStream beside the server, started at the
// first call with its sync setting and at least clients connections.
func (s *server) rawBaseline(ctx context.Context, syncAlways bool, clients int) (*rawJetStream, error) {
	if s.raw == nil || len(s.raw.js) < clients {
		if s.raw != nil {
			s.raw.stop()
		}
		raw, err := startRawJetStream(ctx, s.home, syncAlways, clients)
		if err != nil {
			return nil, err
		}
		s.raw = raw
	}
	return s.raw, nil
}

// startServer starts `bgtask server` in a new home and waits until it serves
// requests.
func (r *runner) startServer(ctx context.Context, name string, args ...string) (*server, error) {
	home, err := r.newHome(name)
	if err != nil {
		return nil, err
	}
	return r.startServerIn(ctx, home, name, args...)
}

// startServerIn starts `bgtask server` on an existing home.
func (r *runner) startServerIn(ctx context.Context, home, name string, args ...string) (*server, error) {
	p, err := r.spawn(home, name, append([]string{"server", "--log-level", "warn"}, args...)...)
	if err != nil {
		return nil, err
	}
	s := &server{proc: p, r: r}
	if err := s.waitReady(ctx, 5*time.Minute); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// waitReady waits until the server has written its discovery file, which it does
// once its projector has replayed the stream and its API serves, and connects.
func (s *server) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if pid, err := s.r.opts.ServerPID(s.home); err == nil && pid == s.pid() {
			break
		}
		if s.exited() {
			return s.failure("exited before it was ready")
		}
		if time.Now().After(deadline) {
			return s.failure("not ready after %v", timeout)
		}
		if err := sleepCtx(ctx, 2*time.Millisecond); err != nil {
			return err
		}
	}
	nc, err := s.r.opts.Connect(s.home)
	if err != nil {
		return s.failure("connect: %v", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return err
	}
	s.nc, s.js, s.api = nc, js, api.NewClient(nc)
	return nil
}

// clients returns n connections to the server (the first is its own), for
// concurrent clients that each wait for their replies.
func (s *server) clients(n int) ([]*api.Client, error) {
	for len(s.conns) < n-1 {
		nc, err := s.r.opts.Connect(s.home)
		if err != nil {
			return nil, err
		}
		s.conns = append(s.conns, nc)
	}
	out := []*api.Client{s.api}
	for _, nc := range s.conns[:n-1] {
		out = append(out, api.NewClient(nc))
	}
	return out, nil
}

// stop closes the clients, stops the server and kills whatever it left running
// (shims and their commands outlive a server on purpose).
func (s *server) stop() {
	if s.raw != nil {
		s.raw.stop()
	}
	for _, nc := range s.conns {
		nc.Close()
	}
	if s.nc != nil {
		s.nc.Close()
	}
	s.proc.stop(15 * time.Second)
	if err := sweep(s.home); err != nil {
		s.r.progress("%s: %v", s.name, err)
	}
}

// spec is a task the bench registers: its command runs in the home, with the
// marker in its environment so that the cleanup finds it whatever the login
// profile does to the environment.
func (s *server) spec(command, target string) []byte {
	data, _ := json.Marshal(map[string]any{
		"command": command,
		"cwd":     s.home,
		"target":  target,
		"env":     map[string]string{markerEnv: s.home},
	})
	return data
}

// sharedServer returns the run's server with a worker for a --sync mode,
// starting it (and the other modes given, concurrently) when first asked. A
// worker resolves the login environment before it takes its first task, which
// takes as long as the user's profile: each is warmed up with one task first.
func (r *runner) sharedServer(ctx context.Context, mode string, alsoStart ...string) (*server, error) {
	modes := append([]string{mode}, alsoStart...)
	started := make([]*server, len(modes))
	errs := make([]error, len(modes))
	var wg sync.WaitGroup
	for i, m := range modes {
		if r.shared[m] != nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.progress("starting a server with --sync %s and its worker", m)
			s, err := r.startServer(ctx, "server-"+m, "--sync", m)
			if err == nil {
				if err = s.warmUp(ctx); err != nil {
					s.stop()
				}
			}
			if err != nil {
				errs[i] = fmt.Errorf("server --sync %s: %w", m, err)
				return
			}
			started[i] = s
		}()
	}
	wg.Wait()
	for i, s := range started {
		if s != nil {
			r.shared[modes[i]] = s
		}
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return r.shared[mode], nil
}

// warmUp runs one task to its wake-up, so the worker has its login environment.
func (s *server) warmUp(ctx context.Context) error {
	w, err := watchInbox(s.nc, "bench-warmup")
	if err != nil {
		return err
	}
	defer w.close()
	reg, err := s.api.Register(ctx, s.spec("true", "bench-warmup"))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if _, err := w.wait(ctx, reg.ID); err != nil {
		return s.failure("warm-up task %s: %v", reg.ID, err)
	}
	return nil
}

// arrival is a wake-up as the bench received it.
type arrival struct {
	at     time.Time
	wakeup events.Wakeup
}

// inboxWatch sees the wake-ups of one target as they are published: a core NATS
// subscription receives the dispatcher's JetStream publish to the inbox as soon as
// the server routes it, which is when a consumer could read it.
type inboxWatch struct {
	sub     *nats.Subscription
	mu      sync.Mutex
	got     map[string]arrival
	last    time.Time
	changed chan struct{} // closed and replaced on each arrival
}

func watchInbox(nc *nats.Conn, target string) (*inboxWatch, error) {
	w := &inboxWatch{got: map[string]arrival{}, changed: make(chan struct{})}
	sub, err := nc.Subscribe(events.InboxSubject(target), func(m *nats.Msg) {
		at := time.Now()
		var wk events.Wakeup
		if json.Unmarshal(m.Data, &wk) != nil || wk.Notice != "" {
			return
		}
		w.mu.Lock()
		w.got[wk.ID] = arrival{at: at, wakeup: wk}
		w.last = at
		close(w.changed)
		w.changed = make(chan struct{})
		w.mu.Unlock()
	})
	if err != nil {
		return nil, err
	}
	// A task can end before the registration's reply is read: the subscription
	// must be in place on the server before the first task is registered.
	if err := nc.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	w.sub = sub
	return w, nil
}

func (w *inboxWatch) close() { _ = w.sub.Unsubscribe() }

// wait returns the wake-up of task id once it arrived.
func (w *inboxWatch) wait(ctx context.Context, id string) (arrival, error) {
	for {
		w.mu.Lock()
		a, ok := w.got[id]
		changed := w.changed
		w.mu.Unlock()
		if ok {
			return a, nil
		}
		select {
		case <-ctx.Done():
			return arrival{}, fmt.Errorf("no wake-up: %w", ctx.Err())
		case <-changed:
		}
	}
}

// waitCount waits until n wake-ups arrived and returns when the last did.
func (w *inboxWatch) waitCount(ctx context.Context, n int) (time.Time, error) {
	for {
		w.mu.Lock()
		got, last, changed := len(w.got), w.last, w.changed
		w.mu.Unlock()
		if got >= n {
			return last, nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("%d of %d wake-ups: %w", got, n, ctx.Err())
		case <-changed:
		}
	}
}

// sinceExit is, for each wake-up seen, the milliseconds from its command's exit
// (the shim's ended_at) to its arrival.
func (w *inboxWatch) sinceExit() []float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []float64
	for _, a := range w.got {
		if a.wakeup.EndedAt != nil {
			out = append(out, ms(a.at.Sub(*a.wakeup.EndedAt)))
		}
	}
	return out
}

// registerAll registers n copies of spec through the clients concurrently and
// returns the ids.
func registerAll(ctx context.Context, clients []*api.Client, n int, spec []byte) ([]string, error) {
	specs := make([][]byte, n)
	for i := range specs {
		specs[i] = spec
	}
	return registerSpecs(ctx, clients, specs)
}

// registerSpecs registers specs through the clients concurrently, each client
// one request at a time, and returns their ids, in order.
func registerSpecs(ctx context.Context, clients []*api.Client, specs [][]byte) ([]string, error) {
	ids := make([]string, len(specs))
	errs := make([]error, len(clients))
	var wg sync.WaitGroup
	for c, client := range clients {
		wg.Go(func() {
			for i := c; i < len(specs); i += len(clients) {
				reg, err := client.Register(ctx, specs[i])
				if err != nil {
					errs[c] = fmt.Errorf("register: %w", err)
					return
				}
				ids[i] = reg.ID
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return ids, nil
}

// listTotal is how many tasks the server's projection holds.
func (s *server) listTotal(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	reply, err := s.api.List(ctx, engine.ListQuery{Limit: 1})
	return reply.Total, err
}
