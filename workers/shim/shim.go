// Package shim is the real parent of the commands a worker runs. A worker starts
// one shim, in a session of its own, and hands it each run it starts; the shim
// keeps them all in one loop (keeper.go), so that no process of bgtask's own
// lives per command. It starts each command in its own process group with
// stdout and stderr going straight to files (nothing copies them, so nothing can
// block the command), enforces the deadline and the stall kill, keeps the output
// files within their bound on disk (bound.go), reaps the command, writes the exit
// file atomically, and stops what the command left behind. The shim outlives its
// worker: a worker that stops, is killed or upgraded leaves its commands running
// under it, and the shim ends once the worker is gone and the last of its runs
// is over. A shim killed leaves its commands to the worker, their subreaper,
// which learns how they end (workers.adoptCommand). Everything the shim knows of
// a run is in what the worker sent and in the run's directory, whose files are
// named below. Who writes each of them, when, and what a reader may take from it
// is told in one place, at the top of workers/rundir.go.
//
// The package calls the kernel through package syscall alone, without os, time,
// strconv or the reflection-based packages: the shim is a small program, started
// with each worker, and holds little memory of its own beside its runs'. It runs
// as its own binary, bgtask-shim, or as `bgtask shim` where that is missing.
package shim

import (
	"errors"
	"syscall"
)

// The files of a run directory the shim reads or writes.
const (
	StdoutFile   = "stdout"
	StderrFile   = "stderr"
	PIDFile      = "pid.json"
	ExitFile     = "exit.json"
	ExitTempFile = ExitFile + ".tmp"
)

// RunEnv names the run (its directory's name, <task>-<epoch>) in its command's
// environment, which every process the command starts inherits: the shim stops
// by it what a command left behind outside its process group, and a worker what
// the command of a dead shim left.
const RunEnv = "BGTASK_RUN"

// Why the shim stopped a command, in Exit.StoppedBy.
const (
	StoppedByDeadline = "deadline"
	StoppedByStall    = "stall"
)

// Fault tests name a crash point in CrashEnv to have a process kill itself there.
const (
	CrashEnv        = "BGTASK_CRASH_AT"
	CrashAfterStart = "shim-after-start" // the command started, its PID not recorded
)

// Main runs a shim with its arguments, which are none: it reads its runs on its
// standard input (receiveRun) and keeps them until the worker closes its end
// and the last run is over.
func Main(args []string) error {
	if len(args) == 1 && (args[0] == "--help" || args[0] == "-h") {
		return writeAll(1, []byte("usage: "+usage))
	}
	if len(args) == 1 && args[0] == "--protocol" {
		return writeAll(1, []byte(Protocol+"\n"))
	}
	if len(args) > 0 {
		return errors.New("shim: argument " + args[0] + ": usage: " + synopsis)
	}
	// The commands' orphans are the shim's to stop, not init's; descriptors the
	// worker inherited (a pipe its caller reads) must not reach a command that
	// outlives it: its reader would never see EOF.
	adoptOrphans()
	KeepInherited()
	k, err := newKeeper()
	if err != nil {
		return err
	}
	return k.serve()
}

// start starts the command with its stdin on /dev/null and its output appended
// to the run's files, having reserved its exit file first (exit).
func (r Run) start(env []string, exit *exitFile) (pid int, err error) {
	// The exit file's blocks are taken before anything runs: a disk that fills
	// while the command runs must not lose how it ended. Its temp file also marks
	// the start: from here on the command may be running before its PIDs are
	// recorded, and a worker that finds the temp file and no pid.json knows the
	// shim died starting it.
	if *exit, err = reserveExit(r.Dir); err != nil {
		return 0, errors.New("reserve the exit file, so that a full disk cannot lose the command's exit: " + err.Error())
	}
	var files [3]int // stdin, stdout, stderr
	for i, f := range []struct {
		path  string
		flags int
	}{
		{"/dev/null", syscall.O_RDONLY},
		{join(r.Dir, StdoutFile), syscall.O_WRONLY | syscall.O_CREAT | syscall.O_APPEND},
		{join(r.Dir, StderrFile), syscall.O_WRONLY | syscall.O_CREAT | syscall.O_APPEND},
	} {
		if files[i], err = open(f.path, f.flags, 0o600); err != nil {
			return 0, err
		}
		defer syscall.Close(files[i])
	}
	pid, err = syscall.ForkExec(r.Path, r.Args, &syscall.ProcAttr{
		Dir:   r.Cwd,
		Env:   env,
		Files: []uintptr{uintptr(files[0]), uintptr(files[1]), uintptr(files[2])},
		Sys:   commandAttr(),
	})
	if err != nil {
		return 0, &fileError{"fork/exec", r.Path, err}
	}
	return pid, nil
}

// exitReserveBytes is the room the exit file is given before the command starts:
// a record is a few hundred bytes, a start error with a long path a few more.
const exitReserveBytes = 4 << 10

// exitFile is the exit file of a run, to be: its temp file, made with its blocks
// allocated before the command starts, which the record overwrites and which is
// then renamed into place. Neither needs a block more, so a full disk loses no exit.
type exitFile struct {
	dir string
	fd  int // -1: not reserved; the record is written as any file
}

// reserveExit makes the exit file's temp file in dir with exitReserveBytes of it
// allocated. If that fails, the exitFile it returns still writes the record as a
// file of its own, where the disk has room.
func reserveExit(dir string) (exitFile, error) {
	e := exitFile{dir: dir, fd: -1}
	tmp := join(dir, ExitTempFile)
	fd, err := open(tmp, syscall.O_RDWR|syscall.O_CREAT|syscall.O_TRUNC, 0o600)
	if err != nil {
		return e, err
	}
	err = allocate(fd, exitReserveBytes)
	if err == syscall.EOPNOTSUPP {
		// A file system (or system) without fallocate allocates the blocks written.
		err = writeAll(fd, make([]byte, exitReserveBytes))
	}
	if err != nil {
		syscall.Close(fd)
		return e, &fileError{"allocate", tmp, err}
	}
	e.fd = fd
	return e, nil
}

// write writes the exit file, whole. The exit code is what the caller waits
// for, and it must outlive a crash of the host before it is in the log: where
// no worker watches the run, the file is made durable; where one does, the
// worker records the exit as soon as it reads it, and makes the file durable
// itself if the log cannot take the exit at once (KeepExit). The worker may
// read it before it is on disk: a crash of the host in the meantime may leave a
// file it cannot read, which it takes for none, as after a crash before the
// write: the task is lost either way.
func (e exitFile) write(exit exitRecord) error {
	path := join(e.dir, ExitFile)
	durable := !watched(e.dir)
	if e.fd < 0 {
		mode := notDurable
		if durable {
			mode = syncAfterRename
		}
		return writeFile(path, exit.appendJSON(nil), mode)
	}
	tmp := join(e.dir, ExitTempFile)
	if err := overwrite(e.fd, tmp, exit.appendJSON(nil)); err != nil {
		return err
	}
	if err := syscall.Rename(tmp, path); err != nil {
		return &fileError{"rename", tmp, err}
	}
	if !durable {
		return nil
	}
	if err := syscall.Fsync(e.fd); err != nil {
		return &fileError{"sync", path, err}
	}
	_ = SyncDir(e.dir)
	return nil
}

// overwrite makes the file fd (at path) hold data: written over the blocks the
// file has and cut to its length, it takes no block more.
func overwrite(fd int, path string, data []byte) error {
	for off := 0; off < len(data); {
		n, err := syscall.Pwrite(fd, data[off:], int64(off))
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return &fileError{"write", path, err}
		}
		off += n
	}
	if err := syscall.Ftruncate(fd, int64(len(data))); err != nil {
		return &fileError{"truncate", path, err}
	}
	return nil
}

func (e exitFile) close() {
	if e.fd >= 0 {
		syscall.Close(e.fd)
	}
}

// outputSize is how much the command has written to its output files.
func (r Run) outputSize() int64 {
	return fileSize(join(r.Dir, StdoutFile)) + fileSize(join(r.Dir, StderrFile))
}
