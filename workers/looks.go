package workers

import "sync"

// looks runs a look at a run's files on a goroutine of its own each time it is
// called for (a file changed, a process ended, a poll fell due), one look at a
// time: a call while a look runs has it run once more after. Between looks no
// goroutine waits, so a quiet run costs the worker no goroutine stack of its
// own for its output and none for its exit (a few KiB each, with a thousand
// sleeping tasks a worker's largest cost).
type looks struct {
	mu      sync.Mutex
	look    func() (again bool) // false once there is nothing more to look for; nil before start
	running bool                // a look's goroutine runs
	called  bool                // called for while it ran: it looks once more
	over    bool                // no look more: look said so, or stop
	done    sync.WaitGroup
}

// call has look run: now on a goroutine of its own, or after the look that runs.
// It never blocks: the notifier calls it with its watches locked.
func (l *looks) call() {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.over:
	case l.running || l.look == nil: // a look runs, or none may yet
		l.called = true
	default:
		l.running = true
		l.done.Add(1)
		go l.run()
	}
}

// start has look run now, and each time it is called for from now on: calls
// before start wait for it, the watches that call being made before the first
// look.
func (l *looks) start(look func() (again bool)) {
	l.mu.Lock()
	l.look, l.called = look, false
	l.mu.Unlock()
	l.call()
}

func (l *looks) run() {
	defer l.done.Done()
	for {
		again := l.look()
		l.mu.Lock()
		l.over = l.over || !again
		if l.over || !l.called {
			l.running = false
			l.mu.Unlock()
			return
		}
		l.called = false
		l.mu.Unlock()
	}
}

// stop starts no look more, and returns once none runs: a look called for just
// before it may still run before it returns.
func (l *looks) stop() {
	l.mu.Lock()
	l.over = true
	l.mu.Unlock()
	l.done.Wait()
}
