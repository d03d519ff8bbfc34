package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/node"
	"github.com/bgtask/bgtask/engine/sinks"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/serverhome"
	"github.com/bgtask/bgtask/projections"
)

type serverOptions struct {
	listen   string
	sync     string
	leaseTTL time.Duration
	noWorker bool
	replicas int
	worker   workerOptions
	delivery deliveryOptions
	// archiveAfter is how long finished tasks stay whole in the event stream.
	archiveAfter time.Duration
	// snapshotEvery is how many events pass between two snapshots of the projection.
	snapshotEvery uint64
	logLevel      string
	probe         probeOptions
	// denyPrivate refuses webhook destinations outside the public address ranges.
	denyPrivate bool
	logBytes    byteSize // the log stream's size limit; 0: fit it to the disk
	http        httpOptions
}

// pushing is what the engine pushes with: the delivery flags, and the rule of
// --webhook-deny-private.
func (o serverOptions) pushing(secret []byte) pushing {
	p := o.delivery.pushing(secret)
	if o.denyPrivate {
		p.runner = sinks.New(secret).WithBearers(p.bearers).DenyPrivate()
	}
	return p
}

func serverCmd(g *globals) *cobra.Command {
	var o serverOptions
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
			changed := cmd.Flags().Changed
			if err := o.http.check(); err != nil {
				return err
			}
			if o.replicas < 1 || o.replicas > 5 {
				return usageErr("--replicas %d: want 1 to 5", o.replicas)
			}
			if g.natsURL == "" {
				for _, flag := range []string{"replicas", "client-user", "client-creds", "client-nkey"} {
					if changed(flag) {
						return usageErr("--%s goes with --nats: the embedded server is one node with one identity", flag)
					}
				}
				return runServer(cmd.Context(), g, o)
			}
			for _, flag := range []string{"listen", "sync"} {
				if changed(flag) {
					return usageErr("--%s is for the embedded server; with --nats the cluster's own configuration decides", flag)
				}
			}
			return runExternal(cmd.Context(), g, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.listen, "listen", "127.0.0.1:0", "loopback HOST:PORT for NATS clients; port 0 reuses the last port if free, else picks one")
	f.StringVar(&o.sync, "sync", "always", "when the embedded JetStream store reaches the disk: always (fsync before every acknowledgement) or interval (every 2 minutes: faster, but a power loss can undo acknowledged events)")
	f.DurationVar(&o.leaseTTL, "lease-ttl", events.DefaultLeaseTTL, "how long a worker may go without a heartbeat before its running tasks are lost (it must outlast a worker's restart)")
	f.BoolVar(&o.noWorker, "no-worker", false, "run no worker in the server (tasks wait for 'bgtask worker' processes)")
	f.IntVar(&o.replicas, "replicas", 1, "copies of each stream and of the heartbeat bucket, with --nats (3 on a cluster of three or more JetStream nodes)")
	o.probe.register(f)
	o.http.register(f)
	cmd.AddCommand(natsContextCmd(g))
	f.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	o.worker.register(f)
	o.delivery.register(f)
	f.BoolVar(&o.denyPrivate, "webhook-deny-private", false, "refuse webhook destinations in loopback, private, link-local (cloud metadata), carrier-grade NAT and other non-public ranges, checked on the address each push dials (no HTTP proxy is used then); off by default for a single machine, on for a shared deployment (docs/security.md)")
	f.Var(&o.logBytes, "log-bytes", "the size limit of the output log stream BGTASK_LOGS, such as 512MiB (default: half of what JetStream may store, from 64MiB to 4GiB; the embedded server may store 75% of the disk it finds free)")
	f.Uint64Var(&o.snapshotEvery, "snapshot-every", 100_000, "write a snapshot of the current state to "+serverhome.SnapshotFile+" in the home after this many events (and at least as many events as there are tasks), so that a restart reads it and replays only the events after it; 0: no snapshots, none read")
	f.DurationVar(&o.archiveAfter, "archive-after", engine.DefaultArchiveAfter, "move tasks finished longer ago than this out of the event stream into the archive stream BGTASK_ARCHIVE (their history, audit and show stay whole); 0: never")
	return cmd
}

func newLogger(w interface{ Write([]byte) (int, error) }, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, &exitError{code: client.ExitUsage, err: fmt.Errorf("--log-level: %w", err)}
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}

func runServer(ctx context.Context, g *globals, o serverOptions) error {
	logger, err := newLogger(g.stderr, o.logLevel)
	if err != nil {
		return err
	}
	home, lock, ids, err := openHome(g.home)
	if err != nil {
		return err
	}
	defer lock.Close()
	// The engine may do anything, so its key is made for this run and never
	// written down: no command can read it from a file.
	engineID, err := serverhome.NewCredentials()
	if err != nil {
		return fmt.Errorf("credentials: %w", err)
	}
	host, port, err := listenAddress(o.listen, home)
	if err != nil {
		return &exitError{code: client.ExitUsage, err: err}
	}
	if o.sync != "always" && o.sync != "interval" {
		return usageErr("--sync %q: want always or interval", o.sync)
	}
	secret, err := loadWebhookSecret(o.delivery.secretFile, home)
	if err != nil {
		return err
	}
	e := &embeddedServer{home: home, host: host, port: port, engineID: engineID, ids: ids, secret: secret, o: o, logger: logger,
		httpAddr: o.http.addr, httpToken: newHTTPToken()}
	defer os.Remove(filepath.Join(home, serverhome.DiscoveryFile))
	defer removeHTTPFile(home)
	for {
		roomAgain, err := e.serve(ctx)
		if err != nil || !roomAgain {
			return err
		}
		// A stream whose write failed for lack of space fails every write after it,
		// whatever room there is later, until it is loaded again from disk. JetStream
		// is not stopped and started alone: nats-server races with the clients it
		// serves meanwhile.
		logger.Warn("the disk of the event store has room again: restarting the embedded NATS server and the engine to load the streams again", "dir", filepath.Join(home, serverhome.StoreDir))
	}
}

// embeddedServer is a server on embedded NATS, run again from the same home when a disk
// that filled has room again.
type embeddedServer struct {
	home     string
	host     string
	port     int // the port the last run listened on, once it has
	maxStore int64
	engineID serverhome.Credentials
	ids      serverhome.Identities
	secret   []byte
	o        serverOptions
	logger   *slog.Logger
	// httpAddr is where the HTTP API listens: once it has, where it listened.
	httpAddr, httpToken string
}

// serve runs NATS, the engine and the worker until ctx is done, or until the
// store's disk has filled and has room again (roomAgain).
func (e *embeddedServer) serve(ctx context.Context) (roomAgain bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ns, err := startNATS(e.home, e.host, e.port, e.maxStore, e.engineID, e.ids, e.o.sync == "always", e.logger)
	if err != nil {
		return false, err
	}
	defer func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	}()
	// Every run stores at most what the first found it could: 75% of a disk
	// measured just after it had room again would leave too little for the streams.
	e.maxStore = ns.JetStreamConfig().MaxStore
	alarm := watchStoreDisk(ns, e.logger)
	hasRoom := awaitRoom(ctx, ns.JetStreamConfig().StoreDir, alarm, e.logger)
	nc, err := connectInProcess(ns, e.engineID, "bgtask-engine")
	if err != nil {
		return false, err
	}
	defer nc.Close()
	base := engine.Base{Logger: e.logger}
	o := e.o
	// One engine per home: its id is the same across restarts, so a push it
	// claimed before a crash is known to be dead when it starts again.
	eng, err := startEngine(ctx, nc, base, engineOptions{
		writer: "engine@" + hostName(), leaseTTL: o.leaseTTL, replicas: 1,
		push: o.pushing(e.secret), denyPrivate: o.denyPrivate, archiveAfter: o.archiveAfter,
		logBytes: int64(o.logBytes), maxStore: e.maxStore, storeDir: ns.JetStreamConfig().StoreDir, diskFull: alarm,
		snapshots: projections.Snapshots{Path: filepath.Join(e.home, serverhome.SnapshotFile), Every: o.snapshotEvery, Build: buildID()},
	})
	if err != nil {
		return false, err
	}
	defer eng.Stop()
	conns := []*nats.Conn{nc}
	if !o.noWorker {
		o.worker.stateDir = filepath.Join(e.home, "worker")
		w, err := startWorker(ctx, ns, e.ids.Worker, o.worker, base)
		if err != nil {
			return false, err
		}
		defer w.Stop() // its commands go on; the next start watches them again
		conns = append(conns, w.nc)
	}
	stopHTTP, err := e.startHTTP(ctx, ns, eng.Metrics())
	if err != nil {
		return false, err
	}
	defer stopHTTP()
	if err := announce(e.home, ns); err != nil {
		return false, err
	}
	if addr, ok := ns.Addr().(*net.TCPAddr); ok {
		e.port = addr.Port // where the clients reconnect
	}
	e.logger.Info("bgtask server ready", "home", e.home, "url", ns.ClientURL())
	select {
	case <-hasRoom:
		// The connections go first: every append in flight then fails at once, so
		// the worker and the engine stop without waiting out their retries; the
		// next run's worker records what the runs' directories hold.
		for _, c := range conns {
			c.Close()
		}
		return true, nil
	case <-ctx.Done():
		e.logger.Info("bgtask server stopping")
		return false, nil
	}
}

// openHome creates the home (0700) if need be, locks it for this server, and loads
// the identities kept in it.
func openHome(dir string) (home string, lock *os.File, ids serverhome.Identities, err error) {
	if home, err = serverhome.Dir(dir); err != nil {
		return "", nil, ids, err
	}
	if err := os.MkdirAll(home, 0o700); err != nil {
		return "", nil, ids, fmt.Errorf("create home: %w", err)
	}
	if lock, err = serverhome.Lock(home); err != nil {
		return "", nil, ids, err
	}
	if err := serverhome.RecordSupervisor(home); err != nil {
		lock.Close()
		return "", nil, ids, fmt.Errorf("record the supervisor: %w", err)
	}
	if ids, err = serverhome.LoadOrCreateIdentities(home); err != nil {
		lock.Close()
		return "", nil, ids, fmt.Errorf("credentials: %w", err)
	}
	return home, lock, ids, nil
}

// announce tells clients where the server is: its port, kept for the next start,
// and the discovery file, written last, once everything serves.
func announce(home string, ns *server.Server) error {
	if addr, ok := ns.Addr().(*net.TCPAddr); ok {
		if err := serverhome.RememberPort(home, serverhome.PortFile, addr.Port); err != nil {
			return fmt.Errorf("write %s: %w", serverhome.PortFile, err)
		}
	}
	if err := serverhome.WriteDiscovery(home, serverhome.Discovery{URL: ns.ClientURL(), PID: os.Getpid(), Version: version()}); err != nil {
		return fmt.Errorf("write discovery file: %w", err)
	}
	return nil
}

// runExternal runs the engine (and a worker, unless --no-worker) against a NATS
// deployment of your own.
func runExternal(ctx context.Context, g *globals, o serverOptions) error {
	logger, err := newLogger(g.stderr, o.logLevel)
	if err != nil {
		return err
	}
	if err := o.probe.check(ctx, g, logger); err != nil {
		return err
	}
	nc, err := g.connect("bgtask-engine")
	if err != nil {
		return err
	}
	defer nc.Close()
	if err := checkMaxPayload(nc.MaxPayload()); err != nil {
		return err
	}
	base := engine.Base{Logger: logger}
	home, err := serverhome.Dir(g.home)
	if err != nil {
		return err
	}
	// The home holds what this engine keeps on its own disk (the generated webhook
	// secret, snapshots, the worker's runs); against a cluster it need not exist
	// yet. An engine-only replica with a secret file of its own may run where it
	// cannot be made, and then replays the whole stream at each start.
	homeErr := os.MkdirAll(home, 0o700)
	if homeErr != nil && (o.delivery.secretFile == "" || !o.noWorker) {
		needs := "the generated webhook secret"
		if o.delivery.secretFile != "" {
			needs = "the worker's runs"
		}
		return fmt.Errorf("the home %s cannot be created for %s: %w (give --home, or --webhook-secret-file and --no-worker)", home, needs, homeErr)
	}
	secret, err := loadWebhookSecret(o.delivery.secretFile, home)
	if err != nil {
		return err
	}
	snapshots := projections.Snapshots{Path: filepath.Join(home, serverhome.SnapshotFile), Every: o.snapshotEvery, Build: buildID()}
	if homeErr != nil && snapshots.Every > 0 {
		logger.Warn("no projection snapshots: the home cannot be created", "home", home, "err", homeErr)
		snapshots.Every = 0
	}
	// Replicas may share a host: each engine process has an id of its own, so no
	// replica takes another's push in flight for one of its own dead ones.
	eng, err := startEngine(ctx, nc, base, engineOptions{
		writer: fmt.Sprintf("engine@%s/%d", hostName(), os.Getpid()), leaseTTL: o.leaseTTL, replicas: o.replicas,
		push: o.pushing(secret), denyPrivate: o.denyPrivate, archiveAfter: o.archiveAfter,
		logBytes: int64(o.logBytes), snapshots: snapshots,
	})
	if err != nil {
		return err
	}
	defer eng.Stop()
	if !o.noWorker {
		o.worker.stateDir = filepath.Join(home, "worker")
		wnc, err := g.connect("bgtask-worker")
		if err != nil {
			return err
		}
		w, err := newWorker(ctx, wnc, o.worker, base)
		if err != nil {
			wnc.Close()
			return err
		}
		defer w.Stop()
	}
	stopHTTP, err := externalHTTP(ctx, g, o.http, home, homeErr, eng.Metrics(), logger)
	if err != nil {
		return err
	}
	defer stopHTTP()
	logger.Info("bgtask server ready", "nats", redactURL(g.natsURL), "replicas", o.replicas)
	<-ctx.Done()
	logger.Info("bgtask server stopping")
	return nil
}

// redactURL drops passwords from NATS URLs before they are logged.
func redactURL(urls string) string {
	var out []string
	for _, raw := range strings.Split(urls, ",") {
		if u, err := url.Parse(strings.TrimSpace(raw)); err == nil {
			out = append(out, u.Redacted())
		}
	}
	return strings.Join(out, ",")
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
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) || errors.As(err, new(*exitError)) {
			return v, err // an exitError is a bad command line: no retry mends it
		}
		log.Warn("starting: retrying", "err", err)
		select {
		case <-ctx.Done():
			return v, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// engineOptions are what the server's flags and home say of its engine.
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
		Version: version(), Base: base,
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

// startWorker runs the server's own worker on a connection of its own, as a worker
// on another host would.
func startWorker(ctx context.Context, ns *server.Server, creds serverhome.Credentials, o workerOptions, base engine.Base) (*workerHandle, error) {
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

// connectInProcess connects a component of the server to the embedded NATS server
// without going through the network.
func connectInProcess(ns *server.Server, creds serverhome.Credentials, name string) (*nats.Conn, error) {
	auth, err := creds.NATSOption()
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect("", nats.InProcessServer(ns), auth, nats.Name(name))
	if err != nil {
		return nil, fmt.Errorf("connect to the embedded server: %w", err)
	}
	return nc, nil
}

// listenAddress parses --listen. Only loopback addresses are accepted: registering a
// task is running a command. Port 0 prefers the port of the previous run, so workers
// and clients that reconnect find the server where it was.
func listenAddress(listen, home string) (string, int, error) {
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return "", 0, fmt.Errorf("--listen %q: want HOST:PORT: %w", listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("--listen %q: bad port", listen)
	}
	if host == "localhost" {
		host = "127.0.0.1"
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return "", 0, fmt.Errorf("--listen %q: the embedded server listens on loopback only (127.0.0.1, ::1); use an external NATS cluster for other hosts", listen)
	}
	if port == 0 {
		port = server.RANDOM_PORT
		if prev := serverhome.RememberedPort(home, serverhome.PortFile); prev > 0 && portFree(host, prev) {
			port = prev
		}
	}
	return host, port, nil
}

// portFree reports whether a listener can bind host:port now. Go sets SO_REUSEADDR,
// as nats-server's own listener does, so the connections of the previous run that
// linger in TIME_WAIT do not keep the port.
func portFree(host string, port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// startNATS starts the embedded server with its three users: the engine, the
// workers and the clients, each with its permissions (permissions.go).
func startNATS(home, host string, port int, maxStore int64, engine serverhome.Credentials, ids serverhome.Identities, syncAlways bool, logger *slog.Logger) (*server.Server, error) {
	var users []*server.NkeyUser
	for _, u := range []struct {
		creds serverhome.Credentials
		perms *server.Permissions
	}{{engine, nil}, {ids.Worker, workerPermissions}, {ids.Client, clientPermissions}} {
		pub, err := u.creds.PublicKey()
		if err != nil {
			return nil, fmt.Errorf("credentials: %w", err)
		}
		users = append(users, &server.NkeyUser{Nkey: pub, Permissions: u.perms})
	}
	ns, err := server.NewServer(&server.Options{
		ServerName: "bgtask",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   filepath.Join(home, serverhome.StoreDir),
		// 0: 75% of the free disk.
		JetStreamMaxStore: maxStore,
		Nkeys:             users,
		SyncAlways:        syncAlways,
		NoSigs:            true,
	})
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	ns.SetLoggerV2(natsLogger{logger.With("component", "nats")}, false, false, false)
	ns.Start()
	if !ns.ReadyForConnections(30 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("embedded NATS did not start (is the port in use?)")
	}
	return ns, nil
}

// natsLogger sends the embedded server's warnings and errors to the server's log.
type natsLogger struct{ l *slog.Logger }

func (n natsLogger) Noticef(format string, v ...any) { n.l.Debug(fmt.Sprintf(format, v...)) }
func (n natsLogger) Warnf(format string, v ...any)   { n.l.Warn(fmt.Sprintf(format, v...)) }
func (n natsLogger) Fatalf(format string, v ...any)  { n.l.Error(fmt.Sprintf(format, v...)) }
func (n natsLogger) Errorf(format string, v ...any)  { n.l.Error(fmt.Sprintf(format, v...)) }
func (n natsLogger) Debugf(format string, v ...any)  { n.l.Debug(fmt.Sprintf(format, v...)) }
func (n natsLogger) Tracef(format string, v ...any)  {}

func hostName() string {
	h, err := os.Hostname()
	if err != nil {
		return "localhost"
	}
	return h
}

// eventHeadroom is what a message carries besides its event: the headers of an
// append (message id, expected stream and sequence).
const eventHeadroom = 4 << 10

// checkMaxPayload refuses a deployment whose messages cannot carry the largest
// event bgtask writes: every such append would be refused, and retried for ever.
func checkMaxPayload(max int64) error {
	if need := int64(engine.MaxEventBytes + eventHeadroom); max < need {
		return fmt.Errorf("the NATS servers take messages of at most %d bytes; bgtask needs %d (max_payload in their configuration)", max, need)
	}
	return nil
}
