package engine

import (
	"context"
	"errors"
	"sync"
)

// Component is the lifecycle of every long-running part of an engine: here the
// dispatcher, timers, dependencies, leases, pusher, archiver, scheduler and
// schedule runner; elsewhere the projector, the watch of the targets' states and
// the API server. One shape lets
// the composition root (engine/node) start them in order and stop them in
// reverse without knowing each part's habits, and lets a test of any part stop it
// however far it got.
//
// Start does what the part needs before it can serve (a replay, a first read of
// the fleet or of the targets), returns once it can, and leaves its work running
// in goroutines of its own. ctx bounds the start and lends its values; the work
// goes on until Stop, not until ctx ends, so that a shutdown happens in the order
// the wiring chose rather than all at once. A Start that fails leaves nothing
// running. A part is started once: a second Start fails (with ErrStarted, but
// for the watch of the targets' states, whose package is below this one).
//
// Stop ends the work and returns once every goroutine the part started has
// returned. It is safe to call before Start (it does nothing then) and more than
// once.
type Component interface {
	Start(ctx context.Context) error
	Stop()
}

// ErrStarted is the error of a second Start of a Component.
var ErrStarted = errors.New("started already: a part is started once")

// lifecycle is what a Component of this package keeps to follow the contract:
// Start calls begin and runs its goroutines with goroutine; Stop calls end.
type lifecycle struct {
	mu      sync.Mutex
	started bool
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// begin marks the part started and returns the context its work runs under,
// cancelled by end alone.
func (l *lifecycle) begin(ctx context.Context) (context.Context, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.started {
		return nil, ErrStarted
	}
	l.started = true
	ctx, l.cancel = context.WithCancel(context.WithoutCancel(ctx))
	return ctx, nil
}

// goroutine runs f as part of the work end waits for.
func (l *lifecycle) goroutine(f func()) { l.wg.Go(f) }

// end cancels the work and waits for its goroutines.
func (l *lifecycle) end() {
	l.mu.Lock()
	cancel := l.cancel
	l.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	l.wg.Wait()
}
