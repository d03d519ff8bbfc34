package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/internal/bench"
	"github.com/bgtask/bgtask/internal/serverhome"
)

const benchLong = `Measure bgtask on this machine. Each scenario starts its own 'bgtask server'
(and 'bgtask worker') processes in a temporary home, drives them as a client
would, and measures the same work done the plainest way as its baseline, in the
same run: the figures mean something as ratios, on a shared and noisy machine.
The report's header gives what a process start costs here ('bash -c true', CPU
and wall), which every ratio against task-spooler is printed beside: where a
start is dear the peer, which starts a client per task, pays most.

Scenarios (in the order they run):
  register    tasks armed per second through bgtask.register, 1 and 8 clients,
              against raw synchronous JetStream publishes with a per-subject
              expected-sequence check
  latency     exit → wake-up p50/p99 with --sync always and interval, against
              sequential conditional JetStream appends, with and without the
              output's last chunk published before them
  start       register → command started p50/p99, against exec.Command; and
              task-spooler's, its client's start included
  throughput  1,000 tasks running 'true' with the worker's default parallelism,
              against a Go program running them as parallel; and through
              task-spooler, 'tsp -S 64'
  restart     server start to serving queries on a stream of 1M events,
              against a raw ordered-consumer read of it
  memory      1,000 concurrent 'sleep' tasks on one worker: RSS of the worker
              and its shims, ticks on time; the supervisor's RSS and PSS per
              running task, against task-spooler's (at most 900 sleeps)
  loginenv    a task's start in the login environment, against 'bash -lc true'
  growth      server memory with 200,000 finished tasks in the stream
  timers      server memory with 10,000 pending timers; a burst of 1,000 due
              in one second, against time.AfterFunc
  join        1,000 running members (--wake-on none) and one join --all:
              server CPU and RSS while they run, against the same server idle
              and empty; last member's end → the join's wake-up, against a
              lone task's end → its own wake-up
  burst       10,000 tasks running 'true' at once: the server's RSS idle, at
              its peak and once it stops falling after them, against the same
              server idle before (target ≤ 1.2×) and one restarted on the
              same home (what the finished tasks hold)
  pids        1,000 watched PIDs of processes bgtask did not start: server and
              worker CPU and RSS, each end → its wake-up, against as many
              commands bgtask runs itself

The peer, task-spooler (Debian's package task-spooler, 'tsp'), runs in the same
run when it is installed, with a server of its own in the temporary directory;
the report says when it is not, and those scenarios run without it.

Each measurement is repeated (--repeat); the report gives the median, p50/p99
where it applies, min and max, the ratio to the baseline (and to the peer) and
whether the targets of the issues are met. --quick runs every scenario at a
small size, in under a minute; the full run takes several minutes and a few GB
of disk in the temporary directory. Everything the bench starts is killed and removed when it ends, on an
error or Ctrl-C too.`

func benchCmd(g *globals) *cobra.Command {
	var (
		quick     bool
		asJSON    bool
		repeats   int
		scenarios []string
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure bgtask against its own baselines, side by side in one run",
		Long:  benchLong,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			exe, err := os.Executable()
			if err != nil {
				return fmt.Errorf("find the bgtask binary: %w", err)
			}
			rep, err := bench.Run(cmd.Context(), bench.Options{
				Exe: exe,
				Connect: func(home string) (*nats.Conn, error) {
					return (&globals{home: home}).connect("bgtask-bench")
				},
				ServerPID: func(home string) (int, error) {
					d, err := serverhome.ReadDiscovery(home)
					return d.PID, err
				},
				StoreDir:     serverhome.StoreDir,
				SnapshotFile: serverhome.SnapshotFile,
				Quick:        quick,
				Scenarios:    scenarios,
				Repeats:      repeats,
				Progress:     g.stderr,
			})
			if rep == nil {
				if errors.Is(err, bench.ErrUnknownScenario) {
					return &exitError{code: client.ExitUsage, err: err}
				}
				return err
			}
			if asJSON {
				if perr := printJSON(g.stdout, rep); perr != nil {
					return perr
				}
			} else {
				rep.Print(g.stdout)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.BoolVar(&quick, "quick", false, "small sizes: every scenario in under a minute (targets only indicative)")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON")
	f.IntVar(&repeats, "repeat", 0, "repeats of each measurement (default 2 with --quick, else 3)")
	f.StringSliceVar(&scenarios, "scenario", nil, "scenarios to run, comma-separated: "+strings.Join(bench.Names(), ",")+" (default all)")
	return cmd
}
