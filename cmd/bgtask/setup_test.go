package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// setupRuntime is one runtime's `bgtask setup`, run with its configuration
// directory in a temp dir.
type setupRuntime struct {
	name string
	// prepare points the runtime at a fresh configuration directory (made) and
	// returns the settings file setup edits.
	prepare func(t *testing.T) string
}

var setupRuntimes = []setupRuntime{
	{"claude-code", func(t *testing.T) string {
		user := t.TempDir()
		t.Setenv("HOME", user)
		return mkdirFor(t, filepath.Join(user, ".claude", "settings.json"))
	}},
	{"codex", func(t *testing.T) string {
		codexHome := filepath.Join(t.TempDir(), "codex")
		t.Setenv("CODEX_HOME", codexHome)
		return mkdirFor(t, filepath.Join(codexHome, "hooks.json"))
	}},
	{"gemini", func(t *testing.T) string {
		user := t.TempDir()
		t.Setenv("HOME", user)
		t.Setenv("GEMINI_CLI_HOME", "")
		return mkdirFor(t, filepath.Join(user, ".gemini", "settings.json"))
	}},
	{"openclaw", func(t *testing.T) string {
		state := filepath.Join(t.TempDir(), "openclaw")
		t.Setenv("OPENCLAW_STATE_DIR", state)
		t.Setenv("OPENCLAW_CONFIG_PATH", "")
		return mkdirFor(t, filepath.Join(state, "openclaw.json"))
	}},
}

func mkdirFor(t *testing.T, path string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// A settings file that is a relative symbolic link into a dotfiles directory
// stays a link: setup and --remove edit the file it leads to, keep its mode and
// leave no temp file behind.
func TestSetupWritesThroughASymlinkedSettingsFile(t *testing.T) {
	for _, rt := range setupRuntimes {
		t.Run(rt.name, func(t *testing.T) {
			home := t.TempDir()
			path := rt.prepare(t)
			dotfiles := mkdirFor(t, filepath.Join(filepath.Dir(path), "..", "dotfiles", "settings.json"))
			mine := `{"theme": "dark", "hooks": {"Stop": [{"hooks": [{"type": "command", "command": "say done"}]}]}}`
			if err := os.WriteFile(dotfiles, []byte(mine), 0o640); err != nil {
				t.Fatal(err)
			}
			link := filepath.Join("..", "dotfiles", "settings.json")
			if err := os.Symlink(link, path); err != nil {
				t.Fatal(err)
			}
			keptLink := func(what string, hooks bool) {
				t.Helper()
				if dest, err := os.Readlink(path); err != nil || dest != link {
					t.Fatalf("after %s, %s is no longer the link to %s: %q, %v", what, path, link, dest, err)
				}
				data, _ := os.ReadFile(dotfiles)
				if !strings.Contains(string(data), `"dark"`) || !strings.Contains(string(data), "say done") ||
					strings.Contains(string(data), "bgtask") != hooks {
					t.Fatalf("after %s, the link's target (bgtask's hooks: want %v):\n%s", what, hooks, data)
				}
				if st, _ := os.Stat(dotfiles); st.Mode().Perm() != 0o640 {
					t.Errorf("after %s, the target's mode is %v", what, st.Mode().Perm())
				}
				for _, dir := range []string{filepath.Dir(path), filepath.Dir(dotfiles)} {
					entries, _ := os.ReadDir(dir)
					if len(entries) != 1 {
						t.Errorf("after %s, %s holds %v", what, dir, entries)
					}
				}
			}
			bgtask(t, home, "setup", rt.name).must(t, 0, "setup")
			keptLink("setup", true)
			bgtask(t, home, "setup", rt.name, "--remove").must(t, 0, "setup --remove")
			keptLink("--remove", false)

			// A file that only bgtask's hooks fill is kept after --remove: the link
			// would lead nowhere.
			if err := os.WriteFile(dotfiles, nil, 0o640); err != nil {
				t.Fatal(err)
			}
			bgtask(t, home, "setup", rt.name).must(t, 0, "setup on an empty file")
			bgtask(t, home, "setup", rt.name, "--remove").must(t, 0, "setup --remove of all there is")
			if data, err := os.ReadFile(path); err != nil || strings.Contains(string(data), "bgtask") {
				t.Errorf("after --remove of all there was, through the link: %v\n%s", err, data)
			}
		})
	}
}

// A link that leads nowhere is refused, with a message naming it, and nothing
// is made or changed.
func TestSetupRefusesADanglingSettingsLink(t *testing.T) {
	for _, rt := range setupRuntimes {
		t.Run(rt.name, func(t *testing.T) {
			home := t.TempDir()
			path := rt.prepare(t)
			missing := filepath.Join(t.TempDir(), "gone", "settings.json")
			if err := os.Symlink(missing, path); err != nil {
				t.Fatal(err)
			}
			for _, args := range [][]string{{"setup", rt.name}, {"setup", rt.name, "--remove"}} {
				r := bgtask(t, home, args...)
				if r.code == 0 || !strings.Contains(r.stderr, path) || !strings.Contains(r.stderr, "does not exist") ||
					!strings.Contains(r.stderr, "nothing was changed") {
					t.Errorf("%s on a dangling link: exit %d, stderr %q", strings.Join(args, " "), r.code, r.stderr)
				}
				if dest, err := os.Readlink(path); err != nil || dest != missing {
					t.Fatalf("the link was changed: %q, %v", dest, err)
				}
				if _, err := os.Stat(filepath.Dir(missing)); !os.IsNotExist(err) {
					t.Errorf("the link's missing target was made: %v", err)
				}
				if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 1 {
					t.Errorf("%s holds %v", filepath.Dir(path), entries)
				}
			}
		})
	}
}

// Run as root on another user's settings file, setup leaves it that user's,
// with its mode.
func TestSetupKeepsTheSettingsFilesOwnerAndMode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give a file to another user")
	}
	const uid, gid = 4242, 4343
	for _, rt := range setupRuntimes {
		t.Run(rt.name, func(t *testing.T) {
			home := t.TempDir()
			path := rt.prepare(t)
			if err := os.WriteFile(path, []byte(`{"theme": "dark"}`), 0o664); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, 0o664); err != nil { // past the umask
				t.Fatal(err)
			}
			if err := os.Chown(path, uid, gid); err != nil {
				t.Fatal(err)
			}
			for _, args := range [][]string{{"setup", rt.name}, {"setup", rt.name, "--remove"}} {
				bgtask(t, home, args...).must(t, 0, strings.Join(args, " "))
				st, err := os.Stat(path)
				if err != nil {
					t.Fatal(err)
				}
				sys := st.Sys().(*syscall.Stat_t)
				if sys.Uid != uid || sys.Gid != gid || st.Mode().Perm() != 0o664 {
					t.Errorf("after %s: owner %d:%d, mode %v; want %d:%d, 0664", strings.Join(args, " "), sys.Uid, sys.Gid, st.Mode().Perm(), uid, gid)
				}
			}
			if data, _ := os.ReadFile(path); !strings.Contains(string(data), "dark") || strings.Contains(string(data), "bgtask") {
				t.Errorf("after setup and --remove:\n%s", data)
			}
			if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 1 {
				t.Errorf("%s holds %v", filepath.Dir(path), entries)
			}
		})
	}
}
