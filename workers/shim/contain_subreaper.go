//go:build linux && !bgtask_portable

package shim

import "syscall"

// Containment with a subreaper: Linux's. The tag bgtask_portable selects the
// containment by process group instead (contain_group.go), which macOS has.

// adoptOrphans makes the shim its command's subreaper: orphans of the command
// become the shim's children, not init's, so the whole tree stays under it.
func adoptOrphans() {
	_, _, _ = syscall.RawSyscall6(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0, 0, 0, 0)
}

// commandAttr puts the command in its own process group. It does not die with
// the shim: a shim killed leaves its command to the worker that started the shim,
// a subreaper, which learns how it ends (workers.adoptCommand).
func commandAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// stopLeftovers ends what the command (process group pgid) left running.
func stopLeftovers(pgid int, grace int64) { stopOrphans(grace) }

// stopOrphans ends what the command left running when it exited: processes it
// started in the background, in its process group or in a session of their own
// (setsid, a daemon's double fork). Their parents have ended, so they are the
// shim's children now (it is their subreaper). Each gets TERM, and KILL once grace
// (nanoseconds) has passed; their own children come to the shim in turn when they
// end.
func stopOrphans(grace int64) {
	self := syscall.Getpid()
	killAt := monotonic() + grace
	termed := map[int]bool{}
	for {
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if err == syscall.ECHILD {
				return // no child left
			}
			if err == syscall.EINTR {
				continue
			}
			if err != nil || pid <= 0 {
				break // children left, none ended
			}
		}
		// A child is not reaped but here, so its PID cannot name another process
		// between this look and the signal.
		kill := monotonic() >= killAt
		for _, pid := range childrenOf(self) {
			switch {
			case kill:
				_ = syscall.Kill(pid, syscall.SIGKILL)
			case !termed[pid]:
				_ = syscall.Kill(pid, syscall.SIGTERM)
				termed[pid] = true
			}
		}
		sleep(20e6)
	}
}

// childrenOf lists the processes whose parent is pid, from /proc.
func childrenOf(pid int) []int {
	proc, err := open("/proc", syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return nil
	}
	defer syscall.Close(proc)
	var names []string
	buf := make([]byte, 8192)
	for {
		n, err := syscall.ReadDirent(proc, buf)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			break
		}
		_, _, names = syscall.ParseDirent(buf[:n], -1, names)
	}
	var out []int
	for _, name := range names {
		child, ok := parseUint(name)
		if !ok {
			continue
		}
		if _, ppid, _, err := procStat(int(child)); err == nil && ppid == pid {
			out = append(out, int(child))
		}
	}
	return out
}
