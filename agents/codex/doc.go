// Package codex is bgtask's side of the Codex CLI (@openai/codex 0.169.0): the
// hooks file `bgtask setup codex` edits (Setup), the hooks it runs (Hook: the
// thread's target marked busy and idle), and `bgtask setup codex deliver`
// (Delivery), which hands a thread's wake-ups to Codex with `codex queue`
// through client.Handoff, reading what its answers mean.
//
// Codex reads lifecycle hooks from $CODEX_HOME/hooks.json, a JSON document
// {"hooks": {EVENT: [{"matcher": ..., "hooks": [{"type": "command", "command":
// ...}]}]}} whose root may hold only "description" and "hooks". Each group of
// bgtask's is one command handler, recognised by its command ending in
// HookCommandSuffix; every other group, handler and field is kept as it was.
package codex
