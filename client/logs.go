package client

import (
	"context"
	"strconv"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// The output streams of a command.
const (
	Stdout = events.Stdout
	Stderr = events.Stderr
)

// LogChunk is a piece of a command's output: its stream, its offset in the
// stream, its bytes, EOF on the last piece of a stream that ended, and Seq, its
// sequence in the log stream, after which a read resumes (LogOptions.After).
type LogChunk = events.LogChunk

// LogOptions choose what Logs reads.
type LogOptions struct {
	// Streams to read, Stdout and/or Stderr; none: both, in the order written.
	Streams []string
	// Follow keeps reading what the command writes until its output ends.
	Follow bool
	// After is the log stream's sequence to read after (0: from the start), as a
	// reader that lost its place resumes.
	After uint64
}

// Logs calls fn with the output a task's command wrote, in order: what is kept
// of it (each stream keeps its last 4 MiB), and, with Follow, what it writes
// until its output ends. An error of fn ends the read.
func (c *Client) Logs(ctx context.Context, id string, o LogOptions, fn func(LogChunk) error) error {
	t, err := c.Get(ctx, id)
	if err != nil {
		return err
	}
	js, err := c.jetstream()
	if err != nil {
		return err
	}
	logs, err := events.ConnectLogs(ctx, js)
	if err != nil {
		return c.goneOr(err)
	}
	if !o.Follow {
		return c.goneOr(logs.ReadAfter(ctx, t.ID, o.Streams, o.After, fn))
	}
	watch, stopWatching := context.WithCancel(ctx)
	taskEnded := make(chan struct{})
	defer func() { stopWatching(); <-taskEnded }()
	go func() {
		defer close(taskEnded)
		// An error too ends the wait: the task can no longer be followed, and what
		// its log holds is all there will be to read.
		_, _ = c.Follow(watch, t.ID, func(t Task) bool { return !t.Phase.Runs() })
	}()
	return c.goneOr(logs.Follow(ctx, t.ID, o.Streams, o.After, taskEnded, fn))
}

// TargetState is what a target (an agent) says of itself: busy (in a turn), or
// idle; a busy state may end by itself (Until).
type TargetState = events.TargetState

// The states of a target.
const (
	TargetBusy = events.TargetBusy
	TargetIdle = events.TargetIdle
)

// MarkSession is what an agent runtime's hook does at each turn's start and
// end: it connects with cfg, records that target is busy (ending by itself
// after busyTTL, as a runtime killed in a turn says idle no more) or idle, and
// closes; ctx bounds it all.
func MarkSession(ctx context.Context, cfg Config, target, state string, busyTTL time.Duration) error {
	c, err := Connect(ctx, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	var ttl time.Duration
	if state == TargetBusy {
		ttl = busyTTL
	}
	_, err = c.SetTarget(ctx, target, state, ttl)
	return err
}

// SetTarget says that a target is busy, until ttl has passed (0: until it says
// idle), or idle, and returns the state stored. Pushes to a busy target under the
// defer_idle policy wait.
func (c *Client) SetTarget(ctx context.Context, name, state string, ttl time.Duration) (TargetState, error) {
	if err := checkName("target", name); err != nil {
		return TargetState{}, err
	}
	st := TargetState{State: state, Since: time.Now().UTC()}
	switch {
	case state != TargetBusy && state != TargetIdle:
		return TargetState{}, &Error{Code: 400, Field: "state", Message: "state " + strconv.Quote(state) + ": want busy or idle"}
	case ttl != 0 && state != TargetBusy:
		return TargetState{}, &Error{Code: 400, Field: "ttl", Message: "ttl: only a busy state ends by itself"}
	case ttl != 0:
		if err := events.CheckBusyTTL(ttl); err != nil {
			return TargetState{}, &Error{Code: 400, Field: "ttl", Message: err.Error()}
		}
		until := st.Since.Add(ttl)
		st.Until = &until
	}
	targets, err := c.targets(ctx)
	if err != nil {
		return TargetState{}, err
	}
	return st, c.do(ctx, true, func(ctx context.Context) error { return targets.Set(ctx, name, st) })
}

// Target returns the state of a target: idle if it never said one.
func (c *Client) Target(ctx context.Context, name string) (TargetState, error) {
	if err := checkName("target", name); err != nil {
		return TargetState{}, err
	}
	targets, err := c.targets(ctx)
	if err != nil {
		return TargetState{}, err
	}
	var out TargetState
	return out, c.do(ctx, true, func(ctx context.Context) (err error) {
		out, err = targets.Get(ctx, name)
		return err
	})
}

// Targets returns the state of every target that said one.
func (c *Client) Targets(ctx context.Context) (map[string]TargetState, error) {
	targets, err := c.targets(ctx)
	if err != nil {
		return nil, err
	}
	var out map[string]TargetState
	return out, c.do(ctx, true, func(ctx context.Context) (err error) {
		out, err = targets.List(ctx)
		return err
	})
}

func (c *Client) targets(ctx context.Context) (*events.Targets, error) {
	js, err := c.jetstream()
	if err != nil {
		return nil, err
	}
	t, err := events.ConnectTargets(ctx, js)
	return t, c.goneOr(err)
}

// DefaultTarget receives the wake-ups of specs that name none.
const DefaultTarget = engine.DefaultTarget

// ValidName reports whether s may name a target or a worker: 1 to 128 letters,
// digits, '-' or '_'.
func ValidName(s string) bool { return events.ValidToken(s) }

// checkName is the *Error of a name (of a target: field) that is not valid.
func checkName(field, name string) error {
	if !events.ValidToken(name) {
		return &Error{Code: 400, Field: field, Message: field + " " + strconv.Quote(name) + ": use 1-128 letters, digits, '-' or '_'"}
	}
	return nil
}

// CheckBusyTTL says why a busy state may not end by itself after ttl: it is not
// positive, or longer than a busy state may last.
func CheckBusyTTL(ttl time.Duration) error { return events.CheckBusyTTL(ttl) }

// Where a deployment keeps the targets' states, and the archived histories: a
// runtime may read and write a target's state with any NATS client.
const (
	TargetsBucket     = events.TargetsBucket
	ArchiveStreamName = events.ArchiveStreamName
)
