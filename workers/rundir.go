package workers

// A run's directory, STATE/runs/<task>-<epoch>, is where a worker and its shim
// meet for one run of a task, and what a restarted worker finds the run again by. Who
// writes each file, when, and what a reader may take from it:
//
//	(the directory)  the worker, before it appends the spawn (writeIntent), its
//	                 name made durable: no task is taken without a trace on
//	                 disk. Its name says the task and epoch (intentOf). It is
//	                 also the run's start lock: the worker locks it (flock) and
//	                 sends it to the shim with the run (shim.receiveRun); the
//	                 shim holds it until the run is over, so a lock found free
//	                 means no shim works on the run or ever will (shimAlive).
//	stdout, stderr   made by the worker (prepareRun); the command appends
//	                 to them directly. The worker reads them into the tail, the
//	                 log and the completion rule, and frees the blocks no restart
//	                 reads again (boundOutput); the shim frees the start of each
//	                 past its last shim.OutputKeepBytes, read or not (package
//	                 shim's bound.go): a reader may find a hole where old output
//	                 was, and skips it (freedAhead, resumeAt).
//	run.json         shimRun, by the worker, whole but not durable, last (while
//	                 the spawn is appended, for a task's first run): a run without
//	                 it, in the boot of the host it was made in (bootFile), never
//	                 had its shim started (errShimNotStarted). It holds the
//	                 command's environment, which the worker hands the shim on its
//	                 stdin (shim.EnvironFD) and a result command runs in.
//	exit.json.tmp    the shim, just before it starts the command: the exit
//	                 file's blocks, so that a full disk loses no exit. Renamed
//	                 to exit.json at the end. Found with no pid.json and the
//	                 lock free: the shim died starting the command, which may
//	                 run unrecorded (errShimDied).
//	pid.json         shimPIDs, by the shim, once the command started, whole (by
//	                 rename) but not durable: after a crash of the host nothing it
//	                 names is alive. Its PIDs come with start times, so a reused
//	                 PID is never signalled.
//	exit.json        shimExit, by the shim, once it reaped the command (or the
//	                 start failed), by rename: a reader sees all of it or none.
//	                 Durable (fsync after the rename) if no worker watched the
//	                 run (none held the state directory's lock, shim.WorkerLock),
//	                 or once a worker could not record the exit at once
//	                 (shim.KeepExit); a crash of the host may leave one that
//	                 does not decode, which counts as none. The shim's end
//	                 without it: the worker writes it, where it learns how the
//	                 command ended (adoptCommand), or the run is lost.
//	stop.json        stopDecision, by the worker, atomically and durably before
//	                 it stops a command for a rule or leaves it running after a
//	                 match: a worker killed meanwhile finishes the same decision
//	                 (decisionOf).
//
// Only the directory's name, the exit file while no worker records it, and
// stop.json are durable: after a crash of the host no command is running, and
// what the log says decides. A worker that starts in a later boot of the host
// than the one its runs were made in (bootFile) loses each run it finds with no
// exit on disk, whatever else the directory holds or lacks: its command may
// have started before the host went down, and must not run a second time.
//
// The shim answers each run on its stdin once the start is recorded (pid.json, or
// a start error in exit.json), or with why nothing could be (shims.hand). A worker removes
// the directory once the run's end is in the log (a run watched to its end through
// the sweeper, sweepDelay later), or, at its next start, when the log says the run
// is not its own (reattach), which removes then too whatever else STATE/runs holds
// that no worker made for a run (intentOf). The shim's side of all this is package
// shim.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/proc"
	"github.com/bgtask/bgtask/workers/shim"
)

// runDir is where one run of a task keeps its files.
func (w *Worker) runDir(taskID string, epoch uint64) string {
	return filepath.Join(w.cfg.StateDir, "runs", taskID+"-"+strconv.FormatUint(epoch, 10))
}

// writeIntent makes the directory of a run, its intent: made (and made durable)
// before the spawn is appended, so no task can be taken without a trace on disk,
// and named for the task and the epoch of the run (runDir). A directory with
// nothing in it stands for an intent whose spawn may not be in the log, which
// reattach settles like any other (it stops what is not the worker's). It fails
// with fs.ErrExist if the run's directory exists: then this worker holds the run
// already (a redelivered armed event must not clobber it).
func writeIntent(dir string) error {
	runs := filepath.Dir(dir)
	if err := os.MkdirAll(runs, 0o700); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	// Its name in runs on disk before the spawn is all a restart after a crash of
	// the host needs: the mkdir is one change of runs, and what the directory
	// will hold is not durable anyway.
	return shim.SyncDir(runs)
}

// intentOf reads which task and epoch a run directory is for, from its name; ok
// is false for a directory no worker made for a run.
func intentOf(dir string) (sr shimRun, ok bool) {
	name := filepath.Base(dir)
	i := strings.LastIndexByte(name, '-')
	if i < 0 {
		return sr, false
	}
	epoch, err := strconv.ParseUint(name[i+1:], 10, 64)
	if err != nil || !events.ValidToken(name[:i]) {
		return sr, false
	}
	return shimRun{TaskID: name[:i], Epoch: epoch}, true
}

// runFile is the worker's record of a run, in its run directory beside the shim's
// files (package shim): what it started, and where the task's log stood.
const runFile = "run.json"

// shimRun is run.json.
type shimRun struct {
	TaskID string   `json:"task_id"`
	Epoch  uint64   `json:"epoch"`
	Path   string   `json:"path"`
	Args   []string `json:"args"`
	Env    []string `json:"env"` // the command's: it may hold secrets (0600, in a 0700 directory)
	Dir    string   `json:"dir"`
	// LogOffsets is where the task's log streams stood when this run started.
	LogOffsets offsets       `json:"log_offsets"`
	Deadline   time.Time     `json:"deadline,omitempty"`
	StallAfter time.Duration `json:"stall_after,omitempty"`
	KillGrace  time.Duration `json:"kill_grace,omitempty"`
}

// shimArgs are the arguments of the shim that starts run in dir, with envBytes of
// environment on its standard input.
func (r shimRun) shimArgs(dir string, envBytes int) []string {
	run := shim.Run{
		Dir: dir, Cwd: r.Dir, Path: r.Path, Args: r.Args,
		StallAfter: int64(r.StallAfter), KillGrace: int64(r.KillGrace), EnvBytes: int64(envBytes),
	}
	if !r.Deadline.IsZero() {
		run.Deadline = r.Deadline.UnixNano()
	}
	return run.ShimArgs()
}

// shimPIDs is the shim's pid.json.
type shimPIDs struct {
	Shim    shim.ProcRef `json:"shim"`
	Command shim.ProcRef `json:"command"`
	Started time.Time    `json:"started_at"`
}

// shimExit is the shim's exit.json: how the command ended, or why it could not start.
type shimExit struct {
	ExitCode   int       `json:"exit_code"`
	Signal     string    `json:"signal,omitempty"`
	StoppedBy  string    `json:"stopped_by,omitempty"` // shim.StoppedByDeadline or shim.StoppedByStall
	StartedAt  time.Time `json:"started_at"`
	EndedAt    time.Time `json:"ended_at"`
	StartError string    `json:"start_error,omitempty"`
}

// decisionFile keeps what the worker decided to do with a run before it acted.
const decisionFile = "stop.json"

// stopDecision is what a worker decided to do with a run, written before it acts:
// stop the command for a rule (a match, the deadline, a stall), or leave it running
// after a match. A worker that dies before the end is recorded (during the kill
// grace, say) finishes the same decision when it starts again, rather than watch
// again a command whose matched line is behind where the log stands.
type stopDecision struct {
	StoppedBy   string  `json:"stopped_by"`
	MatchedLine *string `json:"matched_line,omitempty"`
	KeepRunning bool    `json:"keep_running,omitempty"`
}

func readJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, v)
}

// writeJSONAtomic writes v so that a reader sees all of it or none, durably: a
// decision, once taken, must outlive a crash of the host.
func writeJSONAtomic(path string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return shim.WriteDurable(path, data)
}

// bootFile, in a worker's state directory, names the boot of the host
// (proc.Boot) the runs in it were made in: the worker writes it, durably, at
// each start, after it settled the runs an earlier boot left, and before it
// takes a run.
const bootFile = "boot"

// hostBoot names this boot of the host, or is empty where it cannot be read.
func hostBoot() string {
	boot, _ := proc.Boot()
	return boot
}

// runsBoot is the boot of the host the runs in stateDir were made in; empty if
// not known.
func runsBoot(stateDir string) string {
	data, _ := os.ReadFile(filepath.Join(stateDir, bootFile))
	return strings.TrimSpace(string(data))
}
