package shim

import (
	"errors"
	"syscall"
)

var errProcStat = errors.New("unreadable /proc stat")

// procStat reads a process's state letter, parent and start time from
// /proc/PID/stat.
func procStat(pid int) (state byte, ppid int, start uint64, err error) {
	data, err := readFile("/proc/" + string(appendInt(nil, int64(pid))) + "/stat")
	if err != nil {
		return 0, 0, 0, err
	}
	// pid (comm) state ppid ...: comm may hold spaces; field 22 is the start time.
	i := len(data) - 1
	for i >= 0 && data[i] != ')' {
		i--
	}
	if i < 0 {
		return 0, 0, 0, errProcStat
	}
	fields := splitFields(data[i+1:], 20)
	if len(fields) < 20 || len(fields[0]) != 1 {
		return 0, 0, 0, errProcStat
	}
	parent, ok := parseUint(fields[1])
	if !ok {
		return 0, 0, 0, errProcStat
	}
	if start, ok = parseUint(fields[19]); !ok {
		return 0, 0, 0, errProcStat
	}
	return fields[0][0], int(parent), start, nil
}

// splitFields splits data at runs of spaces and newlines, into at most n fields.
func splitFields(data []byte, n int) []string {
	var fields []string
	for i := 0; i < len(data) && len(fields) < n; {
		for i < len(data) && (data[i] == ' ' || data[i] == '\n') {
			i++
		}
		start := i
		for i < len(data) && data[i] != ' ' && data[i] != '\n' {
			i++
		}
		if i > start {
			fields = append(fields, string(data[start:i]))
		}
	}
	return fields
}

// signalNames are the names of signals without their SIG prefix.
var signalNames = [...]string{
	syscall.SIGHUP: "HUP", syscall.SIGINT: "INT", syscall.SIGQUIT: "QUIT", syscall.SIGILL: "ILL",
	syscall.SIGTRAP: "TRAP", syscall.SIGABRT: "ABRT", syscall.SIGBUS: "BUS", syscall.SIGFPE: "FPE",
	syscall.SIGKILL: "KILL", syscall.SIGUSR1: "USR1", syscall.SIGSEGV: "SEGV", syscall.SIGUSR2: "USR2",
	syscall.SIGPIPE: "PIPE", syscall.SIGALRM: "ALRM", syscall.SIGTERM: "TERM", syscall.SIGSTKFLT: "STKFLT",
	syscall.SIGCHLD: "CHLD", syscall.SIGCONT: "CONT", syscall.SIGSTOP: "STOP", syscall.SIGTSTP: "TSTP",
	syscall.SIGTTIN: "TTIN", syscall.SIGTTOU: "TTOU", syscall.SIGURG: "URG", syscall.SIGXCPU: "XCPU",
	syscall.SIGXFSZ: "XFSZ", syscall.SIGVTALRM: "VTALRM", syscall.SIGPROF: "PROF", syscall.SIGWINCH: "WINCH",
	syscall.SIGIO: "IO", syscall.SIGPWR: "PWR", syscall.SIGSYS: "SYS",
}
