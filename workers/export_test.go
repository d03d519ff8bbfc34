package workers

import (
	"log/slog"
	"os"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/workers/shim"
)

// StartRunAndDie does what a worker does to start a task's command in runDir, up
// to handing it to its shim, and then nothing more, as a worker killed at that
// moment: the run is sent to a shim (started through shim), holding the run's
// start lock, when it returns; the shim records the command's start later, or
// never. launched receives the shim's answer.
func StartRunAndDie(shimCmd []string, runDir, taskID string, epoch uint64, spec engine.Spec) (launched <-chan error, err error) {
	if err := writeIntent(runDir); err != nil {
		return nil, err
	}
	run, err := prepareRun(runDir, shimRun{TaskID: taskID, Epoch: epoch, Env: os.Environ(), Dir: spec.Cwd, KillGrace: time.Second}, spec)
	if err != nil {
		return nil, err
	}
	s := &shims{cmd: shimCmd, log: slog.New(slog.DiscardHandler)}
	sh, err := s.shim()
	if err != nil {
		return nil, err
	}
	env := shim.JoinEnviron(run.Env)
	answer, err := sh.post(runDir, run.shimArgs(runDir, len(env)), env)
	if err != nil {
		s.close()
		return nil, err
	}
	done := make(chan error, 1)
	go func() {
		done <- <-answer
		s.close() // the worker's end: the shim ends once its run is over
	}()
	return done, nil
}

// ShimAlive is shimAlive: whether a shim holds the start lock of the run in dir.
var ShimAlive = shimAlive

// CanAdopt: a worker here learns how the command of a dead shim ends.
const CanAdopt = canAdopt

// LetGoOfShim has w let go of its shim, as it does when it stops: the shim ends
// once its runs are over, and w starts another for its next run.
func LetGoOfShim(w *Worker) {
	w.shims.mu.Lock()
	defer w.shims.mu.Unlock()
	if w.shims.live != nil {
		w.shims.live.letGo()
	}
}
