package openclaw

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/bgtask/bgtask/agents/internal/setup"
	"github.com/bgtask/bgtask/internal/serverhome"
)

// Setup is `bgtask setup openclaw`: OpenClaw's configuration file made to load
// bgtask's plugin and to take /hooks/agent turns in named sessions, the plugin
// written, and the gateway's hook token declared to the bgtask server of Home;
// or all of it taken out again (Remove).
type Setup struct {
	Config string // OpenClaw's configuration file (ConfigPath)
	Remove bool
	// Bgtask is the bgtask binary, and Home its home, that the plugin runs and
	// whose server holds the token.
	Bgtask, Home string
	// Stdout is told what was done, Stderr warned.
	Stdout, Stderr io.Writer
}

// Run installs, or removes; running it again changes nothing.
func (s Setup) Run() error {
	f, err := setup.ReadFile(s.Config, 0o600)
	if err != nil {
		return err
	}
	cfg, err := setup.ParseObject(f.Data, s.Config)
	if err != nil {
		return fmt.Errorf("%w; OpenClaw reads JSON5, setup only plain JSON: fix or move it, nothing was changed", err)
	}
	if s.Remove {
		return s.remove(f, cfg)
	}
	if f.Data == nil {
		return fmt.Errorf("%s does not exist: set OpenClaw up first (openclaw onboard), or give its state directory (--state-dir, $OPENCLAW_STATE_DIR); nothing was changed", s.Config)
	}
	return s.install(f, cfg)
}

func (s Setup) install(f *setup.File, cfg setup.Object) error {
	gw, err := readGateway(cfg)
	if err != nil {
		return fmt.Errorf("%s: %w; fix it, nothing was changed", s.Config, err)
	}
	if gw.Token == "" {
		gw.Token = newToken()
	}
	e := edits{token: gw.Token, pluginDir: PluginDir(s.Home)}
	edited, err := e.install(cfg)
	if err != nil {
		return fmt.Errorf("%s: %w; fix it, nothing was changed", s.Config, err)
	}
	data, err := edited.Indent()
	if err != nil {
		return err
	}
	pluginChanged, err := writePlugin(e.pluginDir, pluginFiles(s.Bgtask, s.Home, gw.AgentURL()))
	if err != nil {
		return err
	}
	bearer := serverhome.Bearer{Token: gw.Token, URLPrefixes: []string{gw.AgentURL()}}
	bearerChanged, err := s.declare(bearer)
	if err != nil {
		return err
	}
	if bytes.Equal(data, f.Data) && !pluginChanged && !bearerChanged {
		fmt.Fprintf(s.Stdout, "bgtask is already set up in %s\n", s.Config)
		return nil
	}
	if !bytes.Equal(data, f.Data) {
		if err := f.Install(s.Home, data, 0o700); err != nil {
			return err
		}
	}
	fmt.Fprintf(s.Stdout, `set up bgtask in %s: hooks enabled with allowRequestSessionKey and the "agent:" session key prefix, plugin %q loaded from %s
the bgtask server holds the hook token (bearer %q, sent to %s only)
A running gateway applies this by itself (its default hybrid reload); else restart it.
Note: with hooks.allowRequestSessionKey, whoever holds the hook token can run a turn in any agent session (docs/openclaw.md).
`, s.Config, PluginID, e.pluginDir, BearerName, gw.AgentURL())
	return nil
}

// declare declares the hook token to the bgtask server, in its home, and
// reports whether that changed the declaration.
func (s Setup) declare(b serverhome.Bearer) (bool, error) {
	if old, err := serverhome.ReadBearer(s.Home, BearerName); err == nil && old.Token == b.Token && slices.Equal(old.URLPrefixes, b.URLPrefixes) {
		return false, nil
	}
	if err := serverhome.WriteBearer(s.Home, BearerName, b); err != nil {
		return false, fmt.Errorf("declare the hook token to the bgtask server: %w", err)
	}
	return true, nil
}

func (s Setup) remove(f *setup.File, cfg setup.Object) error {
	origData, kept, err := f.Original(s.Home)
	if err != nil {
		return err
	}
	var orig setup.Object
	if kept {
		if orig, err = setup.ParseObject(origData, s.Config+" (as it was before setup)"); err != nil {
			return err
		}
	}
	e := edits{pluginDir: PluginDir(s.Home)}
	removed, err := e.remove(cfg, orig)
	if err != nil {
		return fmt.Errorf("%s: %w; fix it, nothing was changed", s.Config, err)
	}
	data, err := removed.Indent()
	if err != nil {
		return err
	}
	if f.Data != nil && (kept || !bytes.Equal(data, f.Data)) {
		if err := f.Uninstall(s.Home, data, len(removed) == 0); err != nil {
			return err
		}
	}
	if !kept && f.Data != nil {
		fmt.Fprintf(s.Stderr, "bgtask: warning: %s as it was before setup is not kept in %s: its hooks settings stay as they are\n", s.Config, s.Home)
	}
	if _, err := serverhome.RemoveBearer(s.Home, BearerName); err != nil {
		return err
	}
	if err := os.RemoveAll(PluginDir(s.Home)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	_ = os.Remove(filepath.Dir(PluginDir(s.Home))) // bgtask's OpenClaw folder, once empty
	fmt.Fprintf(s.Stdout, "removed bgtask's plugin and hooks settings from %s, and the hook token from the bgtask server\n", s.Config)
	return nil
}
