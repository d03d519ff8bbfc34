package server

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/serverhome"
	"github.com/bgtask/bgtask/workers"
)

// WorkerOptions are what a worker runs with, in `bgtask worker` and `bgtask
// server`.
type WorkerOptions struct {
	// ID is the worker's identity in events; "": kept in the state directory.
	ID string
	// StateDir is where the worker keeps its runs and identity. RunWorker's
	// default is HOME/workers/ID (or HOME/workers/default); a server's worker
	// keeps them in HOME/worker.
	StateDir  string
	MaxTasks  int
	Tick      time.Duration
	KillGrace time.Duration
	// Labels are what the worker advertises; host=HOSTNAME is added unless given.
	Labels map[string]string
	// Exclusive keeps the worker for its labels.
	Exclusive bool
	// Drain starts the worker draining.
	Drain bool
}

// RunWorker runs the process of `bgtask worker` on d until ctx is done or it has
// drained: it waits for a server to have made the streams, starts the worker
// (again while the deployment cannot take it yet) and drains it on SIGUSR1.
func RunWorker(ctx context.Context, d Deployment, o WorkerOptions, logger *slog.Logger) error {
	logger = engine.Base{Logger: logger}.WithDefaults().Logger
	if o.StateDir == "" {
		home, err := serverhome.Dir(d.Home)
		if err != nil {
			return err
		}
		name := "default"
		if o.ID != "" {
			name = o.ID // each named worker keeps its own runs
		}
		o.StateDir = filepath.Join(home, "workers", name)
	}
	nc, err := d.connectAs("bgtask-worker", workerIdentity)
	if err != nil {
		return err
	}
	defer nc.Close()
	if err := waitForServer(ctx, nc, logger); err != nil {
		if ctx.Err() != nil {
			return nil // stopped while it waited
		}
		return err
	}
	// SIGUSR1 drains; registered before the worker starts so an early one is not lost.
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	defer signal.Stop(usr1)
	w, err := retryStart(ctx, logger, func() (*workerHandle, error) {
		return newWorker(ctx, nc, o, engine.Base{Logger: logger})
	})
	if err != nil {
		return err
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-usr1:
			w.w.Drain()
		case <-w.w.Drained():
			return nil
		}
	}
}

// waitForServer waits until a bgtask server has created the streams and the
// heartbeat bucket: in a deployment, workers may start before any engine.
func waitForServer(ctx context.Context, nc *nats.Conn, logger *slog.Logger) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	for logged := false; ; {
		_, err := js.Stream(ctx, events.StreamName)
		if err == nil {
			_, err = js.Stream(ctx, events.LogStreamName)
		}
		if err == nil {
			_, err = js.KeyValue(ctx, events.WorkersBucket)
		}
		if err == nil {
			return nil
		}
		if errors.Is(err, nats.ErrPermissionViolation) || errors.Is(err, nats.ErrAuthorization) {
			return err
		}
		// Not created yet, or a cluster too busy or electing a leader to answer.
		if !logged {
			logger.Info("waiting for a bgtask server to create the streams", "err", err)
			logged = true
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// startWorker runs the server's own worker on a connection of its own, as a worker
// on another host would.
func startWorker(ctx context.Context, ns *natsserver.Server, creds serverhome.Credentials, o WorkerOptions, base engine.Base) (*workerHandle, error) {
	nc, err := connectInProcess(ns, creds, "bgtask-worker")
	if err != nil {
		return nil, err
	}
	w, err := newWorker(ctx, nc, o, base)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return w, nil
}

// newWorker starts a worker on nc; it owns nc and closes it when stopped.
func newWorker(ctx context.Context, nc *nats.Conn, o WorkerOptions, base engine.Base) (*workerHandle, error) {
	if o.StateDir == "" {
		return nil, errors.New("worker: no state directory")
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	store, err := events.ConnectStore(ctx, js)
	if err != nil {
		return nil, err
	}
	if err := engine.ValidateLabels("--label", o.Labels); err != nil {
		return nil, &BadOption{Err: err}
	}
	if o.Exclusive && len(engine.ExclusiveLabels(o.Labels)) == 0 {
		return nil, badOption("--exclusive: give the labels the worker is kept for with --label KEY=VALUE (host does not count)")
	}
	w := workers.New(nc, js, store, workers.Config{
		ID: o.ID, MaxTasks: o.MaxTasks, TickInterval: o.Tick, KillGrace: o.KillGrace, StateDir: o.StateDir,
		Labels: o.Labels, Exclusive: o.Exclusive, Drain: o.Drain, Base: base,
	})
	if err := w.Start(ctx); err != nil {
		return nil, err
	}
	return &workerHandle{w: w, nc: nc}, nil
}

// workerHandle is a started worker and the connection it owns.
type workerHandle struct {
	w  *workers.Worker
	nc *nats.Conn
}

func (h *workerHandle) Stop() {
	h.w.Stop()
	h.nc.Close()
}
