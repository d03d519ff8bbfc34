// Package engine is bgtask's domain: the task spec and its validation, the pure state
// machine (Apply an event to a State; Decide what event a command produces), the
// registration and cancellation service, and the dispatcher that persists a task's
// completion before it delivers the wake-up exactly once.
//
// Nothing in this package talks to NATS directly: it uses events.Store and
// events.Inbox, and reads current state through the TaskReader the projector provides.
package engine
