// Package server composes the processes of bgtask around the engine's own
// composition root, engine/node: `bgtask server` on an embedded NATS server
// (Run) or on a NATS deployment of your own (RunExternal), and `bgtask worker`
// (RunWorker). Around the node it puts what a process has and the engine does
// not: the embedded NATS server and its identities, the home and its discovery
// file, the log stream sized to the disk and the alarm of a full one, the
// worker, the HTTP API, the webhooks' secret and the check of a deployment's
// permissions. The command line fills its option structs from its flags.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/serverhome"
	"github.com/bgtask/bgtask/projections"
)

// DefaultLeaseTTL is the default of Options.LeaseTTL (--lease-ttl): how long a
// worker may go without a heartbeat before its running tasks are lost.
const DefaultLeaseTTL = events.DefaultLeaseTTL

// Options are what `bgtask server` runs with, from its flags.
type Options struct {
	// Deployment is the home, and with RunExternal the NATS deployment.
	Deployment
	// Listen is the embedded server's loopback HOST:PORT; port 0 reuses the last
	// run's port if it is free.
	Listen string
	// Sync is when the embedded store reaches the disk: always or interval.
	Sync     string
	LeaseTTL time.Duration
	// NoWorker runs no worker in the server.
	NoWorker bool
	// Replicas is how many copies of each stream and bucket a deployment of
	// your own keeps (RunExternal); the embedded server keeps one.
	Replicas int
	Worker   WorkerOptions
	Delivery DeliveryOptions
	// DenyPrivate refuses webhook destinations outside the public address ranges.
	DenyPrivate bool
	// ArchiveAfter is how long finished tasks stay whole in the event stream.
	ArchiveAfter time.Duration
	// SnapshotEvery is how many events pass between two snapshots of the projection.
	SnapshotEvery uint64
	// LogBytes is the log stream's size limit; 0: fit it to the disk.
	LogBytes ByteSize
	HTTP     HTTPOptions
	// Probe names the client identity RunExternal checks.
	Probe ProbeOptions
	// Logger is the process's log; nil discards it.
	Logger *slog.Logger
	// Version is this build's version as SemVer, which clients are told; Build
	// names the build more closely, for the projection snapshots.
	Version, Build string
}

// BadOption is an option the process cannot run with: the command line's fault,
// which no retry mends. Its message names the flag.
type BadOption struct{ Err error }

func (e *BadOption) Error() string { return e.Err.Error() }

func (e *BadOption) Unwrap() error { return e.Err }

func badOption(format string, args ...any) error {
	return &BadOption{Err: fmt.Errorf(format, args...)}
}

// Run runs bgtask all-in-one on an embedded NATS server until ctx is done: one
// server per home, which it locks.
func Run(ctx context.Context, o Options) error {
	logger := engine.Base{Logger: o.Logger}.WithDefaults().Logger
	home, lock, ids, err := openHome(o.Home)
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
	host, port, prefer, err := listenAddress(o.Listen, home)
	if err != nil {
		return err
	}
	if o.Sync != "always" && o.Sync != "interval" {
		return badOption("--sync %q: want always or interval", o.Sync)
	}
	secret, err := loadWebhookSecret(o.Delivery.SecretFile, home)
	if err != nil {
		return err
	}
	e := &embeddedServer{home: home, host: host, port: port, prefer: prefer, engineID: engineID, ids: ids, secret: secret, o: o, logger: logger,
		httpAddr: o.HTTP.Addr, httpToken: newHTTPToken()}
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
	home string
	host string
	port int // the port the last run listened on, once it has
	// prefer is the port the home's last server listened on, tried first at the
	// first run where port is any.
	prefer   int
	maxStore int64
	engineID serverhome.Credentials
	ids      serverhome.Identities
	secret   []byte
	o        Options
	logger   *slog.Logger
	// httpAddr is where the HTTP API listens: once it has, where it listened.
	httpAddr, httpToken string
}

// serve runs NATS, the engine and the worker until ctx is done, or until the
// store's disk has filled and has room again (roomAgain).
func (e *embeddedServer) serve(ctx context.Context) (roomAgain bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ns, err := e.startNATS()
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
		writer: "engine@" + hostName(), leaseTTL: o.LeaseTTL, replicas: 1,
		push: o.pushing(e.secret, e.home), denyPrivate: o.DenyPrivate, archiveAfter: o.ArchiveAfter,
		logBytes: int64(o.LogBytes), maxStore: e.maxStore, storeDir: ns.JetStreamConfig().StoreDir, diskFull: alarm,
		snapshots: projections.Snapshots{Path: filepath.Join(e.home, serverhome.SnapshotFile), Every: o.SnapshotEvery, Build: o.Build},
		version:   o.Version,
	})
	if err != nil {
		return false, err
	}
	defer eng.Stop()
	conns := []*nats.Conn{nc}
	if !o.NoWorker {
		o.Worker.StateDir = filepath.Join(e.home, "worker")
		w, err := startWorker(ctx, ns, e.ids.Worker, o.Worker, base)
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
	if err := announce(e.home, ns, o.Version); err != nil {
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
func announce(home string, ns *natsserver.Server, version string) error {
	if addr, ok := ns.Addr().(*net.TCPAddr); ok {
		if err := serverhome.RememberPort(home, serverhome.PortFile, addr.Port); err != nil {
			return fmt.Errorf("write %s: %w", serverhome.PortFile, err)
		}
	}
	if err := serverhome.WriteDiscovery(home, serverhome.Discovery{URL: ns.ClientURL(), PID: os.Getpid(), Version: version}); err != nil {
		return fmt.Errorf("write discovery file: %w", err)
	}
	return nil
}

// connectInProcess connects a component of the server to the embedded NATS server
// without going through the network.
func connectInProcess(ns *natsserver.Server, creds serverhome.Credentials, name string) (*nats.Conn, error) {
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
// task is running a command. Port 0 is any port, and prefer the port of the
// previous run, so workers and clients that reconnect find the server where it was.
func listenAddress(listen, home string) (host string, port, prefer int, err error) {
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return "", 0, 0, badOption("--listen %q: want HOST:PORT: %w", listen, err)
	}
	port, err = strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, 0, badOption("--listen %q: bad port", listen)
	}
	if host == "localhost" {
		host = "127.0.0.1"
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return "", 0, 0, badOption("--listen %q: the embedded server listens on loopback only (127.0.0.1, ::1); use an external NATS cluster for other hosts", listen)
	}
	if port == 0 {
		port, prefer = natsserver.RANDOM_PORT, serverhome.RememberedPort(home, serverhome.PortFile)
	}
	return host, port, prefer, nil
}

// startNATS starts the embedded server on the preferred port, once, and where it
// cannot, on the port it was given. It tries the port rather than look whether it
// is free first: another program could take it in between.
func (e *embeddedServer) startNATS() (*natsserver.Server, error) {
	if prefer := e.prefer; prefer > 0 {
		e.prefer = 0
		ns, err := startNATS(e.home, e.host, prefer, e.maxStore, e.engineID, e.ids, e.o.Sync == "always", e.logger)
		if !errors.Is(err, errNotStarted) || !portTaken(e.host, prefer) {
			return ns, err
		}
		e.logger.Warn("the port of the last run is taken: the server listens on a new one", "port", prefer)
	}
	return startNATS(e.home, e.host, e.port, e.maxStore, e.engineID, e.ids, e.o.Sync == "always", e.logger)
}

// errNotStarted: the embedded server did not start (its port taken, or its store
// unusable).
var errNotStarted = errors.New("did not start: its log says why")

// portTaken says whether host:port is taken now: why a start there failed, or
// another cause, which a start on another port would meet again.
func portTaken(host string, port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return true
	}
	l.Close()
	return false
}

// startNATS starts the embedded server with its three users: the engine, the
// workers and the clients, each with its permissions (permissions.go).
func startNATS(home, host string, port int, maxStore int64, engine serverhome.Credentials, ids serverhome.Identities, syncAlways bool, logger *slog.Logger) (*natsserver.Server, error) {
	var users []*natsserver.NkeyUser
	for _, u := range []struct {
		creds serverhome.Credentials
		perms *natsserver.Permissions
	}{{engine, nil}, {ids.Worker, workerPermissions}, {ids.Client, clientPermissions}} {
		pub, err := u.creds.PublicKey()
		if err != nil {
			return nil, fmt.Errorf("credentials: %w", err)
		}
		users = append(users, &natsserver.NkeyUser{Nkey: pub, Permissions: u.perms})
	}
	ns, err := natsserver.NewServer(&natsserver.Options{
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
	if ns.Addr() == nil { // it listens last before Start returns, or never
		ns.Shutdown()
		return nil, fmt.Errorf("embedded NATS on %s: %w", net.JoinHostPort(host, strconv.Itoa(max(port, 0))), errNotStarted)
	}
	if !ns.ReadyForConnections(30 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("embedded NATS was not ready for connections within 30 s")
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

// hostName names this host in the engine's writer id.
func hostName() string {
	h, err := os.Hostname()
	if err != nil {
		return "localhost"
	}
	return h
}
