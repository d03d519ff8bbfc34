package workers

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The directories of finished runs go together, once the delay has passed; a
// flush (the worker's stop) removes those still waiting, and any given after it,
// at once.
func TestTheDirectoriesOfFinishedRunsGoLaterOrOnAFlush(t *testing.T) {
	base := t.TempDir()
	run := func(name string) string {
		dir := filepath.Join(base, name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "exit.json"), []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
		return dir
	}

	later := sweeper{delay: time.Millisecond}
	a, b := run("a"), run("b")
	later.remove(a)
	later.remove(b)
	later.sweeping.Wait() // the sweep the delay set off
	if exists(a) || exists(b) {
		t.Fatalf("after the delay: a there %v, b there %v; want both removed", exists(a), exists(b))
	}

	waiting := sweeper{delay: time.Hour}
	c := run("c")
	waiting.remove(c)
	if !exists(c) {
		t.Fatal("removed at once; want it kept until the delay or a flush")
	}
	waiting.flush()
	if exists(c) {
		t.Fatal("still there after the flush")
	}
	// A run that ends while the worker stops goes at once.
	d := run("d")
	waiting.remove(d)
	if exists(d) {
		t.Fatal("given after the flush, and still there")
	}
	waiting.flush() // nothing waits: returns
}
