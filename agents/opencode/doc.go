// Package opencode is bgtask's side of opencode (opencode-ai 1.18.33): the
// plugin `bgtask setup opencode` writes into opencode's plugins directory, and
// takes out again (Setup), and the plugin's helper for one session, `bgtask
// hook opencode session ID` (Session), which reports the session's busy and
// idle and offers the plugin the session's wake-ups, handed over through
// client.Handoff once opencode recorded them.
//
// The plugin (plugin.js, embedded) is one file that needs no package. opencode
// gives a plugin what bgtask needs and its shell tool does not have: the
// session's id (the shell.env hook, where the plugin sets OPENCODE_SESSION_ID
// for `bgtask add`), its turns (session.status events), the message that opens a
// turn (chat.message, where pending wake-ups ride along) and an in-process
// client that starts a turn (session.promptAsync), which works in the TUI, where
// opencode listens on no port.
package opencode
