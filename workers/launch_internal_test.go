package workers

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/workers/shim"
)

// A shim that can neither start the command nor record why tells the worker on
// its stderr, which the worker reads until the start is recorded.
func TestAShimThatCannotRecordItsStartSaysWhy(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// The exit file's temporary name taken by a directory (root may write
	// anywhere, but not a file over a directory): its room cannot be reserved, so
	// nothing starts, and nor can the exit file be written.
	if err := os.Mkdir(filepath.Join(dir, shim.ExitFile+".tmp"), 0o700); err != nil {
		t.Fatal(err)
	}
	err = launchShim([]string{self, "shim"}, dir, shimRun{Path: "/bin/true", Args: []string{"true"}, Dir: dir})
	if err == nil || !strings.Contains(err.Error(), "reserve the exit file") || !strings.Contains(err.Error(), "is a directory") {
		t.Fatalf("launch = %v, want the shim's reasons: no room reserved for the exit file, none written", err)
	}
}

// A shim started while its task's spawn is appended starts nothing if the spawn is
// not the worker's: cancelled, it ends without the command having run.
func TestAShimCancelledBeforeItsRunStartsNothing(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, ran := t.TempDir(), filepath.Join(t.TempDir(), "ran")
	run := shimRun{Path: "/bin/sh", Args: []string{"sh", "-c", `touch "$0"`, ran}, Dir: dir, Env: []string{"PATH=/usr/bin:/bin"}}
	s, err := startShim([]string{self, "shim"}, dir, run)
	if err != nil {
		t.Fatal(err)
	}
	s.cancel() // returns once the shim has ended
	if _, err := os.Stat(ran); err == nil {
		t.Fatal("the command of a cancelled shim ran")
	}
	for _, f := range []string{shim.StartingFile, shim.PIDFile, shim.ExitFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			t.Errorf("a cancelled shim wrote %s", f)
		}
	}
	if shimAlive(dir) {
		t.Error("a cancelled shim still holds the run's start lock")
	}
}

// A shim that could not be sent its run (here its directory is gone, and with it
// the start lock) ends with nothing started, and the hand returns why: the run's
// slot is not held for ever by a shim waiting for the rest of its run.
func TestAShimNotSentItsRunEndsAndTheHandReturns(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "gone")
	s, err := startShim([]string{self, "shim"}, dir, shimRun{Path: "/bin/true", Args: []string{"true"}, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	handed := make(chan error, 1)
	go func() { handed <- s.hand() }()
	select {
	case err = <-handed:
	case <-time.After(10 * time.Second):
		s.sh.sock.Close() // lets the hand and the shim end
		<-handed
		t.Fatal("the hand still waits, after 10 s, on a shim that was never sent its run")
	}
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("hand = %v, want the send's error: the run's directory does not exist", err)
	}
}

// A bgtask-shim beside the binary is used only if it speaks the worker's
// protocol: one of another build would start no run.
func TestABgtaskShimOfAnotherProtocolIsNotUsed(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	exe := filepath.Join(dir, "bgtask")
	for _, c := range []struct {
		script string
		use    bool
	}{
		{"#!/bin/sh\nexec " + self + " shim \"$@\"\n", true},
		{"#!/bin/sh\necho bgtask-shim protocol 1\n", false},
	} {
		if err := os.WriteFile(filepath.Join(dir, "bgtask-shim"), []byte(c.script), 0o755); err != nil {
			t.Fatal(err)
		}
		if _, ok := LightShim(exe); ok != c.use {
			t.Errorf("bgtask-shim %q: used %v, want %v", c.script, ok, c.use)
		}
	}
}
