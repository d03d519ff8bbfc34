package workers_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/internal/secretenv"
	"github.com/bgtask/bgtask/workers"
)

const leaked = "bars-leaked-secret"

// bgtask's credentials are in the worker's environment when it was started with
// them, and in a spec's env when its registrant's shell had them: a command, and
// the shim it may read the environment of, never see them, by their names or
// under another name.
func TestCommandsGetNoneOfBgtasksCredentials(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const held = "bars-held-password"
	secretenv.Hold(held) // as the worker does with the password it connects with
	env := append(os.Environ(), "ANOTHER_NAME="+held)
	for _, name := range secretenv.Names {
		env = append(env, name+"="+leaked)
	}
	b.startWorker(t, workers.Config{Env: env})
	dir := t.TempDir()
	id := b.arm(t, engine.Spec{
		Command: `env > env; tr '\0' '\n' < /proc/$PPID/environ > shim-env`, Cwd: dir,
		Env: map[string]string{"SPEC_VAR": "given", "BGTASK_WORKER_PASSWORD": leaked, "SPEC_COPY": held},
	})
	b.waitFor(t, id, 20*time.Second, "ended", ended)
	command := readFile(t, filepath.Join(dir, "env"))
	for name, got := range map[string]string{"command": command, "shim": readFile(t, filepath.Join(dir, "shim-env"))} {
		if strings.Contains(got, leaked) || strings.Contains(got, held) {
			t.Errorf("the %s's environment holds bgtask's credentials:\n%s", name, got)
		}
	}
	if !strings.Contains(command, "SPEC_VAR=given\n") || !strings.Contains(command, "PATH=") {
		t.Errorf("the command's environment lacks the worker's or the spec's variables:\n%s", command)
	}
}

// The login shell starts without bgtask's credentials, and what a profile sets of
// them is not passed on either.
func TestTheLoginEnvironmentHoldsNoneOfBgtasksCredentials(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	for _, name := range secretenv.Names {
		t.Setenv(name, leaked)
	}
	profile := "export BGTASK_PROFILE_VAR=set\nexport BGTASK_CLIENT_PASSWORD=" + leaked + "-in-profile\n" +
		"echo \"inherited:$BGTASK_NATS_PASSWORD\" > \"$HOME/inherited\"\n"
	if err := os.WriteFile(filepath.Join(home, ".bash_profile"), []byte(profile), 0o600); err != nil {
		t.Fatal(err)
	}
	env, err := workers.LoginEnv(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range env {
		if strings.Contains(kv, leaked) {
			t.Errorf("login environment holds %s", kv)
		}
	}
	if !slices.Contains(env, "BGTASK_PROFILE_VAR=set") {
		t.Errorf("login environment %q lacks what the profile exports", env)
	}
	if got := strings.TrimSpace(readFile(t, filepath.Join(home, "inherited"))); got != "inherited:" {
		t.Errorf("the login shell inherited the credentials: %s", got)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
