package setup_test

import (
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/bgtask/bgtask/agents/internal/setup"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// install writes ours into the file at path as a setup would, and remove
// takes it out again, both through a fresh read of the file.
func install(t *testing.T, home, path string, data string) {
	t.Helper()
	f, err := setup.ReadFile(path, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Install(home, []byte(data), 0o755); err != nil {
		t.Fatal(err)
	}
}

func remove(t *testing.T, home, path string, removed string, empty bool) {
	t.Helper()
	f, err := setup.ReadFile(path, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Uninstall(home, []byte(removed), empty); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// A remove gives back the user's very bytes, however they wrote them, when
// nothing but setup's entries changed; a second setup keeps the first's
// original.
func TestRemoveGivesBackTheOriginalBytes(t *testing.T) {
	home, dir := t.TempDir(), t.TempDir()
	path := filepath.Join(dir, "settings.json")
	const mine = "{ \"theme\":   \"keep-me\" ,\n\"b\": [1,2] }\n"
	if err := os.WriteFile(path, []byte(mine), 0o640); err != nil {
		t.Fatal(err)
	}
	install(t, home, path, `{"theme": "keep-me", "b": [1, 2], "hooks": {"x": 1}}`)
	install(t, home, path, `{"theme": "keep-me", "b": [1, 2], "hooks": {"x": 2}}`)
	remove(t, home, path, `{"theme": "keep-me", "b": [1, 2]}`, false)
	if got := read(t, path); got != mine {
		t.Fatalf("after remove: %q, want the original %q", got, mine)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o640 {
		t.Fatalf("mode %v, want 0640 kept", st.Mode().Perm())
	}
	if kept, _ := filepath.Glob(filepath.Join(home, "setup", "*")); len(kept) != 0 {
		t.Fatalf("the original is still kept after the remove: %v", kept)
	}
}

// What the user changed since the setup stays: the original is not written
// over their change.
func TestRemoveKeepsTheUsersLaterChange(t *testing.T) {
	home, dir := t.TempDir(), t.TempDir()
	path := filepath.Join(dir, "settings.json")
	if err := os.WriteFile(path, []byte(`{"theme": "old"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	install(t, home, path, `{"theme": "old", "hooks": 1}`)
	const changed = `{"theme": "new"}`
	remove(t, home, path, changed, false)
	if got := read(t, path); got != changed {
		t.Fatalf("after remove: %q, want the user's change %q", got, changed)
	}
}

// A file setup made goes again; one a link leads to stays (empty), so that the
// user's link still leads somewhere.
func TestRemoveTakesAwayTheFileSetupMade(t *testing.T) {
	home, dir := t.TempDir(), t.TempDir()
	path := filepath.Join(dir, "sub", "settings.json")
	install(t, home, path, `{"hooks": 1}`)
	remove(t, home, path, `{}`, true)
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("the file setup made is still there: %v", err)
	}

	target := filepath.Join(dir, "dotfiles.json")
	link := filepath.Join(dir, "linked.json")
	if err := os.WriteFile(target, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	install(t, home, link, `{"hooks": 1}`)
	remove(t, home, link, `{}`, true)
	if got := read(t, link); got != "" {
		t.Fatalf("through the link after remove: %q, want the empty file it had", got)
	}
}

// The original is there to read while setup's entries are in the file: the
// file as it was before the first setup, not as a later one found it.
func TestOriginalIsTheFileBeforeTheFirstSetup(t *testing.T) {
	home, dir := t.TempDir(), t.TempDir()
	path := filepath.Join(dir, "settings.json")
	const mine = `{"a": false}`
	if err := os.WriteFile(path, []byte(mine), 0o644); err != nil {
		t.Fatal(err)
	}
	original := func() (string, bool) {
		f, err := setup.ReadFile(path, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		data, kept, err := f.Original(home)
		if err != nil {
			t.Fatal(err)
		}
		return string(data), kept
	}
	if _, kept := original(); kept {
		t.Fatal("an original is kept before any setup")
	}
	install(t, home, path, `{"a": true}`)
	install(t, home, path, `{"a": true, "b": 1}`)
	if got, kept := original(); !kept || got != mine {
		t.Fatalf("original %q (kept %v), want %q", got, kept, mine)
	}
	remove(t, home, path, mine, false)
	if _, kept := original(); kept {
		t.Fatal("the original is still kept after the remove")
	}
}
