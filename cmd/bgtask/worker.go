package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/serverhome"
	"github.com/bgtask/bgtask/workers"
	"github.com/bgtask/bgtask/workers/shim"
)

// workerOptions are the flags of a worker, in `bgtask worker` and `bgtask server`.
type workerOptions struct {
	id        string
	stateDir  string
	maxTasks  int
	tick      time.Duration
	killGrace time.Duration
	labels    []string
	exclusive bool
	drain     bool
}

func (o *workerOptions) register(f *pflag.FlagSet) {
	f.StringVar(&o.id, "worker-id", "", "the worker's identity in events (default: HOST-RANDOM, kept in the state directory)")
	f.IntVar(&o.maxTasks, "max-tasks", workers.DefaultMaxTasks, "commands the worker runs at once; it takes no task beyond that")
	f.DurationVar(&o.tick, "tick", workers.DefaultTickInterval, "interval of a running task's tick events")
	f.DurationVar(&o.killGrace, "kill-grace", workers.DefaultKillGrace, "time between TERM and KILL when a task's process group is stopped")
	f.StringArrayVar(&o.labels, "label", nil, "KEY=VALUE the worker advertises; a task's placement must match its labels (repeatable; host=HOSTNAME is always added unless given)")
	f.BoolVar(&o.exclusive, "exclusive", false, "keep the worker for its --label labels: take only tasks whose placement names each of them (host aside)")
}

const workerLong = `Run a worker as its own process, on this host or another. It connects to the
server found through --home (or to --nats URL with the auth flags), advertises its
labels (always host=HOSTNAME), its capacity and a heartbeat, and runs the tasks the
engine offers it: only tasks whose placement its labels match, never more than
--max-tasks at once. With --exclusive it is kept for its labels: it takes only
tasks whose placement names each of its --label labels (host aside), so
'bgtask worker --label pool=gpu --exclusive' runs tasks added with
--label pool=gpu and nothing else; the others wait for another worker. Each command runs in its own process group in the login
environment of the user running the worker; tick events are appended while it
runs and an exited event when it ends.

Each command runs under a shim (bgtask-shim, installed beside this binary; else
this binary in shim mode: 13.8 MiB of RSS per running task against 2.5 MiB) in
a session of its own, so stopping the worker (SIGINT, SIGTERM, even kill -9) leaves its commands
running; the next start with the same --state-dir watches them again and records
the exits that happened meanwhile, once. Any number of workers may run, each with
its own state directory; each task is taken by exactly one of them.

Draining: 'bgtask worker drain ID', SIGUSR1, or --drain at start make the worker
take no new task, watch its running ones to their end, and then exit (status 0)
with its heartbeat removed. Upgrading workers one at a time by draining or by
restarting them loses nothing and restarts no task.`

func workerCmd(g *globals) *cobra.Command {
	var o workerOptions
	var logLevel, stateDir string
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Run a worker that takes tasks and runs their commands",
		Long:  workerLong,
		Example: `  bgtask worker --label pool=gpu --max-tasks 4
  bgtask worker --label pool=gpu --exclusive
  bgtask worker --nats nats://nats-1:4222 --creds worker.creds --label pool=build --state-dir /var/lib/bgtask
  bgtask worker drain build-1-3fa9c2d0`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := newLogger(g.stderr, logLevel)
			if err != nil {
				return err
			}
			if stateDir == "" {
				home, err := serverhome.Dir(g.home)
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
			nc, err := g.connectWorker()
			if err != nil {
				return err
			}
			defer nc.Close()
			if err := waitForServer(cmd.Context(), nc, logger); err != nil {
				if cmd.Context().Err() != nil {
					return nil // stopped while it waited
				}
				return err
			}
			// SIGUSR1 drains; registered before the worker starts so an early one is not lost.
			usr1 := make(chan os.Signal, 1)
			signal.Notify(usr1, syscall.SIGUSR1)
			defer signal.Stop(usr1)
			w, err := retryStart(cmd.Context(), logger, func() (*workerHandle, error) {
				w, err := newWorker(cmd.Context(), nc, o, engine.Base{Logger: logger})
				if errors.Is(err, workers.ErrStateDirInUse) {
					return nil, &exitError{code: 1, err: err} // waiting does not free it
				}
				return w, err
			})
			if err != nil {
				return err
			}
			defer w.Stop()
			for {
				select {
				case <-cmd.Context().Done():
					return nil
				case <-usr1:
					w.w.Drain()
				case <-w.w.Drained():
					return nil
				}
			}
		},
	}
	o.register(cmd.Flags())
	cmd.Flags().BoolVar(&o.drain, "drain", false, "start draining: watch the runs left in the state directory to their end, take no new task, then exit")
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	cmd.Flags().StringVar(&stateDir, "state-dir", "", "where the worker keeps its runs and identity (default HOME/workers/WORKER-ID, or HOME/workers/default)")
	cmd.AddCommand(drainCmd(g))
	return cmd
}

func drainCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "drain WORKER-ID",
		Short: "Tell a worker to take no new task and exit once its running tasks end",
		Long: `Tell a running worker to drain: it takes no new task, keeps watching the tasks it
runs until they end, then removes its heartbeat and exits. Its tasks are not
stopped or restarted. Prints what it still runs. 'bgtask workers' lists the ids.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(cmd.Context(), func(ctx context.Context, c *client.Client) error {
				reply, err := c.DrainWorker(ctx, args[0])
				if errors.Is(err, client.ErrNoWorker) {
					return fmt.Errorf("worker %s: %w", args[0], err)
				}
				if err != nil {
					return err
				}
				if asJSON {
					return printJSONLine(g.stdout, reply)
				}
				_, err = fmt.Fprintf(g.stdout, "worker %s is draining; it exits after %d running task(s)\n", reply.ID, len(reply.Running))
				return err
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print {\"id\": ..., \"running\": [...]} as JSON")
	return cmd
}

// shimCmd is the shim mode the worker starts every command through.
func shimCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "shim --dir=DIR [...] -- PROGRAM ARGV0 [ARG...]",
		Short: "Run one command as its shim (started by workers without bgtask-shim)",
		// The shim's arguments are its own (package shim), the command's among them.
		DisableFlagParsing: true,
		Hidden:             true,
		RunE: func(_ *cobra.Command, args []string) error {
			return shim.Main(args)
		},
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
	labels, err := parseKeyValues("--label", o.labels)
	if err != nil {
		return nil, err
	}
	if err := engine.ValidateLabels("--label", labels); err != nil {
		return nil, usageErr("%v", err)
	}
	if o.exclusive && len(engine.ExclusiveLabels(labels)) == 0 {
		return nil, usageErr("--exclusive: give the labels the worker is kept for with --label KEY=VALUE (host does not count)")
	}
	w := workers.New(nc, js, store, workers.Config{
		ID: o.id, MaxTasks: o.maxTasks, TickInterval: o.tick, KillGrace: o.killGrace, StateDir: o.stateDir,
		Labels: labels, Exclusive: o.exclusive, Drain: o.drain, Base: base,
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
