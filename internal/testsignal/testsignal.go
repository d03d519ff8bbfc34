// Package testsignal lets a test wait for what a part of bgtask did in the
// background (a timer fired, a pass over the schedules ended, a push was
// planned) instead of polling for its effects or sleeping in the hope that it
// happened.
//
// A part keeps a Signal for each such thing in a TestSignals field and calls
// Signal when it happens. The zero Signal does nothing, so in production a
// signal costs one nil check. A test calls Init before it starts the part, and
// then WaitFor. (River's rivershared/testsignal.)
package testsignal

import "time"

// TB is what a signal needs of a test (testing.TB has it): a part that signals
// does not import package testing.
type TB interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// capacity is how many values a signal keeps that its test has not waited for
// yet. One more is a part that signals far more often than the test expects: it
// fails the test rather than block the part.
const capacity = 200

// Signal carries values of type T from a part to its test.
type Signal[T any] struct {
	c  chan T
	tb TB
}

// Init makes s carry values to tb. Call it before the part that signals starts.
func (s *Signal[T]) Init(tb TB) {
	s.c = make(chan T, capacity)
	s.tb = tb
}

// Signal hands v to the test, if a test initialised s; it never blocks.
func (s *Signal[T]) Signal(v T) {
	if s.c == nil {
		return
	}
	select {
	case s.c <- v:
	default:
		s.tb.Errorf("test signal: %d values not waited for; %v not kept", capacity, v)
	}
}

// WaitFor returns the first value signalled that ok accepts, skipping the
// others, or fails the test if none comes within the time given. A nil ok
// accepts the next value.
func (s *Signal[T]) WaitFor(within time.Duration, what string, ok func(T) bool) T {
	s.tb.Helper()
	if s.c == nil {
		panic("testsignal: WaitFor on a signal that Init did not set up")
	}
	timeout := time.NewTimer(within)
	defer timeout.Stop()
	for {
		select {
		case v := <-s.c:
			if ok == nil || ok(v) {
				return v
			}
		case <-timeout.C:
			s.tb.Fatalf("not %s within %s", what, within)
			var zero T
			return zero
		}
	}
}
