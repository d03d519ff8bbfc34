package engine

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/bgtask/bgtask/events"
)

// Redeliver pushes a fired task's wake-up again to push sinks whose push is done:
// the same wake-up, with the same idempotency key (the task id). Sink names the
// one to push again; without it, each that gave up, or, if none did, each one (a
// receiver that acknowledged a push and lost it). The push starts over, retried
// as the sink says (retry_for, max_attempts), until it is delivered or gives up
// again; each Redeliver is one more.
type Redeliver struct {
	Sink *int
}

func (c Redeliver) decide(s State, _ Meta) (events.Payload, uint64, error) {
	if err := s.redeliverable(); err != nil {
		return nil, 0, err
	}
	sinks, field := c.sinks(s), "id"
	if c.Sink != nil {
		if *c.Sink < 0 || *c.Sink >= len(s.Deliveries) {
			return nil, 0, fieldErr("sink", "%d: task %s has push sinks 0 to %d", *c.Sink, s.ID, len(s.Deliveries)-1)
		}
		field = "sink"
	}
	for _, i := range sinks {
		if k := s.Deliveries[i]; !k.Delivered && !k.Failed {
			msg := fmt.Sprintf("task %s: push %d %s; a push is sent again once it was delivered or gave up", s.ID, i, k.progress())
			if len(s.Deliveries) > 1 {
				msg += " (" + s.pushStates() + ")"
			}
			return nil, 0, stateErr(field, "%s", msg)
		}
	}
	return &events.RedeliveryRequested{Sinks: sinks}, s.Epoch, nil
}

// redeliverable says why the task has no push to make again, if it has none.
func (s State) redeliverable() error {
	switch {
	case s.Phase == "":
		return ErrNotFound
	case s.Phase == PhaseArchived:
		return stateErr("id", "task %s is archived: its pushes are no longer made", s.ID)
	case s.Phase == PhaseCancelled:
		return stateErr("id", "task %s was cancelled: it woke nobody, there is nothing to push", s.ID)
	case len(s.Spec.Deliver) == 0:
		return stateErr("id", "task %s has no push sink (deliver): its wake-up goes to its target's inbox alone", s.ID)
	case s.Phase != PhaseFired:
		return stateErr("id", "task %s is %s: its pushes are made once it fires", s.ID, s.Phase)
	case s.Quiet:
		return stateErr("id", "task %s ended %s, which its wake_on does not name: nothing was pushed", s.ID, s.Status)
	case s.Consumed:
		return stateErr("id", "task %s's wake-up was consumed by a wait: it is not pushed again", s.ID)
	}
	return nil
}

// sinks are the push sinks c asks for again.
func (c Redeliver) sinks(s State) []int {
	if c.Sink != nil {
		return []int{*c.Sink}
	}
	var failed, all []int
	for i, k := range s.Deliveries {
		if k.Failed {
			failed = append(failed, i)
		}
		all = append(all, i)
	}
	if len(failed) > 0 {
		return failed
	}
	return all
}

// progress says where a push sink is, for an error.
func (k SinkState) progress() string {
	switch {
	case k.Delivered:
		return "was delivered"
	case k.Failed:
		return "gave up"
	case k.Skipped:
		return "was not made (its wake-up was consumed)"
	case k.GivingUp:
		return "is giving up"
	case k.Claim != nil:
		return "is in flight"
	case k.RetryAt != nil:
		return "is retried, next at " + k.RetryAt.UTC().Format(time.RFC3339)
	case k.Redelivering:
		return "is being sent again"
	case k.Attempts == 0:
		return "is not made yet"
	}
	return "is due"
}

// pushStates says where each push sink is: "push 0 was delivered, push 1 gave up".
func (s State) pushStates() string {
	out := make([]string, len(s.Deliveries))
	for i, k := range s.Deliveries {
		out[i] = fmt.Sprintf("push %d %s", i, k.progress())
	}
	return strings.Join(out, ", ")
}

// redeliveryRequested starts the push of each sink named, which was delivered or
// gave up, over: due at once, with a retry window and max_attempts of its own.
func (s State) redeliveryRequested(p *events.RedeliveryRequested) (State, error) {
	if s.Phase != PhaseFired || s.Quiet || s.Consumed || len(p.Sinks) == 0 {
		return s, ErrWrongPhase
	}
	s.Deliveries = append([]SinkState(nil), s.Deliveries...) // states are values: never share
	for _, i := range p.Sinks {
		if i < 0 || i >= len(s.Deliveries) || !s.Deliveries[i].Delivered && !s.Deliveries[i].Failed {
			return s, fmt.Errorf("%w: sink %d of task %s is not done", ErrWrongPhase, i, s.ID)
		}
		k := &s.Deliveries[i]
		k.Delivered, k.Failed, k.Redelivering = false, false, true
		k.Redeliveries++
		k.EarlierAttempts, k.FirstAttemptAt = k.Attempts, nil
	}
	return s, nil
}

// Redeliver makes pushes of a fired task once more (the command Redeliver).
func (s *Service) Redeliver(ctx context.Context, id string, sink *int) (State, error) {
	state, err := s.update(ctx, id, Redeliver{Sink: sink})
	if err == nil {
		s.base.Logger.Info("redelivery requested", "task", id, "sinks", state.redelivering())
	}
	return state, err
}

// redelivering are the sinks being sent again.
func (s State) redelivering() []int {
	var out []int
	for i, k := range s.Deliveries {
		if k.Redelivering {
			out = append(out, i)
		}
	}
	return out
}
