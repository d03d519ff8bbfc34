package main

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/workers"
)

// workerOptions are the flags of a worker, in `bgtask worker` and `bgtask server`.
type workerOptions struct {
	id        string
	maxTasks  int
	tick      time.Duration
	killGrace time.Duration
}

func (o *workerOptions) register(f *pflag.FlagSet) {
	f.StringVar(&o.id, "worker-id", "", "the worker's identity in events (default HOST-RANDOM)")
	f.IntVar(&o.maxTasks, "max-tasks", workers.DefaultMaxTasks, "commands the worker runs at once; it takes no task beyond that")
	f.DurationVar(&o.tick, "tick", workers.DefaultTickInterval, "interval of a running task's tick events")
	f.DurationVar(&o.killGrace, "kill-grace", workers.DefaultKillGrace, "time between TERM and KILL when a task's process group is stopped")
}

func workerCmd(g *globals) *cobra.Command {
	var o workerOptions
	var logLevel string
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Run a worker that takes tasks and runs their commands",
		Long: `Run a worker as its own process. It connects to the server found through --home
(or to --nats URL), takes armed tasks while it has capacity, runs each command in
its own process group in the login environment of the user running it, appends
tick events while it runs and an exited event when it ends.

Any number of workers may run; each task is taken by exactly one of them. Stopping
a worker (SIGINT, SIGTERM) stops the commands it runs and records their exit.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := newLogger(g.stderr, logLevel)
			if err != nil {
				return err
			}
			nc, err := g.connect("bgtask-worker")
			if err != nil {
				return err
			}
			defer nc.Close()
			w, err := newWorker(cmd.Context(), nc, o, engine.Base{Logger: logger})
			if err != nil {
				return err
			}
			<-cmd.Context().Done()
			w.Stop()
			return nil
		},
	}
	o.register(cmd.Flags())
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	return cmd
}

// newWorker starts a worker on nc; it owns nc and closes it when stopped.
func newWorker(ctx context.Context, nc *nats.Conn, o workerOptions, base engine.Base) (*workerHandle, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	store, err := events.ConnectStore(ctx, js)
	if err != nil {
		return nil, err
	}
	w := workers.New(nc, js, store, workers.Config{
		ID: o.id, MaxTasks: o.maxTasks, TickInterval: o.tick, KillGrace: o.killGrace, Base: base,
	})
	if err := w.Start(ctx); err != nil {
		return nil, err
	}
	return &workerHandle{w: w, nc: nc}, nil
}

type workerHandle struct {
	w  *workers.Worker
	nc *nats.Conn
}

func (h *workerHandle) Stop() {
	h.w.Stop()
	h.nc.Close()
}
