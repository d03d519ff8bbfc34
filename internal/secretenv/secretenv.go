// Package secretenv names the environment variables bgtask reads its own
// credentials from, and takes them out of the environment of the programs bgtask
// starts for others. Both the worker (commands, result commands, shims, the login
// shell) and the engine's exec sinks start such programs; neither depends on the
// other, so the list lives here, below both.
package secretenv

import (
	"slices"
	"strings"
)

// Names are the environment variables bgtask reads its own credentials from: the
// NATS password of --user ($BGTASK_NATS_PASSWORD) and of the server's --client-user
// probe ($BGTASK_CLIENT_PASSWORD). A process of bgtask may have them; the programs
// it starts for others (commands, result commands, exec sinks, the shims) never get
// them: with the worker's password a command could append events as the worker, to
// any task.
var Names = []string{"BGTASK_NATS_PASSWORD", "BGTASK_CLIENT_PASSWORD"}

// Without is env without the variables in Names.
func Without(env []string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return slices.Contains(Names, name)
	})
}
