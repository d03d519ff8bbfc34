package gemini

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bgtask/bgtask/agents/internal/setup"
)

func TestRunsAddFindsTheCommandsThatRegisterATask(t *testing.T) {
	for command, want := range map[string]bool{
		"bgtask add -- make test":                          true,
		"  bgtask add --json -- 'sleep 5; echo done'":      true,
		"/usr/local/bin/bgtask add -- make":                true,
		"bgtask --home /tmp/h add -- make":                 true,
		"bgtask --home=/tmp/h add -- make":                 true,
		"cd app && bgtask add -- make":                     true,
		"make lint; bgtask add -- make test":               true,
		"id=$(bgtask add -- make) && echo $id":             true,
		"FOO=1 env BAR=2 bgtask add --env X=1 -- make":     true,
		"exec bgtask add -- make":                          true,
		"bgtask add --help":                                false,
		"bgtask add -h":                                    false,
		"bgtask add -- grep -h x f":                        true, // -h is the command's
		"bgtask list":                                      false,
		"bgtask wait 0196f3 && bgtask show 0196f3":         false,
		"bgtask --home add list":                           false, // add is --home's value
		"echo 'bgtask add -- make'":                        false,
		`echo "run: bgtask add -- make"`:                   false,
		"echo bgtask add":                                  false,
		"mybgtask add -- x":                                false,
		"git add . && git commit -m 'bgtask add support'":  false,
		`printf '%s\n' "a;b" | bgtask add --each-line`:     true,
		"bgtask add \\\n  -- make":                         true,
		"bash -c 'bgtask add -- make'":                     false, // a script the shell does not read
		"":                                                 false,
		"(bgtask add -- make)":                             true,
		"`bgtask add -- make`":                             true,
		`"bgtask" add -- make`:                             true,
		"bgtask":                                           false,
		"bgtask --home":                                    false,
		"FOO=1":                                            false,
		"1FOO=x bgtask add -- make":                        false, // not an assignment: a program
		"bgtask add; echo 'unbalanced":                     true,
		"true\nbgtask add -- make\n":                       true,
		"bgtask show add":                                  false,
		"sudo bgtask add -- make":                          false, // another user's bgtask: not this session's
		"bgtask add -- echo a\\;b":                         true,
		`bgtask add -- sh -c "echo \"x; y\""`:              true,
		"bgtask add --each-line < cmds.txt":                true,
		"bgtask  add":                                      true,
		"\tbgtask\tadd\t--\tmake":                          true,
		"bgtask --timeout 5s add -- make":                  true,
		"bgtask --nats nats://h:4222 --creds c add -- x":   true,
		"bgtask --nats nats://h:4222 --creds add add -- x": true,
	} {
		if got := RunsAdd(command); got != want {
			t.Errorf("RunsAdd(%q) = %v, want %v", command, got, want)
		}
	}
}

// The rewritten call runs the waiter with the session and the model's very
// command, however it is quoted, in the background.
func TestRewriteHandsTheCallToAWaiter(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "bgtask")
	// A bgtask that prints its arguments, one a line.
	if err := os.WriteFile(fake, []byte("#!/bin/sh\nfor a; do printf '%s\\n' \"$a\"; done\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	const sid = "6b1ffa89-8a2d-453b-9f68-b0d7306e393b"
	for _, command := range []string{
		"bgtask add -- make test",
		`bgtask add -- sh -c 'echo "it'\''s $HOME" && exit 3'`,
		"cd 'my dir' && bgtask add --json -- `which make`\n",
	} {
		input, ok := Rewrite(setup.Quote(fake)+" --home "+setup.Quote(dir), sid, 4242, command)
		if !ok {
			t.Fatalf("%q was not rewritten", command)
		}
		if input["is_background"] != true {
			t.Errorf("%q: not run in the background: %v", command, input)
		}
		out, err := exec.Command("sh", "-c", input["command"].(string)).Output()
		if err != nil {
			t.Fatal(err)
		}
		want := strings.Join([]string{"--home", dir, "hook", "gemini", "attach", "--pid", "4242", sid, "--", command}, "\n") + "\n"
		if string(out) != want {
			t.Errorf("%q ran as\n%s\nwant\n%s", command, out, want)
		}
	}
	if input, ok := Rewrite("bgtask", sid, 4242, "make test"); ok {
		t.Errorf("a call that registers no task was rewritten: %v", input)
	}
}
