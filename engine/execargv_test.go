package engine_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/bgtask/bgtask/engine"
)

func execSpec(t *testing.T, argv ...string) []byte {
	t.Helper()
	data, err := json.Marshal(map[string]any{"command": "x", "deliver": []any{map[string]any{"type": "exec", "argv": argv}}})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// A placeholder is refused where a shell or an interpreter would parse it as code
// (the wake-up's text is the task's output: `$(touch /tmp/x)` would run), and so is
// a shell that reads its script from stdin, the prompt. The error names the field,
// the argument, and what to use instead.
func TestExecArgvRefusesPlaceholdersThatAShellParses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		argv []string
		arg  string // the argument the error names
	}{
		{[]string{"sh", "-c", "echo {{result}} >/dev/null"}, "argv[2]"},
		{[]string{"sh", "-c", "notify {{result}}"}, "argv[2]"},
		{[]string{"/bin/sh", "-c", "notify {{tail}}"}, "argv[2]"},
		{[]string{"bash", "-c", "notify '{{prompt}}'"}, "argv[2]"},
		{[]string{"/usr/local/bin/bash5.2", "-c", "notify {{result}}"}, "argv[2]"},
		{[]string{"dash", "-c", "notify {{origin.chat}}"}, "argv[2]"},
		{[]string{"zsh", "-c", "notify {{command}}"}, "argv[2]"},
		{[]string{"ksh93", "-c", "notify {{reason}}"}, "argv[2]"},
		{[]string{"mksh", "-c", "notify {{task_id}}"}, "argv[2]"},
		{[]string{"fish", "-c", "notify {{result}}"}, "argv[2]"},
		{[]string{"tcsh", "-c", "notify {{result}}"}, "argv[2]"},
		{[]string{"bash", "-ec", "notify {{result}}"}, "argv[2]"},
		{[]string{"bash", "-lc", "notify {{result}}"}, "argv[2]"},
		{[]string{"bash", "-c", "-e", "notify {{result}}"}, "argv[3]"},
		{[]string{"bash", "-o", "pipefail", "-c", "notify {{result}}"}, "argv[4]"},
		{[]string{"bash", "-euo", "pipefail", "-c", "notify {{result}}"}, "argv[4]"},
		{[]string{"bash", "-O", "extglob", "-c", "notify {{result}}"}, "argv[4]"},
		{[]string{"bash", "--norc", "--noprofile", "-c", "notify {{result}}"}, "argv[4]"},
		{[]string{"bash", "--rcfile", "/etc/rc", "-c", "notify {{result}}"}, "argv[4]"},
		{[]string{"sh", "-c", "--", "notify {{result}}"}, "argv[3]"},
		{[]string{"fish", "-d", "all", "-c", "notify {{result}}"}, "argv[4]"},
		{[]string{"fish", "--command", "notify {{result}}"}, "argv[2]"},
		{[]string{"fish", "--command=notify {{result}}"}, "argv[1]"},
		{[]string{"fish", "-C", "notify {{result}}", "-c", "true"}, "argv[2]"},
		{[]string{"SH.EXE", "-c", "notify {{result}}"}, "argv[2]"},
		{[]string{`C:\msys64\usr\bin\bash.exe`, "-c", "notify {{result}}"}, "argv[2]"},
		{[]string{"sh", "-o", "{{result}}", "-c", "true"}, "argv[2]"},
		{[]string{"sh", "-{{result}}", "-c", "true"}, "argv[1]"},
		// the script file a shell runs
		{[]string{"sh", "{{result}}"}, "argv[1]"},
		{[]string{"bash", "-x", "/tmp/{{origin.script}}.sh"}, "argv[2]"},
		// a shell reading its script from stdin, which is the prompt
		{[]string{"sh"}, "argv[0]"},
		{[]string{"bash", "-x"}, "argv[0]"},
		{[]string{"sh", "-s", "{{result}}"}, "argv[0]"},
		{[]string{"env", "sh"}, "argv[1]"},
		// through a program that runs another
		{[]string{"env", "sh", "-c", "notify {{result}}"}, "argv[3]"},
		{[]string{"/usr/bin/env", "-i", "PATH=/bin", "bash", "-c", "notify {{result}}"}, "argv[5]"},
		{[]string{"env", "-S", "sh -c 'notify {{result}}'"}, "argv[2]"},
		{[]string{"env", "--split-string=sh -c 'notify {{result}}'"}, "argv[1]"},
		{[]string{"busybox", "sh", "-c", "notify {{result}}"}, "argv[3]"},
		{[]string{"busybox", "ash", "-c", "notify {{result}}"}, "argv[3]"},
		{[]string{"sudo", "-u", "bot", "sh", "-c", "notify {{result}}"}, "argv[5]"},
		{[]string{"timeout", "30", "nice", "-n", "5", "bash", "-c", "notify {{result}}"}, "argv[7]"},
		{[]string{"nohup", "setsid", "sh", "-c", "notify {{result}}"}, "argv[4]"},
		{[]string{"xargs", "-0", "sh", "-c", "notify {{result}}"}, "argv[4]"},
		{[]string{"docker", "exec", "bot", "sh", "-c", "notify {{result}}"}, "argv[5]"},
		{[]string{"kubectl", "exec", "pod", "--", "bash", "-c", "notify {{result}}"}, "argv[6]"},
		{[]string{"su", "bot", "-c", "notify {{result}}"}, "argv[3]"},
		{[]string{"runuser", "-u", "bot", "--command=notify {{result}}"}, "argv[3]"},
		{[]string{"flock", "/tmp/lock", "-c", "notify {{result}}"}, "argv[3]"},
		{[]string{"script", "-qc", "notify {{result}}"}, "argv[2]"},
		// programs that join their arguments into a command line a shell parses
		{[]string{"ssh", "host", "notify", "{{result}}"}, "argv[3]"},
		{[]string{"watch", "-n", "1", "notify {{result}}"}, "argv[3]"},
		{[]string{"pwsh", "-NoProfile", "-Command", "notify {{result}}"}, "argv[3]"},
		{[]string{"cmd.exe", "/d", "/c", "notify {{result}}"}, "argv[3]"},
		{[]string{"tmux", "send-keys", "-t", "agent", "{{prompt}}", "Enter"}, "argv[4]"},
		// interpreters' inline programs, program files and stdin
		{[]string{"python3", "-c", "print('{{result}}')"}, "argv[2]"},
		{[]string{"python3.12", "-Ic", "print('{{result}}')"}, "argv[2]"},
		{[]string{"python", "-W", "ignore", "-c", "print('{{result}}')"}, "argv[4]"},
		{[]string{"python3", "-m", "{{result}}"}, "argv[2]"},
		{[]string{"python3", "{{result}}.py"}, "argv[1]"},
		{[]string{"python3"}, "argv[0]"},
		{[]string{"python3", "-"}, "argv[0]"},
		{[]string{"perl", "-le", "print q({{result}})"}, "argv[2]"},
		{[]string{"perl", "-Mstrict", "-eprint q({{result}})"}, "argv[2]"},
		{[]string{"ruby", "-I", "lib", "-e", "puts '{{result}}'"}, "argv[4]"},
		{[]string{"node", "--eval", "console.log('{{result}}')"}, "argv[2]"},
		{[]string{"node", "-p", "'{{result}}'"}, "argv[2]"},
		{[]string{"php", "-r", "echo '{{result}}';"}, "argv[2]"},
		// the program itself
		{[]string{"{{result}}"}, "argv[0]"},
		{[]string{"/opt/{{origin.tool}}/notify", "x"}, "argv[0]"},
	} {
		_, err := engine.ParseSpec(execSpec(t, tc.argv...))
		var fe *engine.FieldError
		if !errors.As(err, &fe) || fe.Field != "deliver[0].argv" || !strings.HasPrefix(fe.Reason, tc.arg+" ") {
			t.Errorf("argv %q: error %v, want deliver[0].argv: %s ...", tc.argv, err, tc.arg)
			continue
		}
		for _, hint := range []string{"stdin", "BGTASK_TASK_ID", "BGTASK_*"} {
			if !strings.Contains(fe.Reason, hint) {
				t.Errorf("argv %q: error %q does not point to %s", tc.argv, fe.Reason, hint)
			}
		}
	}
}

// Placeholders where no shell parses them stay allowed: arguments of a program,
// and a shell's positional parameters after its script.
func TestExecArgvAllowsPlaceholdersAsArguments(t *testing.T) {
	t.Parallel()
	for _, argv := range [][]string{
		{"claude", "--resume", "{{origin.session}}", "-p"},
		{"notify", "{{result}}", "{{tail}}", "{{prompt}}"},
		{"openclaw", "system", "event", "--text", "{{prompt}}", "--mode", "now"},
		{"sh", "-c", `notify "$1"`, "sh", "{{result}}"},
		{"sh", "-c", `notify "$(cat)"`},
		{"bash", "-o", "pipefail", "-c", `notify "$1" "$2"`, "bash", "{{result}}", "{{origin.chat}}"},
		{"sh", "/opt/hooks/notify.sh", "{{task_id}}", "{{status}}"},
		{"fish", "-c", "notify $argv", "{{result}}"},
		{"env", "CHAT={{origin.chat}}", "notify", "{{result}}"},
		{"timeout", "30", "notify", "{{result}}"},
		{"python3", "-c", "import sys; print(sys.argv[1])", "{{result}}"},
		{"python3", "/opt/notify.py", "{{result}}"},
		{"python3", "-m", "notify", "{{result}}"},
		{"perl", "-e", "print $ARGV[0]", "{{result}}"},
		{"su", "bot", "-c", `notify "$0"`, "{{result}}"},
	} {
		if _, err := engine.ParseSpec(execSpec(t, argv...)); err != nil {
			t.Errorf("argv %q refused: %v", argv, err)
		}
	}
}
