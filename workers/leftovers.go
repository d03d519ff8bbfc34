package workers

import (
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// RunEnv names the run (its directory's name, <task>-<epoch>) in its command's
// environment, and so in the environment of every process the command starts that
// keeps it: what a command whose shim died leaves running, in its process group
// or in sessions of its own (setsid, a daemon's double fork), is found by it.
const RunEnv = "BGTASK_RUN"

func runMarker(dir string) string { return RunEnv + "=" + filepath.Base(dir) }

// leftoversLimit bounds the hunt for a dead shim's leftovers past the kill grace:
// a process that forks faster than it is killed does not hold the worker.
const leftoversLimit = 5 * time.Second

// stopLeftovers ends what the command of the run in dir left running when its
// shim died: every process with the run's marker in its environment gets TERM,
// and KILL once grace has passed, until none is left; each is signalled once its
// marker is checked again (signalMarked). None is left once two looks in a row
// find none: a command whose shim died as it started it may be in the middle of
// its exec, where the kernel shows no environment yet. Those this process
// adopted (a subreaper: the shim died while this worker watched) are reaped at
// the end.
func stopLeftovers(dir string, grace time.Duration) {
	marker := []byte("\x00" + runMarker(dir) + "\x00")
	start := time.Now()
	termed := map[int]bool{}
	for looks := 0; ; {
		kill := time.Since(start) >= grace
		found := markedProcesses(marker)
		if len(found) == 0 {
			looks++
		} else {
			looks = 0
		}
		if looks == 2 || time.Since(start) >= grace+leftoversLimit {
			reapAdopted() // those that were this process's, adopted when their shim died
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
