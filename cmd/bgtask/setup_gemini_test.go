package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bgtask/bgtask/client"
)

// A settings file setup would lose something of is refused with the usage exit
// status, naming the file and why, and nothing changes.
func TestSetupGeminiRefusesSettingsWithComments(t *testing.T) {
	user := t.TempDir()
	t.Setenv("HOME", user)
	t.Setenv("GEMINI_CLI_HOME", "")
	path := mkdirFor(t, filepath.Join(user, ".gemini", "settings.json"))
	const mine = "{\n  // dark, always\n  \"theme\": \"dark\"\n}\n"
	if err := os.WriteFile(path, []byte(mine), 0o644); err != nil {
		t.Fatal(err)
	}
	r := bgtask(t, t.TempDir(), "setup", "gemini").must(t, client.ExitUsage, "setup over comments")
	if !strings.Contains(r.stderr, path) || !strings.Contains(r.stderr, "has comments") {
		t.Errorf("the error does not name the file and the reason: %s", r.stderr)
	}
	if data, _ := os.ReadFile(path); string(data) != mine {
		t.Errorf("a refused setup changed the file: %q", data)
	}
}
