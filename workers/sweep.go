package workers

import (
	"os"
	"sync"
	"time"
)

// sweepDelay is how long the directory of a run watched to its end stays before it
// is removed. Removing a run's directory unlinks its files and the directory,
// metadata that the file system's journal commits with the next fsync on the disk:
// removed at once, they would ride on the fsyncs of the very wake-up that the end
// sets off (completion-persisted, the inbox) and delay it. A tenth of a second is
// past that wake-up, and batches the runs that end meanwhile into one commit.
const sweepDelay = 100 * time.Millisecond

// sweeper removes the directories of finished runs, a while after their end and
// together. A worker that dies meanwhile finds them at its next start, as it finds
// a run whose end it recorded just before it died: the log says the run is no
// longer its own, and the directory goes.
type sweeper struct {
	delay    time.Duration
	mu       sync.Mutex
	dirs     []string
	timer    *time.Timer // the sweep to come, if any
	flushed  bool        // by a stopping worker: what comes later goes at once
	sweeping sync.WaitGroup
}

// remove has dir removed once the delay has passed.
func (s *sweeper) remove(dir string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.flushed {
		_ = os.RemoveAll(dir)
		return
	}
	s.dirs = append(s.dirs, dir)
	if s.timer == nil {
		s.sweeping.Add(1)
		s.timer = time.AfterFunc(s.delay, func() {
			defer s.sweeping.Done()
			s.sweep()
		})
	}
}

func (s *sweeper) sweep() {
	s.mu.Lock()
	dirs := s.dirs
	s.dirs, s.timer = nil, nil
	s.mu.Unlock()
	for _, dir := range dirs {
		_ = os.RemoveAll(dir)
	}
}

// flush removes every directory still waiting, now, and returns once no sweep is
// under way; a directory given later is removed at once. A stopped worker leaves
// no finished run behind.
func (s *sweeper) flush() {
	s.mu.Lock()
	s.flushed = true
	if s.timer != nil && s.timer.Stop() {
		s.sweeping.Done() // it will not run
	}
	s.mu.Unlock()
	s.sweep()
	s.sweeping.Wait()
}
