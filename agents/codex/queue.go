package codex

import "strings"

// QueueResult is what a `codex queue --thread ID --message TEXT --resume` that
// exited 0 did with the message, read from what it printed.
type QueueResult int

const (
	// Queued: the message is in Codex's queue ($CODEX_HOME/queue_1.sqlite) and the
	// app-server daemon holds the thread, so it opens a turn for it now, or at the
	// end of the turn that runs.
	Queued QueueResult = iota
	// QueuedNotResumed: the message is in the queue, and no daemon could resume the
	// thread; it becomes a turn when the thread is next resumed (`codex resume`).
	QueuedNotResumed
	// HeldElsewhere: the message is in the queue, and a process other than the
	// daemon writes the thread: a TUI running its own app server, which opens a
	// turn for the message as the daemon would, or a `codex exec`, which pops it
	// when its turn ends and aborts the turn it opened as the process exits, so the
	// model never runs on it (openai/codex#41060, seen in 0.169.0).
	HeldElsewhere
)

// ParseQueueOutput classifies the output of a `codex queue --resume` that exited 0.
// Codex 0.169.0 prints "Queued message ID for thread ID." and, when the resume
// failed, "Warning: message was queued, but could not resume thread ID: REASON",
// the reason "... already has an active writer" when another process holds it.
func ParseQueueOutput(out string) QueueResult {
	_, warning, ok := strings.Cut(out, "could not resume thread")
	switch {
	case !ok:
		return Queued
	case strings.Contains(strings.SplitN(warning, "\n", 2)[0], "active writer"):
		return HeldElsewhere
	default:
		return QueuedNotResumed
	}
}
