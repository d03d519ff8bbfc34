package server

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/node"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/projections"
	"github.com/bgtask/bgtask/workers"
)

// engineOptions are what the server's options and home say of its engine.
type engineOptions struct {
	writer       string
	leaseTTL     time.Duration
	replicas     int
	push         pushing
	archiveAfter time.Duration
	snapshots    projections.Snapshots
	logBytes     int64  // asked for; 0: logStreamBytes fits it to maxStore
	maxStore     int64  // what JetStream may store; 0: the account's limit, if any
	storeDir     string // the embedded server's store, for what it says of its disk
	// denyPrivate refuses webhooks to non-public addresses at registration too.
	denyPrivate bool
	// diskFull, if set, says the store's disk is full: registrations and cancels
	// then fail at once, where JetStream would leave their appends unanswered.
	diskFull diskAlarm
	version  string // the API service's, as SemVer
}

// startEngine creates the log stream, sized to the store, which workers and
// clients write and read and the engine does not, and starts the engine.
func startEngine(ctx context.Context, nc *nats.Conn, base engine.Base, o engineOptions) (*node.Node, error) {
	if err := openLogs(ctx, nc, o, base.WithDefaults().Logger); err != nil {
		return nil, err
	}
	cfg := node.Config{
		Conn: nc, Writer: o.writer, LeaseTTL: o.leaseTTL, Replicas: o.replicas,
		Sinks: o.push.runner, RetryBase: o.push.retryBase, Bearers: o.push.bearers,
		DenyPrivateWebhooks: o.denyPrivate, ArchiveAfter: o.archiveAfter, Snapshots: o.snapshots,
		Version: o.version, Base: base,
	}
	if alarm := o.diskFull; alarm != nil {
		cfg.Requests = func(s events.Store) events.Store { return refuseWhenFull{Store: s, alarm: alarm} }
	}
	n, err := node.New(cfg)
	if err != nil {
		return nil, err
	}
	if err := n.Start(ctx); err != nil {
		return nil, err
	}
	return n, nil
}

// openLogs creates (or finds) the log stream, retrying while JetStream is not ready.
func openLogs(ctx context.Context, nc *nats.Conn, o engineOptions, log *slog.Logger) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	maxStore := o.maxStore
	if maxStore <= 0 {
		maxStore = accountMaxStore(ctx, js, o.replicas)
	}
	logBytes := logStreamBytes(o.logBytes, maxStore)
	if err := checkStoreRoom(maxStore, logBytes, o.storeDir); err != nil {
		return err
	}
	_, err = retryStart(ctx, log, func() (*events.Logs, error) {
		logs, err := events.OpenLogs(ctx, js, events.LogConfig{Replicas: o.replicas, MaxBytes: logBytes})
		if tooBig := errStreamTooBig(err, events.LogStreamName, logBytes, maxStore); tooBig != nil {
			return nil, tooBig
		}
		return logs, err
	})
	return err
}

// retryStart retries one step of the start: on a cluster, a stream is not created
// (or found, or a heartbeat not written) while a leader is elected, while another
// engine creates the same stream, or while the cluster is too busy to answer in
// time, and all of that passes. A step that still fails after node.StartTimeout
// fails the start, with every attempt's error logged.
func retryStart[T any](ctx context.Context, log *slog.Logger, step func() (T, error)) (T, error) {
	deadline := time.Now().Add(node.StartTimeout)
	for {
		v, err := step()
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) || unmendable(err) {
			return v, err
		}
		log.Warn("starting: retrying", "err", err)
		select {
		case <-ctx.Done():
			return v, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// unmendable reports whether waiting cannot mend err: a bad option, or a state
// directory that another worker holds.
func unmendable(err error) bool {
	return errors.As(err, new(*BadOption)) || errors.Is(err, workers.ErrStateDirInUse)
}
