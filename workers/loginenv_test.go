package workers

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/internal/testkit"
)

func TestLookPathSearchesThePATHOfTheGivenEnv(t *testing.T) {
	t.Parallel()
	dir, other, empty := t.TempDir(), t.TempDir(), t.TempDir()
	for _, f := range []struct {
		dir, name string
		mode      os.FileMode
	}{
		{dir, "bgtask-prog", 0o755},
		{other, "bgtask-prog", 0o755},
		{dir, "bgtask-plain", 0o644},
	} {
		if err := os.WriteFile(filepath.Join(f.dir, f.name), []byte("#!/bin/sh\n"), f.mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "bgtask-dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		program string
		env     []string
		want    string // "" means not found
	}{
		{name: "found in the env's PATH", program: "bgtask-prog", env: []string{"HOME=/x", "PATH=" + empty + ":" + dir}, want: filepath.Join(dir, "bgtask-prog")},
		{name: "first PATH entry wins", program: "bgtask-prog", env: []string{"PATH=" + other + ":" + dir}, want: filepath.Join(other, "bgtask-prog")},
		{name: "later PATH value wins", program: "bgtask-prog", env: []string{"PATH=" + other, "PATH=" + dir}, want: filepath.Join(dir, "bgtask-prog")},
		{name: "not found outside the env's PATH", program: "bgtask-prog", env: []string{"PATH=" + empty}},
		{name: "no PATH at all", program: "bgtask-prog", env: []string{"HOME=/x"}},
		{name: "file without execute permission skipped", program: "bgtask-plain", env: []string{"PATH=" + dir}},
		{name: "directory skipped", program: "bgtask-dir", env: []string{"PATH=" + dir}},
		{name: "relative name with a slash is taken from the cwd", program: "./bgtask-whatever", env: []string{"PATH=" + empty}, want: "/bgtask-whatever"},
		{name: "absolute name used as given", program: "/opt/bgtask-whatever", env: []string{"PATH=" + empty}, want: "/opt/bgtask-whatever"},
		{name: "absolute name used as given", program: "/usr/bin/env", env: nil, want: "/usr/bin/env"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := lookPath(tt.program, tt.env, "/")
			if tt.want == "" {
				if err == nil {
					t.Fatalf("lookPath(%q) = %q, want not found", tt.program, got)
				}
				if !strings.Contains(err.Error(), tt.program) {
					t.Errorf("error %q does not name the program %q", err, tt.program)
				}
				return
			}
			if err != nil {
				t.Fatalf("lookPath(%q): %v", tt.program, err)
			}
			if got != tt.want {
				t.Errorf("lookPath(%q) = %q, want %q", tt.program, got, tt.want)
			}
		})
	}
}

func TestLookPathIgnoresTheWorkersOwnPATH(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("sh is not in this process's PATH")
	}
	if got, err := lookPath("sh", []string{"PATH=" + t.TempDir()}, "/"); err == nil {
		t.Fatalf("lookPath(sh) = %q from the worker's PATH, want not found in the given env's PATH", got)
	}
}

func TestMergeEnvLaterValuesWin(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		base      []string
		overrides map[string]string
		extra     []string
		want      []string
	}{
		{name: "base kept in order", base: []string{"B=1", "A=2"}, want: []string{"B=1", "A=2"}},
		{name: "later duplicate in base wins in place", base: []string{"A=1", "B=2", "A=3"}, want: []string{"A=3", "B=2"}},
		{name: "override replaces a base value", base: []string{"A=1", "B=2"}, overrides: map[string]string{"A": "over"}, want: []string{"A=over", "B=2"}},
		{name: "override adds a variable", base: []string{"A=1"}, overrides: map[string]string{"C": "3"}, want: []string{"A=1", "C=3"}},
		{name: "extra wins over override and base", base: []string{"ID=base"}, overrides: map[string]string{"ID": "spec"}, extra: []string{"ID=task"}, want: []string{"ID=task"}},
		{name: "empty value is a value", base: []string{"A=1"}, overrides: map[string]string{"A": ""}, want: []string{"A="}},
		{name: "value containing '='", base: []string{"A=1"}, overrides: map[string]string{"A": "x=y"}, want: []string{"A=x=y"}},
		{name: "nothing", want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			base := slices.Clone(tt.base)
			got := mergeEnv(base, tt.overrides, tt.extra...)
			if !slices.Equal(got, tt.want) {
				t.Errorf("mergeEnv = %q, want %q", got, tt.want)
			}
			if !slices.Equal(base, tt.base) {
				t.Errorf("mergeEnv changed its base: %q, was %q", base, tt.base)
			}
		})
	}
}

func TestMergeEnvManyOverridesEachOnce(t *testing.T) {
	t.Parallel()
	overrides := map[string]string{"A": "a", "B": "b", "C": "c", "D": "d"}
	got := mergeEnv([]string{"B=old", "X=x"}, overrides)
	slices.Sort(got)
	if want := []string{"A=a", "B=b", "C=c", "D=d", "X=x"}; !slices.Equal(got, want) {
		t.Errorf("mergeEnv = %q, want %q", got, want)
	}
}

// Not parallel: it points HOME at a profile it controls.
func TestLoginEnvReadsTheProfileAndIgnoresWhatItPrints(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash is not installed")
	}
	home := t.TempDir()
	profile := `echo "junk on stdout from the profile"
echo "BGTASK_PRINTED=not-exported"
printf 'binary junk \0 with a NUL\n'
echo "junk on stderr" >&2
export BGTASK_TEST_MARK=1
export BGTASK_TEST_MULTILINE='first
second'
`
	useProfile(t, home, profile)

	env, err := LoginEnv(context.Background())
	if err != nil {
		t.Fatalf("LoginEnv: %v", err)
	}
	vars := map[string]string{}
	for _, kv := range env {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || name == "" {
			t.Errorf("entry %q is not NAME=value", kv)
			continue
		}
		if strings.Contains(kv, "junk") {
			t.Errorf("profile output leaked into the environment: %q", kv)
		}
		if _, dup := vars[name]; dup {
			t.Errorf("%s appears twice", name)
		}
		vars[name] = value
	}
	if vars["PATH"] == "" {
		t.Errorf("no PATH in the login environment %q", env)
	}
	if got, want := vars["BGTASK_TEST_MARK"], "1"; got != want {
		t.Errorf("BGTASK_TEST_MARK = %q, want %q (the profile's export)", got, want)
	}
	if got, want := vars["BGTASK_TEST_MULTILINE"], "first\nsecond"; got != want {
		t.Errorf("BGTASK_TEST_MULTILINE = %q, want %q", got, want)
	}
	if got, want := vars["HOME"], home; got != want {
		t.Errorf("HOME = %q, want %q", got, want)
	}
	for _, name := range []string{"BGTASK_PRINTED", "_", "SHLVL", "PWD", "OLDPWD"} {
		if v, ok := vars[name]; ok {
			t.Errorf("%s=%q is in the environment, want it left out", name, v)
		}
	}
}

// useProfile points HOME at home, with profile as its login profile.
func useProfile(t *testing.T, home, profile string) {
	t.Helper()
	// bash -l reads the first of these it finds; write both so the profile runs
	// whichever bash prefers.
	for _, name := range []string{".bash_profile", ".profile"} {
		if err := os.WriteFile(filepath.Join(home, name), []byte(profile), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("HOME", home)
}

// A profile that hangs holding a lock (as pyenv's rehash does when another shell
// holds it) must neither hold the worker forever nor, once given up on, leave its
// lock behind: that would make every later login shell of the user wait too.
// Not parallel: it points HOME at a profile it controls.
func TestLoginEnvGivesUpOnAHangingProfileAndLetsItsTrapsRun(t *testing.T) {
	testkit.FullOnly(t)
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash is not installed")
	}
	home := t.TempDir()
	lock, straggler := filepath.Join(home, "lock"), filepath.Join(home, "straggler")
	useProfile(t, home, `trap 'rm -f "$HOME/lock"' EXIT
: > "$HOME/lock"
( trap '' TERM; exec sleep 600 ) &
echo $! > "$HOME/straggler"
sleep 600
`)
	t.Cleanup(func() {
		if data, err := os.ReadFile(straggler); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	env, err := LoginEnv(ctx)
	if err == nil || !strings.Contains(err.Error(), "gave up waiting for the profile") {
		t.Fatalf("LoginEnv = %d variables, %v; want the error that it gave up on the profile", len(env), err)
	}
	if _, err := os.Stat(lock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the profile's lock is still there (%v): its EXIT trap did not run", err)
	}
}
