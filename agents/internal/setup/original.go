package setup

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/bgtask/bgtask/internal/serverhome"
)

// original is a configuration file as it was before a setup first changed it,
// kept in bgtask's home so that a remove gives the user back the very bytes
// they had (their formatting, key order and comments), not bgtask's rewriting
// of them.
type original struct {
	Path    string `json:"path"`
	Existed bool   `json:"existed"`
	Data    []byte `json:"data,omitempty"`
}

// originalFile is where the original of the file at target is kept: named by
// a hash of the path, as one home serves the settings of several runtimes,
// scopes and projects.
func originalFile(home, target string) string {
	sum := sha256.Sum256([]byte(target))
	return filepath.Join(home, "setup", hex.EncodeToString(sum[:12])+".json")
}

// Install writes data in place of the file, first keeping in home what the
// file held, unless an earlier setup kept it already: the original is the
// file as the user had it before any setup.
func (f *File) Install(home string, data []byte, dirMode fs.FileMode) error {
	keep := originalFile(home, f.Target)
	if _, err := os.Stat(keep); errors.Is(err, fs.ErrNotExist) {
		rec, _ := json.Marshal(original{Path: f.Target, Existed: f.Data != nil, Data: f.Data})
		if err := os.MkdirAll(filepath.Dir(keep), 0o700); err != nil {
			return err
		}
		if err := serverhome.ReplaceFile(keep, rec, 0o600); err != nil {
			return fmt.Errorf("keep the original of %s: %w", f.Path, err)
		}
	} else if err != nil {
		return err
	}
	return f.Write(data, dirMode)
}

// Original is the file as the user had it before any setup, when a setup kept
// it in home: nil data for a file there was not. A setup whose entries replaced
// values of the user's reads them back from it.
func (f *File) Original(home string) (data []byte, kept bool, err error) {
	rec, err := os.ReadFile(originalFile(home, f.Target))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	var orig original
	if json.Unmarshal(rec, &orig) != nil || orig.Path != f.Target {
		return nil, false, nil
	}
	return orig.Data, true, nil
}

// Uninstall takes setup's entries out of the file: removed is its data
// without them, and empty says that nothing else is left in it. Where removed
// holds the same value as the file before setup, the user gets back the
// original's very bytes; a file left empty goes (not one a link leads to:
// the user's link would then lead nowhere); where
// the user changed the file since, removed is written, keeping their changes.
// A kept original is used only when it holds the same value, so one left by a
// remove done by hand is harmless.
func (f *File) Uninstall(home string, removed []byte, empty bool) error {
	keep := originalFile(home, f.Target)
	var orig original
	kept := false
	if rec, err := os.ReadFile(keep); err == nil {
		kept = json.Unmarshal(rec, &orig) == nil && orig.Path == f.Target
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	var err error
	switch {
	case kept && orig.Existed && sameValue(orig.Data, removed, empty):
		err = f.Write(orig.Data, 0o700)
	case empty && !f.Linked() && !(kept && orig.Existed):
		err = os.Remove(f.Path)
	default:
		err = f.Write(removed, 0o700)
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.Remove(keep); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// sameValue reports whether a runtime reads the same settings from the
// original as from removed: the same JSON value, or nothing in either (an
// empty file is read as an empty object).
func sameValue(orig, removed []byte, empty bool) bool {
	if len(bytes.TrimSpace(orig)) == 0 {
		return empty
	}
	return bytes.Equal(orig, removed) || SameJSON(orig, removed)
}
