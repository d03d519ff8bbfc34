package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/bgtask/bgtask/events"
)

// ErrConsumed: the task's wake-up was consumed already.
var ErrConsumed = errors.New("wake-up consumed already")

// Consume records that a wait read a fired task's wake-up, and that it is to be
// removed from its target's inbox, so that the caller is not woken by it again;
// its push sinks' pushes not made yet are not made.
// Only a wake-up that was delivered can be: a cancelled task, or a quiet one (its
// outcome not one its wake_on names), has none.
type Consume struct{}

func (Consume) decide(s State, _ Meta) (events.Payload, uint64, error) {
	switch {
	case s.Phase == "":
		return nil, 0, ErrNotFound
	case s.Phase == PhaseCancelled:
		return nil, 0, fmt.Errorf("%w: task %s was cancelled: it woke nobody, there is nothing to consume", ErrWrongPhase, s.ID)
	case s.Phase != PhaseFired:
		return nil, 0, fmt.Errorf("%w: task %s is %s: its wake-up can be consumed once it fired", ErrWrongPhase, s.ID, s.Phase)
	case s.Quiet:
		return nil, 0, fmt.Errorf("%w: task %s ended %s, which its wake_on does not name: nothing was delivered to consume", ErrWrongPhase, s.ID, s.Status)
	case s.Consumed:
		return nil, 0, ErrConsumed
	}
	return &events.Consumed{InboxSeq: s.InboxSeq}, s.Epoch, nil
}

func (s State) consumed(p *events.Consumed) (State, error) {
	if s.Phase != PhaseFired || s.Quiet || s.Consumed || p.InboxSeq != s.InboxSeq {
		return s, ErrWrongPhase
	}
	s.Consumed = true
	// A push not made yet (held for a busy target, or waiting to be retried) would
	// wake the caller with what it has: it is not made. One in flight runs out.
	s.Deliveries = append([]SinkState(nil), s.Deliveries...) // states are values: never share
	for i, k := range s.Deliveries {
		if !k.Done() && k.Claim == nil {
			k.Skipped, k.GivingUp, k.RetryAt, k.Redelivering = true, false, nil, false
			s.Deliveries[i] = k
		}
	}
	return s, nil
}

// WakeupRemover removes a delivered wake-up from its inbox (events.JetStreamInbox).
type WakeupRemover interface {
	Remove(ctx context.Context, seq uint64, msgID string) error
}

// ConsumeFrom lets Consume remove wake-ups from inbox. Call it before the first
// Consume.
func (s *Service) ConsumeFrom(inbox WakeupRemover) { s.inbox = inbox }

// Consume records that the fired task's wake-up was read, then removes it from its
// target's inbox. The record comes first: it is what the audit reads, and a
// removal that did not happen (a crash between the two) is done by calling
// Consume again, which is why a task consumed already is no error.
func (s *Service) Consume(ctx context.Context, id string) (State, error) {
	if s.inbox == nil {
		return State{}, errors.New("this engine has no inbox to consume from")
	}
	state, err := s.update(ctx, id, Consume{})
	if errors.Is(err, ErrConsumed) {
		state, err = Load(ctx, s.store, id)
	}
	if err != nil {
		return State{}, err
	}
	if err := s.inbox.Remove(ctx, state.InboxSeq, state.ID); err != nil {
		return State{}, err
	}
	s.base.Logger.Info("consumed", "task", id, "inbox_seq", state.InboxSeq)
	return state, nil
}
