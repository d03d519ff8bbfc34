package workers

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/bgtask/bgtask/internal/secretenv"
)

const envMarker = "\x00__BGTASK_LOGIN_ENV__\x00"

// loginEnvTimeout bounds how long a worker waits for the user's profile before it
// runs commands in its own environment instead: it takes no task meanwhile.
const loginEnvTimeout = 10 * time.Second

// LoginEnv returns the environment a login shell (`bash -lc`) sets up: PATH and
// everything the user's profile exports. A login shell takes a second or two to
// start, so a worker resolves it once and runs every command with `bash -c` in it.
// Profile scripts may print; the marker separates their output from the
// environment. The shell starts from this process's environment without bgtask's
// credentials (secretenv.Without), and none are in what it returns, whoever set them.
//
// The shell runs in a process group of its own, so that killing the worker's group
// does not kill a profile script midway. Profile scripts take locks (pyenv's
// rehash does): one killed holding its lock leaves it behind, and every later
// login shell of the user waits on it. For the same reason a shell slower than
// loginEnvTimeout gets SIGTERM, which runs its exit traps, rather than SIGKILL.
func LoginEnv(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, loginEnvTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-lc", `printf '\0__BGTASK_LOGIN_ENV__\0'; exec env -0`)
	cmd.Env = secretenv.Without(os.Environ())
	cmd.Stdin = nil
	cmd.Stderr = nil
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	// A child of the profile that ignores the TERM may hold stdout open.
	cmd.WaitDelay = 2 * time.Second
	out, err := cmd.Output()
	if ctx.Err() != nil {
		return nil, fmt.Errorf("resolve login environment with bash -lc: gave up waiting for the profile: %w", ctx.Err())
	}
	if err != nil {
		return nil, fmt.Errorf("resolve login environment with bash -lc: %w", err)
	}
	_, envBlock, ok := bytes.Cut(out, []byte(envMarker))
	if !ok {
		return nil, fmt.Errorf("resolve login environment: bash -lc printed no environment")
	}
	var env []string
	for _, kv := range strings.Split(string(envBlock), "\x00") {
		name, _, ok := strings.Cut(kv, "=")
		// The shell's own bookkeeping is not part of the environment a command sees.
		if !ok || name == "" || name == "_" || name == "SHLVL" || name == "PWD" || name == "OLDPWD" {
			continue
		}
		env = append(env, kv)
	}
	return secretenv.Without(env), nil
}

// mergeEnv returns base with the overrides set, later values winning.
func mergeEnv(base []string, overrides map[string]string, extra ...string) []string {
	seen := map[string]int{}
	var out []string
	set := func(kv string) {
		name, _, _ := strings.Cut(kv, "=")
		if i, ok := seen[name]; ok {
			out[i] = kv
			return
		}
		seen[name] = len(out)
		out = append(out, kv)
	}
	for _, kv := range base {
		set(kv)
	}
	for k, v := range overrides {
		set(k + "=" + v)
	}
	for _, kv := range extra {
		set(kv)
	}
	return out
}

// lookPath finds an argv[0] in the PATH of env (not the worker's own PATH: the
// command runs in the login environment), as a shell in dir would: a relative PATH
// entry such as "." is relative to dir.
func lookPath(name string, env []string, dir string) (string, error) {
	if strings.Contains(name, "/") {
		if !filepath.IsAbs(name) {
			name = filepath.Join(dir, name)
		}
		return name, nil
	}
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, entry := range filepath.SplitList(path) {
		if !filepath.IsAbs(entry) {
			entry = filepath.Join(dir, entry)
		}
		p := filepath.Join(entry, name)
		if info, err := os.Stat(p); err == nil && !info.IsDir() && info.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: command not found in PATH", name)
}
