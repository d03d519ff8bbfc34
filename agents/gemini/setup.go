package gemini

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/bgtask/bgtask/agents/internal/setup"
)

// Setup is `bgtask setup gemini`: bgtask's settings and hooks put into Gemini
// CLI's user settings file, or taken out of it (Remove).
type Setup struct {
	Remove bool
	// Bgtask is the bgtask binary, and Home its home, that the hooks run.
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

// SettingsPath is Gemini CLI's user settings file: .gemini/settings.json in
// $GEMINI_CLI_HOME, which Gemini CLI takes for the home directory when it is
// set, else in the user's home.
func SettingsPath() (string, error) {
	home := os.Getenv("GEMINI_CLI_HOME")
	if home == "" {
		var err error
		if home, err = os.UserHomeDir(); err != nil {
			return "", fmt.Errorf("no home directory for ~/.gemini: %w", err)
		}
	}
	return filepath.Join(home, ".gemini", "settings.json"), nil
}

// Run installs the settings and hooks, or removes them; running it again
// changes nothing.
func (s Setup) Run() error {
	path, err := SettingsPath()
	if err != nil {
		return err
	}
	// 0644 for a new file, as Gemini CLI writes it.
	f, err := setup.ReadFile(path, 0o644)
	if err != nil {
		return err
	}
	if s.Remove {
		return s.remove(f)
	}
	data, err := Install(f.Data, commandPrefix(s.Bgtask, s.Home))
	if err != nil {
		return &SettingsError{Path: path, Err: err}
	}
	if bytes.Equal(data, f.Data) {
		fmt.Fprintf(s.Stdout, "bgtask's settings and hooks are already in %s.\n", path)
	} else {
		if err := f.Install(s.Home, data, 0o755); err != nil {
			return err
		}
		fmt.Fprintf(s.Stdout, "Installed bgtask's hooks in %s, with %s. Gemini CLI sessions started from now on are woken when their tasks end.\n", path, settingsList())
	}
	if HooksDisabled(data) {
		fmt.Fprintf(s.Stderr, "bgtask: warning: %s turns hooks off (hooksConfig): bgtask's do not run\n", path)
	}
	return nil
}

func (s Setup) remove(f *setup.File) error {
	original, _, err := f.Original(s.Home)
	if err != nil {
		return err
	}
	data, empty, err := Remove(f.Data, original)
	if err != nil {
		return &SettingsError{Path: f.Path, Err: err}
	}
	if bytes.Equal(data, f.Data) {
		fmt.Fprintf(s.Stdout, "Nothing of bgtask's in %s: nothing to remove.\n", f.Path)
		return nil
	}
	if err := f.Uninstall(s.Home, data, empty); err != nil {
		return err
	}
	fmt.Fprintf(s.Stdout, "Removed bgtask's hooks and settings from %s.\n", f.Path)
	return nil
}

// commandPrefix is the shell words that start the bgtask binary on home.
func commandPrefix(bgtask, home string) string {
	return setup.Quote(bgtask) + " --home " + setup.Quote(home)
}

func settingsList() string {
	var out []string
	for _, s := range Settings {
		out = append(out, s.String())
	}
	return strings.Join(out, " and ")
}
