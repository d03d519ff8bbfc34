package shim

import (
	"errors"
	"slices"
	"syscall"
	"unicode/utf8"
)

// ProcRef names a process for as long as it lives: a PID alone may be reused.
type ProcRef struct {
	PID int `json:"pid"`
	// Start is when the process started: on Linux in clock ticks after boot
	// (/proc/PID/stat), on macOS in Unix microseconds (kinfo_proc).
	Start uint64 `json:"start"`
}

// The shim writes its two files as JSON by hand (see the package comment). Their
// fields are the worker's to read; its types for them are in package workers, and
// its tests hold the two to the same names.

// pidsRecord is pid.json.
type pidsRecord struct {
	shim, command ProcRef
	startedAt     int64 // Unix nanoseconds
}

// exitRecord is exit.json: how the command ended, or why it could not start.
type exitRecord struct {
	exitCode           int
	signal             string
	stoppedBy          string // StoppedByDeadline or StoppedByStall
	startedAt, endedAt int64  // Unix nanoseconds
	startError         string
}

// exitOf is the record of a command that ended with status ws.
func exitOf(ws syscall.WaitStatus, stoppedBy string, startedAt, endedAt int64) exitRecord {
	exit := exitRecord{exitCode: ws.ExitStatus(), stoppedBy: stoppedBy, startedAt: startedAt, endedAt: endedAt}
	if ws.Signaled() {
		exit.exitCode, exit.signal = 128+int(ws.Signal()), signalName(ws.Signal())
	}
	return exit
}

// ExitRecord is what the exit file says of a command that ended with status ws,
// started and ended at those Unix nanoseconds: for a worker that writes it where
// the shim died before it could.
func ExitRecord(ws syscall.WaitStatus, startedAt, endedAt int64) []byte {
	return exitOf(ws, "", startedAt, endedAt).appendJSON(nil)
}

func (p ProcRef) appendJSON(b []byte) []byte {
	b = appendInt(append(b, `{"pid":`...), int64(p.PID))
	b = appendUint(append(b, `,"start":`...), p.Start)
	return append(b, '}')
}

func (p pidsRecord) appendJSON(b []byte) []byte {
	b = p.shim.appendJSON(append(b, `{"shim":`...))
	b = p.command.appendJSON(append(b, `,"command":`...))
	b = appendTime(append(b, `,"started_at":`...), p.startedAt)
	return append(b, '}')
}

func (e exitRecord) appendJSON(b []byte) []byte {
	b = appendInt(append(b, `{"exit_code":`...), int64(e.exitCode))
	if e.signal != "" {
		b = appendString(append(b, `,"signal":`...), e.signal)
	}
	if e.stoppedBy != "" {
		b = appendString(append(b, `,"stopped_by":`...), e.stoppedBy)
	}
	b = appendTime(append(b, `,"started_at":`...), e.startedAt)
	b = appendTime(append(b, `,"ended_at":`...), e.endedAt)
	if e.startError != "" {
		b = appendString(append(b, `,"start_error":`...), e.startError)
	}
	return append(b, '}')
}

// appendString quotes s as a JSON string; invalid UTF-8 becomes U+FFFD.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b = append(b, '\\', byte(r))
		case r < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[r>>4], hex[r&0xf])
		default:
			b = utf8.AppendRune(b, r)
		}
	}
	return append(b, '"')
}

// WriteWhole writes a file so that a reader sees all of it or none; a crash of
// the host may lose it.
func WriteWhole(path string, data []byte) error {
	return writeFile(path, data, notDurable)
}

// WriteDurable writes a file so that a reader sees all of it or none, and it
// survives the host's crash: a temp file, fsync, rename, fsync of the directory.
func WriteDurable(path string, data []byte) error {
	return writeFile(path, data, syncBeforeRename)
}

// How writeFile makes a file durable.
type durability int

const (
	notDurable       durability = iota // a crash of the host may lose it
	syncBeforeRename                   // readers see it once it is on disk
	// syncAfterRename lets readers see it at once, and returns once it is on disk.
	// A crash of the host in between may leave it empty, or with the file system's
	// stale data: readers must take a file they cannot read for none.
	syncAfterRename
)

func writeFile(path string, data []byte, mode durability) error {
	tmp := path + ".tmp"
	fd, err := open(tmp, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	if err := writeAll(fd, data); err != nil {
		return &fileError{"write", tmp, err}
	}
	if mode == syncBeforeRename {
		if err := syscall.Fsync(fd); err != nil {
			return &fileError{"sync", tmp, err}
		}
	}
	if err := syscall.Rename(tmp, path); err != nil {
		return &fileError{"rename", tmp, err}
	}
	if mode == notDurable {
		return nil
	}
	if mode == syncAfterRename {
		if err := syscall.Fsync(fd); err != nil {
			return &fileError{"sync", path, err}
		}
	}
	// The rename is on disk once its directory is: best effort, the file's data is.
	_ = SyncDir(dirOf(path))
	return nil
}

// WorkerLock is the file of a worker's state directory that the worker holds
// locked (flock) while it runs. A run's directory is STATE/runs/NAME.
const WorkerLock = "lock"

// watched says whether a worker watches the run in dir: one holds the lock of
// the state directory the run's directory is in.
func watched(dir string) bool {
	fd, err := open(join(dirOf(dirOf(dir)), WorkerLock), syscall.O_RDONLY, 0)
	if err != nil {
		return false
	}
	defer syscall.Close(fd) // and with it the lock, if this took it
	return syscall.Flock(fd, syscall.LOCK_SH|syscall.LOCK_NB) == syscall.EWOULDBLOCK
}

// KeepExit makes the exit file in dir durable, if there is one: a worker that
// cannot record a run's exit in the log at once keeps it so, as the shim does
// where no worker watches.
func KeepExit(dir string) error {
	fd, err := open(join(dir, ExitFile), syscall.O_RDONLY, 0)
	if errors.Is(err, syscall.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	if err := syscall.Fsync(fd); err != nil {
		return &fileError{"sync", join(dir, ExitFile), err}
	}
	return SyncDir(dir)
}

// SyncDir makes a directory's entries durable: the files made, renamed or removed
// in it.
func SyncDir(path string) error {
	fd, err := open(path, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	if err := syscall.Fsync(fd); err != nil {
		return &fileError{"sync", path, err}
	}
	return nil
}

// EnvironFD is the shim's standard input, where the worker writes the command's
// environment (JoinEnviron). The worker keeps it in run.json, which the shim
// cannot read without the JSON packages it does without (see the package
// comment). It is a socket, on which the shim answers too (receiveRun).
const EnvironFD = 0

// readEnviron reads the command's environment from EnvironFD: want bytes, or it
// is not whole.
func readEnviron(want int64) ([]string, error) {
	data, err := readFull(EnvironFD, "the environment on standard input", int(want))
	return splitEnviron(data), err
}

// readFull reads n bytes from fd, named name in errors: fewer before its end are
// not the whole of them.
func readFull(fd int, name string, n int) ([]byte, error) {
	buf := make([]byte, n)
	for got := 0; got < n; {
		k, err := syscall.Read(fd, buf[got:])
		switch {
		case err == syscall.EINTR:
		case err != nil:
			return nil, &fileError{"read", name, err}
		case k == 0:
			return nil, errors.New(name + ": " + string(appendInt(nil, int64(got))) + " bytes of " + string(appendInt(nil, int64(n))) + ": not whole")
		default:
			got += k
		}
	}
	return buf, nil
}

// splitEnviron reads NUL-separated NAME=value entries, as in /proc/PID/environ.
func splitEnviron(data []byte) []string {
	return slices.DeleteFunc(splitNUL(data), func(kv string) bool { return kv == "" })
}

// splitNUL splits NUL-terminated strings, as the kernel lists a process's
// arguments and environment.
func splitNUL(data []byte) []string {
	var list []string
	for len(data) > 0 {
		end := 0
		for end < len(data) && data[end] != 0 {
			end++
		}
		list = append(list, string(data[:end]))
		data = data[min(end+1, len(data)):]
	}
	return list
}

// JoinEnviron writes env as the shim reads it on EnvironFD.
func JoinEnviron(env []string) []byte {
	var b []byte
	for _, kv := range env {
		b = append(append(b, kv...), 0)
	}
	return b
}

// ProcStart reads a process's start time, which with its PID names it uniquely.
func ProcStart(pid int) (uint64, error) {
	_, _, start, err := procStat(pid)
	return start, err
}

// Zombie names process pid, and says whether it has ended and waits to be reaped.
func Zombie(pid int) (ProcRef, bool) {
	state, _, start, err := procStat(pid)
	return ProcRef{PID: pid, Start: start}, err == nil && state == 'Z'
}

// Alive reports whether the process p names is still running (a zombie is not).
func (p ProcRef) Alive() bool {
	if p.PID <= 0 {
		return false
	}
	state, _, start, err := procStat(p.PID)
	return err == nil && start == p.Start && state != 'Z'
}

// signalName is a signal's name without its SIG prefix: TERM, KILL; its number if
// it has no name here.
func signalName(sig syscall.Signal) string {
	if sig >= 0 && int(sig) < len(signalNames) && signalNames[sig] != "" {
		return signalNames[sig]
	}
	return string(appendInt(nil, int64(sig)))
}
