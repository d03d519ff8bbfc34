package shim

import "errors"

// Run is what a shim starts and the timers it enforces itself, so they hold while
// no worker watches. The worker hands it to the shim as arguments (ShimArgs) on the
// shim's standard input (receiveRun), not on its command line: a command is found
// by its own (pgrep -f), not by its shim's. Times are in nanoseconds, as
// time.Time.UnixNano and time.Duration have them.
type Run struct {
	Dir        string // the run directory
	Cwd        string // the command's working directory
	Path       string // the program, found in the command's PATH
	Args       []string
	Deadline   int64 // Unix nanoseconds; 0: none
	StallAfter int64 // kill when the output is quiet this long; 0: never
	KillGrace  int64 // between TERM and KILL
	// EnvBytes is the length of the environment the worker writes on the shim's
	// standard input: fewer bytes before its end are not the whole of it (the
	// worker died handing it over), and no command starts in part of its
	// environment.
	EnvBytes int64
}

const synopsis = "bgtask-shim"

const usage = synopsis + `

Reads bgtask runs on standard input, a socket: each the run's arguments
(--dir=DIR --env-bytes=N [--cwd=DIR] [--deadline-unix-ns=N]
[--stall-after-ns=N] [--kill-grace-ns=N] -- PROGRAM ARGV0 [ARG...]), its
environment (NUL-separated NAME=value, N bytes in all; fewer, and no command
starts) and its start lock. Runs PROGRAM as the command of the run in DIR,
beside the others, and records its PIDs and its exit there; ends once standard
input is closed and the last command has ended. Workers start it; it is no
command for people.
`

// ShimArgs are the shim's arguments for r: flags, then "--", the program and its argv.
func (r Run) ShimArgs() []string {
	args := []string{"--dir=" + r.Dir, "--env-bytes=" + string(appendInt(nil, r.EnvBytes)), "--cwd=" + r.Cwd}
	if r.Deadline != 0 {
		args = append(args, "--deadline-unix-ns="+string(appendInt(nil, r.Deadline)))
	}
	if r.StallAfter > 0 {
		args = append(args, "--stall-after-ns="+string(appendInt(nil, r.StallAfter)))
	}
	if r.KillGrace > 0 {
		args = append(args, "--kill-grace-ns="+string(appendInt(nil, r.KillGrace)))
	}
	return append(append(args, "--", r.Path), r.Args...)
}

// parseArgs reads what ShimArgs wrote.
func parseArgs(args []string) (r Run, err error) {
	r.EnvBytes = -1
	for len(args) > 0 && args[0] != "--" {
		name, value, ok := cut(args[0], '=')
		if !ok {
			return Run{}, errors.New("shim: argument " + args[0] + ": want --name=value")
		}
		var number *int64
		switch name {
		case "--dir":
			r.Dir = value
		case "--cwd":
			r.Cwd = value
		case "--env-bytes":
			number = &r.EnvBytes
		case "--deadline-unix-ns":
			number = &r.Deadline
		case "--stall-after-ns":
			number = &r.StallAfter
		case "--kill-grace-ns":
			number = &r.KillGrace
		default:
			return Run{}, errors.New("shim: unknown argument " + name)
		}
		if number != nil {
			if *number, ok = parseInt64(value); !ok {
				return Run{}, errors.New("shim: " + name + ": " + value + " is no whole number")
			}
		}
		args = args[1:]
	}
	if len(args) < 3 || r.Dir == "" || r.EnvBytes < 0 {
		return Run{}, errors.New("shim: the run's arguments: want --dir=DIR --env-bytes=N ... -- PROGRAM ARGV0 [ARG...]")
	}
	r.Path, r.Args = args[1], args[2:]
	return r, nil
}

func cut(s string, sep byte) (before, after string, found bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == sep {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}
