package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/internal/serverhome"
)

func setupCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "setup",
		Short: "Install what an agent runtime needs to be woken by bgtask",
		Long: `Install, in an agent runtime's own configuration, what makes the wake-up of a task
that a session registered reach that session while it runs, and at its next start
when it was closed. Each subcommand is idempotent, leaves the runtime's other
settings alone, and takes out what it installed with --remove.`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(setupClaudeCodeCmd(g), setupCodexCmd(g))
	return cmd
}

func hookCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "hook",
		Short: "Run as an agent runtime's hook (installed by 'bgtask setup')",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(hookClaudeCodeCmd(g))
	return cmd
}

// configFile is an agent runtime's configuration file as setup edits it. A
// symbolic link at its path (dotfiles kept in a repository) stays: the file it
// leads to is read and replaced, with its mode and owner, so that a setup run as
// root leaves a user's file that user's.
type configFile struct {
	path     string      // as named
	target   string      // the file read and written: path, or where its links lead
	data     []byte      // nil: no file yet
	mode     fs.FileMode // the file's, or newMode for a new one
	uid, gid int         // the file's owner to keep; -1: this process's
}

// readConfigFile reads the file at path, or what a link there leads to; a new
// file will have newMode. A link that leads nowhere is refused: replacing it
// would break the user's dotfiles, writing where it points would make a file
// the user may not expect there.
func readConfigFile(path string, newMode fs.FileMode) (*configFile, error) {
	f := &configFile{path: path, target: path, mode: newMode, uid: -1, gid: -1}
	if st, err := os.Lstat(path); err == nil && st.Mode()&fs.ModeSymlink != 0 {
		target, err := filepath.EvalSymlinks(path)
		if errors.Is(err, fs.ErrNotExist) {
			dest, _ := os.Readlink(path)
			return nil, fmt.Errorf("%s is a symbolic link to %s, which does not exist: create that file (empty will do) or remove the link; nothing was changed", path, dest)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: follow the symbolic link: %w; nothing was changed", path, err)
		}
		f.target = target
	}
	data, err := os.ReadFile(f.target)
	if errors.Is(err, fs.ErrNotExist) {
		return f, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	st, err := os.Stat(f.target)
	if err != nil {
		return nil, err
	}
	f.data, f.mode = data, st.Mode().Perm()
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

// linked reports whether the file was reached through a symbolic link.
func (f *configFile) linked() bool { return f.target != f.path }

// write replaces the file with data, atomically, beside the file itself, so the
// link at its path stays; with dirMode, the directory of a new file is made.
func (f *configFile) write(data []byte, dirMode fs.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(f.target), dirMode); err != nil {
		return err
	}
	if err := serverhome.ReplaceFileAs(f.target, data, f.mode, f.uid, f.gid); err != nil {
		return fmt.Errorf("write %s: %w", f.target, err)
	}
	return nil
}
