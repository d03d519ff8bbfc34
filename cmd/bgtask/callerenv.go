package main

import (
	"encoding/json"
	"os"
	"slices"
	"strings"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/internal/secretenv"
)

// shellNoise are the variables a shell keeps for itself, which mean nothing to a
// command started elsewhere, later.
var shellNoise = []string{"_", "OLDPWD", "SHLVL"}

// callerEnv is the environment a command registered from this process runs in
// by default: this process's, which is its caller's (the shell that ran `bgtask
// add`, the agent that runs `bgtask mcp`), with its PATH, virtualenv and exports,
// less bgtask's credentials and a shell's own bookkeeping, and PWD the task's cwd
// (none for a task without one: the worker's home is not known here).
func callerEnv(environ []string, cwd string) map[string]string {
	env := map[string]string{}
	for _, kv := range secretenv.Without(environ) {
		name, value, ok := strings.Cut(kv, "=")
		if ok && name != "" && name != "PWD" && !slices.Contains(shellNoise, name) {
			env[name] = value
		}
	}
	if cwd != "" {
		env["PWD"] = cwd
	}
	return env
}

// withCallerEnv makes the environment of doc's command the caller's (callerEnv),
// with doc's env set over it: the spec's environment is caller, its env the whole
// environment the command runs in. The credentials g connects with are held
// first: a variable that holds one, under any name, stays here.
func withCallerEnv(g *globals, doc map[string]any) error {
	g.holdCredentials()
	given, err := stringMap(doc["env"])
	if err != nil {
		return err
	}
	var cwd string
	switch v := doc["cwd"].(type) {
	case string:
		cwd = v
	case json.RawMessage:
		_ = json.Unmarshal(v, &cwd) // not a string: the engine says so
	}
	env := callerEnv(os.Environ(), cwd)
	for name, value := range given {
		env[name] = value
	}
	doc["env"], doc["environment"] = env, engine.EnvironmentCaller
	return nil
}

// stringMap reads a spec's env as --env or a --spec gave it.
func stringMap(v any) (map[string]string, error) {
	switch v := v.(type) {
	case nil:
		return nil, nil
	case map[string]string:
		return v, nil
	case json.RawMessage:
		var m map[string]string
		if json.Unmarshal(v, &m) == nil {
			return m, nil
		}
	}
	return nil, &exitError{code: client.ExitUsage, err: &engine.FieldError{Field: "env", Reason: "want an object of strings, NAME: VALUE"}}
}
