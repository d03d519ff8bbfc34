package events

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TargetsBucket is the KV bucket where targets (agents, conversations, bots) say
// whether they are busy. The key is the target's name; the value a TargetState, or
// just the word busy or idle, so any NATS client can set it.
const TargetsBucket = "BGTASK_TARGETS"

// Target states.
const (
	TargetBusy = "busy"
	TargetIdle = "idle"
)

// TargetState is what a target last said of itself. A busy state with Until ends
// by itself then, so a runtime that crashed while busy does not hold its wake-ups
// forever.
type TargetState struct {
	State string     `json:"state"`
	Until *time.Time `json:"until,omitempty"`
	Since time.Time  `json:"since,omitzero"`
}

// MaxBusyTTL bounds how long a busy state may last before it ends by itself. A
// busy target is one in a turn (the runtime setups give theirs 30 minutes), and
// the TTL is what frees its held wake-ups if its runtime crashed in one: past a
// day it frees nothing anyone is still waiting for, and a TTL that long is a
// mistake of units more likely than a turn. A target busy for longer says busy
// with no TTL, and idle when it is done.
const MaxBusyTTL = 24 * time.Hour

// CheckBusyTTL checks the TTL of a busy state: above 0 and at most MaxBusyTTL.
func CheckBusyTTL(ttl time.Duration) error {
	switch {
	case ttl <= 0:
		return fmt.Errorf("%s: want a positive duration such as 10m", ttl)
	case ttl > MaxBusyTTL:
		return fmt.Errorf("%s is over the %s a busy state may last by itself; say busy with no TTL, and idle when done", ttl, MaxBusyTTL)
	}
	return nil
}

// BusyAt reports whether the target is busy at now. An unknown target is idle.
func (t TargetState) BusyAt(now time.Time) bool {
	return t.State == TargetBusy && (t.Until == nil || now.Before(*t.Until))
}

// ParseTargetState reads a value of the bucket.
func ParseTargetState(data []byte) (TargetState, error) {
	data = bytes.TrimSpace(data)
	if word := string(data); word == TargetBusy || word == TargetIdle {
		return TargetState{State: word}, nil
	}
	var t TargetState
	if err := json.Unmarshal(data, &t); err != nil {
		return TargetState{}, fmt.Errorf("target state %q: not busy, idle or a JSON object: %w", data, err)
	}
	if t.State != TargetBusy && t.State != TargetIdle {
		return TargetState{}, fmt.Errorf("target state %q: state must be busy or idle", t.State)
	}
	return t, nil
}

// Targets is the target-state bucket.
type Targets struct{ kv jetstream.KeyValue }

// OpenTargets creates or updates the bucket.
func OpenTargets(ctx context.Context, js jetstream.JetStream, replicas int) (*Targets, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      TargetsBucket,
		Description: "bgtask target states: busy or idle, set by the targets' runtimes",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("create bucket %s: %w", TargetsBucket, err)
	}
	return &Targets{kv: kv}, nil
}

// ConnectTargets returns the bucket a server created.
func ConnectTargets(ctx context.Context, js jetstream.JetStream) (*Targets, error) {
	kv, err := js.KeyValue(ctx, TargetsBucket)
	if err != nil {
		return nil, fmt.Errorf("find bucket %s (is bgtask server running?): %w", TargetsBucket, err)
	}
	return &Targets{kv: kv}, nil
}

// Set records a target's state.
func (t *Targets) Set(ctx context.Context, name string, st TargetState) error {
	if !ValidToken(name) {
		return fmt.Errorf("invalid target %q: use letters, digits, '-' and '_'", name)
	}
	data, err := json.Marshal(st)
	if err != nil {
		return err
	}
	_, err = t.kv.Put(ctx, name, data)
	return err
}

// Get returns a target's state; a target that never said anything is idle.
func (t *Targets) Get(ctx context.Context, name string) (TargetState, error) {
	entry, err := t.kv.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return TargetState{State: TargetIdle}, nil
	}
	if err != nil {
		return TargetState{}, err
	}
	return ParseTargetState(entry.Value())
}

// List returns every target that has a state.
func (t *Targets) List(ctx context.Context) (map[string]TargetState, error) {
	states := map[string]TargetState{}
	keys, err := t.kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	for name := range keys.Keys() {
		st, err := t.Get(ctx, name)
		if err != nil {
			return nil, err
		}
		states[name] = st
	}
	return states, nil
}

// TargetWatch follows the targets' states. It has the lifecycle of every
// long-running part of an engine (engine.Component): Start calls fn with every
// target's current state and returns once it has; fn then hears of each change
// until Stop. A value that does not parse is passed to bad and counts as idle.
type TargetWatch struct {
	kv  jetstream.KeyValue
	fn  func(name string, st TargetState)
	bad func(name string, err error)

	mu      sync.Mutex
	started bool
	cancel  context.CancelFunc
	done    chan struct{}
}

// Watch returns a watch of the targets' states that calls fn; Start starts it.
func (t *Targets) Watch(fn func(name string, st TargetState), bad func(name string, err error)) *TargetWatch {
	return &TargetWatch{kv: t.kv, fn: fn, bad: bad}
}

// Start passes every target's current state to fn, and returns once it has.
func (w *TargetWatch) Start(ctx context.Context) error {
	w.mu.Lock()
	started := w.started
	w.started = true
	w.mu.Unlock()
	if started {
		return errors.New("the watch of the targets' states is started already")
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	kw, err := w.kv.WatchAll(ctx)
	if err != nil {
		cancel()
		return fmt.Errorf("watch bucket %s: %w", TargetsBucket, err)
	}
	// WatchAll sends every current value, then a nil entry, then the changes.
	for synced := false; !synced; {
		select {
		case <-ctx.Done():
			cancel()
			_ = kw.Stop()
			return ctx.Err()
		case entry, ok := <-kw.Updates():
			switch {
			case !ok:
				cancel()
				return fmt.Errorf("watch bucket %s: closed", TargetsBucket)
			case entry == nil:
				synced = true
			default:
				w.pass(entry)
			}
		}
	}
	done := make(chan struct{})
	w.mu.Lock()
	w.cancel, w.done = cancel, done
	w.mu.Unlock()
	go func() {
		defer close(done)
		defer func() { _ = kw.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return
			case entry, ok := <-kw.Updates():
				if !ok {
					return
				}
				if entry != nil {
					w.pass(entry)
				}
			}
		}
	}()
	return nil
}

func (w *TargetWatch) pass(entry jetstream.KeyValueEntry) {
	st := TargetState{State: TargetIdle}
	if entry.Operation() == jetstream.KeyValuePut {
		parsed, err := ParseTargetState(entry.Value())
		if err != nil {
			w.bad(entry.Key(), err)
		} else {
			st = parsed
		}
	}
	w.fn(entry.Key(), st)
}

// Stop ends the watch; it is safe before Start and twice.
func (w *TargetWatch) Stop() {
	w.mu.Lock()
	cancel, done := w.cancel, w.done
	w.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}
