// Package claudecode is bgtask's side of Claude Code (@anthropic-ai/claude-code
// 2.1.328): the hooks `bgtask setup claude-code` puts into a settings.json, put
// in and taken out again without touching the user's other settings (Setup),
// and what they run, `bgtask hook claude-code EVENT` (Hook): the session's
// target marked busy and idle, and the waiter that hands the session its
// wake-ups through client.Handoff.
//
// Claude Code reads hooks from the "hooks" object of its settings files:
// {"hooks": {EVENT: [{"matcher": ..., "hooks": [{"type": "command", "command": ...,
// "async": ..., "asyncRewake": ..., "timeout": ...}]}]}}. Every handler of bgtask's
// is recognised by its command holding CommandMarker; every other key, group and
// handler is kept as it was, in its place.
package claudecode
