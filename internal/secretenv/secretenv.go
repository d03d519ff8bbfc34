// Package secretenv keeps bgtask's credentials out of the environment of the
// programs bgtask starts for others. Both the worker (commands, result commands,
// shims, the login shell) and the engine's exec sinks start such programs, and the
// CLI hands its caller's environment to a command; none of them depends on the
// others, so what a credential looks like is known here, below all of them.
//
// A credential is recognised by its name (Names, and the names HoldName adds) or
// by its value (Hold): a password that bgtask read from a flag or a file, or from a
// variable, may sit in another variable under any name.
package secretenv

import (
	"slices"
	"strings"
	"sync"
)

// Names are the environment variables that hold bgtask's credentials: the NATS
// password of --user ($BGTASK_NATS_PASSWORD) and of the server's --client-user
// probe ($BGTASK_CLIENT_PASSWORD), which bgtask reads, and the passwords of the
// engine and worker identities that deploy/nats/accounts.conf and
// docker-compose.yml name ($BGTASK_ENGINE_PASSWORD, $BGTASK_WORKER_PASSWORD),
// which the shell that starts a server or a worker may hold. The programs bgtask
// starts for others never get them: with the worker's password a command could
// append events as the worker, to any task.
var Names = []string{"BGTASK_NATS_PASSWORD", "BGTASK_CLIENT_PASSWORD", "BGTASK_ENGINE_PASSWORD", "BGTASK_WORKER_PASSWORD"}

// held are the credentials this process read, by value, and the names of the
// variables it read others from (a webhook bearer's env:VAR).
var held = struct {
	sync.RWMutex
	values map[string]bool
	names  map[string]bool
}{values: map[string]bool{}, names: map[string]bool{}}

// Hold records a credential this process read (a password, a token, an nkey
// seed): a variable that holds it, whatever its name, is dropped by Without. An
// empty value is no credential.
func Hold(value string) {
	value = strings.TrimSpace(value)
	if value == "" {
		return
	}
	held.Lock()
	held.values[value] = true
	held.Unlock()
}

// HoldName records a variable this process read a credential from: Without drops
// it as it drops Names.
func HoldName(name string) {
	held.Lock()
	held.names[name] = true
	held.Unlock()
}

// Without is env (NAME=VALUE strings) without the variables that hold a
// credential, by name or by value.
func Without(env []string) []string {
	held.RLock()
	defer held.RUnlock()
	return slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		name, value, _ := strings.Cut(kv, "=")
		return slices.Contains(Names, name) || held.names[name] || held.values[strings.TrimSpace(value)]
	})
}
