package client

import (
	"context"
	"encoding/json"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// Event is an event of a task's history as a reader sees it (History, Events):
// its type, time, writer and payload, the spec's env hidden, and Seq, its
// sequence in the event stream, which orders every task's events.
type Event = events.Record

// EventOptions choose the events an EventFeed reads: a task's, those of the
// tasks for a target, or, with neither, every task's.
type EventOptions struct {
	// Task is a task's id, or a unique part of it as Get takes: its events, from
	// its first.
	Task string
	// Target is a target's name: the events of the tasks for it.
	Target string
	// After is the event stream's sequence to read after (0: from the first
	// event), as a reader that lost its place resumes after the last Seq it got.
	After uint64
	// FromNow reads only the events appended from now on, instead of after After.
	FromNow bool
}

// EventFeed is a read of the event stream that Events opened: each Read goes
// on from the last event the one before it read. One Read at a time.
type EventFeed struct {
	c     *Client
	store *events.JetStreamStore
	task  string                                    // the whole id; "": every task's
	match func(context.Context, events.Record) bool // nil: every event
	after uint64
}

// Events opens a read of the events o selects. It finds the task o names and
// takes its place in the stream now, before any event is read: a caller may say
// that it is open (an HTTP response its headers), and miss nothing appended
// after. An unknown task is an *Error (404), a bad target name one too (400).
func (c *Client) Events(ctx context.Context, o EventOptions) (*EventFeed, error) {
	f := &EventFeed{c: c, after: o.After}
	switch {
	case o.Task != "" && o.Target != "":
		return nil, &Error{Code: 400, Field: "target", Message: "target: give a task or a target, not both"}
	case o.Target != "":
		if err := checkName("target", o.Target); err != nil {
			return nil, err
		}
		f.match = c.ofTarget(o.Target)
	case o.Task != "":
		t, err := c.Get(ctx, o.Task)
		if err != nil {
			return nil, err
		}
		f.task = t.ID
	}
	js, err := c.jetstream()
	if err != nil {
		return nil, err
	}
	if f.store, err = events.ConnectStore(ctx, js); err != nil {
		return nil, c.goneOr(err)
	}
	if o.FromNow {
		if f.after, err = f.store.LastSeq(ctx); err != nil {
			return nil, c.goneOr(err)
		}
	}
	return f, nil
}

// Read calls fn with each event the feed selects, in the stream's order, as they
// are appended, until ctx ends (its error) or fn fails (fn's error). An event
// this client cannot read (of a newer version, or damaged) is left out: the
// audit reports it.
func (f *EventFeed) Read(ctx context.Context, fn func(Event) error) error {
	var fnErr error
	err := f.store.Follow(ctx, f.task, f.after, func(rec events.Record, decodeErr error) bool {
		f.after = rec.Seq
		if decodeErr != nil || (f.match != nil && !f.match(ctx, rec)) {
			return true
		}
		fnErr = fn(engine.HideEnvIn(rec))
		return fnErr == nil
	})
	if fnErr != nil {
		return fnErr
	}
	return f.c.goneOr(err)
}

// maxTargetCache bounds what a read of a target's events remembers of tasks'
// targets.
const maxTargetCache = 100_000

// ofTarget matches the events of the tasks for target: a task's target is in
// its armed event, or, for a task armed before the read started, asked for.
func (c *Client) ofTarget(target string) func(context.Context, Event) bool {
	known := map[string]bool{}
	return func(ctx context.Context, rec Event) bool {
		if is, ok := known[rec.TaskID]; ok {
			return is
		}
		if len(known) >= maxTargetCache {
			clear(known)
		}
		if p, err := rec.Decode(); err == nil {
			var spec engine.Spec
			if armed, ok := p.(*events.Armed); ok && json.Unmarshal(armed.Spec, &spec) == nil {
				known[rec.TaskID] = spec.Target == target
				return known[rec.TaskID]
			}
		}
		// Asked once, not again through a restart of the server: the read goes on.
		t, err := c.api.Get(ctx, rec.TaskID)
		if err != nil {
			return false // not remembered: asked again at the task's next event
		}
		known[rec.TaskID] = t.Spec.Target == target
		return known[rec.TaskID]
	}
}
