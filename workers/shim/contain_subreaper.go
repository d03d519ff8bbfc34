//go:build linux && !bgtask_portable

package shim

import "syscall"

// Containment with a subreaper: Linux's. The tag bgtask_portable selects the
// containment by process group instead (contain_group.go), which macOS has.

// adoptOrphans makes the shim its commands' subreaper: orphans of a command
// become the shim's children, not init's, so that the shim can stop them when
// the command ends (strays).
func adoptOrphans() {
	_, _, _ = syscall.RawSyscall6(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0, 0, 0, 0)
}

// commandAttr puts the command in its own process group. It does not die with
// the shim: a shim killed leaves its commands to the worker that started the
// shim, a subreaper, which learns how they end (workers.adoptCommand).
func commandAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// strays are the shim's children an ended command may have left running outside
// its process group (setsid, a daemon's double fork), come to the shim as their
// parents ended: those, other than the commands it runs, whose environment holds
// the run's marker (RunEnv=NAME); and once no command runs, all of them, since
// no command that runs can have left them: a process that cleared its
// environment, wrote its title over it, or whose environment cannot be read
// (setuid, not dumpable) is stopped then.
func (k *keeper) strays(marker []byte) []int {
	children := childrenOf(k.self.PID)
	if len(k.runs) == 0 {
		return children
	}
	var found []int
	for _, pid := range children {
		if marker != nil && k.runs[pid] == nil && hasEntry(pid, marker) {
			found = append(found, pid)
		}
	}
	return found
}

// hasEntry says whether the environment of process pid holds the entry kv.
func hasEntry(pid int, kv []byte) bool {
	env, err := readFile("/proc/" + string(appendInt(nil, int64(pid))) + "/environ")
	if err != nil {
		return false
	}
	for _, entry := range splitNUL(env) {
		if entry == string(kv) {
			return true
		}
	}
	return false
}

// childrenOf lists the processes whose parent is pid: from its threads' lists of
// children, where the kernel keeps them (CONFIG_PROC_CHILDREN), else from all of
// /proc.
func childrenOf(pid int) []int {
	task := "/proc/" + string(appendInt(nil, int64(pid))) + "/task"
	tids := listDir(task)
	var out []int
	for _, tid := range tids {
		list, err := readFile(task + "/" + tid + "/children")
		if err != nil {
			return childrenInProc(pid)
		}
		for _, field := range splitFields(list, len(list)) {
			if child, ok := parseUint(field); ok {
				out = append(out, int(child))
			}
		}
	}
	return out
}

// childrenInProc lists the processes whose parent is pid, from each process's
// /proc/PID/stat.
func childrenInProc(pid int) []int {
	var out []int
	for _, name := range listDir("/proc") {
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

// listDir lists the names in the directory at path.
func listDir(path string) []string {
	dir, err := open(path, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return nil
	}
	defer syscall.Close(dir)
	var names []string
	buf := make([]byte, 8192)
	for {
		n, err := syscall.ReadDirent(dir, buf)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			return names
		}
		_, _, names = syscall.ParseDirent(buf[:n], -1, names)
	}
}
