package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine/server"
	"github.com/bgtask/bgtask/workers"
	"github.com/bgtask/bgtask/workers/shim"
)

// workerFlags are the flags of a worker, in `bgtask worker` and `bgtask server`,
// into o; the labels are parsed when the command runs.
type workerFlags struct {
	o         *server.WorkerOptions
	keyValues []string
}

func registerWorkerFlags(f *pflag.FlagSet, o *server.WorkerOptions) *workerFlags {
	w := &workerFlags{o: o}
	f.StringVar(&o.ID, "worker-id", "", "the worker's identity in events (default: HOST-RANDOM, kept in the state directory)")
	f.IntVar(&o.MaxTasks, "max-tasks", workers.DefaultMaxTasks, "commands the worker runs at once; it takes no task beyond that")
	f.DurationVar(&o.Tick, "tick", workers.DefaultTickInterval, "interval of a running task's tick events")
	f.DurationVar(&o.KillGrace, "kill-grace", workers.DefaultKillGrace, "time between TERM and KILL when a task's process group is stopped")
	f.StringArrayVar(&w.keyValues, "label", nil, "KEY=VALUE the worker advertises; a task's placement must match its labels (repeatable; host=HOSTNAME is always added unless given)")
	f.BoolVar(&o.Exclusive, "exclusive", false, "keep the worker for its --label labels: take only tasks whose placement names each of them (host aside)")
	return w
}

// labels are the --label flags' labels.
func (w *workerFlags) labels() (map[string]string, error) {
	return parseKeyValues("--label", w.keyValues)
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

The worker's commands run under its shim (bgtask-shim, installed beside this
binary; else this binary in shim mode, which holds more memory), one process
for all of them, in a session of its own: stopping the worker (SIGINT, SIGTERM,
even kill -9) leaves its commands running, and the next start with the same
--state-dir watches them again and records the exits that happened meanwhile,
once. A shim killed leaves its commands to the worker, which records their exits. Any number of workers may run, each with
its own state directory; each task is taken by exactly one of them.

Draining: 'bgtask worker drain ID', SIGUSR1, or --drain at start make the worker
take no new task, watch its running ones to their end, and then exit (status 0)
with its heartbeat removed. Upgrading workers one at a time by draining or by
restarting them loses nothing and restarts no task.`

func workerCmd(g *globals) *cobra.Command {
	var o server.WorkerOptions
	var logLevel string
	var flags *workerFlags
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
			if o.Labels, err = flags.labels(); err != nil {
				return err
			}
			d, err := g.deployment()
			if err != nil {
				return err
			}
			return server.RunWorker(cmd.Context(), d, o, logger)
		},
	}
	flags = registerWorkerFlags(cmd.Flags(), &o)
	cmd.Flags().BoolVar(&o.Drain, "drain", false, "start draining: watch the runs left in the state directory to their end, take no new task, then exit")
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	cmd.Flags().StringVar(&o.StateDir, "state-dir", "", "where the worker keeps its runs and identity (default HOME/workers/WORKER-ID, or HOME/workers/default)")
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

// shimCmd is the shim mode the worker starts its commands through.
func shimCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "shim",
		Short: "Keep a worker's commands (started by workers without bgtask-shim)",
		// The shim reads its runs on its stdin; its arguments are its own (package shim).
		DisableFlagParsing: true,
		Hidden:             true,
		RunE: func(_ *cobra.Command, args []string) error {
			return shim.Main(args)
		},
	}
}
