package workers

import (
	"bytes"
	"os"

	"golang.org/x/sys/unix"
)

// markedProcesses lists the processes of this user, besides this one, whose
// environment holds marker (NUL-framed: "\x00NAME=VALUE\x00"). macOS has no
// /proc: the list is kern.proc.uid, an environment is in kern.procargs2.
func markedProcesses(marker []byte) []int {
	procs, err := unix.SysctlKinfoProcSlice("kern.proc.uid", os.Getuid())
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var out []int
	for _, p := range procs {
		if pid := int(p.Proc.P_pid); pid != self && pid > 0 && hasMarker(pid, marker) {
			out = append(out, pid)
		}
	}
	return out
}

// hasMarker looks for marker in pid's kern.procargs2: its arguments, then its
// environment, each NUL-terminated. An ended process (a zombie) has none.
func hasMarker(pid int, marker []byte) bool {
	args, err := unix.SysctlRaw("kern.procargs2", pid)
	return err == nil && bytes.Contains(args, marker)
}

// signalMarked signals pid if it still is a process with marker. macOS has no
// pidfd: the check and the signal are two calls, and a PID that the process gave
// up in between and another process took would be signalled.
func signalMarked(pid int, marker []byte, sig unix.Signal) {
	if hasMarker(pid, marker) {
		_ = unix.Kill(pid, sig)
	}
}
