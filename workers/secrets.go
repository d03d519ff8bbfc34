package workers

import (
	"slices"
	"strings"
)

// SecretEnv are the environment variables bgtask reads its own credentials from:
// the NATS password of --user ($BGTASK_NATS_PASSWORD) and of the server's
// --client-user probe ($BGTASK_CLIENT_PASSWORD). A process of bgtask may have them;
// the programs it starts for others (commands, result commands, exec sinks, the
// shims) never get them: with the worker's password a command could append events
// as the worker, to any task.
var SecretEnv = []string{"BGTASK_NATS_PASSWORD", "BGTASK_CLIENT_PASSWORD"}

// WithoutSecrets is env without SecretEnv.
func WithoutSecrets(env []string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return slices.Contains(SecretEnv, name)
	})
}
