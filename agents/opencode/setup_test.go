package opencode

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// userHome is a user's home with opencode's global configuration in it, as
// XDG_CONFIG_HOME names it, and a bgtask home of its own.
func userHome(t *testing.T) (home, config, bgHome string) {
	root := t.TempDir()
	home = filepath.Join(root, "user")
	config = filepath.Join(home, ".config")
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", config)
	return home, filepath.Join(config, "opencode"), filepath.Join(root, "bg")
}

func runSetup(t *testing.T, s Setup) (string, error) {
	t.Helper()
	var out bytes.Buffer
	s.Stdout, s.Stderr = &out, &out
	if s.Bgtask == "" {
		s.Bgtask = "/opt/bg tools/bgtask"
	}
	err := s.Run()
	return out.String(), err
}

// files is every file under dir with its bytes.
func files(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		out[path] = string(data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameFiles(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// Setup writes the plugin in $XDG_CONFIG_HOME/opencode/plugins, running this
// bgtask with its home; again, it changes nothing; --remove leaves exactly the
// files there were, with their bytes, and nothing kept in the bgtask home.
func TestSetupWritesThePluginAndRemoveGivesBackEveryFile(t *testing.T) {
	home, config, bgHome := userHome(t)
	if err := os.MkdirAll(config, 0o755); err != nil {
		t.Fatal(err)
	}
	const mine = "{\"$schema\": \"https://opencode.ai/config.json\"}\n"
	if err := os.WriteFile(filepath.Join(config, "opencode.json"), []byte(mine), 0o644); err != nil {
		t.Fatal(err)
	}
	before := files(t, home)

	s := Setup{Scope: ScopeUser, Home: bgHome}
	if _, err := runSetup(t, s); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(config, "plugins", PluginName)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the plugin: %v", err)
	}
	if want := `const BGTASK = ["/opt/bg tools/bgtask","--home",` + `"` + bgHome + `"]`; !strings.Contains(string(data), want) {
		t.Errorf("the plugin does not run this bgtask and home (%s)", want)
	}
	if out, err := runSetup(t, s); err != nil || !strings.Contains(out, "already") {
		t.Errorf("setup again: %v, %q; want nothing changed", err, out)
	}
	if again, _ := os.ReadFile(path); !bytes.Equal(again, data) {
		t.Errorf("setup again changed the plugin")
	}

	s.Remove = true
	if _, err := runSetup(t, s); err != nil {
		t.Fatal(err)
	}
	if after := files(t, home); !sameFiles(before, after) {
		t.Errorf("after --remove the files are %v, want %v", after, before)
	}
	if kept, _ := filepath.Glob(filepath.Join(bgHome, "setup", "*")); len(kept) != 0 {
		t.Errorf("setup keeps files after --remove: %v", kept)
	}
	if out, err := runSetup(t, s); err != nil || !strings.Contains(out, "nothing to remove") {
		t.Errorf("--remove again: %v, %q; want nothing to remove", err, out)
	}
}

// Without XDG_CONFIG_HOME the plugin goes to ~/.config/opencode/plugins.
func TestSetupWithoutXDGConfigHome(t *testing.T) {
	home, _, bgHome := userHome(t)
	t.Setenv("XDG_CONFIG_HOME", "")
	if _, err := runSetup(t, Setup{Scope: ScopeUser, Home: bgHome}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(home, ".config", "opencode", "plugins", PluginName)); err != nil {
		t.Fatal(err)
	}
}

// A file of the plugin's name that bgtask did not write is left as it is, by
// setup and --remove alike.
func TestSetupRefusesAFileNotItsOwn(t *testing.T) {
	_, config, bgHome := userHome(t)
	path := filepath.Join(config, "plugins", PluginName)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	const theirs = "export const Mine = async () => ({})\n"
	if err := os.WriteFile(path, []byte(theirs), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, remove := range []bool{false, true} {
		_, err := runSetup(t, Setup{Scope: ScopeUser, Home: bgHome, Remove: remove})
		var pe *PluginError
		if !errors.As(err, &pe) || pe.Path != path || !strings.Contains(err.Error(), "nothing was changed") {
			t.Errorf("remove=%v: %v; want a PluginError naming %s", remove, err, path)
		}
		if got, _ := os.ReadFile(path); string(got) != theirs {
			t.Errorf("remove=%v: the file became %q", remove, got)
		}
	}
}

// A project's plugin runs bgtask from PATH, with its default home.
func TestProjectScopeWritesIntoTheProject(t *testing.T) {
	_, _, bgHome := userHome(t)
	proj := t.TempDir()
	t.Chdir(proj)
	if _, err := runSetup(t, Setup{Scope: ScopeProject, Home: bgHome}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(proj, ".opencode", "plugins", PluginName))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `const BGTASK = ["bgtask"]`) {
		t.Errorf("the project's plugin does not run bgtask from PATH")
	}
	if _, err := runSetup(t, Setup{Scope: ScopeProject, Home: bgHome, Remove: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(proj, ".opencode", "plugins", PluginName)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the project's plugin is still there: %v", err)
	}
}

// A plugin file that is a symbolic link (dotfiles) stays one: the file it leads
// to is written, and given back as it was by --remove.
func TestSetupWritesThroughALink(t *testing.T) {
	_, config, bgHome := userHome(t)
	dotfiles := filepath.Join(t.TempDir(), "bgtask.js")
	if err := os.WriteFile(dotfiles, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(config, "plugins", PluginName)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(dotfiles, path); err != nil {
		t.Fatal(err)
	}
	if _, err := runSetup(t, Setup{Scope: ScopeUser, Home: bgHome}); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(dotfiles); !bytes.HasPrefix(data, pluginMarker) {
		t.Errorf("the file the link leads to does not hold the plugin")
	}
	if _, err := runSetup(t, Setup{Scope: ScopeUser, Home: bgHome, Remove: true}); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Lstat(path); err != nil || st.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("the link is gone: %v", err)
	}
	if data, _ := os.ReadFile(dotfiles); len(data) != 0 {
		t.Errorf("after --remove the linked file holds %q, want it empty as it was", data)
	}
}

func TestParseScope(t *testing.T) {
	if _, err := ParseScope("global"); err == nil || !strings.Contains(err.Error(), "want user or project") {
		t.Errorf("scope global: %v", err)
	}
}
