package events

import "time"

// DeliveryAttempt claims attempt number Attempt of push sink Sink (its index in the
// spec's deliver list) for the writer, before anything is sent. The conditional
// append makes the claim exclusive among engine replicas; the claim holds until
// Until, after which an attempt without a result may be claimed again.
type DeliveryAttempt struct {
	Sink     int    `json:"sink"`
	SinkType string `json:"sink_type"`
	Attempt  int    `json:"attempt"`
	// Instance is the engine process that claimed it: the same writer with another
	// instance is a previous run of that engine, whose claim died with it.
	Instance string    `json:"instance"`
	Until    time.Time `json:"until"`
}

// DeliveryResult is how an attempt ended. RetryAt is set when another attempt
// follows (chosen with jitter when the result was written, so a replay sees the
// same schedule); a failure without it is the last.
type DeliveryResult struct {
	Sink    int  `json:"sink"`
	Attempt int  `json:"attempt"`
	OK      bool `json:"ok"`
	// HTTPStatus for a webhook, ExitCode for an exec sink, Error when neither
	// tells the whole story (a refused connection, a timeout, a start failure).
	HTTPStatus int        `json:"http_status,omitempty"`
	ExitCode   *int       `json:"exit_code,omitempty"`
	Error      string     `json:"error,omitempty"`
	Output     string     `json:"output,omitempty"`
	DurationMS int64      `json:"duration_ms"`
	RetryAt    *time.Time `json:"retry_at,omitempty"`
}

// DeliveryFailed records that a push sink gave up; the wake-up stays in the inbox.
type DeliveryFailed struct {
	Sink     int    `json:"sink"`
	Attempts int    `json:"attempts"`
	Reason   string `json:"reason"`
}

// RedeliveryRequested starts the push of each sink in Sinks over (bgtask
// redeliver), each of which was delivered or gave up: the same wake-up, due
// again, retried as its sink says.
type RedeliveryRequested struct {
	Sinks []int `json:"sinks"`
}

func (*DeliveryAttempt) EventType() Type     { return TypeDeliveryAttempt }
func (*DeliveryResult) EventType() Type      { return TypeDeliveryResult }
func (*DeliveryFailed) EventType() Type      { return TypeDeliveryFailed }
func (*RedeliveryRequested) EventType() Type { return TypeRedeliveryRequested }
