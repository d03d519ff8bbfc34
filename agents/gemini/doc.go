// Package gemini is bgtask's side of Gemini CLI (@google/gemini-cli 0.61.0): the
// settings and hooks `bgtask setup gemini` merges into the user's settings.json,
// put in and taken out again without touching the user's other settings (Setup),
// and what the hooks run, `bgtask hook gemini EVENT` (Hook): the session's target
// marked busy and idle, a shell call that registers a task handed to a waiter
// (Rewrite, Waiter), and the wake-ups that waited given to the next turn. Both
// hand wake-ups over through client.Handoff.
//
// Gemini CLI gives no outside process a way into a running session. What it
// offers, and bgtask uses: a BeforeTool hook may rewrite a tool call, and so run
// the model's 'bgtask add' inside a waiter, in the background; a background
// command that ends while the session is idle starts a new turn holding its
// output (with experimental.modelSteering and
// tools.shell.backgroundCompletionBehavior "inject"); a BeforeAgent hook may add
// text to the turn that starts.
//
// Gemini CLI reads hooks from the "hooks" object of its settings files, as Claude
// Code does: {"hooks": {EVENT: [{"matcher": ..., "hooks": [{"type": "command",
// "command": ..., "timeout": MILLISECONDS}]}]}}. Every handler of bgtask's is
// recognised by its command holding CommandMarker; every other key, group and
// handler is kept as it was, in its place.
package gemini
