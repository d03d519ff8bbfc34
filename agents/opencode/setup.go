package opencode

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/bgtask/bgtask/agents/internal/setup"
)

//go:embed plugin.js
var pluginTemplate []byte

// PluginName is the plugin's file in opencode's plugins directory.
const PluginName = "bgtask.js"

// pluginMarker starts the plugin's file: a file there without it is not
// bgtask's, and setup leaves it alone.
var pluginMarker = []byte("// bgtask: the opencode plugin that `bgtask setup opencode` writes")

// Scope is where the plugin goes.
type Scope string

const (
	// ScopeUser: opencode's global plugins, $XDG_CONFIG_HOME/opencode/plugins
	// (~/.config/opencode/plugins), for every session of the user.
	ScopeUser Scope = "user"
	// ScopeProject: .opencode/plugins of the current directory, for the sessions
	// of that project, everyone's who works on it.
	ScopeProject Scope = "project"
)

// ParseScope reads --scope.
func ParseScope(s string) (Scope, error) {
	switch sc := Scope(s); sc {
	case ScopeUser, ScopeProject:
		return sc, nil
	}
	return "", fmt.Errorf("%q: want user or project", s)
}

// Setup is `bgtask setup opencode`: bgtask's plugin written into opencode's
// plugins directory of Scope, or taken out of it (Remove).
type Setup struct {
	Scope  Scope
	Remove bool
	// Bgtask is the bgtask binary, and Home its home, that the user scope's
	// plugin runs; a project's, shared with everyone who works on it, runs bgtask
	// on PATH with its default home.
	Bgtask, Home string
	// Stdout is told what was done, Stderr warned.
	Stdout, Stderr io.Writer
}

// PluginError is a file where the plugin goes that is not bgtask's: nothing was
// changed.
type PluginError struct {
	Path string
}

func (e *PluginError) Error() string {
	return fmt.Sprintf("%s: a file that bgtask did not write is there (it does not start with %q); move it away, or rename it; nothing was changed", e.Path, pluginMarker)
}

// Run writes the plugin, or removes it; running it again changes nothing.
func (s Setup) Run() error {
	path, err := s.pluginPath()
	if err != nil {
		return err
	}
	// 0644, as opencode's own files are.
	f, err := setup.ReadFile(path, 0o644)
	if err != nil {
		return err
	}
	// An empty file is one that a link leads to (dotfiles), to be filled.
	if len(bytes.TrimSpace(f.Data)) > 0 && !bytes.HasPrefix(f.Data, pluginMarker) {
		return &PluginError{Path: path}
	}
	if s.Remove {
		if !bytes.HasPrefix(f.Data, pluginMarker) {
			fmt.Fprintf(s.Stdout, "No bgtask plugin at %s: nothing to remove.\n", path)
			return nil
		}
		if err := f.Uninstall(s.Home, nil, true); err != nil {
			return err
		}
		fmt.Fprintf(s.Stdout, "Removed the bgtask plugin %s.\n", path)
		return nil
	}
	data, err := Plugin(s.command())
	if err != nil {
		return err
	}
	if bytes.Equal(data, f.Data) {
		fmt.Fprintf(s.Stdout, "The bgtask plugin is already at %s.\n", path)
		return nil
	}
	if err := f.Install(s.Home, data, 0o755); err != nil {
		return err
	}
	fmt.Fprintf(s.Stdout, "Wrote the bgtask plugin %s. opencode sessions started from now on are woken when their tasks end.\n", path)
	if _, err := exec.LookPath("bgtask"); err != nil {
		fmt.Fprintln(s.Stderr, "bgtask: warning: bgtask is not on PATH: the model runs 'bgtask add' by name in opencode's shell tool, and a project's plugin runs it from there")
	}
	return nil
}

// pluginPath is the plugin's file in the plugins directory of the scope.
func (s Setup) pluginPath() (string, error) {
	if s.Scope == ScopeProject {
		dir, err := os.Getwd()
		if err != nil {
			return "", err
		}
		return filepath.Join(dir, ".opencode", "plugins", PluginName), nil
	}
	dir, err := ConfigDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "plugins", PluginName), nil
}

// command is the bgtask command line the plugin runs.
func (s Setup) command() []string {
	if s.Scope == ScopeProject {
		return []string{"bgtask"}
	}
	return []string{s.Bgtask, "--home", s.Home}
}

// ConfigDir is opencode's global configuration directory:
// $XDG_CONFIG_HOME/opencode, else ~/.config/opencode.
func ConfigDir() (string, error) {
	if dir := os.Getenv("XDG_CONFIG_HOME"); filepath.IsAbs(dir) {
		return filepath.Join(dir, "opencode"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no home directory for ~/.config/opencode: %w", err)
	}
	return filepath.Join(home, ".config", "opencode"), nil
}

// Plugin is the plugin's file, running bgtask as argv.
func Plugin(argv []string) ([]byte, error) {
	// A JSON array of strings is a JavaScript one; json.Marshal escapes what a
	// script could not hold (U+2028, U+2029).
	js, err := json.Marshal(argv)
	if err != nil {
		return nil, err
	}
	return bytes.Replace(pluginTemplate, []byte("__BGTASK__"), js, 1), nil
}
