package main

import (
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/internal/testkit"
)

// A timer paused before its time does not fire when its time passes, and fires at
// once, late, when it is resumed; a finished task cannot be paused.
func TestAPausedTimerFiresWhenResumed(t *testing.T) {
	testkit.FullOnly(t)
	home := t.TempDir()
	startServer(t, home)
	id := addTask(t, home, "--delay", "500ms", "--prompt", "resumed")
	bgtask(t, home, "pause", id).must(t, 0, "pause")
	time.Sleep(time.Second) // the timer's time passes while it is paused
	shown := decode[struct {
		Phase   engine.Phase `json:"state"`
		Paused  bool         `json:"paused"`
		Waiting string       `json:"waiting"`
	}](t, bgtask(t, home, "show", id, "--json").must(t, 0, "show").stdout)
	if shown.Phase != engine.PhaseArmed || !shown.Paused || !strings.HasPrefix(shown.Waiting, "paused") {
		t.Fatalf("a paused timer past its time: %+v", shown)
	}
	bgtask(t, home, "resume", id).must(t, 0, "resume")
	w := decode[struct {
		Status string `json:"status"`
		Prompt string `json:"prompt"`
		LateBy string `json:"late_by"`
	}](t, bgtask(t, home, "wait", id, "--json", "--timeout", "30s").must(t, 0, "wait").stdout)
	if late, err := time.ParseDuration(w.LateBy); w.Status != engine.StatusSucceeded || w.Prompt != "resumed" || err != nil || late < 500*time.Millisecond {
		t.Fatalf("wake-up of the resumed timer: %+v", w)
	}
	if r := bgtask(t, home, "pause", id); r.code != client.ExitConflict {
		t.Fatalf("pause of a fired task: exit %d, %s; want %d", r.code, r.stderr, client.ExitConflict)
	}
}
