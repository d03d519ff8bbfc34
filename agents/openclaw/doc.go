// Package openclaw is bgtask's side of OpenClaw (openclaw 2026.9.6): what `bgtask
// setup openclaw` writes (Setup), the session a command started by an OpenClaw
// agent's exec tool runs in (Target, Sink), and `bgtask hook openclaw`, which
// marks a session's target busy while a turn runs and idle after it (Hook).
//
// The pieces, and why each is there:
//
//   - A plugin of bgtask's, loaded by the gateway from bgtask's home
//     (plugins.load.paths, plugins.entries.bgtask). Its resolve_exec_env hook gives
//     every exec command the key of the session it runs for (SessionEnv), the
//     gateway's /hooks/agent URL (URLEnv) and BGTASK_HOME: OpenClaw gives commands
//     no session id of its own. Its before_model_resolve and agent_end hooks run `bgtask hook
//     openclaw busy|idle KEY`: a /hooks/agent run that starts in a session while
//     another turn runs there makes that turn fail (OpenClaw 2026.9.6: "the
//     transcript writer no longer owned this session"), so a wake-up waits for the
//     turn's end.
//   - The gateway's hooks (hooks.enabled, hooks.token, allowRequestSessionKey,
//     an "agent:" session key prefix), which /hooks/agent needs to run a turn in
//     a session named by the request.
//   - The hook token, declared in bgtask's home as bearer BearerName (never in a
//     spec), for that URL only.
//
// A task registered from such a session gets the webhook sink of Sink: a POST to
// /hooks/agent with waitForCompletion, in the persistent session of its origin,
// which OpenClaw answers once the turn has run; a re-post with the same
// Idempotency-Key (bgtask's task id) replays that answer with no second turn.
package openclaw
