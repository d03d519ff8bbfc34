// Package workers runs tasks. A worker advertises its labels, state and capacity
// in its heartbeat; the engine offers it armed tasks its labels match. It takes one
// by appending spawned on top of the armed event, conditional on armed still being
// the task's last event, so only one worker can ever take it; it then runs the command in its own process group in
// the user's login environment, appends ticks while it runs and exited when it ends.
// Every append is conditional on the worker's own last event: when the engine
// cancels the task, the next append fails, and the worker stops the process group.
package workers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/secretenv"
)

// Config configures a worker.
type Config struct {
	// ID is the worker's identity, the writer of its events. Default: host-<random>.
	ID string
	// MaxTasks is how many commands it runs at once; it takes no task beyond that.
	MaxTasks int
	// TickInterval is how often a running task's tick is appended.
	TickInterval time.Duration
	// KillGrace is how long a cancelled command has between TERM and KILL.
	KillGrace time.Duration
	// TailLines is how many lines of output an exited event keeps.
	TailLines int
	// Env is the environment commands run in; nil resolves the login environment.
	Env []string
	// StateDir keeps the worker's runs (one directory each, written by their shims),
	// so that after a restart it watches them again. Required.
	StateDir string
	// Shim is the command that runs a shim (package shim), given the shim's
	// arguments after its own. Default: DefaultShim.
	Shim []string
	// Labels are matched against the placement of tasks; host (the hostname) is
	// added unless given.
	Labels map[string]string
	// Exclusive keeps the worker for the tasks placed on its labels: it takes only
	// those whose placement names each of its labels but host.
	Exclusive bool
	// Drain starts the worker draining: it watches the runs it left and exits.
	Drain bool
	Base  engine.Base
}

// Defaults.
const (
	DefaultMaxTasks     = 64
	DefaultTickInterval = 10 * time.Second
	DefaultKillGrace    = 10 * time.Second
	DefaultTailLines    = 50
	// MaxLineBytes caps each output line kept in an event.
	MaxLineBytes = 2000
)

func (c Config) withDefaults() Config {
	if c.MaxTasks <= 0 {
		c.MaxTasks = DefaultMaxTasks
	}
	if c.TickInterval <= 0 {
		c.TickInterval = DefaultTickInterval
	}
	if c.KillGrace <= 0 {
		c.KillGrace = DefaultKillGrace
	}
	if c.TailLines <= 0 {
		c.TailLines = DefaultTailLines
	}
	if c.Shim == nil {
		c.Shim = DefaultShim()
	}
	c.Labels = maps.Clone(c.Labels)
	if c.Labels == nil {
		c.Labels = map[string]string{}
	}
	if c.Labels[engine.HostLabel] == "" {
		c.Labels[engine.HostLabel] = hostname()
	}
	c.Base = c.Base.WithDefaults()
	return c
}

// Worker takes the tasks the engine offers it and runs them.
type Worker struct {
	cfg   Config
	host  string
	nc    *nats.Conn
	js    jetstream.JetStream
	store events.Store
	logs  *events.Logs
	env   func() []string
	// slots holds one token per task the worker runs or is taking: it never runs
	// more than MaxTasks.
	slots chan struct{}

	// beatMu orders the heartbeats with the removal of a drained worker's.
	beatMu sync.Mutex

	mu               sync.Mutex
	runs             map[string]*run
	taking           map[string]bool
	state            events.WorkerState
	stopping         bool
	held             int // what a stopping worker left running
	started          time.Time
	drained          chan struct{} // closed when a drain has ended: nothing runs, nothing is taken
	heartbeatRemoved bool          // by the end of a drain; set under beatMu too

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	subs   []*nats.Subscription
	lock   *os.File
	// notify tells the runs when their files change: one inotify instance for all.
	notify *notifier
	// finished removes the directories of runs whose end is recorded.
	finished sweeper
	// shims is the shim that runs the worker's commands.
	shims *shims

	liveness *events.Liveness
}

// beat writes the worker's heartbeat: its lease, and what it runs.
func (w *Worker) beat(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, appendTimeout)
	defer cancel()
	w.beatMu.Lock()
	defer w.beatMu.Unlock()
	w.mu.Lock()
	if w.heartbeatRemoved {
		w.mu.Unlock()
		return nil // drained: it must not come back alive
	}
	info := events.WorkerInfo{
		ID: w.cfg.ID, Host: w.host, Labels: w.cfg.Labels, Exclusive: w.cfg.Exclusive, State: w.state, Running: max(len(w.runs), w.held),
		MaxTasks: w.cfg.MaxTasks, Heartbeat: time.Now().UTC(), StartedAt: w.started,
	}
	w.mu.Unlock()
	return w.liveness.Beat(ctx, info)
}

// heartbeat renews the lease four times per lease TTL until the worker stops. The
// TTL is the server's, read again before every beat and when the connection comes
// back (a server restarted with another --lease-ttl): a worker beating at the rate
// of an older, longer TTL would look dead between its beats.
func (w *Worker) heartbeat(ctx context.Context) {
	reconnected := w.nc.StatusChanged(nats.CONNECTED)
	defer w.nc.RemoveStatusListener(reconnected)
	every := beatEvery(w.liveness.TTL())
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		case <-reconnected:
		}
		read, cancel := context.WithTimeout(ctx, appendTimeout)
		if err := w.liveness.Refresh(read); err != nil && ctx.Err() == nil {
			w.cfg.Base.Logger.Warn("lease TTL not read again", "err", err)
		}
		cancel()
		if next := beatEvery(w.liveness.TTL()); next != every {
			w.cfg.Base.Logger.Info("the lease TTL changed: heartbeats follow it", "lease_ttl", w.liveness.TTL(), "every", next)
			every = next
			ticker.Reset(every)
		}
		if err := w.beat(ctx); err != nil && ctx.Err() == nil {
			w.cfg.Base.Logger.Warn("heartbeat not recorded", "err", err)
		}
	}
}

func beatEvery(ttl time.Duration) time.Duration { return max(ttl/4, 100*time.Millisecond) }

// New returns a worker that appends through store and reads armed tasks with js.
func New(nc *nats.Conn, js jetstream.JetStream, store events.Store, cfg Config) *Worker {
	cfg = cfg.withDefaults()
	w := &Worker{
		cfg: cfg, host: hostname(), nc: nc, js: js, store: store,
		slots: make(chan struct{}, cfg.MaxTasks), runs: map[string]*run{}, taking: map[string]bool{},
		state: events.WorkerStarting, started: time.Now().UTC(), drained: make(chan struct{}),
		finished: sweeper{delay: sweepDelay}, shims: &shims{cmd: cfg.Shim, log: cfg.Base.Logger},
	}
	w.env = sync.OnceValue(func() []string {
		if cfg.Env != nil {
			return secretenv.Without(cfg.Env)
		}
		env, err := LoginEnv(context.Background())
		if err != nil {
			cfg.Base.Logger.Warn("using the worker's own environment", "err", err)
			return secretenv.Without(os.Environ())
		}
		return env
	})
	return w
}

// ID is the worker's identity.
func (w *Worker) ID() string { return w.cfg.ID }

// Start begins taking tasks.
func (w *Worker) Start(ctx context.Context) error {
	if err := w.checkConfig(); err != nil {
		return err
	}
	lock, err := lockStateDir(w.cfg.StateDir)
	if err != nil {
		return err
	}
	w.lock = lock
	started := false
	defer func() {
		if !started {
			lock.Close() // another worker may have the directory
		}
	}()
	if err := w.open(ctx); err != nil {
		return err
	}
	w.ctx, w.cancel = context.WithCancel(context.WithoutCancel(ctx))
	w.notify = newNotifier(w.cfg.Base.Logger)
	if err := w.reattach(w.ctx); err != nil {
		return w.abort(err)
	}
	for verb, handle := range map[string]nats.MsgHandler{events.VerbOffer: w.onOffer, events.VerbDrain: w.onDrain} {
		sub, err := w.nc.Subscribe(events.WorkerSubject(w.cfg.ID, verb), handle)
		if err != nil {
			return w.abort(fmt.Errorf("worker: subscribe to %s: %w", verb, err))
		}
		w.subs = append(w.subs, sub)
	}
	w.startLoops(w.ctx)
	started = true
	w.cfg.Base.Logger.Info("worker started", "worker", w.cfg.ID, "max_tasks", w.cfg.MaxTasks, "labels", engine.FormatLabels(w.cfg.Labels), "shim", strings.Join(w.cfg.Shim, " "))
	if w.cfg.Drain {
		w.Drain()
	}
	return nil
}

func (w *Worker) checkConfig() error {
	if w.cfg.StateDir == "" || len(w.cfg.Shim) == 0 {
		return errors.New("worker: a state directory and a shim command are required")
	}
	if err := engine.ValidateLabels("--label", w.cfg.Labels); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	if w.cfg.Exclusive && len(engine.ExclusiveLabels(w.cfg.Labels)) == 0 {
		return errors.New("worker: --exclusive: give the labels it is kept for with --label KEY=VALUE (host does not count)")
	}
	if w.cfg.ID != "" && !events.ValidToken(w.cfg.ID) {
		return fmt.Errorf("worker: id %q: use letters, digits, '-' and '_'", w.cfg.ID)
	}
	return nil
}

// open takes the worker's identity from its state directory, connects to its
// streams, beats once and hears cancellations.
func (w *Worker) open(ctx context.Context) error {
	var err error
	if w.cfg.ID, err = stableID(w.cfg.StateDir, w.cfg.ID); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	if !events.ValidToken(w.cfg.ID) {
		return fmt.Errorf("worker: id %q: use letters, digits, '-' and '_'", w.cfg.ID)
	}
	if w.logs, err = events.ConnectLogs(ctx, w.js); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	if w.liveness, err = events.ConnectLiveness(ctx, w.js); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	// The first heartbeat comes before the first run is watched again: the runs
	// this worker left are its own only while its lease holds.
	if err := w.beat(ctx); err != nil {
		return fmt.Errorf("worker: heartbeat: %w", err)
	}
	// Cancellations and external completions are published on the task's
	// subject; a core subscription sees them at once. One that is missed is still
	// caught by the next conditional append.
	for _, typ := range []events.Type{events.TypeCancelled, events.TypeCompleted} {
		sub, err := w.nc.Subscribe(events.TypeFilter(typ), w.onCancelled)
		if err != nil {
			return fmt.Errorf("worker: subscribe to %s: %w", typ, err)
		}
		w.subs = append(w.subs, sub)
	}
	return nil
}

// abort undoes a start that failed after the worker's context was made.
func (w *Worker) abort(err error) error {
	w.cancel()
	w.wg.Wait()
	w.unsubscribe()
	w.notify.close()
	w.finished.flush()
	w.shims.close()
	return err
}

// startLoops starts what runs for the worker's life: the heartbeat, the reaping of
// shims, and the resolution of the login environment that makes it ready.
func (w *Worker) startLoops(ctx context.Context) {
	w.wg.Go(func() { w.heartbeat(ctx) })
	// A shim ends after its last run is over, when the worker may watch it no
	// more: it is reaped when its end is signalled, as are the orphans the worker
	// adopts as a subreaper (the commands of a shim that died, and what they
	// leave).
	becomeSubreaper()
	ended := make(chan os.Signal, 1)
	signal.Notify(ended, syscall.SIGCHLD)
	w.wg.Go(func() {
		defer signal.Stop(ended)
		for {
			select {
			case <-ctx.Done():
				return
			case <-ended:
				reapShims()
				reapAdopted()
			}
		}
	})
	w.wg.Go(func() {
		// A login shell takes a second or two: take no task before it is resolved,
		// so tasks go to workers that can start them at once.
		w.env()
		w.setState(ctx, events.WorkerReady, events.WorkerStarting)
	})
}

// setState moves the worker to a state if it is in one of from, and says so in a
// heartbeat at once: the engine offers tasks only to a ready worker.
func (w *Worker) setState(ctx context.Context, to events.WorkerState, from ...events.WorkerState) bool {
	w.mu.Lock()
	if !slices.Contains(from, w.state) {
		w.mu.Unlock()
		return false
	}
	w.state = to
	w.mu.Unlock()
	if err := w.beat(ctx); err != nil && ctx.Err() == nil {
		w.cfg.Base.Logger.Warn("heartbeat not recorded", "err", err)
	}
	return true
}

func (w *Worker) unsubscribe() {
	for _, sub := range w.subs {
		_ = sub.Unsubscribe()
	}
}

// Stop takes no more tasks and stops watching the running ones. Their commands go
// on under their shims; the next Start of a worker with the same state directory
// watches them again and records their exits. The worker's lease holds meanwhile:
// its last heartbeat says stopped, or is removed if it ran nothing.
func (w *Worker) Stop() {
	if w.cancel == nil {
		return
	}
	w.unsubscribe()
	w.mu.Lock()
	w.stopping = true
	// The runs it holds now are left running, and stay its own: they keep its lease.
	held := len(w.runs) + len(w.taking)
	w.held = held
	w.mu.Unlock()
	w.cancel()
	w.wg.Wait()
	w.notify.close()
	w.finished.flush()
	w.shims.close()
	ctx, cancel := context.WithTimeout(context.Background(), appendTimeout)
	defer cancel()
	var err error
	if held == 0 || w.isDrained() {
		err = w.liveness.Remove(ctx, w.cfg.ID)
	} else {
		w.mu.Lock()
		w.state = events.WorkerStopped
		w.mu.Unlock()
		err = w.beat(ctx)
	}
	if err != nil {
		w.cfg.Base.Logger.Warn("last heartbeat not recorded", "err", err)
	}
	w.lock.Close()
}

// Running returns the ids of the tasks this worker runs now.
func (w *Worker) Running() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	ids := make([]string, 0, len(w.runs))
	for id := range w.runs {
		ids = append(ids, id)
	}
	return ids
}

// onCancelled stops the run of a task cancelled or completed from outside.
func (w *Worker) onCancelled(m *nats.Msg) {
	// bgtask.events.<task-id>.cancelled, or .completed
	parts := strings.Split(m.Subject, ".")
	if len(parts) != 4 {
		return
	}
	w.mu.Lock()
	r := w.runs[parts[2]]
	w.mu.Unlock()
	if r != nil {
		r.cancel()
	}
}

func hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "localhost"
	}
	return h
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
