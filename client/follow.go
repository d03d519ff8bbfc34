package client

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/events"
)

// Follow reads a task's events from its first, as they are appended, until the
// task as they make it satisfies done, and returns it then. It misses nothing that
// happens meanwhile. When ctx ends first it returns the task as far as it got,
// with ctx's error.
func (c *Client) Follow(ctx context.Context, id string, done func(Task) bool) (Task, error) {
	js, err := c.jetstream()
	if err != nil {
		return Task{}, err
	}
	store, err := events.ConnectStore(ctx, js)
	if err != nil {
		return Task{}, c.goneOr(err)
	}
	var s engine.State
	err = store.Follow(ctx, id, 0, func(rec events.Record, decodeErr error) bool {
		if decodeErr == nil {
			s, _ = engine.Apply(s, rec)
		}
		return !done(api.View(s))
	})
	return api.View(s), c.goneOr(err)
}

// goneOr is err, or, once the home's server went for good under the client,
// why.
func (c *Client) goneOr(err error) error {
	if gone := c.gone.Load(); gone != nil && err != nil {
		return gone
	}
	return err
}

// Ended reports whether nothing more is delivered for a task: it fired, was
// cancelled, or was archived after either.
func Ended(t Task) bool { return t.Phase.Terminal() }

// Wait returns a task (by id or a unique prefix) once it has ended: fired,
// cancelled or archived. Its wake-up is WakeupOf's.
func (c *Client) Wait(ctx context.Context, id string) (Task, error) {
	t, err := c.Get(ctx, id)
	if err != nil || Ended(t) {
		return t, err // an unknown task is an error at once, not a wait for ever
	}
	t, err = c.Follow(ctx, t.ID, Ended)
	if err == nil && t.Phase == engine.PhaseArchived {
		return c.Get(ctx, t.ID) // the archive has what its events were
	}
	return t, err
}

// WakeupOf is the wake-up of a task that has ended: the one it delivered, or,
// for a task cancelled before it fired, one that says so.
func WakeupOf(t Task) Wakeup {
	if t.Wakeup != nil {
		return *t.Wakeup
	}
	return t.CancelledWakeup()
}

// ConsumingPrefix is where a waiter that will consume a task's wake-up (`bgtask
// wait --consume`) says so: it answers a request on ConsumingPrefix.<task id>
// from before the task fires until it has consumed the wake-up. A reader of the
// inbox that hands wake-ups to an agent (Handoff) leaves such a wake-up to it.
const ConsumingPrefix = "bgtask.consuming"

// HoldWakeup says, until release, that this client will consume the wake-up of
// task id: call it before the wait, and Consume after, so that a Handoff of the
// task's target does not hand the wake-up over meanwhile.
func (c *Client) HoldWakeup(id string) (release func(), err error) {
	sub, err := c.nc.Subscribe(ConsumingPrefix+"."+id, func(m *nats.Msg) { _ = m.Respond(nil) })
	if err != nil {
		return nil, err
	}
	return func() { _ = sub.Unsubscribe() }, nil
}

// ConsumeWakeup consumes the wake-up of a task that has ended, and says whether
// there was one: a task that woke nobody (cancelled, or quiet under its wake_on)
// has none.
func (c *Client) ConsumeWakeup(ctx context.Context, t Task) (bool, error) {
	if t.Phase != engine.PhaseFired || t.Quiet {
		return false, nil
	}
	if _, err := c.Consume(ctx, t.ID); err != nil {
		return false, fmt.Errorf("consume the wake-up of %s: %w", t.ID, err)
	}
	return true, nil
}
