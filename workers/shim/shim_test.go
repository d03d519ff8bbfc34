package shim

import (
	"encoding/json"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The shim writes its JSON by hand; the worker reads it with encoding/json.
func TestTheFilesTheShimWritesReadBackTheSame(t *testing.T) {
	at := time.Date(2026, 11, 30, 9, 13, 34, 397335882, time.UTC)
	for _, want := range []Exit{
		{ExitCode: 0, StartedAt: at, EndedAt: at.Add(time.Second)},
		{ExitCode: 143, Signal: "TERM", StoppedBy: StoppedByDeadline, StartedAt: at, EndedAt: at},
		{ExitCode: 0, StartedAt: at, EndedAt: at, StartError: `fork/exec "/no/such": no such file; tab	nl
nul` + "\x00 \x1f <&> é 日本 \u2028"},
	} {
		var got Exit
		if err := json.Unmarshal(want.appendJSON(nil), &got); err != nil {
			t.Fatalf("%s: %v", want.appendJSON(nil), err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("read back %+v, want %+v", got, want)
		}
	}
	var got Exit
	if err := json.Unmarshal(Exit{StartError: "bad \xff utf-8"}.appendJSON(nil), &got); err != nil || got.StartError != "bad \ufffd utf-8" {
		t.Errorf("invalid UTF-8 read back as %q (%v), want it replaced", got.StartError, err)
	}

	pids := PIDs{Shim: ProcRef{PID: 25486, Start: 2350865}, Command: ProcRef{PID: 1 << 22, Start: 1<<64 - 1}, Started: at}
	var gotPIDs PIDs
	if err := json.Unmarshal(pids.appendJSON(nil), &gotPIDs); err != nil || gotPIDs != pids {
		t.Errorf("read back %+v (%v), want %+v", gotPIDs, err, pids)
	}
}

func TestArgumentsReadBackTheSameRun(t *testing.T) {
	for _, want := range []Run{
		{Dir: "/state/runs/a.1", Cwd: "/home/u", Path: "/bin/bash", Args: []string{"bash", "-c", "echo --dir=x -- y"}},
		{Dir: "/d", Cwd: "/", Path: "/bin/sleep", Args: []string{"sleep", "--", "1"},
			Deadline: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC), StallAfter: 90 * time.Second, KillGrace: 1500 * time.Millisecond},
	} {
		got, err := parseArgs(want.ShimArgs())
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("parseArgs(%q) = %+v, %v; want %+v", want.ShimArgs(), got, err, want)
		}
	}
	for _, bad := range [][]string{
		nil,
		{"--dir=/d"},
		{"--dir=/d", "--", "/bin/true"},
		{"--cwd=/", "--", "/bin/true", "true"},
		{"--dir=/d", "--bogus=1", "--", "/bin/true", "true"},
		{"--dir=/d", "--kill-grace=soon", "--", "/bin/true", "true"},
		{"/d", "--", "/bin/true", "true"},
	} {
		if _, err := parseArgs(bad); err == nil {
			t.Errorf("parseArgs(%q) = nil error, want one", bad)
		}
	}
}

// A shim lives as long as its command, one per running task: it must not grow the
// packages that take a third more memory (see the package comment), nor anything
// of the rest of bgtask.
func TestTheShimBinaryStaysSmall(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/bgtask/bgtask/cmd/bgtask-shim").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for dep := range strings.FieldsSeq(string(out)) {
		heavy := dep == "fmt" || strings.HasPrefix(dep, "encoding/json") || strings.HasPrefix(dep, "log") || strings.HasPrefix(dep, "net") ||
			strings.HasPrefix(dep, "github.com/") && !strings.HasPrefix(dep, "github.com/bgtask/bgtask/workers/shim") && dep != "github.com/bgtask/bgtask/cmd/bgtask-shim"
		if heavy {
			t.Errorf("bgtask-shim depends on %s", dep)
		}
	}
}
