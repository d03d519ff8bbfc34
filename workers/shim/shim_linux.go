package shim

import "syscall"

// Args are this process's arguments after its name, for a main without package
// os (which is where Go keeps them), from the kernel's copy.
func Args() ([]string, error) {
	cmdline, err := readFile("/proc/self/cmdline")
	if err != nil {
		return nil, err
	}
	args := splitNUL(cmdline)
	if len(args) == 0 {
		return nil, nil
	}
	return args[1:], nil
}

// adoptOrphans makes the shim its command's subreaper: orphans of the command
// become the shim's children, not init's, so the whole tree stays under it.
func adoptOrphans() {
	_, _, _ = syscall.RawSyscall6(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0, 0, 0, 0)
}

// keepInherited marks every descriptor from 3 up close-on-exec.
func keepInherited() {
	_, _, _ = syscall.RawSyscall(sysCloseRange, 3, ^uintptr(0), closeRangeCloexec)
}

func pipeCloexec(p []int) error { return syscall.Pipe2(p, syscall.O_CLOEXEC) }

// commandAttr puts the command in its own process group. The command dies with
// the shim (Pdeathsig), so it never runs on unrecorded if the shim is killed
// before it wrote pid.json.
func commandAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

func allocate(fd int, size int64) error { return syscall.Fallocate(fd, 0, 0, size) }

func dup(from, to int) error { return syscall.Dup3(from, to, 0) }

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
