package events

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// Watch calls fn with every target's current state, returns once it has, and goes
// on calling fn with each change until stop is called. A value that does not parse
// is passed to bad and counts as idle.
func (t *Targets) Watch(ctx context.Context, fn func(name string, st TargetState), bad func(name string, err error)) (stop func(), err error) {
	ctx, cancel := context.WithCancel(ctx)
	w, err := t.kv.WatchAll(ctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("watch bucket %s: %w", TargetsBucket, err)
	}
	pass := func(entry jetstream.KeyValueEntry) {
		st := TargetState{State: TargetIdle}
		if entry.Operation() == jetstream.KeyValuePut {
			parsed, err := ParseTargetState(entry.Value())
			if err != nil {
				bad(entry.Key(), err)
			} else {
				st = parsed
			}
		}
		fn(entry.Key(), st)
	}
	// WatchAll sends every current value, then a nil entry, then the changes.
	for synced := false; !synced; {
		select {
		case <-ctx.Done():
			cancel()
			_ = w.Stop()
			return nil, ctx.Err()
		case entry, ok := <-w.Updates():
			switch {
			case !ok:
				cancel()
				return nil, fmt.Errorf("watch bucket %s: closed", TargetsBucket)
			case entry == nil:
				synced = true
			default:
				pass(entry)
			}
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() { _ = w.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return
			case entry, ok := <-w.Updates():
				if !ok {
					return
				}
				if entry != nil {
					pass(entry)
				}
			}
		}
	}()
	return func() { cancel(); <-done }, nil
}
