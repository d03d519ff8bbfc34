package events

import (
	"context"
	"errors"
	"regexp"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// Subjects and streams. A task id and a target are single subject tokens, so one
// subject filter holds exactly one task's history or one target's inbox.
const (
	StreamName      = "BGTASK_EVENTS"
	SubjectPrefix   = "bgtask.events"
	InboxStreamName = "BGTASK_INBOX"
	InboxPrefix     = "bgtask.deliver"
)

var (
	// ErrConflict means the append lost the race: another event was written to the
	// task after the history the writer decided on. Re-read and decide again.
	ErrConflict = errors.New("events: the task changed since it was read")
	// ErrNotFound means the task has no events.
	ErrNotFound = errors.New("events: no such task")
	// ErrIncomplete means a read of a task's history could not reach the event
	// that its last event read showed: the servers that answered stayed behind
	// the one that answered first. Read again.
	ErrIncomplete = errors.New("events: the history read stopped short of the task's last event")
	// ErrNoSpace means the store's disk is full: no append succeeds until it has
	// room again, so one that a caller waits for fails at once.
	ErrNoSpace = errors.New("events: the event store's disk is full")
	// ErrClosed means the store's connection to NATS was closed: no append on it
	// succeeds again, so none is retried.
	ErrClosed = nats.ErrConnectionClosed
)

// TaskSubject is the subject an event of a task is published on. The event stream
// stores it on the task's StoredSubject, so that permissions and core
// subscriptions can still tell the types apart.
func TaskSubject(taskID string, t Type) string { return SubjectPrefix + "." + taskID + "." + string(t) }

// StoredSubject is the one subject a task's events are stored on in the event
// stream: its whole history, in order.
func StoredSubject(taskID string) string { return SubjectPrefix + "." + taskID }

// TypeFilter matches one event type of every task.
func TypeFilter(t Type) string { return SubjectPrefix + ".*." + string(t) }

// InboxSubject is where the wake-ups for a target are published.
func InboxSubject(target string) string { return InboxPrefix + "." + target }

// tokenPattern is compiled at its first use: its {1,128} makes it a large program,
// which every start of the binary, a client command's too, would build.
var tokenPattern = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`) })

// ValidToken reports whether s can be used as one subject token (a task id or a
// target): no dots, wildcards or spaces.
func ValidToken(s string) bool { return tokenPattern().MatchString(s) }

// Store is the event log. Implementations must make Append atomic with its
// condition and idempotent by event id.
type Store interface {
	// Append writes ev if the task's last event is still at sequence expect (0: the
	// task has no events yet). It returns the event's sequence, or ErrConflict. A retry
	// of an append that already succeeded returns the original sequence while that
	// event is the task's last, and ErrConflict once others followed it.
	Append(ctx context.Context, ev Event, expect uint64) (uint64, error)
	// History returns a task's events in order, or ErrNotFound. It holds every
	// event acknowledged before it was called.
	History(ctx context.Context, taskID string) ([]Record, error)
	// Last returns a task's last event, or ErrNotFound.
	Last(ctx context.Context, taskID string) (Record, error)
	// LastSeq is the sequence of the last event in the whole log (0 if empty).
	LastSeq(ctx context.Context) (uint64, error)
}

// Inbox holds delivered wake-ups.
type Inbox interface {
	// Deliver publishes w to its target's inbox with the task id as message id and
	// returns its inbox sequence. With recheckSince set, a wake-up already in the inbox
	// (from an attempt whose outcome is unknown) is found and not published again.
	Deliver(ctx context.Context, w Wakeup, recheckSince time.Time) (uint64, error)
}
