package engine

import (
	"context"
	"errors"
	"time"

	"github.com/bgtask/bgtask/events"
)

// ErrNothingToAppend is what a decision passed to Update returns when the task, as
// it now is, needs no event from this writer: Update appends nothing and returns
// it with the state.
var ErrNothingToAppend = errors.New("engine: the task needs no event")

// UpdatePolicy is what Update does when an append fails. Whatever the policy, every
// append is conditional on the last event of the state its event was decided on:
// no writer adds to a history it has not read.
//
//   - ReloadOnConflict: reload and decide again after a conflict, at most Max
//     times; any other error is the caller's. The API's commands (Service),
//     the dispatcher's completion, and the lease check (Max 0: its next pass
//     sees the task again).
//   - ReloadOnError: after any failed append, wait, reload and decide again, at
//     most Max times. The timers (they decide on a reader, which lags the log)
//     and the pusher's record of an attempt (it decides afresh from the log).
//   - RetrySameEvent: append the very same event again after an error other than
//     a conflict (or a closed connection), until the context ends, so that an append whose ack was lost
//     counts once (the store dedupes by event id); after a conflict, reload
//     (where the writer says whether it still holds the task) and decide again.
//     A worker's record of its run, which must not lose how the command ended.
type UpdatePolicy interface{ updatePolicy() }

// ReloadOnConflict decides again on a reloaded state after a conflict, at most Max
// times; Update returns any other error at once.
type ReloadOnConflict struct{ Max int }

// ReloadOnError decides again on a reloaded state after any failed append, at most
// Max times, waiting Wait before each reload. Retrying, if set, is told of each
// error other than a conflict that is retried.
type ReloadOnError struct {
	Max      int
	Wait     time.Duration
	Retrying func(ev events.Event, err error)
}

// RetrySameEvent appends the same event again after each error other than a
// conflict, Backoff apart, until the context ends; Retrying, if set, is told of
// each such error. A conflict reloads the state and decides again.
type RetrySameEvent struct {
	Backoff  time.Duration
	Retrying func(ev events.Event, err error)
}

func (ReloadOnConflict) updatePolicy() {}
func (ReloadOnError) updatePolicy()    {}
func (RetrySameEvent) updatePolicy()   {}

// Update decides on s the event to append, appends it conditional on s's last event,
// and returns the state with it applied. When the append fails, policy says whether
// reload gives the state to decide on again (reload is called only then: nil for
// ReloadOnConflict{Max: 0}). A decision's
// error, reload's, or the append's error that the policy gives up on is returned
// with the state it was decided on (or the state reload returned).
func Update(ctx context.Context, store events.Store, s State, reload func(context.Context) (State, error),
	decide func(State) (events.Event, error), policy UpdatePolicy) (State, error) {
	for reloads := 0; ; reloads++ {
		ev, err := decide(s)
		if err != nil {
			return s, err
		}
		seq, err := appendEvent(ctx, store, ev, s.Seq, policy)
		if err == nil {
			return Apply(s, events.Record{Seq: seq, Event: ev})
		}
		if !reloadAfter(ctx, policy, reloads, ev, err) {
			return s, err
		}
		if s, err = reload(ctx); err != nil {
			return s, err
		}
	}
}

// appendEvent appends ev conditional on expect, again and again as policy says.
func appendEvent(ctx context.Context, store events.Store, ev events.Event, expect uint64, policy UpdatePolicy) (uint64, error) {
	for {
		seq, err := store.Append(ctx, ev, expect)
		same, ok := policy.(RetrySameEvent)
		if err == nil || !ok || errors.Is(err, events.ErrConflict) || errors.Is(err, events.ErrClosed) {
			return seq, err
		}
		if same.Retrying != nil {
			same.Retrying(ev, err)
		}
		if !pause(ctx, same.Backoff) {
			return 0, err
		}
	}
}

// reloadAfter reports whether the append of ev that failed with err, after the given
// number of reloads, is decided again on a reloaded state, having waited as the
// policy says.
func reloadAfter(ctx context.Context, policy UpdatePolicy, reloads int, ev events.Event, err error) bool {
	conflict := errors.Is(err, events.ErrConflict)
	switch p := policy.(type) {
	case ReloadOnConflict:
		return conflict && reloads < p.Max
	case ReloadOnError:
		if reloads >= p.Max {
			return false
		}
		if !conflict && p.Retrying != nil {
			p.Retrying(ev, err)
		}
		return pause(ctx, p.Wait)
	case RetrySameEvent:
		return conflict
	}
	return false
}

// pause waits d, and reports false if ctx ends first.
func pause(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}
