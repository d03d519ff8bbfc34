package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
)

// WorkerPrefix starts the subjects on which a worker is told what to do:
// bgtask.worker.<worker-id>.<verb>. A worker subscribes to its own; the engine
// offers tasks on them, and an operator drains a worker there.
const WorkerPrefix = "bgtask.worker"

// Verbs of the worker subjects.
const (
	VerbOffer = "offer"
	VerbDrain = "drain"
)

// WorkerSubject is the subject of one verb of one worker.
func WorkerSubject(workerID, verb string) string { return WorkerPrefix + "." + workerID + "." + verb }

// Offer asks a worker to take an armed task. The worker takes it the usual way, by
// appending spawned conditional on the task's last event, so an offer that comes
// twice, late, or to two workers at once still starts the command once.
type Offer struct {
	TaskID string `json:"task_id"`
}

// OfferReply says whether the worker took the task, and if not, why.
type OfferReply struct {
	Taken  bool   `json:"taken"`
	Reason string `json:"reason,omitempty"`
}

// Reasons a worker declines an offer.
const (
	DeclineFull     = "full"      // no free slot
	DeclineNotReady = "not_ready" // starting, draining or stopping
	DeclineLabels   = "labels"    // its labels do not match the task's placement
	DeclineTaken    = "taken"     // the task is no longer armed: someone else took it, or it ended
	DeclineError    = "error"     // it could not read the task or write its state
)

// DrainReply is a worker's answer to a drain: what it still runs before it exits.
type DrainReply struct {
	ID      string   `json:"id"`
	Running []string `json:"running"`
}

// ErrNoWorker means nothing answers on the worker's subject: it is not running.
var ErrNoWorker = errors.New("no worker with this id is running")

// OfferTask offers a task to a worker and waits for its answer.
func OfferTask(ctx context.Context, nc *nats.Conn, workerID string, o Offer) (OfferReply, error) {
	var reply OfferReply
	return reply, request(ctx, nc, WorkerSubject(workerID, VerbOffer), o, &reply)
}

// DrainWorker tells a worker to drain: take no new task, and exit when its runs end.
func DrainWorker(ctx context.Context, nc *nats.Conn, workerID string) (DrainReply, error) {
	var reply DrainReply
	return reply, request(ctx, nc, WorkerSubject(workerID, VerbDrain), struct{}{}, &reply)
}

func request(ctx context.Context, nc *nats.Conn, subject string, req, reply any) error {
	data, err := json.Marshal(req)
	if err != nil {
		return err
	}
	msg, err := nc.RequestWithContext(ctx, subject, data)
	if errors.Is(err, nats.ErrNoResponders) {
		return ErrNoWorker
	}
	if err != nil {
		return fmt.Errorf("%s: %w", subject, err)
	}
	if err := json.Unmarshal(msg.Data, reply); err != nil {
		return fmt.Errorf("%s: unreadable reply: %w", subject, err)
	}
	return nil
}
