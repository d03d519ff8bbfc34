// Package events defines bgtask's lifecycle events and the streams they live in.
//
// Every change of a task is an immutable Event appended to one JetStream stream
// (StreamName). An event is published on a subject that names its task and type,
//
//	bgtask.events.<task-id>.<type>
//
// so that subject permissions and core subscriptions (bgtask.events.*.cancelled)
// can tell the types apart, and the stream's subject transform stores it on one
// subject per task, its StoredSubject:
//
//	bgtask.events.<task-id>
//
// A task's whole history is that one subject, in order; every append is
// conditional on the last sequence of that subject. That compare-and-swap is the
// one mechanism that gives single ownership: two writers that read the same
// history can never both append after it. The stored subject does not carry the
// type: a reader takes it from the event's envelope, as Decode does.
//
// Last and History read with direct gets on the task's subject, no consumer: on
// one server a history is one batched request. On a replicated stream Last asks
// the stream's leader, and History reads until it reaches the leader's last event
// (ErrIncomplete if the replicas it reads from stay behind).
//
// Wake-ups are published to a second stream (InboxStreamName) on
// bgtask.deliver.<target>, with the task id as the message id.
//
// This package is the only code that knows JetStream headers and stream layouts;
// the rest of bgtask talks to the Store and Inbox interfaces.
package events
