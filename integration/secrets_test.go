package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A server started with credentials in its environment passes them to nothing it
// starts for a task, not to the command, not to an exec sink: bgtask's own, the
// ones its deployment files name, and a webhook bearer's token, by its variable or
// under any other name.
func TestCommandsAndExecSinksGetNoneOfTheServersCredentials(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	const secret = "bars-leaked-secret"
	startServerEnv(t, home, []string{
		"BGTASK_NATS_PASSWORD=" + secret, "BGTASK_CLIENT_PASSWORD=" + secret,
		"BGTASK_ENGINE_PASSWORD=" + secret, "BGTASK_WORKER_PASSWORD=" + secret,
		"HOOK_TOKEN=" + secret + "-token", "A_COPY_OF_IT=" + secret + "-token",
	}, "--webhook-bearer", "hook=env:HOOK_TOKEN@https://hooks.example.com/")
	nc, _ := connect(t, home)
	log := openLog(t, home)
	dir := t.TempDir()
	count := `env | grep -c ` + secret + ` > "$0" || true`
	id := register(t, nc, map[string]any{
		"argv":    []string{"sh", "-c", count, filepath.Join(dir, "command")},
		"deliver": []map[string]any{{"type": "exec", "argv": []string{"/bin/sh", "-c", count, filepath.Join(dir, "sink")}}},
	})
	log.waitSinksDone(t, id, 1)
	for _, name := range []string{"command", "sink"} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(data)); got != "0" {
			t.Errorf("%s lines of the %s's environment hold the server's credentials, want 0", got, name)
		}
	}
}
