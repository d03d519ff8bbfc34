package engine

import (
	"regexp"
	"strconv"
	"sync"

	"github.com/bgtask/bgtask/events"
)

// Process names a process bgtask did not start, which a task watches (bgtask
// add --pid): it fires once when the process ends. A PID alone may name another
// process later, so the process is named by its start time and the boot of its
// host too (package internal/proc reads them); the task is placed on that host.
type Process struct {
	PID int `json:"pid"`
	// Start is the process's start time in clock ticks after boot (Linux: field
	// 22 of /proc/PID/stat).
	Start uint64 `json:"start"`
	// Boot names the boot of the host it runs in (Linux:
	// /proc/sys/kernel/random/boot_id).
	Boot string `json:"boot"`
}

// bootIDPattern is compiled at its first use, as labelKey is.
var bootIDPattern = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9-]{1,64}$`) })

// validateProcess checks the spec of a task that watches a process: its
// identity, the host it runs on, and nothing that only a command has.
func (s *Spec) validateProcess() error {
	p := s.Process
	if p == nil {
		return nil
	}
	switch {
	case p.PID <= 0:
		return fieldErr("process.pid", "%d: want the id of a running process, above 0", p.PID)
	case p.Start == 0:
		return fieldErr("process.start", "required: the process's start time in clock ticks after boot (Linux: field 22 of /proc/PID/stat), so that a reused PID is not taken for it")
	case !bootIDPattern().MatchString(p.Boot):
		return fieldErr("process.boot", "%q: want the boot id of the process's host (Linux: /proc/sys/kernel/random/boot_id)", p.Boot)
	case s.Placement == nil || s.Placement.Labels[HostLabel] == "":
		return fieldErr("placement.labels.host", "required with process: the host the process runs on, the only one whose worker can watch it")
	}
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"command", s.Command != ""}, {"argv", len(s.Argv) > 0}, {"start_at", s.StartAt != ""},
		{"external", s.External}, {"join", s.Join != nil}, {"cwd", s.Cwd != ""}, {"env", len(s.Env) > 0}, {"environment", s.Environment != ""},
		{"completion", s.Completion != nil}, {"keep_running", s.KeepRunning}, {"stall_after", s.StallAfter != ""},
		{"on_stall", s.OnStall != ""}, {"max_respawns", s.MaxRespawns != nil}, {"result", s.Result != nil},
		{"max_result_bytes", s.MaxResultBytes != 0}, {"retry", s.Retry != nil}, {"after", len(s.After) > 0},
		{"after_policy", s.AfterPolicy != ""}, {"probe_every", s.ProbeEvery != ""}, {"notify", s.Notify != nil},
	} {
		if f.set {
			return fieldErr(f.name, "not with process: the task watches a process bgtask did not start, it runs nothing")
		}
	}
	return nil
}

// ReasonProcessEnded is the reason of a watched process's end: bgtask did not
// start it, so the exit status is not bgtask's to read.
func ReasonProcessEnded(pid int) string {
	return "process " + strconv.Itoa(pid) + " ended; its exit status cannot be read: bgtask did not start it, and only a process's parent can read how it exited"
}

// processPrompt is the prompt of a process watch whose spec has none.
func processPrompt(w events.Wakeup, vars map[string]string) []part {
	parts := []part{lit("Background task %s %s", w.ID, w.Status)}
	if vars["duration"] != "" {
		parts = append(parts, lit(" after watching for %s", vars["duration"]))
	}
	parts = append(parts, lit(".\nWatched: "), placeholder("command"), lit("\n"))
	if w.Reason != "" {
		parts = append(parts, lit("Reason: "), placeholder("reason"), lit("\n"))
	}
	return parts
}
