package testsignal_test

import (
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/bgtask/bgtask/internal/testsignal"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// failures is a TB that keeps what a signal reports, for the failures a test
// of this package provokes.
type failures struct {
	testing.TB
	errors, fatals []string
}

func (f *failures) Errorf(format string, args ...any) {
	f.errors = append(f.errors, fmt.Sprintf(format, args...))
}
func (f *failures) Fatalf(format string, args ...any) {
	f.fatals = append(f.fatals, fmt.Sprintf(format, args...))
}

// A signal no test set up, as in production, takes a value and keeps nothing.
func TestTheZeroSignalDoesNothing(t *testing.T) {
	var s testsignal.Signal[int]
	for i := range 1000 {
		s.Signal(i)
	}
}

// A test waits for the value it is after, from another goroutine, skipping the
// others.
func TestWaitForSkipsToTheValueAccepted(t *testing.T) {
	var s testsignal.Signal[int]
	s.Init(t)
	go func() {
		for i := range 10 {
			s.Signal(i)
		}
	}()
	if got := s.WaitFor(10*time.Second, "a value over 6", func(v int) bool { return v > 6 }); got != 7 {
		t.Fatalf("WaitFor = %d, want 7", got)
	}
	if got := s.WaitFor(10*time.Second, "the next value", nil); got != 8 {
		t.Fatalf("WaitFor(nil) = %d, want 8", got)
	}
}

// A wait for a value that does not come fails the test, saying what it waited for.
func TestWaitForFailsTheTestAfterItsTime(t *testing.T) {
	f := &failures{TB: t}
	var s testsignal.Signal[int]
	s.Init(f)
	s.Signal(1)
	s.WaitFor(50*time.Millisecond, "a two", func(v int) bool { return v == 2 })
	if len(f.fatals) != 1 || f.fatals[0] != "not a two within 50ms" {
		t.Fatalf("failures %q", f.fatals)
	}
}

// A part that signals more than the test waits for fails the test, and is not
// held up.
func TestASignalNoOneWaitsForFailsTheTest(t *testing.T) {
	f := &failures{TB: t}
	var s testsignal.Signal[int]
	s.Init(f)
	for i := range 1000 {
		s.Signal(i)
	}
	if len(f.errors) == 0 {
		t.Fatal("a full signal did not fail the test")
	}
}
