package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/events"
)

// hostile is text with the sequences a terminal acts on: a clear screen (CSI), a
// title and a clipboard write (OSC, ended by BEL and by ST), an 8-bit CSI, a
// bidirectional override and a backspace.
const hostile = "a\x1b[2J\x1b]0;owned\x07\x1b]52;c;ZWNobyBvd25lZA==\x1b\\\u009b31m\u202ebc\bz"

func hostileTask() api.TaskView {
	code := 1
	st := engine.State{
		ID: "0194f1c2-7a3b-7c4d-8e5f-601234567890", Phase: engine.PhaseFired, Status: "failed" + hostile,
		ArmedAt: time.Now(), Reason: hostile, Worker: "w" + hostile, Host: "h" + hostile,
		Spec: engine.Spec{
			Command: "echo " + hostile, Kind: "k" + hostile, Cwd: "/tmp/" + hostile, Target: "t",
			Deliver: []engine.Sink{{Type: engine.SinkExec, Argv: []string{"notify", hostile}}},
		},
		Run: &events.Exited{ExitCode: code, Tail: []string{"out " + hostile, "\ttabbed"}, MatchedLine: hostile},
	}
	v := api.View(st)
	v.Result = "line one " + hostile + "\nline two"
	v.Waiting = "waiting " + hostile
	return v
}

// TestHumanOutputEscapesControlSequences: list and show print what a task's owner
// wrote with its control characters escaped, so none reaches the terminal.
func TestHumanOutputEscapesControlSequences(t *testing.T) {
	t.Parallel()
	for name, print := range map[string]func(*bytes.Buffer) error{
		"list": func(b *bytes.Buffer) error {
			return printTaskTable(b, api.ListReply{Tasks: []api.TaskView{hostileTask()}, Total: 1})
		},
		"show": func(b *bytes.Buffer) error { return printTask(b, hostileTask()) },
	} {
		var b bytes.Buffer
		if err := print(&b); err != nil {
			t.Fatal(err)
		}
		out := b.String()
		for _, c := range []string{"\x1b", "\x07", "\b", "\u009b", "\u202e"} {
			if strings.Contains(out, c) {
				t.Errorf("%s printed %q raw:\n%s", name, c, out)
			}
		}
		if !strings.Contains(out, `a\x1b[2J\x1b]0;owned\x07`) || !strings.Contains(out, `\u009b31m\u202ebc\x08z`) {
			t.Errorf("%s does not show the escapes:\n%s", name, out)
		}
	}
	var b bytes.Buffer
	if err := printTask(&b, hostileTask()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "\n  \ttabbed\n") {
		t.Errorf("show escaped a tab of the output:\n%s", b.String())
	}
}

func TestOneLineCutsAtACharacterBoundary(t *testing.T) {
	t.Parallel()
	got := oneLine(strings.Repeat("é", 40), 21)
	if want := strings.Repeat("é", 9) + "…"; got != want {
		t.Fatalf("oneLine = %q, want %q", got, want)
	}
}
