// Package events defines bgtask's lifecycle events and the streams they live in.
//
// Every change of a task is an immutable Event appended to one JetStream stream
// (StreamName), on one subject per task and event type:
//
//	bgtask.events.<task-id>.<type>
//
// so a task's whole history is the subject filter bgtask.events.<task-id>.> and every
// append can be made conditional on the last sequence of that filter. That
// compare-and-swap is the one mechanism that gives single ownership: two writers
// that read the same history can never both append after it.
//
// Wake-ups are published to a second stream (InboxStreamName) on
// bgtask.deliver.<target>, with the task id as the message id.
//
// This package is the only code that knows JetStream headers and stream layouts;
// the rest of bgtask talks to the Store and Inbox interfaces.
package events
