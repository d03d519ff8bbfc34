package server

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/internal/serverhome"
	"github.com/bgtask/bgtask/projections"
)

// RunExternal runs the engine (and a worker, unless NoWorker) against the NATS
// deployment of o.URL until ctx is done. Before it serves, it checks that
// neither an anonymous connection nor the client identity (o.Probe) can publish
// into the event stream.
func RunExternal(ctx context.Context, o Options) error {
	logger := engine.Base{Logger: o.Logger}.WithDefaults().Logger
	if err := o.Probe.check(ctx, o.URL, logger); err != nil {
		return err
	}
	nc, err := o.Connect("bgtask-engine")
	if err != nil {
		return err
	}
	defer nc.Close()
	if err := checkMaxPayload(nc.MaxPayload()); err != nil {
		return err
	}
	base := engine.Base{Logger: logger}
	home, homeErr, err := externalHome(o)
	if err != nil {
		return err
	}
	secret, err := loadWebhookSecret(o.Delivery.SecretFile, home)
	if err != nil {
		return err
	}
	snapshots := projections.Snapshots{Path: filepath.Join(home, serverhome.SnapshotFile), Every: o.SnapshotEvery, Build: o.Build}
	if homeErr != nil && snapshots.Every > 0 {
		logger.Warn("no projection snapshots: the home cannot be created", "home", home, "err", homeErr)
		snapshots.Every = 0
	}
	// Replicas may share a host: each engine process has an id of its own, so no
	// replica takes another's push in flight for one of its own dead ones.
	eng, err := startEngine(ctx, nc, base, engineOptions{
		writer: fmt.Sprintf("engine@%s/%d", hostName(), os.Getpid()), leaseTTL: o.LeaseTTL, replicas: o.Replicas,
		push: o.pushing(secret, home), denyPrivate: o.DenyPrivate, archiveAfter: o.ArchiveAfter,
		logBytes: int64(o.LogBytes), snapshots: snapshots, version: o.Version,
	})
	if err != nil {
		return err
	}
	defer eng.Stop()
	if !o.NoWorker {
		o.Worker.StateDir = filepath.Join(home, "worker")
		wnc, err := o.Connect("bgtask-worker")
		if err != nil {
			return err
		}
		w, err := newWorker(ctx, wnc, o.Worker, base)
		if err != nil {
			wnc.Close()
			return err
		}
		defer w.Stop()
	}
	stopHTTP, err := externalHTTP(ctx, o, home, homeErr, eng.Metrics(), logger)
	if err != nil {
		return err
	}
	defer stopHTTP()
	logger.Info("bgtask server ready", "nats", redactURL(o.URL), "replicas", o.Replicas)
	<-ctx.Done()
	logger.Info("bgtask server stopping")
	return nil
}

// externalHome is the home of a server on a deployment of your own, made if need
// be. It holds what this engine keeps on its own disk (the generated webhook
// secret, snapshots, the worker's runs); against a cluster it need not exist
// yet. An engine-only replica with a secret file of its own may run where it
// cannot be made (homeErr says why), and then replays the whole stream at each
// start.
func externalHome(o Options) (home string, homeErr, err error) {
	home, err = serverhome.Dir(o.Home)
	if err != nil {
		return "", nil, err
	}
	homeErr = os.MkdirAll(home, 0o700)
	if homeErr != nil && (o.Delivery.SecretFile == "" || !o.NoWorker) {
		needs := "the generated webhook secret"
		if o.Delivery.SecretFile != "" {
			needs = "the worker's runs"
		}
		return "", nil, fmt.Errorf("the home %s cannot be created for %s: %w (give --home, or --webhook-secret-file and --no-worker)", home, needs, homeErr)
	}
	return home, homeErr, nil
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
