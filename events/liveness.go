package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
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
	ID   string `json:"id"`
	Host string `json:"host"`
	// Labels always include host; placement matches tasks to them.
	Labels map[string]string `json:"labels,omitempty"`
	// Exclusive: it takes only tasks whose placement names each of its labels but
	// host (bgtask worker --exclusive).
	Exclusive bool `json:"exclusive,omitempty"`
	// State says whether it takes tasks: only a ready worker is offered any.
	State     WorkerState `json:"state,omitempty"`
	Running   int         `json:"running"`
	MaxTasks  int         `json:"max_tasks"`
	Heartbeat time.Time   `json:"heartbeat"`
	StartedAt time.Time   `json:"started_at,omitzero"`
}

// WorkerState is where a worker is in its life.
type WorkerState string

const (
	WorkerStarting WorkerState = "starting" // watching its runs again, resolving its environment
	WorkerReady    WorkerState = "ready"    // takes tasks
	WorkerDraining WorkerState = "draining" // takes no task; exits when its runs have ended
	WorkerStopped  WorkerState = "stopped"  // its process ended; its runs go on, its lease holds
)

// Liveness is the heartbeat bucket.
type Liveness struct {
	kv  jetstream.KeyValue
	ttl atomic.Int64 // a time.Duration: the bucket's TTL when last read
}

func newLiveness(kv jetstream.KeyValue, ttl time.Duration) *Liveness {
	l := &Liveness{kv: kv}
	l.ttl.Store(int64(ttl))
	return l
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
	return newLiveness(kv, ttl), nil
}

// ConnectLiveness returns the heartbeat bucket a server created.
func ConnectLiveness(ctx context.Context, js jetstream.JetStream) (*Liveness, error) {
	kv, err := js.KeyValue(ctx, WorkersBucket)
	if err != nil {
		return nil, fmt.Errorf("find bucket %s (is bgtask server running?): %w", WorkersBucket, err)
	}
	l := newLiveness(kv, 0)
	if err := l.Refresh(ctx); err != nil {
		return nil, err
	}
	return l, nil
}

// TTL is the lease TTL.
func (l *Liveness) TTL() time.Duration { return time.Duration(l.ttl.Load()) }

// Refresh reads the lease TTL from the bucket again: a server that restarts with
// another --lease-ttl changes it under the workers connected to it, which must
// beat at the rate of the TTL the server uses now.
func (l *Liveness) Refresh(ctx context.Context) error {
	status, err := l.kv.Status(ctx)
	if err != nil {
		return fmt.Errorf("read bucket %s: %w", WorkersBucket, err)
	}
	l.ttl.Store(int64(status.TTL()))
	return nil
}

// Beat records a worker's heartbeat.
func (l *Liveness) Beat(ctx context.Context, info WorkerInfo) error {
	data, err := json.Marshal(info)
	if err != nil {
		return err
	}
	_, err = l.kv.Put(ctx, info.ID, data)
	return err
}

// Remove deletes a worker's heartbeat: it holds no task any more and is gone.
func (l *Liveness) Remove(ctx context.Context, workerID string) error {
	return l.kv.Delete(ctx, workerID)
}

// watchInitialTimeout bounds how long a watch waits for the current values.
const watchInitialTimeout = 30 * time.Second

// WorkerUpdate is a change of one worker's heartbeat entry.
type WorkerUpdate struct {
	ID   string
	Info WorkerInfo
	// At is when the server stored the heartbeat: one clock for every worker.
	At time.Time
	// Gone: the entry was removed (the worker drained and left).
	Gone bool
}

// Watch returns every worker's current heartbeat, then sends every change until
// ctx ends; then the channel is closed. An entry that expires with its TTL sends
// nothing: a reader ages entries out by At.
func (l *Liveness) Watch(ctx context.Context) ([]WorkerUpdate, <-chan WorkerUpdate, error) {
	w, err := l.kv.WatchAll(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("watch %s: %w", WorkersBucket, err)
	}
	var current []WorkerUpdate
	initial := time.NewTimer(watchInitialTimeout)
	defer initial.Stop()
	for done := false; !done; {
		select {
		case entry, ok := <-w.Updates():
			switch {
			case !ok:
				return nil, nil, fmt.Errorf("watch %s: ended before the current values", WorkersBucket)
			case entry == nil:
				done = true // the end of the current values
			default:
				if u, ok := workerUpdate(entry); ok {
					current = append(current, u)
				}
			}
		case <-initial.C:
			_ = w.Stop()
			return nil, nil, fmt.Errorf("watch %s: no current values after %v", WorkersBucket, watchInitialTimeout)
		case <-ctx.Done():
			_ = w.Stop()
			return nil, nil, ctx.Err()
		}
	}
	out := make(chan WorkerUpdate)
	go func() {
		defer close(out)
		defer func() { _ = w.Stop() }()
		for {
			var entry jetstream.KeyValueEntry
			var ok bool
			select {
			case <-ctx.Done():
				return
			case entry, ok = <-w.Updates():
				if !ok {
					return
				}
			}
			u, ok := workerUpdate(entry)
			if !ok {
				continue
			}
			select {
			case out <- u:
			case <-ctx.Done():
				return
			}
		}
	}()
	return current, out, nil
}

func workerUpdate(entry jetstream.KeyValueEntry) (WorkerUpdate, bool) {
	u := WorkerUpdate{ID: entry.Key(), At: entry.Created(), Gone: entry.Operation() != jetstream.KeyValuePut}
	if !u.Gone && json.Unmarshal(entry.Value(), &u.Info) != nil {
		return u, false
	}
	return u, true
}

// Alive reports whether a worker's heartbeat is within the lease TTL.
func (l *Liveness) Alive(ctx context.Context, workerID string) (bool, error) {
	_, err := l.kv.Get(ctx, workerID)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrInvalidKey) {
		return false, nil
	}
	return err == nil, err
}
