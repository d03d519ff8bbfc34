package claudecode

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/bgtask/bgtask/agents/internal/setup"
)

// Setup is `bgtask setup claude-code`: bgtask's hooks put into the settings
// file of Scope, or taken out of it (Remove).
type Setup struct {
	Scope  Scope
	Remove bool
	// Bgtask is the bgtask binary, and Home its home, that the user scope's hooks
	// run; a project's, shared with everyone who works on it, run bgtask on PATH
	// with its default home.
	Bgtask, Home string
	// Stdout is told what was done, Stderr warned.
	Stdout, Stderr io.Writer
}

// SettingsError is a settings file that setup does not understand: nothing was
// changed.
type SettingsError struct {
	Path string
	Err  error
}

func (e *SettingsError) Error() string {
	return fmt.Sprintf("%s: %v; nothing was changed", e.Path, e.Err)
}

func (e *SettingsError) Unwrap() error { return e.Err }

// Run installs the hooks, or removes them; running it again changes nothing.
func (s Setup) Run() error {
	path, prefix, err := s.settings()
	if err != nil {
		return err
	}
	// 0644 for a new file, as Claude Code writes them.
	f, err := setup.ReadFile(path, 0o644)
	if err != nil {
		return err
	}
	var data []byte
	if s.Remove {
		data, err = Remove(f.Data)
	} else {
		data, err = Install(f.Data, prefix, s.Scope)
	}
	if err != nil {
		return &SettingsError{Path: path, Err: err}
	}
	switch {
	case bytes.Equal(data, f.Data) && s.Remove:
		fmt.Fprintf(s.Stdout, "No bgtask hooks in %s: nothing to remove.\n", path)
		return nil
	case bytes.Equal(data, f.Data):
		fmt.Fprintf(s.Stdout, "The bgtask hooks are already in %s.\n", path)
		return nil
	}
	if s.Remove {
		if err := f.Uninstall(s.Home, data, setup.SameJSON(data, []byte("{}"))); err != nil {
			return err
		}
		fmt.Fprintf(s.Stdout, "Removed the bgtask hooks from %s.\n", path)
		return nil
	}
	if err := f.Install(s.Home, data, 0o755); err != nil {
		return err
	}
	fmt.Fprintf(s.Stdout, "Installed the bgtask hooks in %s. Claude Code sessions started from now on are woken when their tasks end.\n", path)
	if _, err := exec.LookPath("bgtask"); err != nil && s.Scope == ScopeProject {
		fmt.Fprintln(s.Stderr, "bgtask: warning: bgtask is not on PATH, and a project's hooks run it from there")
	}
	return nil
}

// settings is the settings file of the scope, and the command its hooks start
// bgtask with.
func (s Setup) settings() (path, prefix string, err error) {
	if s.Scope == ScopeProject {
		dir, err := os.Getwd()
		if err != nil {
			return "", "", err
		}
		return filepath.Join(dir, ".claude", "settings.json"), "bgtask", nil
	}
	userHome, err := os.UserHomeDir()
	if err != nil {
		return "", "", fmt.Errorf("no home directory for ~/.claude: %w", err)
	}
	return filepath.Join(userHome, ".claude", "settings.json"), setup.Quote(s.Bgtask) + " --home " + setup.Quote(s.Home), nil
}
