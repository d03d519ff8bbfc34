package shim

import (
	"errors"
	"strings"
	"time"
)

// Run is what a shim starts and the timers it enforces itself, so they hold while
// no worker watches. The worker passes it as the shim's arguments (ShimArgs), which
// also makes a shim's command line in ps say what it runs.
type Run struct {
	Dir        string // the run directory
	Cwd        string // the command's working directory
	Path       string // the program, found in the command's PATH
	Args       []string
	Deadline   time.Time
	StallAfter time.Duration // kill when the output is quiet this long; 0: never
	KillGrace  time.Duration // between TERM and KILL
}

const usage = `bgtask-shim --dir=DIR [--cwd=DIR] [--deadline=TIME] [--stall-after=D] [--kill-grace=D] -- PROGRAM ARGV0 [ARG...]

Runs PROGRAM as the command of the bgtask run in DIR, with the environment in
DIR/environ, and records its PIDs and its exit there. Workers start it; it is no
command for people.
`

// ShimArgs are the shim's arguments for r: flags, then "--", the program and its argv.
func (r Run) ShimArgs() []string {
	args := []string{"--dir=" + r.Dir, "--cwd=" + r.Cwd}
	if !r.Deadline.IsZero() {
		args = append(args, "--deadline="+r.Deadline.UTC().Format(time.RFC3339Nano))
	}
	if r.StallAfter > 0 {
		args = append(args, "--stall-after="+r.StallAfter.String())
	}
	if r.KillGrace > 0 {
		args = append(args, "--kill-grace="+r.KillGrace.String())
	}
	return append(append(args, "--", r.Path), r.Args...)
}

// parseArgs reads what ShimArgs wrote.
func parseArgs(args []string) (r Run, err error) {
	for len(args) > 0 && args[0] != "--" {
		name, value, ok := strings.Cut(args[0], "=")
		if !ok {
			return Run{}, errors.New("shim: argument " + args[0] + ": want --name=value")
		}
		switch name {
		case "--dir":
			r.Dir = value
		case "--cwd":
			r.Cwd = value
		case "--deadline":
			r.Deadline, err = time.Parse(time.RFC3339Nano, value)
		case "--stall-after":
			r.StallAfter, err = time.ParseDuration(value)
		case "--kill-grace":
			r.KillGrace, err = time.ParseDuration(value)
		default:
			return Run{}, errors.New("shim: unknown argument " + name)
		}
		if err != nil {
			return Run{}, errors.New("shim: " + name + ": " + err.Error())
		}
		args = args[1:]
	}
	if len(args) < 3 || r.Dir == "" {
		return Run{}, errors.New("shim: usage: " + usage)
	}
	r.Path, r.Args = args[1], args[2:]
	return r, nil
}
