package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"

	"github.com/bgtask/bgtask/events"
)

// Base is what every long-running part carries: a logger and a clock, so tests can
// see what happened and drive time.
type Base struct {
	Logger *slog.Logger
	Now    func() time.Time
}

// WithDefaults fills in a discarding logger and the wall clock.
func (b Base) WithDefaults() Base {
	if b.Logger == nil {
		b.Logger = slog.New(slog.DiscardHandler)
	}
	if b.Now == nil {
		b.Now = time.Now
	}
	return b
}

// keyNamespace makes task ids for idempotency keys: the same key always names the
// same task, so "arm once" is the event log's own first-event condition and needs no
// second store that could disagree with it.
var keyNamespace = uuid.MustParse("6f3c1a52-2a4e-4d0c-9f57-6b1f0b9b7a10")

// TaskID returns the id a spec registers under: derived from its idempotency key if
// it has one, else a new time-ordered UUID v7.
func TaskID(spec Spec) (string, error) {
	if spec.IdempotencyKey != "" {
		return uuid.NewSHA1(keyNamespace, []byte(spec.IdempotencyKey)).String(), nil
	}
	id, err := uuid.NewV7()
	return id.String(), err
}

// Service registers and cancels tasks.
type Service struct {
	base    Base
	store   events.Store
	writer  string
	archive ArchiveReader
	// publicWebhooks: webhooks may not name a non-public address.
	publicWebhooks bool
	// bearers are the bearer tokens a webhook may name.
	bearers Bearers
	// inbox is where Consume removes a wake-up from.
	inbox WakeupRemover
}

// NewService returns a service that appends as writer (the engine's identity).
func NewService(store events.Store, writer string, base Base) *Service {
	return &Service{base: base.WithDefaults(), store: store, writer: writer}
}

// ReadArchive lets Register read the whole spec of an archived task, to compare it
// with a registration under the same idempotency key; without an archive, only the
// command, kind and target that the task's summary keeps are compared. Call it
// before the first Register.
func (s *Service) ReadArchive(archive ArchiveReader) { s.archive = archive }

// DenyPrivateWebhooks makes Register refuse a webhook whose URL names a non-public
// address or localhost (CheckPublicWebhooks), for a server whose pushes refuse
// them: the registrant learns it at once rather than from a failed delivery. Call
// it before the first Register.
func (s *Service) DenyPrivateWebhooks() { s.publicWebhooks = true }

// DeclareBearers makes Register accept a webhook that names one of these bearer
// tokens, for a URL under its prefixes (Bearers.Check); without them, a spec
// that names one is refused. Call it before the first Register.
func (s *Service) DeclareBearers(b Bearers) { s.bearers = b }

// Register validates a spec and arms it. It returns the task id and whether this
// call armed it (false: the idempotency key was registered before, with the same
// spec). The same key with another spec is a *KeyConflictError.
func (s *Service) Register(ctx context.Context, raw []byte) (string, bool, error) {
	// One instant for the spec's relative deadline and the armed event's time, so
	// that a retry can count its deadline from the first registration.
	now := s.base.Now()
	spec, err := ParseSpecAt(raw, now)
	if err != nil {
		return "", false, err
	}
	if s.publicWebhooks {
		if err := CheckPublicWebhooks(spec); err != nil {
			return "", false, err
		}
	}
	if err := s.bearers.Check(spec); err != nil {
		return "", false, err
	}
	if err := s.checkAfter(ctx, spec); err != nil {
		return "", false, err
	}
	id, err := TaskID(spec)
	if err != nil {
		return "", false, err
	}
	ev, err := Decide(State{ID: id}, Arm{Spec: spec}, Meta{Writer: s.writer, Now: now})
	if err != nil {
		return "", false, err
	}
	_, err = s.appendArmed(ctx, ev)
	switch {
	case err == nil:
		s.base.Logger.Info("armed", "task", id, "command", spec.CommandLine(), "target", spec.Target)
		return id, true, nil
	case errors.Is(err, events.ErrConflict) && spec.IdempotencyKey != "":
		if err := s.checkKeyedRetry(ctx, id, raw, spec); err != nil {
			return "", false, err
		}
		return id, false, nil
	default:
		return "", false, err
	}
}

// appendArmed appends a task's first event, retrying the same event while the
// store cannot be reached (a stream leader being elected takes seconds): the
// event's id makes a retry of a write that was stored count once.
func (s *Service) appendArmed(ctx context.Context, ev events.Event) (uint64, error) {
	for {
		seq, err := s.store.Append(ctx, ev, 0)
		if err == nil || errors.Is(err, events.ErrConflict) || errors.Is(err, events.ErrNoSpace) || ctx.Err() != nil {
			return seq, err
		}
		s.base.Logger.Warn("armed not recorded yet, retrying", "task", ev.TaskID, "err", err)
		select {
		case <-ctx.Done():
			return 0, err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// MaxCancelReasonBytes bounds a cancel's reason: it is kept in the task's state, so
// in every view and list page of it. Even if every byte takes six as JSON, it stays
// within the budget of a reason and is never cut.
const MaxCancelReasonBytes = 512

// Cancel appends cancelled to an armed or running task; the worker that runs it sees
// the event and stops the command's process group.
func (s *Service) Cancel(ctx context.Context, id, reason string) (State, error) {
	if len(reason) > MaxCancelReasonBytes {
		return State{}, fieldErr("reason", "%d bytes is over the limit of %d", len(reason), MaxCancelReasonBytes)
	}
	return s.update(ctx, id, Cancel{Reason: reason})
}

// Complete ends a task from outside: whichever of it, the command's exit and the
// deadline comes first decides.
func (s *Service) Complete(ctx context.Context, id, status, result string) (State, error) {
	return s.update(ctx, id, Complete{Status: status, Result: result})
}

// Pause holds a task that has not started.
func (s *Service) Pause(ctx context.Context, id string) (State, error) {
	return s.update(ctx, id, Pause{})
}

// Resume lets a paused task go on.
func (s *Service) Resume(ctx context.Context, id string) (State, error) {
	return s.update(ctx, id, Resume{})
}

// update decides c on the task's current state and appends the result, deciding
// again on the new state if another writer got there first.
func (s *Service) update(ctx context.Context, id string, c Command) (State, error) {
	load := func(ctx context.Context) (State, error) { return Load(ctx, s.store, id) }
	state, err := load(ctx)
	if err != nil {
		return State{}, err
	}
	decide := func(state State) (events.Event, error) { return Decide(state, c, s.meta()) }
	return Update(ctx, s.store, state, load, decide, ReloadOnConflict{Max: 10})
}

func (s *Service) meta() Meta { return Meta{Writer: s.writer, Now: s.base.Now()} }

// Load rebuilds one task's state from its history in the store. A task whose last
// event is armed has no other (Register appends armed only on a task with no event),
// so that event, one direct read, is its whole history: a worker loads every task
// offered to it, and a history read costs the server a consumer of its own.
func Load(ctx context.Context, store events.Store, id string) (State, error) {
	last, err := store.Last(ctx, id)
	if errors.Is(err, events.ErrNotFound) {
		return State{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return State{}, err
	}
	if last.Type == events.TypeArmed {
		if state, err := Apply(State{}, last); err == nil {
			return state, nil
		}
	}
	history, err := store.History(ctx, id)
	if errors.Is(err, events.ErrNotFound) {
		return State{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return State{}, err
	}
	state, _ := Replay(history)
	return state, nil
}
