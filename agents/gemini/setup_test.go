package gemini

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// userSettings makes HOME a directory of the test's with Gemini CLI's settings
// file holding data (nil: none), and returns its path.
func userSettings(t *testing.T, data []byte) string {
	t.Helper()
	user := t.TempDir()
	t.Setenv("HOME", user)
	t.Setenv("GEMINI_CLI_HOME", "")
	path := filepath.Join(user, ".gemini", "settings.json")
	if data != nil {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o640); err != nil {
			t.Fatal(err)
		}
	}
	return path
}

func runSetup(t *testing.T, home string, remove bool) (string, error) {
	t.Helper()
	var out syncBuffer
	err := Setup{Remove: remove, Bgtask: "/usr/local/bin/bgtask", Home: home, Stdout: &out, Stderr: io.Discard}.Run()
	return out.String(), err
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// Setup, a second setup and a remove give the user back their file, byte for
// byte, with its mode; the settings setup changed get their values back.
func TestSetupAndRemoveGiveBackTheFile(t *testing.T) {
	for _, mine := range []string{`{"theme": "keep-me"}` + "\n", `{ "experimental":{"modelSteering":false} }`} {
		path := userSettings(t, []byte(mine))
		home := t.TempDir()
		if _, err := runSetup(t, home, false); err != nil {
			t.Fatal(err)
		}
		once := readFile(t, path)
		if !strings.Contains(once, `"modelSteering": true`) || !strings.Contains(once, "'/usr/local/bin/bgtask' --home '"+home+"' hook gemini BeforeTool") {
			t.Fatalf("after setup:\n%s", once)
		}
		if out, err := runSetup(t, home, false); err != nil || readFile(t, path) != once || !strings.Contains(out, "already") {
			t.Fatalf("a second setup (%v, %q) changed the file:\n%s", err, out, readFile(t, path))
		}
		if _, err := runSetup(t, home, true); err != nil {
			t.Fatal(err)
		}
		if got := readFile(t, path); got != mine {
			t.Errorf("after remove: %q, want the original %q", got, mine)
		}
		if st, _ := os.Stat(path); st.Mode().Perm() != 0o640 {
			t.Errorf("mode %v, want 0640 kept", st.Mode().Perm())
		}
		if out, err := runSetup(t, home, true); err != nil || !strings.Contains(out, "nothing to remove") {
			t.Errorf("a second remove: %q, %v", out, err)
		}
	}
}

// With no settings file, setup makes one and a remove takes it away again;
// $GEMINI_CLI_HOME stands for the home directory, as it does for Gemini CLI.
func TestSetupInGeminiCLIHome(t *testing.T) {
	userSettings(t, nil)
	dir := t.TempDir()
	t.Setenv("GEMINI_CLI_HOME", dir)
	path := filepath.Join(dir, ".gemini", "settings.json")
	home := t.TempDir()
	if _, err := runSetup(t, home, false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(readFile(t, path), "hook gemini SessionEnd") {
		t.Fatalf("setup did not write %s", path)
	}
	if _, err := runSetup(t, home, true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("the file setup made is still there: %v", err)
	}
}

// A settings file setup does not understand is refused, naming the file and
// why, and nothing changes.
func TestSetupRefusesSettingsWithComments(t *testing.T) {
	const mine = "{\n  // my theme\n  \"theme\": \"keep-me\"\n}\n"
	path := userSettings(t, []byte(mine))
	home := t.TempDir()
	_, err := runSetup(t, home, false)
	var bad *SettingsError
	if !errors.As(err, &bad) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "has comments") {
		t.Fatalf("setup over comments: %v", err)
	}
	if got := readFile(t, path); got != mine {
		t.Errorf("a refused setup changed the file: %q", got)
	}
	if kept, _ := filepath.Glob(filepath.Join(home, "*")); len(kept) != 0 {
		t.Errorf("a refused setup left %v in the home", kept)
	}
}

// A settings file that is a symbolic link stays one: the file it leads to is
// changed, and given back.
func TestSetupThroughASymbolicLink(t *testing.T) {
	const mine = `{"theme": "keep-me"}`
	path := userSettings(t, nil)
	dotfiles := filepath.Join(t.TempDir(), "gemini-settings.json")
	if err := os.WriteFile(dotfiles, []byte(mine), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(dotfiles, path); err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	if _, err := runSetup(t, home, false); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Lstat(path); err != nil || st.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("the link was replaced: %v", err)
	}
	if !strings.Contains(readFile(t, dotfiles), "hook gemini") {
		t.Fatalf("the file the link leads to was not changed")
	}
	if _, err := runSetup(t, home, true); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, dotfiles); got != mine {
		t.Errorf("after remove: %q", got)
	}
}
