package workers

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// RunEnv names the run (its directory's name, <task>-<epoch>) in its command's
// environment, and so in the environment of every process the command starts that
// keeps it: a shim that dies takes only the command with it (its parent-death
// signal), and what the command started in sessions of its own (setsid, a daemon's
// double fork) goes on with parent 1. The worker finds those processes by it.
const RunEnv = "BGTASK_RUN"

func runMarker(dir string) string { return RunEnv + "=" + filepath.Base(dir) }

// leftoversLimit bounds the hunt for a dead shim's leftovers past the kill grace:
// a process that forks faster than it is killed does not hold the worker.
const leftoversLimit = 5 * time.Second

// stopLeftovers ends what the command of the run in dir left running when its
// shim died: every process with the run's marker in its environment gets TERM,
// and KILL once grace has passed, until none is left. They are not this process's
// children (init has them), so nothing here reaps anything; each is signalled
// through a pidfd opened before its marker is checked again, so a PID that names
// another process by then is never signalled.
func stopLeftovers(dir string, grace time.Duration) {
	marker := []byte("\x00" + runMarker(dir) + "\x00")
	start := time.Now()
	termed := map[int]bool{}
	for {
		kill := time.Since(start) >= grace
		found := markedProcesses(marker)
		if len(found) == 0 || time.Since(start) >= grace+leftoversLimit {
			return
		}
		for _, pid := range found {
			switch {
			case kill:
				signalMarked(pid, marker, unix.SIGKILL)
			case !termed[pid]:
				signalMarked(pid, marker, unix.SIGTERM)
				termed[pid] = true
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// markedProcesses lists the processes, besides this one, whose environment holds
// marker (NUL-framed: "\x00NAME=VALUE\x00"). An ended process (a zombie) has no
// environment left.
func markedProcesses(marker []byte) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		if hasMarker(pid, marker) {
			out = append(out, pid)
		}
	}
	return out
}

func hasMarker(pid int, marker []byte) bool {
	env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	return err == nil && (bytes.HasPrefix(env, marker[1:]) || bytes.Contains(env, marker))
}

// signalMarked signals pid if it still is a process with marker.
func signalMarked(pid int, marker []byte, sig unix.Signal) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return // ended
	}
	defer unix.Close(fd)
	// The pidfd names one process for good: the one that has the PID now.
	if hasMarker(pid, marker) {
		_ = unix.PidfdSendSignal(fd, sig, nil, 0)
	}
}
