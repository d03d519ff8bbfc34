package main

import (
	"context"
	"errors"
	"path/filepath"
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
	stateDir  string
	maxTasks  int
	tick      time.Duration
	killGrace time.Duration
}

func (o *workerOptions) register(f *pflag.FlagSet) {
	f.StringVar(&o.id, "worker-id", "", "the worker's identity in events (default: HOST-RANDOM, kept in the state directory)")
	f.IntVar(&o.maxTasks, "max-tasks", workers.DefaultMaxTasks, "commands the worker runs at once; it takes no task beyond that")
	f.DurationVar(&o.tick, "tick", workers.DefaultTickInterval, "interval of a running task's tick events")
	f.DurationVar(&o.killGrace, "kill-grace", workers.DefaultKillGrace, "time between TERM and KILL when a task's process group is stopped")
}

func workerCmd(g *globals) *cobra.Command {
	var o workerOptions
	var logLevel, stateDir string
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Run a worker that takes tasks and runs their commands",
		Long: `Run a worker as its own process. It connects to the server found through --home
(or to --nats URL), takes armed tasks while it has capacity, runs each command in
its own process group in the login environment of the user running it, appends
tick events while it runs and an exited event when it ends.

Each command runs under a shim (this binary in shim mode) in a session of its
own, so stopping the worker (SIGINT, SIGTERM, even kill -9) leaves its commands
running; the next start with the same --state-dir watches them again and records
the exits that happened meanwhile, once. Any number of workers may run, each with
its own state directory; each task is taken by exactly one of them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := newLogger(g.stderr, logLevel)
			if err != nil {
				return err
			}
			if stateDir == "" {
				home, err := homeDir(g.home)
				if err != nil {
					return err
				}
				name := "default"
				if o.id != "" {
					name = o.id // each named worker keeps its own runs
				}
				stateDir = filepath.Join(home, "workers", name)
			}
			o.stateDir = stateDir
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
	cmd.Flags().StringVar(&stateDir, "state-dir", "", "where the worker keeps its runs and identity (default HOME/workers/WORKER-ID, or HOME/workers/default)")
	return cmd
}

// shimCmd is the shim mode the worker starts every command through.
func shimCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "shim DIR",
		Short:  "Run one command as its shim (started by workers)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			return workers.RunShim(args[0])
		},
	}
}

// newWorker starts a worker on nc; it owns nc and closes it when stopped.
func newWorker(ctx context.Context, nc *nats.Conn, o workerOptions, base engine.Base) (*workerHandle, error) {
	if o.stateDir == "" {
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
	w := workers.New(nc, js, store, workers.Config{
		ID: o.id, MaxTasks: o.maxTasks, TickInterval: o.tick, KillGrace: o.killGrace, StateDir: o.stateDir, Base: base,
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
