package workers

import (
	"os"
	"time"

	"github.com/bgtask/bgtask/engine"
)

// StartRunAndDie does what a worker does to start a task's command in runDir, up
// to handing it to its shim, and then nothing more, as a worker killed at that
// moment: the run is sent to the shim (started through shim), holding the run's
// start lock, when it returns; the shim records the command's start later, or
// never. launched receives the result of the shim's first stage.
func StartRunAndDie(shim []string, runDir, taskID string, epoch uint64, spec engine.Spec) (launched <-chan error, err error) {
	if err := writeIntent(runDir); err != nil {
		return nil, err
	}
	run, err := prepareRun(runDir, shimRun{TaskID: taskID, Epoch: epoch, Env: os.Environ(), Dir: spec.Cwd, KillGrace: time.Second}, spec)
	if err != nil {
		return nil, err
	}
	s, err := startShim(shim, runDir, run)
	if err != nil {
		return nil, err
	}
	sent := s.send()
	done := make(chan error, 1)
	go func() { done <- s.handed(sent) }()
	return done, nil
}

// ShimAlive is shimAlive: whether a shim holds the start lock of the run in dir.
var ShimAlive = shimAlive

// launchShim starts the shim of a prepared run and hands it the run at once.
func launchShim(shimCmd []string, dir string, run shimRun) error {
	s, err := startShim(shimCmd, dir, run)
	if err != nil {
		return err
	}
	return s.hand()
}

// SpareShims is the number of idle shims w keeps for its next runs.
func SpareShims(w *Worker) int {
	w.spares.mu.Lock()
	defer w.spares.mu.Unlock()
	return len(w.spares.idle)
}

// BusyShims is the number of shims w waits on to be idle once their runs end.
func BusyShims(w *Worker) int {
	w.spares.mu.Lock()
	defer w.spares.mu.Unlock()
	return len(w.spares.busy)
}

// CanAdopt: a worker here learns how the command of a dead shim ends.
const CanAdopt = canAdopt
