package engine

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/bgtask/bgtask/events"
)

// Delivery policies: when a fired wake-up is pushed to the spec's sinks. The inbox
// copy is written at fire time whatever the policy.
const (
	// PolicyQueue (the default) pushes at once if the target is idle, whatever other
	// pushes are running, and holds the wake-up while it is busy; held wake-ups go
	// out one after another, in the order they fired, when it is idle again.
	PolicyQueue = "queue"
	// PolicyDeferIdle is queue, and also holds while an earlier wake-up of the same
	// target is not acknowledged yet, or another one's push is in flight, so the
	// runtime gets one at a time.
	PolicyDeferIdle = "defer_idle"
	// PolicyImmediate pushes at once, whatever the target's state.
	PolicyImmediate = "immediate"
)

// Push sink types.
const (
	SinkWebhook = "webhook"
	SinkExec    = "exec"
)

// Limits and defaults of push sinks.
const (
	MaxSinks         = 8
	MaxAttemptsLimit = 20
	// DefaultRetryFor is how long a push is retried after its first attempt: long
	// enough to ride out a receiver's restart, a night's outage or a laptop's
	// sleep; MaxRetryFor bounds what a sink may ask for, which keeps a task's
	// history (two events per attempt, an attempt every 2.5 to 5 minutes once
	// the backoff reached MaxRetryWait) within about 8,000 events.
	DefaultRetryFor       = 24 * time.Hour
	MaxRetryFor           = 7 * 24 * time.Hour
	DefaultWebhookTimeout = 30 * time.Second
	DefaultExecTimeout    = 10 * time.Minute
	MaxSinkTimeout        = time.Hour
	// claimGrace is added to a sink's timeout to make an attempt's claim: an
	// attempt still without a result after it died with its engine.
	claimGrace = 15 * time.Second
)

// Sink is a push sink of a spec's deliver list.
type Sink struct {
	// Type is webhook or exec.
	Type string `json:"type" jsonschema:"webhook or exec"`
	// URL is where a webhook POSTs the wake-up.
	URL string `json:"url,omitempty" jsonschema:"webhook: the http(s) URL the wake-up is POSTed to, signed"`
	// Body is a webhook's body as a JSON template: its string values may use the
	// prompt's placeholders and {{prompt}} (see RenderBody). Without it, the body
	// is the wake-up JSON.
	Body json.RawMessage `json:"body,omitempty" jsonschema:"webhook: the body as a JSON template whose strings may use the prompt's placeholders and {{prompt}} (default: the wake-up)"`
	// OmitEmpty leaves out of Body each string value that renders empty: an
	// object's member with its key, an array's element.
	OmitEmpty bool `json:"omit_empty,omitempty" jsonschema:"webhook with a body: leave out each string value of the body that renders empty (an object's member with its key)"`
	// Bearer names a bearer token the server declares (WebhookBearer), which a
	// webhook sends as Authorization: Bearer. The token itself is never in a spec.
	Bearer string `json:"bearer,omitempty" jsonschema:"webhook: the name of a bearer token the server declares, sent as Authorization: Bearer"`
	// Argv is the program an exec sink runs, with the rendered prompt on stdin; its
	// elements may use the prompt's placeholders and {{prompt}}.
	Argv []string `json:"argv,omitempty" jsonschema:"exec: the program and its arguments, which may use the prompt's placeholders and {{prompt}}; the prompt is on its stdin"`
	// Timeout bounds one attempt (default 30s for a webhook, 10m for exec).
	Timeout string `json:"timeout,omitempty" jsonschema:"bound of one attempt (default 30s for a webhook, 10m for exec)"`
	// RetryFor is how long after its first attempt a push is retried (default
	// 24h, at most 7 days); the last attempt is made when it ends.
	RetryFor string `json:"retry_for,omitempty" jsonschema:"how long after its first attempt a failed push is retried, a duration (default 24h, at most 168h)"`
	// MaxAttempts, if set, also bounds the attempts.
	MaxAttempts int `json:"max_attempts,omitempty" jsonschema:"optional: also bounds the attempts, 1 to 20"`
}

// AttemptTimeout is how long one attempt may take.
func (k Sink) AttemptTimeout() time.Duration {
	if d, err := time.ParseDuration(k.Timeout); err == nil && d > 0 {
		return d
	}
	if k.Type == SinkExec {
		return DefaultExecTimeout
	}
	return DefaultWebhookTimeout
}

// RetryWindow is how long after its first attempt the sink's push is retried.
func (k Sink) RetryWindow() time.Duration {
	if d, err := time.ParseDuration(k.RetryFor); err == nil && d > 0 {
		return d
	}
	return DefaultRetryFor
}

// DeliveryPolicy is the spec's policy, or the default.
func (s Spec) DeliveryPolicy() string {
	if s.Policy == "" {
		return PolicyQueue
	}
	return s.Policy
}

func (s *Spec) validateDelivery() error {
	switch s.Policy {
	case "", PolicyQueue, PolicyDeferIdle, PolicyImmediate:
	default:
		return fieldErr("policy", "%q: want queue, defer_idle or immediate", s.Policy)
	}
	if len(s.Deliver) > MaxSinks {
		return fieldErr("deliver", "%d sinks: at most %d", len(s.Deliver), MaxSinks)
	}
	for i := range s.Deliver {
		if string(s.Deliver[i].Body) == "null" {
			s.Deliver[i].Body = nil
		}
		if err := checkSink(s.Deliver[i], fmt.Sprintf("deliver[%d]", i)); err != nil {
			return err
		}
	}
	return nil
}

// checkSink checks one push sink, named field in the errors.
func checkSink(k Sink, field string) error {
	var err error
	switch k.Type {
	case SinkWebhook:
		err = checkWebhookSink(k, field)
	case SinkExec:
		err = checkExecSink(k, field)
	case "":
		err = fieldErr(field+".type", "required: webhook or exec")
	default:
		err = fieldErr(field+".type", "%q: want webhook or exec", k.Type)
	}
	if err != nil {
		return err
	}
	if err := checkSinkDuration(k.Timeout, field+".timeout", MaxSinkTimeout); err != nil {
		return err
	}
	if err := checkSinkDuration(k.RetryFor, field+".retry_for", MaxRetryFor); err != nil {
		return err
	}
	if k.MaxAttempts < 0 || k.MaxAttempts > MaxAttemptsLimit {
		return fieldErr(field+".max_attempts", "%d: want 1 to %d", k.MaxAttempts, MaxAttemptsLimit)
	}
	return nil
}

func checkWebhookSink(k Sink, field string) error {
	if err := checkWebhookURL(k.URL); err != nil {
		return fieldErr(field+".url", "%v", err)
	}
	if len(k.Argv) > 0 {
		return fieldErr(field+".argv", "only with type exec")
	}
	if k.Body != nil {
		if err := checkBody(k.Body, field+".body"); err != nil {
			return err
		}
	} else if k.OmitEmpty {
		return fieldErr(field+".omit_empty", "only with a body: the wake-up JSON has no template to leave values out of")
	}
	if k.Bearer != "" && !events.ValidToken(k.Bearer) {
		return fieldErr(field+".bearer", "%q: a bearer token's name is 1-128 letters, digits, '-' or '_'", k.Bearer)
	}
	return nil
}

func checkExecSink(k Sink, field string) error {
	if len(k.Argv) == 0 || k.Argv[0] == "" {
		return fieldErr(field+".argv", "exec needs an argv with a program first")
	}
	for j, a := range k.Argv {
		if strings.ContainsRune(a, 0) {
			return fieldErr(field+".argv", "argv[%d] contains a NUL byte", j)
		}
		if err := checkTemplate(a, argvPlaceholders); err != nil {
			return fieldErr(field+".argv", "argv[%d]: %v", j, err)
		}
	}
	if err := checkExecArgv(k.Argv); err != nil {
		return fieldErr(field+".argv", "%v", err)
	}
	switch {
	case k.URL != "":
		return fieldErr(field+".url", "only with type webhook")
	case k.Body != nil:
		return fieldErr(field+".body", "only with type webhook")
	case k.Bearer != "":
		return fieldErr(field+".bearer", "only with type webhook")
	case k.OmitEmpty:
		return fieldErr(field+".omit_empty", "only with type webhook")
	}
	return nil
}

// inDays says a limit of whole days in days too.
func inDays(d time.Duration) string {
	if d < 24*time.Hour || d%(24*time.Hour) != 0 {
		return ""
	}
	return fmt.Sprintf(" (%d days)", d/(24*time.Hour))
}

// checkSinkDuration checks a sink's duration field, when given: positive and
// at most limit.
func checkSinkDuration(value, field string, limit time.Duration) error {
	if value == "" {
		return nil
	}
	d, err := parsePositiveDuration(value)
	if err != nil {
		return fieldErr(field, "%v", err)
	}
	if d > limit {
		return fieldErr(field, "%s is over the limit of %s%s", d, limit, inDays(limit))
	}
	return nil
}

func checkWebhookURL(raw string) error {
	if raw == "" {
		return fmt.Errorf("required for a webhook")
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return fmt.Errorf("%q is not a URL: %v", raw, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("%q: want an http or https URL", raw)
	case u.Host == "":
		return fmt.Errorf("%q has no host", raw)
	case u.User != nil:
		return fmt.Errorf("%q: credentials do not belong in a URL kept in the event stream", raw)
	}
	return nil
}

// reserved are the ranges outside public unicast that netip has no predicate for.
var reserved = []struct {
	prefix netip.Prefix
	class  string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "this-network"},
	{netip.MustParsePrefix("100.64.0.0/10"), "carrier-grade NAT"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
}

var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
)

// NonPublic names the range of a that is not public unicast, or is "" for a public
// address: loopback, private, link-local (169.254.169.254, the cloud metadata
// address, among them), carrier-grade NAT, unspecified, multicast, broadcast and
// reserved, and IPv4 addresses of those inside IPv6 (mapped, NAT64, 6to4). A server
// run with --webhook-deny-private sends no webhook to such an address.
func NonPublic(a netip.Addr) string {
	a = a.Unmap()
	switch {
	case a.IsLoopback():
		return "loopback"
	case a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast():
		return "link-local"
	case a.IsPrivate():
		return "private"
	case a.IsUnspecified():
		return "unspecified"
	case !a.IsGlobalUnicast():
		return "non-unicast"
	}
	for _, r := range reserved {
		if r.prefix.Contains(a) {
			return r.class
		}
	}
	b := a.As16()
	switch {
	case nat64.Contains(a):
		return NonPublic(netip.AddrFrom4([4]byte(b[12:16])))
	case sixToFour.Contains(a):
		return NonPublic(netip.AddrFrom4([4]byte(b[2:6])))
	}
	return ""
}

// CheckPublicWebhooks refuses a spec with a webhook whose URL names a non-public
// address (see NonPublic) or localhost: what a server run with
// --webhook-deny-private can tell at registration. A name is resolved, and checked
// again, at each push.
func CheckPublicWebhooks(s Spec) error {
	for i, k := range s.Deliver {
		if k.Type != SinkWebhook {
			continue
		}
		u, err := url.Parse(k.URL)
		if err != nil {
			continue // validateDelivery has refused it
		}
		host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
		class := ""
		if a, err := netip.ParseAddr(host); err == nil {
			class = NonPublic(a)
		} else if host == "localhost" || strings.HasSuffix(host, ".localhost") {
			class = "loopback"
		}
		if class != "" {
			return fieldErr(fmt.Sprintf("deliver[%d].url", i), "%s is a %s address, which this server refuses (--webhook-deny-private)", u.Hostname(), class)
		}
	}
	return nil
}

// SinkState is how far one push sink of a fired task has got.
type SinkState struct {
	Type     string `json:"type"`
	Attempts int    `json:"attempts,omitempty"`
	// FirstAttemptAt starts the sink's retry window (Sink.RetryWindow).
	FirstAttemptAt *time.Time `json:"first_attempt_at,omitempty"`
	// Claim is the attempt in flight (claimed, no result yet), and ClaimedBy its writer.
	Claim     *events.DeliveryAttempt `json:"claim,omitempty"`
	ClaimedBy string                  `json:"claimed_by,omitempty"`
	// RetryAt is when the next attempt is due after a failed one.
	RetryAt   *time.Time `json:"retry_at,omitempty"`
	LastError string     `json:"last_error,omitempty"`
	Delivered bool       `json:"delivered,omitempty"`
	// GivingUp: the last attempt failed and none follows; delivery-failed is due.
	GivingUp bool `json:"giving_up,omitempty"`
	Failed   bool `json:"failed,omitempty"`
	// Redelivering: a redelivery (bgtask redeliver) asked for the push again
	// after it was done, and it is not done again yet. The push starts over:
	// its retry window from its next attempt, its max_attempts counted after
	// EarlierAttempts, the attempts made before. Redeliveries counts them.
	Redelivering    bool `json:"redelivering,omitempty"`
	Redeliveries    int  `json:"redeliveries,omitempty"`
	EarlierAttempts int  `json:"earlier_attempts,omitempty"`
	// Skipped: the wake-up was consumed (a wait returned it) before this push
	// was made, so it is not made.
	Skipped bool `json:"skipped,omitempty"`
}

// A task's delivery state: how far its push sinks have got, as a whole.
const (
	// DeliveryPending: a push is still to be made, retried or recorded.
	DeliveryPending = "pending"
	// DeliveryDelivered: every push was made (or not made, its wake-up consumed).
	DeliveryDelivered = "delivered"
	// DeliveryFailed: every push is done and one of them gave up
	// (delivery-failed).
	DeliveryFailed = "failed"
)

// DeliveryStates are the delivery states a list may select.
var DeliveryStates = []string{DeliveryPending, DeliveryDelivered, DeliveryFailed}

// deliveryState sums up the task's push sinks; "" if it has none (not fired, or
// fired quiet or with no sink).
func (s State) deliveryState() string {
	if len(s.Deliveries) == 0 {
		return ""
	}
	state := DeliveryDelivered
	for _, k := range s.Deliveries {
		switch {
		case !k.Done():
			return DeliveryPending
		case k.Failed:
			state = DeliveryFailed
		}
	}
	return state
}

// Done reports whether the sink has nothing more to do.
func (k SinkState) Done() bool { return k.Delivered || k.Failed || k.Skipped }

// Acknowledged reports whether a task's push sinks are all done: under defer_idle,
// a later wake-up of its target waits for that.
func (s State) Acknowledged() bool {
	for _, k := range s.Deliveries {
		if !k.Done() {
			return false
		}
	}
	return true
}

// Engine is an engine process as a claimant of deliveries: its writer id, and the
// instance that tells this run of it from an earlier one.
type Engine struct {
	Writer   string
	Instance string
}

// claimLive reports whether a claim still holds at now for engine me: it has not
// expired, and it is not a claim of an earlier run of me, which died with it.
func claimLive(k SinkState, me Engine, now time.Time) bool {
	if k.Claim == nil {
		return false
	}
	if k.ClaimedBy == me.Writer && k.Claim.Instance != me.Instance {
		return false
	}
	return now.Before(k.Claim.Until)
}

func (s State) sink(i int) (SinkState, error) {
	if s.Phase != PhaseFired {
		return SinkState{}, phaseError(s)
	}
	if i < 0 || i >= len(s.Deliveries) {
		return SinkState{}, fmt.Errorf("%w: task %s has no sink %d", ErrWrongPhase, s.ID, i)
	}
	return s.Deliveries[i], nil
}

func (s State) applyDelivery(payload events.Payload, rec events.Record) (State, error) {
	var i int
	switch p := payload.(type) {
	case *events.DeliveryAttempt:
		i = p.Sink
	case *events.DeliveryResult:
		i = p.Sink
	case *events.DeliveryFailed:
		i = p.Sink
	}
	k, err := s.sink(i)
	if err != nil {
		return s, err
	}
	if k.Done() {
		return s, fmt.Errorf("%w: sink %d of task %s is done", ErrWrongPhase, i, s.ID)
	}
	switch p := payload.(type) {
	case *events.DeliveryAttempt:
		switch {
		case k.GivingUp:
			return s, fmt.Errorf("%w: sink %d of task %s has made its last attempt", ErrWrongPhase, i, s.ID)
		case p.Attempt != k.Attempts+1:
			return s, fmt.Errorf("attempt %d of sink %d after %d attempts", p.Attempt, i, k.Attempts)
		case claimLive(k, Engine{Writer: rec.Writer, Instance: p.Instance}, rec.Time):
			return s, fmt.Errorf("%w: attempt %d of sink %d is claimed by %s until %s", ErrNotOwner,
				k.Claim.Attempt, i, k.ClaimedBy, k.Claim.Until.Format(time.RFC3339))
		}
		claim := *p
		k.Attempts, k.Claim, k.ClaimedBy, k.RetryAt = p.Attempt, &claim, rec.Writer, nil
		if k.FirstAttemptAt == nil {
			at := rec.Time
			k.FirstAttemptAt = &at
		}
	case *events.DeliveryResult:
		switch {
		case k.Claim == nil || k.Claim.Attempt != p.Attempt:
			return s, fmt.Errorf("result of attempt %d of sink %d, which is not in flight", p.Attempt, i)
		case rec.Writer != k.ClaimedBy:
			return s, fmt.Errorf("%w: %s reports attempt %d of sink %d, claimed by %s", ErrNotOwner, rec.Writer, p.Attempt, i, k.ClaimedBy)
		}
		k.Claim, k.ClaimedBy, k.LastError = nil, "", p.Error
		switch {
		case p.OK:
			k.Delivered, k.Redelivering = true, false
		case p.RetryAt != nil:
			retry := *p.RetryAt
			k.RetryAt = &retry
		default:
			k.GivingUp = true
		}
	case *events.DeliveryFailed:
		if !k.GivingUp {
			return s, fmt.Errorf("%w: sink %d of task %s has attempts left", ErrWrongPhase, i, s.ID)
		}
		k.GivingUp, k.Failed, k.Redelivering = false, true, false
	}
	s.Deliveries = append([]SinkState(nil), s.Deliveries...) // states are values: never share
	s.Deliveries[i] = k
	return s, nil
}

// ClaimDelivery claims the next attempt of a push sink for engine Engine; the claim
// holds for the sink's timeout and a grace.
type ClaimDelivery struct {
	Sink   int
	Engine Engine
}

func (c ClaimDelivery) decide(s State, m Meta) (events.Payload, uint64, error) {
	k, err := s.sink(c.Sink)
	if err != nil {
		return nil, 0, err
	}
	switch {
	case k.Done() || k.GivingUp:
		return nil, 0, fmt.Errorf("%w: sink %d of task %s has no attempt to make", ErrWrongPhase, c.Sink, s.ID)
	case claimLive(k, c.Engine, m.Now):
		return nil, 0, fmt.Errorf("%w: sink %d of task %s is in flight", ErrNotOwner, c.Sink, s.ID)
	}
	spec := s.Spec.Deliver[c.Sink]
	return &events.DeliveryAttempt{
		Sink: c.Sink, SinkType: spec.Type, Attempt: k.Attempts + 1, Instance: c.Engine.Instance,
		Until: m.Now.Add(spec.AttemptTimeout() + claimGrace),
	}, s.Epoch, nil
}

// SinkOutcome is what one attempt of a push sink came to.
type SinkOutcome struct {
	OK bool
	// Permanent: a failure that another attempt would not change (a 4xx).
	Permanent  bool
	HTTPStatus int
	ExitCode   *int
	Error      string
	Output     string
	Duration   time.Duration
	// RetryAfter is the receiver's own wish (a Retry-After header), if any.
	RetryAfter time.Duration
}

// RecordDelivery records the outcome of the attempt in flight. Backoff is the wait
// before the next attempt, if the outcome allows one.
type RecordDelivery struct {
	Sink    int
	Outcome SinkOutcome
	Backoff time.Duration
}

func (c RecordDelivery) decide(s State, m Meta) (events.Payload, uint64, error) {
	k, err := s.sink(c.Sink)
	if err != nil {
		return nil, 0, err
	}
	if k.Claim == nil || k.ClaimedBy != m.Writer {
		return nil, 0, fmt.Errorf("%w: sink %d of task %s has no attempt of %s in flight", ErrNotOwner, c.Sink, s.ID, m.Writer)
	}
	o := c.Outcome
	r := &events.DeliveryResult{
		Sink: c.Sink, Attempt: k.Claim.Attempt, OK: o.OK, HTTPStatus: o.HTTPStatus, ExitCode: o.ExitCode,
		Error: o.Error, Output: o.Output, DurationMS: o.Duration.Milliseconds(),
	}
	if !o.OK && !o.Permanent {
		r.RetryAt = k.nextAttempt(s.Spec.Deliver[c.Sink], m.Now, c.Backoff)
	}
	return r, s.Epoch, nil
}

// RetryUntil is when the sink's retry window ends: the zero time before its first
// attempt.
func (k SinkState) RetryUntil(sink Sink) time.Time {
	if k.FirstAttemptAt == nil {
		return time.Time{}
	}
	return k.FirstAttemptAt.Add(sink.RetryWindow())
}

// nextAttempt is when the attempt after the one that failed at now is made:
// backoff later, or when the retry window ends if that comes first. It is nil when
// none follows: the window ended, or the sink's max_attempts are made (since the
// push last started over).
func (k SinkState) nextAttempt(sink Sink, now time.Time, backoff time.Duration) *time.Time {
	until := k.RetryUntil(sink)
	if !now.Before(until) || sink.MaxAttempts > 0 && k.Attempts-k.EarlierAttempts >= sink.MaxAttempts {
		return nil
	}
	at := now.Add(backoff)
	if at.After(until) {
		at = until
	}
	return &at
}

// GiveUpDelivery records that a push sink failed for good.
type GiveUpDelivery struct{ Sink int }

func (c GiveUpDelivery) decide(s State, _ Meta) (events.Payload, uint64, error) {
	k, err := s.sink(c.Sink)
	if err != nil {
		return nil, 0, err
	}
	if !k.GivingUp {
		return nil, 0, fmt.Errorf("%w: sink %d of task %s is not giving up", ErrWrongPhase, c.Sink, s.ID)
	}
	reason := k.LastError
	if reason == "" {
		reason = "the last attempt failed"
	}
	return &events.DeliveryFailed{Sink: c.Sink, Attempts: k.Attempts, Reason: reason}, s.Epoch, nil
}

// Push names one sink of one task.
type Push struct {
	TaskID string
	Sink   int
}

// Plan is what to do now about the pushes of one target.
type Plan struct {
	// Start are attempts to claim and make now; GiveUp are sinks whose last attempt
	// failed, to be recorded as delivery-failed.
	Start, GiveUp []Push
	// Held are the tasks whose pushes wait for the target or an earlier wake-up.
	Held []string
	// Next is when the plan may change by time alone (a retry due, a claim expiring,
	// a busy state ending); zero if never.
	Next time.Time
}

// PlanTarget decides which pushes of one target's fired tasks start at now, with
// tasks in the order they fired. It is the policies' one definition:
//   - immediate starts every due attempt;
//   - queue holds while the target is busy; when it is idle, a wake-up that fired
//     while it was idle starts at once, whatever else is in flight, and the ones
//     held for it while it was busy start one after another, in the order they
//     fired, each when the one before has no attempt in flight;
//   - defer_idle holds like queue, and also while any earlier wake-up of the target
//     has a sink not done (delivered, or failed for good), or any other has an
//     attempt in flight (a later one, once a redelivery made an earlier one due
//     again), so one push at a time reaches the target.
//
// Which wake-ups were held comes from the target's state, not from memory: those
// that fired before it became idle (its since, or the until of a busy state that
// ran out). A failed attempt waiting for its retry holds only later defer_idle
// tasks.
func PlanTarget(tasks []State, target events.TargetState, me Engine, now time.Time) Plan {
	var plan Plan
	later := func(t time.Time) {
		if t.After(now) && (plan.Next.IsZero() || t.Before(plan.Next)) {
			plan.Next = t
		}
	}
	busy := target.BusyAt(now)
	if busy && target.Until != nil {
		later(*target.Until)
	}
	idleSince := idleSince(target, now)
	tasksInFlight := 0
	for _, s := range tasks {
		if pushInFlight(s, me, now) {
			tasksInFlight++
		}
	}
	draining, unacknowledged := false, false
	for _, s := range tasks {
		var due []Push
		inFlight := pushInFlight(s, me, now)
		for i, k := range s.Deliveries {
			switch {
			case k.Done():
			case k.GivingUp:
				plan.GiveUp = append(plan.GiveUp, Push{s.ID, i})
			case claimLive(k, me, now):
				later(k.Claim.Until)
			case k.RetryAt != nil && k.RetryAt.After(now):
				later(*k.RetryAt)
			default:
				due = append(due, Push{s.ID, i})
			}
		}
		policy := s.Spec.DeliveryPolicy()
		held := policy == PolicyQueue && s.FiredAt != nil && s.FiredAt.Before(idleSince)
		if held && inFlight {
			draining = true
		}
		if len(due) > 0 {
			hold := false
			switch policy {
			case PolicyQueue:
				hold = busy || (held && draining)
			case PolicyDeferIdle:
				others := tasksInFlight
				if inFlight {
					others--
				}
				hold = busy || unacknowledged || others > 0
			}
			if hold {
				plan.Held = append(plan.Held, s.ID)
			} else {
				plan.Start = append(plan.Start, due...)
				draining = draining || held
			}
		}
		if !s.Acknowledged() {
			unacknowledged = true
		}
	}
	return plan
}

// pushInFlight reports whether a push of task s has an attempt in flight at now.
func pushInFlight(s State, me Engine, now time.Time) bool {
	return slices.ContainsFunc(s.Deliveries, func(k SinkState) bool {
		return !k.Done() && !k.GivingUp && claimLive(k, me, now)
	})
}

// idleSince is when a target that is idle at now became idle; zero if it is busy
// or that is not known (a state written without since, a target never set).
func idleSince(t events.TargetState, now time.Time) time.Time {
	switch {
	case t.BusyAt(now):
		return time.Time{}
	case t.State == events.TargetBusy: // a busy state whose until ran out
		return *t.Until
	}
	return t.Since
}
