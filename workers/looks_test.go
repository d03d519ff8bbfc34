package workers

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bgtask/bgtask/internal/testkit"
)

// Calls while a look runs are one more look after it, never one beside it; no
// goroutine is left once the looks are over.
func TestLooksRunOneAtATimeAndOnceMoreForCallsMeanwhile(t *testing.T) {
	goroutines := runtime.NumGoroutine()
	var l looks
	var running, most, done atomic.Int32
	inFirst, release := make(chan struct{}), make(chan struct{})
	l.call() // before start: waits for it
	l.start(func() bool {
		n := running.Add(1)
		defer running.Add(-1)
		if n > most.Load() {
			most.Store(n)
		}
		if done.Add(1) == 1 {
			close(inFirst)
			<-release
		}
		return true
	})
	<-inFirst
	for range 10 {
		l.call()
	}
	close(release)
	testkit.Eventually(t, 10*time.Second, "the look called for meanwhile, and no goroutine left", func() bool {
		return done.Load() == 2 && runtime.NumGoroutine() <= goroutines
	})
	if done.Load() != 2 || most.Load() != 1 {
		t.Fatalf("%d looks, %d at once at most; want the first and one more for the ten calls meanwhile, one at a time", done.Load(), most.Load())
	}
	l.call()
	testkit.Eventually(t, 10*time.Second, "a look for a call after", func() bool { return done.Load() == 3 })
}

// A look that says there is nothing more to look for ends the looks, and stop
// waits for the look that runs.
func TestLooksEndWhenALookSaysSoAndStopWaitsForTheLook(t *testing.T) {
	var l looks
	var done atomic.Int32
	l.start(func() bool { done.Add(1); return false })
	testkit.Eventually(t, 10*time.Second, "the first look", func() bool { return done.Load() == 1 })
	l.stop()
	l.call()
	l.stop()
	if done.Load() != 1 {
		t.Fatalf("%d looks after the one that said it was over, want none", done.Load()-1)
	}

	var m looks
	inLook, release := make(chan struct{}), make(chan struct{})
	var finished atomic.Bool
	m.start(func() bool {
		close(inLook)
		<-release
		finished.Store(true)
		return true
	})
	<-inLook
	stoppedAfterLook := make(chan bool, 1)
	go func() { m.stop(); stoppedAfterLook <- finished.Load() }()
	testkit.Eventually(t, 10*time.Second, "stop called", func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.over
	})
	close(release)
	if !<-stoppedAfterLook {
		t.Fatal("stop returned while a look ran")
	}
}
