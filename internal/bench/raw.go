package bench

import (
	"context"
	"errors"
	"path/filepath"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// rawJetStream is the baselines' JetStream: a nats-server of the bench's own on
// loopback, with a file store synced as the server under test syncs its own, so a
// raw append costs what an event append costs there, with none of bgtask's work
// around it. It cannot be the server under test: bgtask's client identity may
// create no stream and write into none.
type rawJetStream struct {
	ns *natsserver.Server
	nc []*nats.Conn
	js []jetstream.JetStream
}

// startRawJetStream starts it on a store in dir, with clients connections over
// TCP and the baseline's stream.
func startRawJetStream(ctx context.Context, dir string, syncAlways bool, clients int) (*rawJetStream, error) {
	ns, err := natsserver.NewServer(&natsserver.Options{
		Host:       "127.0.0.1",
		Port:       -1,
		JetStream:  true,
		StoreDir:   filepath.Join(dir, "raw-jetstream"),
		SyncAlways: syncAlways,
		NoSigs:     true,
		NoLog:      true,
	})
	if err != nil {
		return nil, err
	}
	ns.Start()
	raw := &rawJetStream{ns: ns}
	if !ns.ReadyForConnections(time.Minute) {
		raw.stop()
		return nil, errors.New("the baseline's NATS server did not start")
	}
	for range clients {
		nc, err := nats.Connect(ns.ClientURL())
		if err != nil {
			raw.stop()
			return nil, err
		}
		js, err := jetstream.New(nc)
		if err != nil {
			nc.Close()
			raw.stop()
			return nil, err
		}
		raw.nc, raw.js = append(raw.nc, nc), append(raw.js, js)
	}
	if err := createRawStream(ctx, raw.js[0]); err != nil {
		raw.stop()
		return nil, err
	}
	return raw, nil
}

func (r *rawJetStream) stop() {
	for _, nc := range r.nc {
		nc.Close()
	}
	r.ns.Shutdown()
	r.ns.WaitForShutdown()
}
