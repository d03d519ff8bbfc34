package engine

import (
	"fmt"
	"slices"
	"strings"
)

// An exec sink's placeholders are filled with text that is the task's output as
// often as not (a test log, a pull request's build), and so is the prompt on its
// stdin. Put where a shell or another interpreter parses it as code, that text
// would run as code: checkExecArgv refuses such an argv at registration.

// The programs checkExecArgv knows, by programName.
var (
	// shells take -c (clustered with other flags as in -ec), options with an
	// argument (-o pipefail), then the script or script file as their first operand.
	shells = []string{
		"sh", "bash", "rbash", "dash", "ash", "hush", "zsh", "ksh", "mksh", "pdksh", "oksh", "loksh", "lksh",
		"yash", "posh", "fish", "csh", "tcsh",
	}
	// lineShells join all their arguments into one command line that a shell parses.
	lineShells = []string{"pwsh", "powershell", "cmd", "ssh", "watch", "sg", "parallel", "tmux", "screen"}
	// commandFlags are the programs that run the argument of -c (or --command) with a shell.
	commandFlags = []string{"su", "runuser", "flock", "script"}
	// wrappers run the program named by a later argument; what they run is checked.
	wrappers = []string{
		"env", "busybox", "sudo", "doas", "nice", "nohup", "setsid", "timeout", "stdbuf", "time", "command",
		"exec", "xargs", "chrt", "ionice", "taskset", "chroot", "unshare", "nsenter", "firejail", "bwrap",
		"systemd-run", "strace", "ltrace", "numactl", "cgexec", "caffeinate", "arch", "schroot", "proot",
		"docker", "podman", "nerdctl", "kubectl", "lxc-attach", "find", "flatpak-spawn", "uv", "npx",
	}
)

// programName is the name of the program an argument would run: its base name in
// lower case, without .exe and a version (bash5.2, python3.12, ksh93).
func programName(arg string) string {
	name := strings.ToLower(arg[strings.LastIndexAny(arg, `/\`)+1:])
	name = strings.TrimSuffix(name, ".exe")
	return strings.TrimRight(name, "0123456789.-_")
}

func hasPlaceholder(arg string) bool {
	found := false
	_ = scanTemplate(arg, argvPlaceholders, func(string) {}, func(string, string) { found = true })
	return found
}

// execArgvError says which argument of an exec sink would run the wake-up's text as
// code, and what to use instead.
func execArgvError(i int, what string) error {
	return fmt.Errorf("argv[%d] %s, so a task's output would run as code; pass it as an argument after "+
		`the script ("$1" of sh -c 'notify "$1"' sh {{result}}), read the prompt from stdin `+
		`(sh -c 'notify "$(cat)"'), or use the BGTASK_* environment variables the sink gets `+
		`(BGTASK_TASK_ID, BGTASK_STATUS, BGTASK_EXIT_CODE, BGTASK_ORIGIN_<KEY>, ...)`, i, what)
}

// checkExecArgv refuses a placeholder where a shell or interpreter would parse it:
// the program itself, a shell's script or script file and its options, an
// interpreter's inline program, any argument of a program that joins its arguments
// into a shell command line; and a shell or interpreter that would read its script
// from stdin, which is the prompt. Placeholders anywhere else are arguments,
// passed as they are.
func checkExecArgv(argv []string) error {
	if hasPlaceholder(argv[0]) {
		return execArgvError(0, "is the program to run and has a placeholder")
	}
	for i := 0; i < len(argv); i++ {
		name := programName(argv[i])
		switch {
		case slices.Contains(shells, name):
			return checkShell(argv, i)
		case slices.Contains(lineShells, name):
			return checkLineShell(argv, i)
		case interpreters[name] != interpreter{}:
			return checkInterpreter(argv, i, interpreters[name])
		case slices.Contains(commandFlags, name):
			if err := checkCommandFlag(argv, i); err != nil {
				return err
			}
		case name == "env":
			if err := checkEnvSplit(argv, i); err != nil {
				return err
			}
		case i == 0 && !slices.Contains(wrappers, name):
			return nil // a program that runs no other: its arguments are data
		}
		// A wrapper (or a program that may be one): what it runs comes later.
	}
	return nil
}

// shellArgs are, per shell, the one-letter options that take the next argument
// (-o pipefail); the others take -o and +o, and bash -O. fish's -c takes its script
// as its argument; the other shells run their first operand after -c.
var shellArgs = map[string]string{"fish": "CpdfDo", "ksh": "oR", "csh": "", "tcsh": ""}

// shellLongArgs are long options that take the next argument unless given with =.
var shellLongArgs = []string{"rcfile", "init-file", "profile", "command", "init-command", "debug", "debug-output", "features", "profile-startup"}

// checkShell checks the shell at argv[at]: sh [options] [-c] [--] SCRIPT [ARG...].
func checkShell(argv []string, at int) error {
	name := programName(argv[at])
	argLetters, ok := shellArgs[name]
	if !ok {
		argLetters = "oO"
	}
	command, stdin := false, false
	script := -1 // where fish's -c or --command put the script
	i := at + 1
	for ; i < len(argv); i++ {
		a := argv[i]
		if a == "--" || a == "-" {
			i++
			break
		}
		if len(a) < 2 || (a[0] != '-' && a[0] != '+') {
			break
		}
		if hasPlaceholder(a) {
			return execArgvError(i, "is an option of "+name+" and has a placeholder")
		}
		if long, ok := strings.CutPrefix(a, "--"); ok {
			key, _, hasValue := strings.Cut(long, "=")
			command = command || key == "command"
			if !hasValue && slices.Contains(shellLongArgs, key) && i+1 < len(argv) {
				i++
				if key == "command" {
					script = i
				} else if hasPlaceholder(argv[i]) {
					return execArgvError(i, "is the argument of "+name+" --"+key+" and has a placeholder")
				}
			}
			continue
		}
		for _, flag := range a[1:] {
			switch {
			case flag == 'c' && name == "fish":
				command = true
				i++
				script = i
			case flag == 'c':
				command = true
			case flag == 's':
				stdin = true
			case strings.ContainsRune(argLetters, flag):
				i++
				if i < len(argv) && hasPlaceholder(argv[i]) {
					return execArgvError(i, "is the argument of an option of "+name+" and has a placeholder")
				}
			}
		}
	}
	if script < 0 {
		script = i
	}
	switch {
	case command && script < len(argv) && hasPlaceholder(argv[script]):
		return execArgvError(script, "is the script "+name+" -c runs and has a placeholder")
	case command:
		return nil
	case stdin || i >= len(argv):
		return execArgvError(at, "is "+name+" reading its script from stdin, which is the prompt")
	case hasPlaceholder(argv[i]):
		return execArgvError(i, "names the script file "+name+" runs and has a placeholder")
	}
	return nil
}

// checkLineShell refuses a placeholder in any argument after argv[at]: it is joined
// into a command line that a shell parses.
func checkLineShell(argv []string, at int) error {
	for i := at + 1; i < len(argv); i++ {
		if hasPlaceholder(argv[i]) {
			return execArgvError(i, "is part of the command line "+programName(argv[at])+" has a shell parse, and has a placeholder")
		}
	}
	return nil
}

// interpreter is how an interpreter's options are read: the letters whose value is
// a program (python -c CODE, perl -eCODE), those whose value is the rest of the
// argument or else the next one (python -W ignore, ruby -Ilib), and those whose
// value can only be the rest of the argument (perl -Mstrict).
type interpreter struct{ code, value, attached string }

var interpreters = map[string]interpreter{
	"python": {code: "cm", value: "WXQ"}, // -m: the module is the program
	"pypy":   {code: "cm", value: "WXQ"},
	"perl":   {code: "eE", attached: "IMmdDxil0FCV"},
	"ruby":   {code: "e", value: "ICErFWKTx"},
	"node":   {code: "ep", value: "r"},
	"nodejs": {code: "ep", value: "r"},
	"bun":    {code: "ep", value: "r"},
	"php":    {code: "rBRE", value: "cdfz"},
	"lua":    {code: "e", value: "l"},
}

// checkInterpreter checks the interpreter at argv[at]: its inline program, or the
// file it runs (its first operand), or stdin.
func checkInterpreter(argv []string, at int, in interpreter) error {
	name := programName(argv[at])
	refuse := func(i int) error { return execArgvError(i, "is the program "+name+" runs and has a placeholder") }
	code := false
	i := at + 1
	for ; i < len(argv); i++ {
		a := argv[i]
		if a == "--" {
			i++
			break
		}
		if a == "-" || len(a) < 2 || a[0] != '-' {
			break
		}
		if long, ok := strings.CutPrefix(a, "--"); ok {
			key, _, hasValue := strings.Cut(long, "=")
			switch key {
			case "eval", "print":
				code = true
				if hasPlaceholder(a) {
					return refuse(i)
				}
				if !hasValue && i+1 < len(argv) {
					if i++; hasPlaceholder(argv[i]) {
						return refuse(i)
					}
				}
			case "require":
				if !hasValue {
					i++
				}
			}
			continue
		}
	cluster:
		for j, flag := range a[1:] {
			rest := a[2+j:]
			switch {
			case strings.ContainsRune(in.code, flag):
				code = true
				if rest == "" && i+1 < len(argv) {
					i++
					rest = argv[i]
				}
				if hasPlaceholder(rest) {
					return refuse(i)
				}
				break cluster
			case strings.ContainsRune(in.value, flag):
				if rest == "" {
					i++
				}
				break cluster
			case strings.ContainsRune(in.attached, flag):
				break cluster
			}
		}
	}
	switch {
	case code:
		return nil
	case i >= len(argv) || argv[i] == "-":
		return execArgvError(at, "is "+name+" reading its program from stdin, which is the prompt")
	case hasPlaceholder(argv[i]):
		return execArgvError(i, "names the program file "+name+" runs and has a placeholder")
	}
	return nil
}

// checkCommandFlag refuses a placeholder in the command of -c (-qc, -cCOMMAND) or
// --command of su, runuser, flock and script, which a shell runs.
func checkCommandFlag(argv []string, at int) error {
	refuse := func(i int) error {
		return execArgvError(i, "is the command "+programName(argv[at])+" -c has a shell run, and has a placeholder")
	}
	for i := at + 1; i < len(argv); i++ {
		a := argv[i]
		command := ""
		switch long, isLong := strings.CutPrefix(a, "--"); {
		case isLong && long == "command" && i+1 < len(argv):
			i++
			command = argv[i]
		case isLong:
			if value, ok := strings.CutPrefix(long, "command="); ok {
				command = value
			}
		case len(a) > 1 && a[0] == '-':
			if c := strings.IndexByte(a, 'c'); c == len(a)-1 && i+1 < len(argv) {
				i++
				command = argv[i]
			} else if c > 0 {
				command = a[c+1:]
			}
		}
		if hasPlaceholder(command) {
			return refuse(i)
		}
	}
	return nil
}

// checkEnvSplit refuses a placeholder in env -S (--split-string), which env splits
// into the command it runs.
func checkEnvSplit(argv []string, at int) error {
	for i := at + 1; i < len(argv); i++ {
		a := argv[i]
		split := strings.HasPrefix(a, "-S") || strings.HasPrefix(a, "--split-string")
		if split && (a == "-S" || a == "--split-string") && i+1 < len(argv) {
			i++
			a = argv[i]
		}
		if split && hasPlaceholder(a) {
			return execArgvError(i, "is split by env -S into the command it runs, and has a placeholder")
		}
	}
	return nil
}
