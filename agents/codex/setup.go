package codex

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/bgtask/bgtask/agents/internal/setup"
)

// HomeDir is Codex's configuration directory: dir if given, else $CODEX_HOME,
// else ~/.codex.
func HomeDir(dir string) (string, error) {
	if dir == "" {
		dir = os.Getenv("CODEX_HOME")
	}
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("no home directory: give --codex-home or set CODEX_HOME: %w", err)
		}
		dir = filepath.Join(home, ".codex")
	}
	return filepath.Abs(dir)
}

// Setup is `bgtask setup codex`: bgtask's hooks put into the hooks file of
// CodexHome, or taken out of it (Remove).
type Setup struct {
	CodexHome string
	Remove    bool
	// Bgtask is the bgtask binary, and Home its home, that the hooks run.
	Bgtask, Home string
	// Stdout is told what was done, Stderr warned.
	Stdout, Stderr io.Writer
}

// Run installs the hooks, or removes them; running it again changes nothing.
func (s Setup) Run(ctx context.Context) error {
	path := filepath.Join(s.CodexHome, "hooks.json")
	if s.Remove {
		return s.remove(path)
	}
	command := setup.Quote(s.Bgtask) + " --home " + setup.Quote(s.Home) + HookCommandSuffix
	if err := s.install(path, command); err != nil {
		return err
	}
	s.warnUnlessOnLoginPath(ctx)
	return nil
}

func (s Setup) install(path, command string) error {
	f, err := setup.ReadFile(path, 0o600)
	if err != nil {
		return err
	}
	data, err := InstallHooks(f.Data, command)
	if err != nil {
		return fmt.Errorf("%s: %w; fix or move it, nothing was changed", path, err)
	}
	if bytes.Equal(f.Data, data) {
		fmt.Fprintf(s.Stdout, "bgtask's hooks are already in %s\n", path)
		return nil
	}
	if err := f.Install(s.Home, data, 0o700); err != nil {
		return err
	}
	fmt.Fprintf(s.Stdout, "installed bgtask's hooks (%s) in %s\nThe next Codex session asks you to review them: trust them, or the thread's busy/idle state is not followed.\n",
		strings.Join(HookEvents, ", "), path)
	return nil
}

func (s Setup) remove(path string) error {
	f, err := setup.ReadFile(path, 0o600)
	if err != nil {
		return err
	}
	if has, err := HasHooks(f.Data); err != nil {
		return fmt.Errorf("%s: %w; fix or move it, nothing was changed", path, err)
	} else if !has {
		fmt.Fprintf(s.Stdout, "no hook of bgtask's in %s\n", path)
		return nil
	}
	data, empty, err := RemoveHooks(f.Data)
	if err != nil {
		return err
	}
	if err := f.Uninstall(s.Home, data, empty); err != nil {
		return err
	}
	fmt.Fprintf(s.Stdout, "removed bgtask's hooks from %s\n", path)
	return nil
}

// loginShellBound bounds the login shell that setup asks where bgtask is: a
// profile that waits for input must not hold setup.
const loginShellBound = 10 * time.Second

// warnUnlessOnLoginPath warns when the user's login shell, which Codex's shell
// tool runs the model's commands in, does not find bgtask: the hooks call it by
// its path, the model's 'bgtask add' by name.
func (s Setup) warnUnlessOnLoginPath(ctx context.Context) {
	shell, found, err := loginShellFinds(ctx, "bgtask")
	switch {
	case err != nil:
		fmt.Fprintf(s.Stderr, "bgtask: warning: could not ask your login shell (%s -l) whether bgtask is on its PATH, as Codex's shell tool needs: %v\n", shell, err)
	case !found:
		fmt.Fprintf(s.Stderr, "bgtask: warning: your login shell (%s -l), which Codex's shell tool runs commands in, does not find bgtask on its PATH:\n"+
			"the hooks run %s by its path, but the model's 'bgtask add' will fail with \"command not found\".\n"+
			"Add %s to PATH in your shell's login profile (~/.profile, ~/.bash_profile or ~/.zprofile), or link bgtask into a directory on it.\n",
			shell, s.Bgtask, filepath.Dir(s.Bgtask))
	}
}

// loginShellFinds reports whether the user's login shell ($SHELL, else bash),
// run as Codex runs it (-l -c), finds the command name. The shell runs in a
// process group of its own, and past loginShellBound gets SIGTERM, which runs
// the exit traps of a profile holding a lock.
func loginShellFinds(ctx context.Context, name string) (shell string, found bool, err error) {
	shell = os.Getenv("SHELL")
	if shell == "" {
		shell = "bash"
	}
	ctx, cancel := context.WithTimeout(ctx, loginShellBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, shell, "-lc", "command -v "+name)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = time.Second // a child of the profile may hold stdout open
	out, err := cmd.Output()
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		return shell, false, fmt.Errorf("it did not answer within %s", loginShellBound)
	case errors.As(err, &exit):
		return shell, false, nil // command -v: not found
	case err != nil:
		return shell, false, err
	}
	// A profile may print: the answer is the last line.
	out = bytes.TrimSpace(out)
	return shell, filepath.IsAbs(string(out[bytes.LastIndexByte(out, '\n')+1:])), nil
}
