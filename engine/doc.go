// Package engine is bgtask's domain: the task spec and its validation, the pure state
// machine (Apply an event to a State; Decide what event a command produces), the
// registration and cancellation service, and the dispatcher that persists a task's
// completion before it delivers the wake-up exactly once, and the scheduler that
// places armed tasks on workers (Placement, Choose, FairOrder are its pure rules).
//
// Nothing in this package talks to NATS directly: it uses events.Store,
// events.Inbox, a WorkerFeed of heartbeats and an OfferFunc, and reads current
// state through the TaskReader the projector provides.
package engine
