package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// WorkersBucket is the KV bucket of worker heartbeats. An entry lives for the lease
// TTL after its last heartbeat: a worker whose entry is gone has lost its leases.
const WorkersBucket = "BGTASK_WORKERS"

// DefaultLeaseTTL is how long a worker may go without a heartbeat before its
// running tasks are lost. It must outlast a restart or an upgrade of a worker,
// whose commands go on meanwhile.
const DefaultLeaseTTL = time.Minute

// WorkerInfo is what a worker's heartbeat says.
type WorkerInfo struct {
	ID        string    `json:"id"`
	Host      string    `json:"host"`
	Running   int       `json:"running"`
	MaxTasks  int       `json:"max_tasks"`
	Heartbeat time.Time `json:"heartbeat"`
}

// Liveness is the heartbeat bucket.
type Liveness struct {
	kv  jetstream.KeyValue
	ttl time.Duration
}

// OpenLiveness creates or updates the heartbeat bucket with the lease TTL.
func OpenLiveness(ctx context.Context, js jetstream.JetStream, ttl time.Duration, replicas int) (*Liveness, error) {
	if ttl <= 0 {
		ttl = DefaultLeaseTTL
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      WorkersBucket,
		Description: "bgtask worker heartbeats; an entry expires one lease TTL after the last",
		History:     1,
		TTL:         ttl,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("create bucket %s: %w", WorkersBucket, err)
	}
	return &Liveness{kv: kv, ttl: ttl}, nil
}

// ConnectLiveness returns the heartbeat bucket a server created.
func ConnectLiveness(ctx context.Context, js jetstream.JetStream) (*Liveness, error) {
	kv, err := js.KeyValue(ctx, WorkersBucket)
	if err != nil {
		return nil, fmt.Errorf("find bucket %s (is bgtask server running?): %w", WorkersBucket, err)
	}
	status, err := kv.Status(ctx)
	if err != nil {
		return nil, err
	}
	return &Liveness{kv: kv, ttl: status.TTL()}, nil
}

// TTL is the lease TTL.
func (l *Liveness) TTL() time.Duration { return l.ttl }

// Beat records a worker's heartbeat.
func (l *Liveness) Beat(ctx context.Context, info WorkerInfo) error {
	data, err := json.Marshal(info)
	if err != nil {
		return err
	}
	_, err = l.kv.Put(ctx, info.ID, data)
	return err
}

// Alive reports whether a worker's heartbeat is within the lease TTL.
func (l *Liveness) Alive(ctx context.Context, workerID string) (bool, error) {
	_, err := l.kv.Get(ctx, workerID)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrInvalidKey) {
		return false, nil
	}
	return err == nil, err
}
