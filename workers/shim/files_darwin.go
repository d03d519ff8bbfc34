package shim

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// procStat reads a process's state letter (as /proc has it on Linux: R, S, T, Z),
// parent and start time from its kinfo_proc (sysctl kern.proc.pid).
func procStat(pid int) (state byte, ppid int, start uint64, err error) {
	info, err := unix.SysctlKinfoProc("kern.proc.pid", pid)
	if err != nil {
		return 0, 0, 0, err
	}
	if info.Proc.P_pid != int32(pid) {
		return 0, 0, 0, syscall.ESRCH // no such process: the kernel fills nothing
	}
	switch info.Proc.P_stat {
	case 2: // SRUN
		state = 'R'
	case 4: // SSTOP
		state = 'T'
	case 5: // SZOMB
		state = 'Z'
	default: // SIDL, SSLEEP
		state = 'S'
	}
	t := info.Proc.P_starttime
	return state, int(info.Eproc.Ppid), uint64(t.Sec)*1e6 + uint64(t.Usec), nil
}

// signalNames are the names of signals without their SIG prefix.
var signalNames = [...]string{
	syscall.SIGHUP: "HUP", syscall.SIGINT: "INT", syscall.SIGQUIT: "QUIT", syscall.SIGILL: "ILL",
	syscall.SIGTRAP: "TRAP", syscall.SIGABRT: "ABRT", syscall.SIGEMT: "EMT", syscall.SIGFPE: "FPE",
	syscall.SIGKILL: "KILL", syscall.SIGBUS: "BUS", syscall.SIGSEGV: "SEGV", syscall.SIGSYS: "SYS",
	syscall.SIGPIPE: "PIPE", syscall.SIGALRM: "ALRM", syscall.SIGTERM: "TERM", syscall.SIGURG: "URG",
	syscall.SIGSTOP: "STOP", syscall.SIGTSTP: "TSTP", syscall.SIGCONT: "CONT", syscall.SIGCHLD: "CHLD",
	syscall.SIGTTIN: "TTIN", syscall.SIGTTOU: "TTOU", syscall.SIGIO: "IO", syscall.SIGXCPU: "XCPU",
	syscall.SIGXFSZ: "XFSZ", syscall.SIGVTALRM: "VTALRM", syscall.SIGPROF: "PROF", syscall.SIGWINCH: "WINCH",
	syscall.SIGINFO: "INFO", syscall.SIGUSR1: "USR1", syscall.SIGUSR2: "USR2",
}
