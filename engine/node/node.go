// Package node is the composition root of an engine: it opens the engine's
// streams and buckets, wires every long-running part (projector, dispatcher,
// timers, leases, pusher, targets watch, archiver, scheduler, schedule runner
// and API), says in one place who reacts to an applied event, and starts the
// parts in order and stops them in reverse. `bgtask server` and the tests that need an engine make
// one the same way: New(Config), Start, Stop.
package node

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/metrics"
	"github.com/bgtask/bgtask/projections"
)

// Config is what an engine is made of. New checks it with Validate.
type Config struct {
	// Conn is the engine's connection to NATS; it must be allowed everything.
	Conn *nats.Conn
	// Writer names the engine in the events it writes: the same across the
	// restarts of one engine, so that a push it claimed before a crash is known
	// to be dead when it starts again, and distinct between replicas.
	Writer string
	// LeaseTTL is how long a worker may go without a heartbeat before its running
	// tasks are lost.
	LeaseTTL time.Duration
	// Replicas is how many copies of each stream and bucket are kept, 1 to 5.
	Replicas int
	// Sinks makes the attempts of push sinks.
	Sinks engine.SinkRunner
	// RetryBase is the wait after a push sink's first failed attempt; 0:
	// engine.DefaultRetryBase.
	RetryBase time.Duration
	// Bearers are the bearer tokens webhook sinks may name.
	Bearers engine.Bearers
	// DenyPrivateWebhooks refuses, at registration, webhooks to non-public
	// addresses.
	DenyPrivateWebhooks bool
	// ArchiveAfter is how long finished tasks stay whole in the event stream; 0:
	// they are never archived.
	ArchiveAfter time.Duration
	// Snapshots is where and how often the projector keeps a snapshot of its state.
	Snapshots projections.Snapshots
	// Requests, if set, wraps the store the API's requests append through (the
	// embedded server fails them at once while its disk is full).
	Requests func(events.Store) events.Store
	// Version is the API service's version, as SemVer.
	Version string
	Base    engine.Base
}

// Validate says what is wrong with c, naming the field.
func (c Config) Validate() error {
	bad := func(field, why string) error { return fmt.Errorf("engine config: %s %s", field, why) }
	switch {
	case c.Conn == nil:
		return bad("Conn", "is nil: the engine needs a NATS connection")
	case c.Writer == "":
		return bad("Writer", "is empty: it names the engine in the events it writes")
	case c.LeaseTTL <= 0:
		return bad("LeaseTTL", fmt.Sprintf("is %v: want a positive duration", c.LeaseTTL))
	case c.Replicas < 1 || c.Replicas > 5:
		return bad("Replicas", fmt.Sprintf("is %d: want 1 to 5", c.Replicas))
	case c.Sinks == nil:
		return bad("Sinks", "is nil: the pusher needs a sink runner")
	case c.RetryBase < 0:
		return bad("RetryBase", fmt.Sprintf("is %v: want 0 (the default) or more", c.RetryBase))
	case c.ArchiveAfter < 0:
		return bad("ArchiveAfter", fmt.Sprintf("is %v: want 0 (never) or more", c.ArchiveAfter))
	case c.Version == "":
		return bad("Version", "is empty: the API service needs a SemVer version")
	}
	return nil
}

// Node is one engine. It is an engine.Component: Start, then Stop.
type Node struct {
	cfg  Config
	base engine.Base

	projector  *projections.Projector
	dispatcher *engine.Dispatcher
	timers     *engine.Timers
	depends    *engine.Dependencies
	leases     *engine.Leases
	pusher     *engine.Pusher
	targets    *events.TargetWatch
	archiver   *engine.Archiver
	scheduler  *engine.Scheduler
	schedules  *engine.ScheduleRunner
	api        *api.Server
	metrics    *metrics.Metrics

	mu      sync.Mutex
	begun   bool
	running []engine.Component // started, in order
}

// New returns the engine cfg describes, or the first thing wrong with cfg.
func New(cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Node{cfg: cfg, base: cfg.Base.WithDefaults()}, nil
}

// Projector is the engine's state as it reads the event stream, once started.
func (n *Node) Projector() *projections.Projector { return n.projector }

// Metrics serves the engine's metrics in the Prometheus text format, once it
// is started.
func (n *Node) Metrics() http.Handler { return n.metrics.Handler() }

// applied is who reacts to an event the projector applies live, and in which
// order: the dispatcher (a run that ended is delivered, a stall told), the
// timers (an armed task's deadline or start is set, and dropped once the task
// moves on), the dependencies (a task waiting for one that did not succeed is
// skipped), the pusher (a fired wake-up goes to its push sinks), the
// scheduler (an armed task, or a slot a run freed, is placed) and the metrics
// (what the event did is counted). Each only queues work or counts, and
// returns, for the projector must not block.
func (n *Node) applied(s engine.State, rec events.Record) {
	n.dispatcher.Notify(s)
	n.timers.Notify(s)
	n.depends.Notify(s)
	n.pusher.Notify(s)
	n.scheduler.Notify(s)
	n.metrics.Applied(s, rec)
}

// Start opens the engine's streams and buckets (creating them if need be, and
// retrying while JetStream is not ready), wires the parts and starts them:
//
//  1. dispatcher, timers: they take notifications before the projector sends any;
//  2. targets watch, then pusher: every target's state is known before the first
//     push, so a wake-up for a busy target is held from the start;
//  3. projector: it replays the stream; then the work a previous run left
//     (deliveries, deadlines, pushes) is handed to the parts above;
//  4. leases, archiver, scheduler, schedules: they read the replayed state;
//  5. API: requests are served once everything behind them runs.
//
// Stop stops them in the reverse order: the API first, the projector before
// the parts it notifies.
func (n *Node) Start(ctx context.Context) error {
	n.mu.Lock()
	begun := n.begun
	n.begun = true
	n.mu.Unlock()
	if begun {
		return engine.ErrStarted
	}
	st, err := openStreams(ctx, n.cfg, n.base)
	if err != nil {
		return err
	}
	n.wire(st)
	for _, c := range []engine.Component{n.dispatcher, n.timers, n.depends, n.targets, n.pusher, n.projector} {
		if err := n.start(ctx, c); err != nil {
			return err
		}
	}
	unsettled := n.projector.Unsettled()
	n.dispatcher.Recover(unsettled)
	n.timers.Recover(unsettled)
	n.depends.Recover(unsettled)
	n.pusher.Recover(unsettled)
	for _, c := range []engine.Component{n.leases, n.archiver, n.scheduler, n.schedules, n.api} {
		if err := n.start(ctx, c); err != nil {
			return err
		}
	}
	return nil
}

// start starts c, or stops what runs if it fails: a failed Start leaves nothing.
func (n *Node) start(ctx context.Context, c engine.Component) error {
	if err := c.Start(ctx); err != nil {
		n.Stop()
		return err
	}
	n.mu.Lock()
	n.running = append(n.running, c)
	n.mu.Unlock()
	return nil
}

// Stop stops the parts that run, in the reverse order of their start.
func (n *Node) Stop() {
	n.mu.Lock()
	running := n.running
	n.running = nil
	n.mu.Unlock()
	for i := len(running) - 1; i >= 0; i-- {
		running[i].Stop()
	}
}

// wire makes the parts over the streams, each given what it reads and writes.
func (n *Node) wire(st streams) {
	c, base, writer := n.cfg, n.base, n.cfg.Writer
	n.projector = projections.New(st.store, n.applied, base)
	n.projector.UseSnapshots(c.Snapshots)
	n.metrics = metrics.New(n.projector.Phases, func() []engine.WorkerStatus { return n.scheduler.Workers() })
	// The engine's appends, whose conflicts the metrics count.
	store := n.metrics.CountConflicts(st.store)
	n.dispatcher = engine.NewDispatcher(store, st.inbox, n.projector, writer, engine.Deliveries, base)
	n.timers = engine.NewTimers(store, n.projector, writer, base)
	n.depends = engine.NewDependencies(store, n.projector, writer, func() { n.scheduler.Kick() }, base)
	n.leases = engine.NewLeases(store, n.projector, st.liveness, writer, base)
	// Each start is an instance of its own, so no replica takes another's push in
	// flight for one of its own dead ones.
	me := engine.Engine{Writer: writer, Instance: uuid.NewString()}
	n.pusher = engine.NewPusher(store, n.projector, c.Sinks, me, c.RetryBase, base)
	n.targets = st.targets.Watch(n.pusher.TargetChanged, func(name string, err error) {
		base.Logger.Warn("unreadable target state counts as idle", "target", name, "err", err)
	})
	n.archiver = engine.NewArchiver(st.store, st.store, st.archive, n.projector, writer, c.ArchiveAfter, base)
	n.scheduler = engine.NewScheduler(n.projector, st.liveness, func(ctx context.Context, worker string, o events.Offer) (events.OfferReply, error) {
		return events.OfferTask(ctx, c.Conn, worker, o)
	}, base)
	requests := store
	if c.Requests != nil {
		requests = c.Requests(store)
	}
	svc := engine.NewService(requests, writer, base)
	svc.ReadArchive(st.archive)
	svc.ConsumeFrom(st.inbox)
	if c.DenyPrivateWebhooks {
		svc.DenyPrivateWebhooks()
	}
	svc.DeclareBearers(c.Bearers)
	n.schedules = engine.NewScheduleRunner(st.schedules, svc.Register, n.projector, svc.Cancel, base)
	n.api = api.New(c.Conn, svc, n.projector, n.scheduler, st.store, st.archive, c.Version, base)
	n.api.ServeSchedules(st.schedules, n.projector)
	n.api.ServeStats(func() any { return n.metrics.Stats() })
}

// streams are what an engine reads and writes.
type streams struct {
	store    *events.JetStreamStore
	inbox    *events.JetStreamInbox
	liveness *events.Liveness
	targets  *events.Targets
	archive  *events.Archive
	// schedules are the schedules' definitions, one key each.
	schedules *events.Schedules
}

// openStreams opens (creating them if need be) the engine's streams and buckets.
func openStreams(ctx context.Context, c Config, base engine.Base) (streams, error) {
	js, err := jetstream.New(c.Conn)
	if err != nil {
		return streams{}, err
	}
	var st streams
	steps := []func() error{
		func() (err error) {
			st.store, err = events.OpenStore(ctx, js, events.StreamConfig{Replicas: c.Replicas})
			return err
		},
		func() (err error) {
			st.inbox, err = events.OpenInbox(ctx, js, events.InboxConfig{Replicas: c.Replicas})
			return err
		},
		func() (err error) {
			st.liveness, err = events.OpenLiveness(ctx, js, c.LeaseTTL, c.Replicas)
			return err
		},
		func() (err error) {
			st.targets, err = events.OpenTargets(ctx, js, c.Replicas)
			return err
		},
		func() (err error) {
			st.archive, err = events.OpenArchive(ctx, js, c.Replicas)
			return err
		},
		func() (err error) {
			st.schedules, err = events.OpenSchedules(ctx, js, c.Replicas)
			return err
		},
	}
	for _, step := range steps {
		if err := retry(ctx, base, step); err != nil {
			return streams{}, err
		}
	}
	return st, nil
}

// StartTimeout bounds how long an engine retries opening one of its streams.
const StartTimeout = 2 * time.Minute

// retry retries one step of the start: on a cluster, a stream is not created (or
// found) while a leader is elected, while another engine creates the same
// stream, or while the cluster is too busy to answer in time, and all of that
// passes. A step that still fails after StartTimeout fails the start, with every
// attempt's error logged.
func retry(ctx context.Context, base engine.Base, step func() error) error {
	deadline := time.Now().Add(StartTimeout)
	for {
		err := step()
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		base.Logger.Warn("starting: retrying", "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
