package main

import (
	"fmt"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/server"
	"github.com/bgtask/bgtask/internal/serverhome"
)

func serverCmd(g *globals) *cobra.Command {
	var f serverFlags
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run bgtask: engine, projector and a worker, on embedded NATS or a NATS cluster",
		Long: `Run bgtask all-in-one on this machine: an embedded NATS server with JetStream
(file storage in the home directory), the engine that serves the API on
bgtask.register and friends, the dispatcher that delivers wake-ups, the projector
that rebuilds state from the stream, and a worker.

The server listens on loopback only and lets in three identities, each with the
least it needs: the engine (a key made at each start that never leaves the
process), the workers (worker.nkey: the events of a run, never an outcome) and
the clients (credentials.json, and client.nkey for the nats CLI: the API and
reads, no event). It generates them into the home directory, mode 0600, and
writes server.json there so that every client command finds it through --home or
$BGTASK_HOME. With port 0 it listens where its last run did if that port is free.
'bgtask server nats-context' saves a context for the nats CLI. It serves the
HTTP API and the dashboard on --http (loopback, port 0 as for NATS; URL and
token in http.json, a token for /metrics alone in metrics.token; 'bgtask ui'
logs a browser in: docs/http.md). Only one server runs per home. SIGINT or SIGTERM stops it cleanly. What the identities do and do
not protect against: docs/security.md.

With --nats URL (and the auth and TLS flags) it runs against an existing NATS
JetStream cluster instead: no embedded server, no discovery file; streams and the
heartbeat bucket are created with --replicas copies (3 on a cluster of three or
more JetStream nodes). Any number of such servers may run at once: they share
the API (a queue group) and every append is conditional, so each task still
fires once whichever of them sees its end first. Before it serves, it checks that
neither an anonymous connection nor the client identity (--client-user,
--client-creds, --client-nkey) can publish into the event stream, and refuses to
run if one can: registering a task is running a command.`,
		Example: `  bgtask server
  bgtask server --nats nats://n1:4222,nats://n2:4222,nats://n3:4222 --user engine \
      --replicas 3 --no-worker --client-user client`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.runServer(cmd, &f)
		},
	}
	f.register(cmd)
	cmd.AddCommand(natsContextCmd(g))
	return cmd
}

// serverFlags are the flags of `bgtask server`.
type serverFlags struct {
	o        server.Options
	worker   *workerFlags
	probe    probeFlags
	logLevel string
}

func (sf *serverFlags) register(cmd *cobra.Command) {
	o, f := &sf.o, cmd.Flags()
	f.StringVar(&o.Listen, "listen", "127.0.0.1:0", "loopback HOST:PORT for NATS clients; port 0 reuses the last port if free, else picks one")
	f.StringVar(&o.Sync, "sync", "always", "when the embedded JetStream store reaches the disk: always (fsync before every acknowledgement) or interval (every 2 minutes: faster, but a power loss can undo acknowledged events)")
	f.DurationVar(&o.LeaseTTL, "lease-ttl", server.DefaultLeaseTTL, "how long a worker may go without a heartbeat before its running tasks are lost (it must outlast a worker's restart)")
	f.BoolVar(&o.NoWorker, "no-worker", false, "run no worker in the server (tasks wait for 'bgtask worker' processes)")
	f.IntVar(&o.Replicas, "replicas", 1, "copies of each stream and of the heartbeat bucket, with --nats (3 on a cluster of three or more JetStream nodes)")
	sf.probe.register(f)
	registerHTTPFlags(f, &o.HTTP)
	f.StringVar(&sf.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	sf.worker = registerWorkerFlags(f, &o.Worker)
	registerDeliveryFlags(f, &o.Delivery)
	f.BoolVar(&o.DenyPrivate, "webhook-deny-private", false, "refuse webhook destinations in loopback, private, link-local (cloud metadata), carrier-grade NAT and other non-public ranges, checked on the address each push dials (no HTTP proxy is used then); off by default for a single machine, on for a shared deployment (docs/security.md)")
	f.Var(&o.LogBytes, "log-bytes", "the size limit of the output log stream BGTASK_LOGS, such as 512MiB (default: half of what JetStream may store, from 64MiB to 4GiB; the embedded server may store 75% of the disk it finds free)")
	f.Uint64Var(&o.SnapshotEvery, "snapshot-every", 100_000, "write a snapshot of the current state to "+serverhome.SnapshotFile+" in the home after this many events (and at least as many events as there are tasks), so that a restart reads it and replays only the events after it; 0: no snapshots, none read")
	f.DurationVar(&o.ArchiveAfter, "archive-after", engine.DefaultArchiveAfter, "move tasks finished longer ago than this out of the event stream into the archive stream BGTASK_ARCHIVE (their history, audit and show stay whole); 0: never")
}

// runServer checks the flags that depend on --nats and runs the server: on
// embedded NATS, or with --nats on the deployment of your own.
func (g *globals) runServer(cmd *cobra.Command, f *serverFlags) error {
	o, changed := f.o, cmd.Flags().Changed
	if err := o.HTTP.Check(); err != nil {
		return err
	}
	if o.Replicas < 1 || o.Replicas > 5 {
		return usageErr("--replicas %d: want 1 to 5", o.Replicas)
	}
	if g.natsURL == "" {
		for _, flag := range []string{"replicas", "client-user", "client-creds", "client-nkey"} {
			if changed(flag) {
				return usageErr("--%s goes with --nats: the embedded server is one node with one identity", flag)
			}
		}
		if err := g.process(&o, f); err != nil {
			return err
		}
		return server.Run(cmd.Context(), o)
	}
	for _, flag := range []string{"listen", "sync"} {
		if changed(flag) {
			return usageErr("--%s is for the embedded server; with --nats the cluster's own configuration decides", flag)
		}
	}
	if err := g.process(&o, f); err != nil {
		return err
	}
	var err error
	if o.Probe, err = f.probe.options(&g.auth); err != nil {
		return err
	}
	if o.Deployment, err = g.deployment(); err != nil {
		return err
	}
	return server.RunExternal(cmd.Context(), o)
}

// process gives the options of a server its home, its worker's labels, and what
// the process says of itself: its log and its version.
func (g *globals) process(o *server.Options, f *serverFlags) error {
	logger, err := newLogger(g.stderr, f.logLevel)
	if err != nil {
		return err
	}
	if o.Worker.Labels, err = f.worker.labels(); err != nil {
		return err
	}
	o.Home, o.Logger, o.Version, o.Build = g.home, logger, version(), buildID()
	return nil
}

func newLogger(w interface{ Write([]byte) (int, error) }, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, &exitError{code: client.ExitUsage, err: fmt.Errorf("--log-level: %w", err)}
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}
