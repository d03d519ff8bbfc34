package events

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// SchedulesBucket is the KV bucket of schedules. The key is the schedule's name;
// the value the schedule as the engine encodes it. Every change is conditional
// on the revision read, so that engines running the same schedules advance each
// one once per slot.
const SchedulesBucket = "BGTASK_SCHEDULES"

var (
	// ErrNoSchedule: no schedule has that name.
	ErrNoSchedule = errors.New("no such schedule")
	// ErrScheduleExists: a schedule of that name exists already.
	ErrScheduleExists = errors.New("a schedule of that name exists already")
	// ErrScheduleChanged: the schedule changed since it was read.
	ErrScheduleChanged = errors.New("the schedule changed since it was read")
)

// ScheduleEntry is a schedule as stored, with the revision a change is
// conditional on.
type ScheduleEntry struct {
	Name     string
	Value    []byte
	Revision uint64
}

// Schedules is the schedules bucket.
type Schedules struct{ kv jetstream.KeyValue }

// OpenSchedules creates or updates the bucket.
func OpenSchedules(ctx context.Context, js jetstream.JetStream, replicas int) (*Schedules, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      SchedulesBucket,
		Description: "bgtask schedules: each registers a task at its slots",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("create bucket %s: %w", SchedulesBucket, err)
	}
	return &Schedules{kv: kv}, nil
}

func checkScheduleName(name string) error {
	if !ValidToken(name) {
		return fmt.Errorf("invalid schedule name %q: use letters, digits, '-' and '_'", name)
	}
	return nil
}

// Create stores a new schedule, or fails with ErrScheduleExists.
func (s *Schedules) Create(ctx context.Context, name string, value []byte) (uint64, error) {
	if err := checkScheduleName(name); err != nil {
		return 0, err
	}
	rev, err := s.kv.Create(ctx, name, value)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, fmt.Errorf("%w: %s", ErrScheduleExists, name)
	}
	return rev, err
}

// Get returns a schedule, or ErrNoSchedule.
func (s *Schedules) Get(ctx context.Context, name string) (ScheduleEntry, error) {
	if err := checkScheduleName(name); err != nil {
		return ScheduleEntry{}, err
	}
	e, err := s.kv.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return ScheduleEntry{}, fmt.Errorf("%w: %s", ErrNoSchedule, name)
	}
	if err != nil {
		return ScheduleEntry{}, err
	}
	return ScheduleEntry{Name: name, Value: e.Value(), Revision: e.Revision()}, nil
}

// List returns every schedule, by name.
func (s *Schedules) List(ctx context.Context) ([]ScheduleEntry, error) {
	keys, err := s.kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	var names []string
	for name := range keys.Keys() {
		names = append(names, name)
	}
	var out []ScheduleEntry
	for _, name := range names {
		e, err := s.Get(ctx, name)
		if errors.Is(err, ErrNoSchedule) {
			continue // deleted since it was listed
		}
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

// Update replaces a schedule if it is still at revision rev, else fails with
// ErrScheduleChanged (or ErrNoSchedule, if it is gone).
func (s *Schedules) Update(ctx context.Context, name string, value []byte, rev uint64) (uint64, error) {
	if err := checkScheduleName(name); err != nil {
		return 0, err
	}
	next, err := s.kv.Update(ctx, name, value, rev)
	if err == nil {
		return next, nil
	}
	if _, gerr := s.Get(ctx, name); errors.Is(gerr, ErrNoSchedule) {
		return 0, gerr
	}
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return 0, fmt.Errorf("%w: %s", ErrScheduleChanged, name)
	}
	return 0, err
}

// Delete removes a schedule, or fails with ErrNoSchedule.
func (s *Schedules) Delete(ctx context.Context, name string) error {
	if _, err := s.Get(ctx, name); err != nil {
		return err
	}
	return s.kv.Purge(ctx, name)
}

// Watch calls changed after each change to the bucket, until ctx ends; it
// returns then, or if the watch cannot be made or is closed.
func (s *Schedules) Watch(ctx context.Context, changed func()) error {
	w, err := s.kv.WatchAll(ctx, jetstream.UpdatesOnly(), jetstream.MetaOnly())
	if err != nil {
		return fmt.Errorf("watch bucket %s: %w", SchedulesBucket, err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("watch bucket %s: closed", SchedulesBucket)
			}
			if e != nil {
				changed()
			}
		}
	}
}
