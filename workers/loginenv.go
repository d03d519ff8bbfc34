package workers

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

const envMarker = "\x00__BGTASK_LOGIN_ENV__\x00"

// LoginEnv returns the environment a login shell (`bash -lc`) sets up: PATH and
// everything the user's profile exports. A login shell takes a second or two to
// start, so a worker resolves it once and runs every command with `bash -c` in it.
// Profile scripts may print; the marker separates their output from the
// environment.
func LoginEnv(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-lc", `printf '\0__BGTASK_LOGIN_ENV__\0'; exec env -0`)
	cmd.Stdin = nil
	cmd.Stderr = nil
	out, err := cmd.Output()
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
	return env, nil
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
