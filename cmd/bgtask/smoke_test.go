package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// The quick lane's smoke test of the whole path through a real server: a
// command registered with add runs, exits, and fires; wait prints its wake-up
// with its exit code and output, and the wake-up waits in its target's inbox
// until inbox prints and acknowledges it.
func TestTheWholePathFromAddToTheInbox(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home) // no profile of this machine's in the workers' login shell
	startServer(t, home)
	id := addTask(t, home, "--target", "smoke", "--", "echo from-the-command; exit 3")

	w := decode[events.Wakeup](t, bgtask(t, home, "wait", id, "--json", "--timeout", "60s").must(t, client.ExitTaskFailed, "wait").stdout)
	if w.ID != id || w.Status != engine.StatusFailed || w.ExitCode == nil || *w.ExitCode != 3 || !slices.Contains(w.Tail, "from-the-command") {
		t.Fatalf("wait printed %+v, want %s failed with exit code 3 and its output", w, id)
	}
	inbox := strings.TrimSpace(bgtask(t, home, "inbox", "--target", "smoke", "--json").must(t, 0, "inbox").stdout)
	if lines := strings.Split(inbox, "\n"); len(lines) != 1 || decode[events.Wakeup](t, lines[0]).ID != id {
		t.Fatalf("the inbox of smoke holds %q, want the wake-up of %s alone", inbox, id)
	}
	if inboxUnacked(t, home, "smoke") {
		t.Fatal("the wake-up inbox printed is not acknowledged")
	}
}
