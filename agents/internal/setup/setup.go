// Package setup holds what the setups of the agent runtimes share: the
// runtime's configuration file, edited where it is (through a symbolic link,
// keeping its mode and owner), and the quoting of the commands its hooks run.
package setup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/bgtask/bgtask/internal/serverhome"
)

// File is an agent runtime's configuration file as setup edits it. A symbolic
// link at its path (dotfiles kept in a repository) stays: the file it leads to
// is read and replaced, with its mode and owner, so that a setup run as root
// leaves a user's file that user's.
type File struct {
	Path   string // as named
	Target string // the file read and written: Path, or where its links lead
	Data   []byte // nil: no file yet

	mode     fs.FileMode // the file's, or the mode of a new one
	uid, gid int         // the file's owner to keep; -1: this process's
}

// ReadFile reads the file at path, or what a link there leads to; a new file
// will have newMode. A link that leads nowhere is refused: replacing it would
// break the user's dotfiles, writing where it points would make a file the user
// may not expect there.
func ReadFile(path string, newMode fs.FileMode) (*File, error) {
	f := &File{Path: path, Target: path, mode: newMode, uid: -1, gid: -1}
	if st, err := os.Lstat(path); err == nil && st.Mode()&fs.ModeSymlink != 0 {
		target, err := filepath.EvalSymlinks(path)
		if errors.Is(err, fs.ErrNotExist) {
			dest, _ := os.Readlink(path)
			return nil, fmt.Errorf("%s is a symbolic link to %s, which does not exist: create that file (empty will do) or remove the link; nothing was changed", path, dest)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: follow the symbolic link: %w; nothing was changed", path, err)
		}
		f.Target = target
	}
	data, err := os.ReadFile(f.Target)
	if errors.Is(err, fs.ErrNotExist) {
		return f, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	st, err := os.Stat(f.Target)
	if err != nil {
		return nil, err
	}
	f.Data, f.mode = data, st.Mode().Perm()
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		if uid := int(sys.Uid); uid != os.Geteuid() {
			f.uid = uid
		}
		if gid := int(sys.Gid); gid != os.Getegid() {
			f.gid = gid
		}
	}
	return f, nil
}

// Linked reports whether the file was reached through a symbolic link.
func (f *File) Linked() bool { return f.Target != f.Path }

// Write replaces the file with data, atomically, beside the file itself, so the
// link at its path stays; with dirMode, the directory of a new file is made.
func (f *File) Write(data []byte, dirMode fs.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(f.Target), dirMode); err != nil {
		return err
	}
	if err := serverhome.ReplaceFileAs(f.Target, data, f.mode, f.uid, f.gid); err != nil {
		return fmt.Errorf("write %s: %w", f.Target, err)
	}
	return nil
}

// Quote quotes s for the POSIX shell a runtime runs a hook's command with.
func Quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
