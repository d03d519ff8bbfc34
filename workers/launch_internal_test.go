package workers

import (
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/internal/testkit"
	"github.com/bgtask/bgtask/workers/shim"
)

// A shim that can neither start the command nor record why tells the worker
// why, and the hand returns it.
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
	s := &shims{cmd: []string{self, "shim"}, log: slog.New(slog.DiscardHandler)}
	defer s.close()
	err = s.hand(dir, shimRun{Path: "/bin/true", Args: []string{"true"}, Dir: dir})
	if err == nil || !strings.Contains(err.Error(), "reserve the exit file") || !strings.Contains(err.Error(), "is a directory") {
		t.Fatalf("hand = %v, want the shim's reasons: no room reserved for the exit file, none written", err)
	}
	// The shim goes on: the next run starts.
	next := t.TempDir()
	if err := s.hand(next, shimRun{Path: "/bin/true", Args: []string{"true"}, Dir: next}); err != nil || !recorded(next) {
		t.Fatalf("the next hand = %v, recorded %v; want its start recorded", err, recorded(next))
	}
	// The shim writes its exit file into the directory once it ends: not while
	// the test removes the directory.
	testkit.Eventually(t, 10*time.Second, "the next run's exit recorded", func() bool {
		return exists(filepath.Join(next, shim.ExitFile))
	})
}

// A run that cannot be sent (here its directory is gone, and with it the start
// lock) is not waited for: the hand returns why.
func TestARunNotSentIsNotWaitedFor(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	s := &shims{cmd: []string{self, "shim"}, log: slog.New(slog.DiscardHandler)}
	defer s.close()
	handed := make(chan error, 1)
	go func() {
		handed <- s.hand(filepath.Join(t.TempDir(), "gone"), shimRun{Path: "/bin/true", Args: []string{"true"}, Dir: t.TempDir()})
	}()
	select {
	case err = <-handed:
	case <-time.After(10 * time.Second):
		s.close() // lets the hand end
		<-handed
		t.Fatal("the hand still waits, after 10 s, for a run that was never sent")
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
		if _, ok := lightShim(exe); ok != c.use {
			t.Errorf("bgtask-shim %q: used %v, want %v", c.script, ok, c.use)
		}
	}
}

// A run handed to a shim that ends as it comes, without taking it, goes to a
// shim started for it, and starts.
func TestARunHandedToAShimThatEndedGoesToANewOne(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ours, theirs, err := socketPair()
	if err != nil {
		t.Fatal(err)
	}
	go func() { // a shim that reads the run, drops it with its lock, and ends
		_, _ = theirs.Read(make([]byte, 1<<16))
		theirs.Close()
	}()
	said, stderr, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr.Close()
	ended := &liveShim{sock: ours, said: said}
	go ended.hear()
	s := &shims{cmd: []string{self, "shim"}, log: slog.New(slog.DiscardHandler), live: ended}
	defer s.close()
	dir := t.TempDir()
	if err := s.hand(dir, shimRun{Path: "/bin/true", Args: []string{"true"}, Dir: dir}); err != nil || !recorded(dir) {
		t.Fatalf("hand = %v, recorded %v; want the run started by a new shim", err, recorded(dir))
	}
}
