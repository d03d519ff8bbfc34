package workers

import (
	"encoding/json"
	"os"
	"path/filepath"
	"time"

	"github.com/bgtask/bgtask/workers/shim"
)

// runFile is the worker's record of a run, in its run directory beside the shim's
// files (package shim): what it started, and where the task's log stood.
const runFile = "run.json"

// shimRun is run.json.
type shimRun struct {
	TaskID string   `json:"task_id"`
	Epoch  uint64   `json:"epoch"`
	Path   string   `json:"path"`
	Args   []string `json:"args"`
	Env    []string `json:"-"` // in the shim's environ file
	Dir    string   `json:"dir"`
	// LogOffsets is where the task's log streams stood when this run started.
	LogOffsets offsets       `json:"log_offsets"`
	Deadline   time.Time     `json:"deadline,omitempty"`
	StallAfter time.Duration `json:"stall_after,omitempty"`
	KillGrace  time.Duration `json:"kill_grace,omitempty"`
}

// shimArgs are the arguments of the shim that starts run in dir.
func (r shimRun) shimArgs(dir string) []string {
	run := shim.Run{
		Dir: dir, Cwd: r.Dir, Path: r.Path, Args: r.Args,
		StallAfter: int64(r.StallAfter), KillGrace: int64(r.KillGrace),
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

// DefaultShim is how a worker starts shims: bgtask-shim from the directory of its
// own binary, a small program, or else this binary in shim mode, which costs every
// running task the memory of all of bgtask.
func DefaultShim() []string {
	if exe, err := os.Executable(); err == nil {
		if light, ok := LightShim(exe); ok {
			return []string{light}
		}
	}
	// /proc/self/exe is this very binary, even if an upgrade replaced its file.
	return []string{"/proc/self/exe", "shim"}
}

// LightShim is bgtask-shim beside the bgtask binary exe, if it is there.
func LightShim(exe string) (string, bool) {
	light := filepath.Join(filepath.Dir(exe), "bgtask-shim")
	info, err := os.Stat(light)
	return light, err == nil && info.Mode().IsRegular() && info.Mode()&0o111 != 0
}

func readJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, v)
}

// writeJSONAtomic writes v so that a reader sees all of it or none, durably: the
// worker's records of a run must outlive a crash of the host, or a task it took
// would be running in the log with no trace on disk.
func writeJSONAtomic(path string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return shim.WriteDurable(path, data)
}
