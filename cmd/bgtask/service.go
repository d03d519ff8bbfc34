package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/internal/serverhome"
)

// serviceOS is the system whose service manager `bgtask service` uses, and
// serviceBinary finds the binary the service runs: a test sets both.
var (
	serviceOS     = runtime.GOOS
	serviceBinary = os.Executable
)

// The names of the service.
const (
	systemdUnit    = "bgtask.service"
	launchdLabel   = "com.github.bgtask.server"
	serviceLogFile = "service.log" // the LaunchAgent's output, in the home
)

type serviceOptions struct {
	user   bool
	dryRun bool
}

func serviceCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "service",
		Short: "Run 'bgtask server' as a user service that starts at login (or boot) and restarts on failure",
		Long: `Install, remove or inspect a service that runs 'bgtask server --home HOME' with
this very binary: a systemd user unit on Linux, a LaunchAgent on macOS.

Stopping or restarting the service stops the server alone, never the commands
it started: the unit has KillMode=process and the LaunchAgent
AbandonProcessGroup, for the default of both would kill every running command
with the server. The server started again watches them again. The service gets
the PATH of the shell that installs it, so that exec sinks find programs such as
claude or codex.

Each subcommand is idempotent; --dry-run prints the file and the commands it
would run and changes nothing.`,
		Example: `  bgtask service install --user --dry-run
  bgtask service install --user
  bgtask service status --user
  bgtask service uninstall --user`,
		Args: cobra.NoArgs,
	}
	var o serviceOptions
	for _, sub := range []struct {
		use, short string
		run        func(*serviceRun) error
	}{
		{"install", "Write the service's file, enable it and start it (again, if its file changed)", (*serviceRun).install},
		{"uninstall", "Stop and disable the service and remove its file; running commands go on", (*serviceRun).uninstall},
		{"status", "Say whether the service is installed, up to date, enabled and running", (*serviceRun).status},
	} {
		run := sub.run
		c := &cobra.Command{
			Use: sub.use, Short: sub.short, Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				r, err := newServiceRun(cmd.Context(), g, o)
				if err != nil {
					return err
				}
				return run(r)
			},
		}
		c.Flags().BoolVar(&o.user, "user", false, "a service of this user (systemd --user, a LaunchAgent): the only kind bgtask installs")
		if sub.use != "status" {
			c.Flags().BoolVar(&o.dryRun, "dry-run", false, "print the file and the commands, change nothing")
		}
		cmd.AddCommand(c)
	}
	return cmd
}

// serviceRun is one run of a service subcommand: the file the service manager
// reads, and how to drive that manager.
type serviceRun struct {
	ctx     context.Context
	g       *globals
	dryRun  bool
	manager serviceManager
	// path and content are the service's file as install writes it.
	path    string
	content []byte
	// home is the server's home; made by install when the service's output goes
	// there.
	home       string
	homeForLog bool
}

// serviceManager is what differs between systemd and launchd.
type serviceManager interface {
	// reachable fails, saying why, if the manager cannot be driven.
	reachable(r *serviceRun) error
	// installCmds are the commands that enable and start the service; changed:
	// its file is new or differs from the one installed.
	installCmds(r *serviceRun, changed bool) [][]string
	// uninstallCmds stop and disable it; reloadCmds, after its file is removed.
	uninstallCmds(r *serviceRun) [][]string
	reloadCmds() [][]string
	// state says whether it is enabled and running.
	state(r *serviceRun) string
	// notes are what to know once it is installed: where its logs are.
	notes(r *serviceRun) []string
}

func newServiceRun(ctx context.Context, g *globals, o serviceOptions) (*serviceRun, error) {
	if !o.user {
		return nil, usageErr("--user is needed: bgtask installs a service of your own user only (a systemd user unit, a LaunchAgent)")
	}
	exe, err := serviceExecutable()
	if err != nil {
		return nil, err
	}
	home, err := serverhome.Dir(g.home)
	if err != nil {
		return nil, err
	}
	userHome, err := os.UserHomeDir()
	if err != nil {
		return nil, fmt.Errorf("service: no home directory to install in: %w", err)
	}
	r := &serviceRun{ctx: ctx, g: g, dryRun: o.dryRun, home: home}
	path := os.Getenv("PATH")
	switch serviceOS {
	case "linux":
		r.manager = systemd{}
		config := os.Getenv("XDG_CONFIG_HOME")
		if config == "" {
			config = filepath.Join(userHome, ".config")
		}
		r.path = filepath.Join(config, "systemd", "user", systemdUnit)
		r.content = systemdUnitFile(exe, home, path)
	case "darwin":
		r.manager, r.homeForLog = launchd{}, true
		r.path = filepath.Join(userHome, "Library", "LaunchAgents", launchdLabel+".plist")
		r.content = launchdPlist(exe, home, path)
	default:
		return nil, fmt.Errorf("service: bgtask knows the service managers of Linux (systemd) and macOS (launchd), not %s's: run 'bgtask server --home %s' under yours", serviceOS, home)
	}
	return r, nil
}

// serviceExecutable is the absolute path of this binary, which the service runs.
func serviceExecutable() (string, error) {
	exe, err := serviceBinary()
	if err == nil {
		exe, err = filepath.EvalSymlinks(exe)
	}
	if err != nil {
		return "", fmt.Errorf("service: the path of this binary is unknown: %w", err)
	}
	if strings.Contains(exe, string(filepath.Separator)+"go-build") {
		return "", fmt.Errorf("service: this bgtask is go run's temporary build (%s), gone when it ends: install it (go install ./cmd/...) and run that", exe)
	}
	return exe, nil
}

func (r *serviceRun) install() error {
	old, err := os.ReadFile(r.path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("service: %w", err)
	}
	changed := err != nil || !bytes.Equal(old, r.content)
	cmds := r.manager.installCmds(r, changed)
	out := r.g.stdout
	if r.dryRun {
		fmt.Fprintf(out, "# would write %s:\n%s", r.path, r.content)
		r.printCmds("# would run:", cmds)
		r.printNotes()
		if err := r.manager.reachable(r); err != nil {
			fmt.Fprintf(out, "# here, install would fail: %v\n", err)
		}
		return nil
	}
	if err := r.manager.reachable(r); err != nil {
		return err
	}
	if r.homeForLog {
		// launchd opens the log before it starts the server, which would make the home.
		if err := os.MkdirAll(r.home, 0o700); err != nil {
			return fmt.Errorf("service: %w", err)
		}
	}
	if changed {
		if err := writeServiceFile(r.path, r.content); err != nil {
			return err
		}
		fmt.Fprintf(out, "wrote %s\n", r.path)
	} else {
		fmt.Fprintf(out, "%s is up to date\n", r.path)
	}
	if err := r.runAll(cmds); err != nil {
		return err
	}
	fmt.Fprintf(out, "bgtask server runs as a service: %s\n", r.manager.state(r))
	r.printNotes()
	return nil
}

func (r *serviceRun) uninstall() error {
	_, err := os.Stat(r.path)
	if errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(r.g.stdout, "not installed: no %s; nothing to do\n", r.path)
		return nil
	}
	cmds := r.manager.uninstallCmds(r)
	reload := r.manager.reloadCmds()
	if r.dryRun {
		r.printCmds("# would run:", cmds)
		fmt.Fprintf(r.g.stdout, "# would remove %s\n", r.path)
		r.printCmds("# would run:", reload)
		return nil
	}
	if err := r.manager.reachable(r); err != nil {
		return err
	}
	if err := r.runAll(cmds); err != nil {
		return err
	}
	if err := os.Remove(r.path); err != nil {
		return fmt.Errorf("service: %w", err)
	}
	if err := r.runAll(reload); err != nil {
		return err
	}
	fmt.Fprintf(r.g.stdout, "removed %s; the service is stopped and disabled. The commands it started go on: a server started on the same home watches them again.\n", r.path)
	return nil
}

func (r *serviceRun) status() error {
	out := r.g.stdout
	old, err := os.ReadFile(r.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		fmt.Fprintf(out, "not installed: no %s ('bgtask service install --user' writes it)\n", r.path)
		return nil
	case err != nil:
		return fmt.Errorf("service: %w", err)
	case bytes.Equal(old, r.content):
		fmt.Fprintf(out, "installed: %s, as install would write it now\n", r.path)
	default:
		fmt.Fprintf(out, "installed: %s, but not as install would write it now (another binary, home or PATH): run install again\n", r.path)
	}
	if err := r.manager.reachable(r); err != nil {
		fmt.Fprintf(out, "state unknown: %v\n", err)
		return nil
	}
	fmt.Fprintf(out, "state: %s\n", r.manager.state(r))
	r.printNotes()
	return nil
}

func (r *serviceRun) printCmds(title string, cmds [][]string) {
	if len(cmds) == 0 {
		return
	}
	fmt.Fprintln(r.g.stdout, title)
	for _, c := range cmds {
		fmt.Fprintln(r.g.stdout, shellLine(c))
	}
}

func (r *serviceRun) printNotes() {
	prefix := ""
	if r.dryRun {
		prefix = "# "
	}
	for _, n := range r.manager.notes(r) {
		fmt.Fprintln(r.g.stdout, prefix+n)
	}
}

// runAll runs each command, and stops at the first that fails.
func (r *serviceRun) runAll(cmds [][]string) error {
	for _, c := range cmds {
		if out, err := r.output(c...); err != nil {
			return fmt.Errorf("service: %s: %w: %s", shellLine(c), err, strings.TrimSpace(out))
		}
	}
	return nil
}

// output runs a command and returns what it printed, stdout and stderr.
func (r *serviceRun) output(argv ...string) (string, error) {
	out, err := exec.CommandContext(r.ctx, argv[0], argv[1:]...).CombinedOutput()
	return string(out), err
}

// writeServiceFile writes a service's file atomically, making its directory.
func writeServiceFile(path string, content []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("service: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, content, 0o644); err != nil {
		return fmt.Errorf("service: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("service: %w", err)
	}
	return nil
}

// shellLine is a command as one would type it in a POSIX shell.
func shellLine(argv []string) string {
	words := make([]string, len(argv))
	for i, a := range argv {
		words[i] = a
		if a == "" || strings.ContainsAny(a, " \t\n'\"\\$`!*?[]{}()<>|&;#~") {
			words[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(words, " ")
}

// currentUser is the user's login name, for the commands that take it.
func currentUser() string {
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return strconv.Itoa(os.Getuid())
}
