package workers

import (
	"bytes"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

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

// signalMarked signals pid if it still is a process with marker. It signals
// through a pidfd opened before the marker is checked again, so a PID that names
// another process by then is never signalled.
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
