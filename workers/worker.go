// Package workers runs tasks. A worker takes a task by appending spawned on top of
// its armed event, conditional on armed still being the task's last event, so only
// one worker can ever take it; it then runs the command in its own process group in
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
	"io/fs"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// pullWait is how long one request for an armed task waits.
const pullWait = 5 * time.Second

// ConsumerName is the durable consumer of armed events that all workers share, so
// each armed task is offered to one worker at a time.
const ConsumerName = "workers"

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
	// Shim is the command that runs a shim, given a run directory as its last
	// argument. Default: this program with the argument "shim".
	Shim []string
	Base engine.Base
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
		// This very binary, even if an upgrade replaced its file meanwhile.
		c.Shim = []string{"/proc/self/exe", "shim"}
	}
	c.Base = c.Base.WithDefaults()
	return c
}

// Worker takes armed tasks and runs them.
type Worker struct {
	cfg   Config
	host  string
	nc    *nats.Conn
	js    jetstream.JetStream
	store events.Store
	logs  *events.Logs
	env   func() []string
	slots chan struct{}

	mu   sync.Mutex
	runs map[string]*run

	cancel context.CancelFunc
	wg     sync.WaitGroup
	sub    *nats.Subscription
	lock   *os.File

	liveness *events.Liveness
}

// beat writes the worker's heartbeat: its lease, and what it runs.
func (w *Worker) beat(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, appendTimeout)
	defer cancel()
	return w.liveness.Beat(ctx, events.WorkerInfo{
		ID: w.cfg.ID, Host: w.host, Running: len(w.Running()), MaxTasks: w.cfg.MaxTasks, Heartbeat: time.Now().UTC(),
	})
}

// heartbeat renews the lease four times per lease TTL until the worker stops.
func (w *Worker) heartbeat(ctx context.Context) {
	ticker := time.NewTicker(max(w.liveness.TTL()/4, 100*time.Millisecond))
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			if err := w.beat(ctx); err != nil && ctx.Err() == nil {
				w.cfg.Base.Logger.Warn("heartbeat not recorded", "err", err)
			}
		}
	}
}

// New returns a worker that appends through store and reads armed tasks with js.
func New(nc *nats.Conn, js jetstream.JetStream, store events.Store, cfg Config) *Worker {
	cfg = cfg.withDefaults()
	w := &Worker{
		cfg: cfg, host: hostname(), nc: nc, js: js, store: store,
		slots: make(chan struct{}, cfg.MaxTasks), runs: map[string]*run{},
	}
	w.env = sync.OnceValue(func() []string {
		if cfg.Env != nil {
			return cfg.Env
		}
		env, err := LoginEnv(context.Background())
		if err != nil {
			cfg.Base.Logger.Warn("using the worker's own environment", "err", err)
			return os.Environ()
		}
		return env
	})
	return w
}

// ID is the worker's identity.
func (w *Worker) ID() string { return w.cfg.ID }

// Start begins taking tasks.
func (w *Worker) Start(ctx context.Context) error {
	if w.cfg.StateDir == "" || len(w.cfg.Shim) == 0 {
		return errors.New("worker: a state directory and a shim command are required")
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
	if w.cfg.ID != "" && !events.ValidToken(w.cfg.ID) {
		return fmt.Errorf("worker: id %q: use letters, digits, '-' and '_'", w.cfg.ID)
	}
	if w.cfg.ID, err = stableID(w.cfg.StateDir, w.cfg.ID); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	logs, err := events.ConnectLogs(ctx, w.js)
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	w.logs = logs
	if w.liveness, err = events.ConnectLiveness(ctx, w.js); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	if !events.ValidToken(w.cfg.ID) {
		return fmt.Errorf("worker: id %q: use letters, digits, '-' and '_'", w.cfg.ID)
	}
	// The first heartbeat comes before the first run is watched again: the runs
	// this worker left are its own only while its lease holds.
	if err := w.beat(ctx); err != nil {
		return fmt.Errorf("worker: heartbeat: %w", err)
	}
	cons, err := w.js.CreateOrUpdateConsumer(ctx, events.StreamName, jetstream.ConsumerConfig{
		Durable:     ConsumerName,
		Description: "armed tasks, shared by all bgtask workers",
		// A task is armed by its registration, and again when its worker is lost
		// and its spec says respawn.
		FilterSubjects: []string{events.TypeFilter(events.TypeArmed), events.TypeFilter(events.TypeLost)},
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        30 * time.Second,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return fmt.Errorf("worker: consumer %s: %w", ConsumerName, err)
	}
	// Cancellations are published on the task's subject; a core subscription sees
	// them at once. One that is missed is still caught by the next conditional append.
	w.sub, err = w.nc.Subscribe(events.TypeFilter(events.TypeCancelled), w.onCancelled)
	if err != nil {
		return fmt.Errorf("worker: subscribe to cancellations: %w", err)
	}
	ctx, w.cancel = context.WithCancel(context.WithoutCancel(ctx))
	if err := w.reattach(ctx); err != nil {
		w.cancel()
		w.wg.Wait()
		_ = w.sub.Unsubscribe()
		return err
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		w.heartbeat(ctx)
	}()
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		// A login shell takes a second or two: take no task before it is resolved,
		// so tasks go to workers that can start them at once.
		w.env()
		w.takeLoop(ctx, cons)
	}()
	started = true
	w.cfg.Base.Logger.Info("worker started", "worker", w.cfg.ID, "max_tasks", w.cfg.MaxTasks)
	return nil
}

// Stop takes no more tasks and stops watching the running ones. Their commands go
// on under their shims; the next Start of a worker with the same state directory
// watches them again and records their exits.
func (w *Worker) Stop() {
	if w.cancel == nil {
		return
	}
	_ = w.sub.Unsubscribe()
	w.cancel()
	w.wg.Wait()
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

func (w *Worker) takeLoop(ctx context.Context, cons jetstream.Consumer) {
	backoff := 50 * time.Millisecond
	for {
		select {
		case w.slots <- struct{}{}: // wait for capacity before asking for a task
		case <-ctx.Done():
			return
		}
		// A short pull: a request lost with a restarted server is replaced within
		// seconds instead of waiting out a long expiry.
		pullCtx, cancelPull := context.WithTimeout(ctx, pullWait)
		msg, err := cons.Next(jetstream.FetchContext(pullCtx))
		cancelPull()
		if err != nil {
			<-w.slots
			if ctx.Err() != nil {
				return
			}
			if !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) {
				w.cfg.Base.Logger.Warn("worker: fetching armed tasks", "err", err)
				select {
				case <-ctx.Done():
					return
				case <-time.After(backoff):
				}
				backoff = min(2*backoff, 5*time.Second)
			}
			continue
		}
		backoff = 50 * time.Millisecond
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			defer func() { <-w.slots }()
			w.take(ctx, msg)
		}()
	}
}

// take tries to become the owner of an armed task and runs it if it did.
func (w *Worker) take(ctx context.Context, msg jetstream.Msg) {
	log := w.cfg.Base.Logger
	meta, err := msg.Metadata()
	if err != nil {
		_ = msg.Term()
		return
	}
	rec, err := events.DecodeRecord(meta.Sequence.Stream, msg.Data())
	if err == nil {
		var armed engine.State
		var offsets [2]int64
		if rec.Type == events.TypeArmed {
			armed, err = engine.Apply(engine.State{}, rec)
		} else {
			// Lost by its worker: armed again if its spec says respawn. That takes the
			// whole history, and the log goes on after the earlier runs' output.
			armed, err = engine.Load(ctx, w.store, rec.TaskID)
			if err == nil && (armed.Phase != engine.PhaseArmed || armed.Seq != rec.Seq) {
				_ = msg.Ack() // ended, or moved on since
				return
			}
			for i, stream := range []string{events.Stdout, events.Stderr} {
				if err == nil {
					offsets[i], err = w.logs.End(ctx, rec.TaskID, stream)
				}
			}
		}
		if err == nil {
			// The run's directory is made before the spawn is appended: a worker that
			// dies between the two finds the task again when it restarts.
			dir := w.runDir(armed.ID, armed.Epoch+1)
			if err = writeIntent(dir, armed.ID, armed.Epoch+1); errors.Is(err, fs.ErrExist) {
				_ = msg.Ack() // this worker took it before a restart, and holds the run
				return
			} else if err != nil {
				log.Error("worker: cannot write its state directory", "err", err)
				_ = msg.NakWithDelay(time.Second)
				return
			}
			r := &run{w: w, state: armed, cancelled: make(chan struct{})}
			switch held, err := r.claim(ctx); {
			case held:
				_ = msg.Ack()
				engine.CrashPoint(engine.CrashAfterSpawn)
				r.execute(ctx, offsets, func(offsets *[2]int64) bool { return r.runOnce(ctx, offsets) })
			case err == nil:
				_ = os.RemoveAll(dir)
				_ = msg.Ack() // another worker took it, or it was cancelled first
			default:
				// Stopping with the spawn's outcome unknown: the run's directory stays,
				// and the next start of this worker learns it from the log.
				log.Warn("worker: stopping before its take of a task was settled", "task", rec.TaskID, "err", err)
			}
			return
		}
	}
	log.Error("worker: unreadable armed event skipped", "seq", meta.Sequence.Stream, "err", err)
	_ = msg.Term()
}

func (w *Worker) onCancelled(m *nats.Msg) {
	// bgtask.events.<task-id>.cancelled
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
