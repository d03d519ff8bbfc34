package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/bgtask/bgtask/events"
)

// Overlap rules: what a slot does when the schedule's previous occurrence still runs.
const (
	OverlapSkip           = "skip"            // the slot is skipped
	OverlapBufferOne      = "buffer_one"      // the newest such slot runs once the previous ends
	OverlapAllow          = "allow"           // it runs alongside
	OverlapCancelPrevious = "cancel_previous" // the previous is cancelled, the slot runs
)

// Catch-up rules: what happens to the slots missed while no engine ran the
// schedule (or while its engines were late).
const (
	CatchUpLatest = "latest" // the latest missed slot runs, late
	CatchUpNone   = "none"   // missed slots are skipped; only a slot on time runs
	CatchUpAll    = "all"    // every missed slot runs, up to MaxCatchUp of the latest
)

// Overlaps and CatchUps are the accepted values, the default first.
var (
	Overlaps = []string{OverlapSkip, OverlapBufferOne, OverlapAllow, OverlapCancelPrevious}
	CatchUps = []string{CatchUpLatest, CatchUpNone, CatchUpAll}
)

const (
	// MaxCatchUp bounds the slots catch_up all registers at once: a schedule
	// every second left alone for a day must not arm 86,400 tasks.
	MaxCatchUp = 100
	// OnTime is how late a slot may be registered and still count as on time,
	// for catch_up none: an engine wakes a little after the slot.
	OnTime = 30 * time.Second
	// MinEvery is the shortest period of an every schedule.
	MinEvery = time.Second
)

// Schedule registers a task, an occurrence, at each of its slots: the times its
// cron expression (in its zone, UTC by default) names, or every period from its
// creation. Each occurrence's idempotency key is made of the schedule's name and
// the slot's time, so a slot is registered once however many engines run it.
type Schedule struct {
	Name    string `json:"name"`
	Cron    string `json:"cron,omitempty"`
	TZ      string `json:"tz,omitempty"`
	Every   string `json:"every,omitempty"`
	Overlap string `json:"overlap,omitempty"`
	CatchUp string `json:"catch_up,omitempty"`
	Paused  bool   `json:"paused,omitempty"`
	// Spec is the task spec each occurrence registers, as bgtask add would; it has
	// no idempotency key nor occurrence: each occurrence gets its own.
	Spec      json.RawMessage `json:"spec"`
	CreatedAt time.Time       `json:"created_at"`
	// After: the slots after it are due. It is the last slot handled (registered
	// or skipped), or when the schedule was added or resumed.
	After time.Time `json:"after"`
	// LastSlot and LastID are the latest occurrence registered, by its slot or a
	// trigger: the one the overlap rule looks at.
	LastSlot time.Time `json:"last_slot,omitzero"`
	LastID   string    `json:"last_id,omitempty"`
	// Buffered is the slot overlap buffer_one holds until the previous ends.
	Buffered *time.Time `json:"buffered,omitempty"`
}

// ParseSchedule decodes a schedule as stored or as sent to add, and validates it.
func ParseSchedule(data []byte) (Schedule, error) {
	if err := CheckJSON(data, "schedule"); err != nil {
		return Schedule{}, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var s Schedule
	if err := dec.Decode(&s); err != nil {
		return Schedule{}, fieldErr("schedule", "%v", err)
	}
	return s, s.Validate()
}

// Validate checks every field, naming the first that is wrong, and fills in the
// defaults of overlap and catch_up.
func (s *Schedule) Validate() error {
	if !events.ValidToken(s.Name) {
		return fieldErr("name", "%q: use letters, digits, '-' and '_'", s.Name)
	}
	next, err := s.times()
	if err != nil {
		return err
	}
	// The cron parser looks five years ahead for a slot, which holds every date
	// there is, 29 February included: a cron that names none there never fires.
	if next(s.CreatedAt).IsZero() {
		return fieldErr("cron", "%q never fires: it names no date in the next five years", s.Cron)
	}
	if s.Overlap == "" {
		s.Overlap = OverlapSkip
	}
	if !slices.Contains(Overlaps, s.Overlap) {
		return fieldErr("overlap", "%q: want one of %s", s.Overlap, strings.Join(Overlaps, ", "))
	}
	if s.CatchUp == "" {
		s.CatchUp = CatchUpLatest
	}
	if !slices.Contains(CatchUps, s.CatchUp) {
		return fieldErr("catch_up", "%q: want one of %s", s.CatchUp, strings.Join(CatchUps, ", "))
	}
	return s.validateSpec()
}

// validateSpec checks the template as an occurrence of it would be registered.
func (s *Schedule) validateSpec() error {
	if len(s.Spec) == 0 {
		return fieldErr("spec", "required: the task each slot registers")
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(s.Spec, &fields); err != nil {
		return fieldErr("spec", "not a JSON object: %v", err)
	}
	for _, f := range []string{"idempotency_key", "occurrence"} {
		if _, ok := fields[f]; ok {
			return fieldErr("spec."+f, "set by the schedule for each occurrence")
		}
	}
	for _, f := range []string{"start_at", "deadline"} {
		var v string
		if raw, ok := fields[f]; ok && json.Unmarshal(raw, &v) == nil {
			if _, err := time.ParseDuration(v); err != nil {
				return fieldErr("spec."+f, "%q: give a duration from each slot; one time would be past for all the slots after it", v)
			}
		}
	}
	raw, err := s.OccurrenceSpec(time.Unix(0, 0).UTC())
	if err != nil {
		return fieldErr("spec", "%v", err)
	}
	if _, err := ParseSpec(raw); err != nil {
		var fe *FieldError
		if errors.As(err, &fe) {
			return fieldErr("spec."+fe.Field, "%s", fe.Reason)
		}
		return fieldErr("spec", "%v", err)
	}
	return nil
}

// times is the schedule's slots as a function from a time to the next slot after it.
func (s *Schedule) times() (func(time.Time) time.Time, error) {
	switch {
	case s.Cron != "" && s.Every != "":
		return nil, fieldErr("every", "give cron or every, not both")
	case s.Every != "":
		if s.TZ != "" {
			return nil, fieldErr("tz", "only with cron: every counts real time")
		}
		d, err := time.ParseDuration(s.Every)
		if err != nil || d < MinEvery {
			return nil, fieldErr("every", "%q: want a duration of at least %s, like 30s or 1h", s.Every, MinEvery)
		}
		anchor := s.CreatedAt.Truncate(time.Second)
		return func(t time.Time) time.Time {
			if t.Before(anchor) {
				return anchor.Add(d)
			}
			return anchor.Add((t.Sub(anchor)/d + 1) * d)
		}, nil
	case s.Cron != "":
		return s.cronTimes()
	}
	return nil, fieldErr("cron", "give cron (with tz) or every")
}

// cronParser reads the standard five fields and the descriptors (@hourly...).
var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

func (s *Schedule) cronTimes() (func(time.Time) time.Time, error) {
	loc := time.UTC
	if s.TZ != "" {
		l, err := time.LoadLocation(s.TZ)
		if err != nil || s.TZ == "Local" {
			return nil, fieldErr("tz", "%q: want an IANA zone, like Europe/Paris", s.TZ)
		}
		loc = l
	}
	if strings.HasPrefix(s.Cron, "@every") || strings.Contains(s.Cron, "TZ=") {
		return nil, fieldErr("cron", "%q: give every and tz as fields of their own", s.Cron)
	}
	parsed, err := cronParser.Parse(s.Cron)
	if err != nil {
		return nil, fieldErr("cron", "%q: %v", s.Cron, err)
	}
	spec := parsed.(*cron.SpecSchedule)
	spec.Location = loc
	return func(t time.Time) time.Time {
		from := t
		for {
			t = spec.Next(t)
			if gap := skippedSlot(spec, from.In(loc), t); !gap.IsZero() {
				return gap.UTC()
			}
			if t.IsZero() || !repeatedWallClock(t.In(loc)) {
				return t.UTC()
			}
		}
	}, nil
}

// skippedSlot is the instant the clocks jumped forward (spring-forward to
// daylight saving time) between from and next, if the wall clock times they
// skipped hold a slot: such a slot runs when the clocks jump, rather than not at
// all that day. Zero if there is none.
func skippedSlot(spec *cron.SpecSchedule, from, next time.Time) time.Time {
	until := next.In(from.Location())
	if next.IsZero() {
		until = from.AddDate(5, 0, 0)
	}
	for a := from; a.Before(until); {
		b := a.Add(24 * time.Hour)
		if b.After(until) {
			b = until
		}
		_, before := a.Zone()
		if _, after := b.Zone(); before < after {
			// The jump is in (a, b]: find its second.
			lo, hi := a, b
			for hi.Sub(lo) > time.Second {
				mid := lo.Add(hi.Sub(lo) / 2)
				if _, off := mid.Zone(); off == before {
					lo = mid
				} else {
					hi = mid
				}
			}
			fixed := *spec
			fixed.Location = time.FixedZone("", before)
			wall := hi.Truncate(time.Second).In(fixed.Location)
			end := wall.Add(time.Duration(after-before) * time.Second)
			if m := fixed.Next(wall.Add(-time.Second)); !m.IsZero() && m.Before(end) && hi.After(from) && hi.Before(until) {
				return hi.Truncate(time.Second)
			}
		}
		a = b
	}
	return time.Time{}
}

// repeatedWallClock reports whether t's wall clock was shown before, at an
// earlier instant, because the clocks went back (fall-back from daylight saving
// time): such a slot ran at its first instant, and runs once.
func repeatedWallClock(t time.Time) bool {
	_, off := t.Zone()
	for d := 15 * time.Minute; d <= 2*time.Hour; d += 15 * time.Minute {
		if _, before := t.Add(-d).Zone(); time.Duration(before-off)*time.Second == d {
			return true
		}
	}
	return false
}

// Next returns the next n slots after t.
func (s *Schedule) Next(t time.Time, n int) []time.Time {
	next, err := s.times()
	if err != nil {
		return nil
	}
	var out []time.Time
	for t = next(t); len(out) < n && !t.IsZero(); t = next(t) {
		out = append(out, t)
	}
	return out
}

// SlotsBetween returns the slots in (from, to], at most the limit latest of
// them, and how many there were in all.
func (s *Schedule) SlotsBetween(from, to time.Time, limit int) ([]time.Time, int) {
	next, err := s.times()
	if err != nil || limit <= 0 {
		return nil, 0
	}
	var out []time.Time
	n := 0
	for t := next(from); !t.IsZero() && !t.After(to); t = next(t) {
		n++
		if len(out) == limit {
			out = append(out[:0], out[1:]...)
		}
		out = append(out, t)
	}
	return out, n
}

// OccurrenceKey is the idempotency key of the occurrence for slot.
func OccurrenceKey(schedule string, slot time.Time) string {
	return "schedule/" + schedule + "/" + slot.UTC().Format(time.RFC3339Nano)
}

// OccurrenceSpec is the spec registered for slot: the template with the slot's
// idempotency key and occurrence.
func (s *Schedule) OccurrenceSpec(slot time.Time) ([]byte, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(s.Spec, &fields); err != nil {
		return nil, fmt.Errorf("the schedule's spec: %w", err)
	}
	key, _ := json.Marshal(OccurrenceKey(s.Name, slot))
	occ, _ := json.Marshal(Occurrence{Schedule: s.Name, Slot: slot.UTC()})
	fields["idempotency_key"], fields["occurrence"] = key, occ
	return json.Marshal(fields)
}

// Previous is what is known of a schedule's latest occurrence.
type Previous struct {
	ID string
	// Active: it has not ended yet (armed, waiting for its start or a retry, or running).
	Active bool
}

// ScheduleDecision is what to do for a schedule now.
type ScheduleDecision struct {
	// Register are the slots to register now, oldest first.
	Register []time.Time
	// Cancel is the id of the previous occurrence to cancel first ("" for none).
	Cancel string
	// Skipped counts the due slots not registered.
	Skipped int
	// Next is the schedule as it stands once the decision is carried out; the
	// caller stores it, conditional on the revision it read.
	Next Schedule
}

// Changed reports whether the decision changes the schedule.
func (d ScheduleDecision) Changed(s Schedule) bool {
	return len(d.Register) > 0 || !d.Next.After.Equal(s.After) || !equalSlot(d.Next.Buffered, s.Buffered)
}

func equalSlot(a, b *time.Time) bool {
	return (a == nil) == (b == nil) && (a == nil || a.Equal(*b))
}

// DecideSchedule says which slots of s to register at now, given its previous
// occurrence: the due slots are those after s.After up to now; catch_up picks
// among them, and overlap decides against a previous occurrence still active.
// With catch_up all, the missed slots are registered together: the overlap rule
// is about the occurrence before them.
func DecideSchedule(s Schedule, now time.Time, prev Previous) ScheduleDecision {
	d := ScheduleDecision{Next: s}
	if s.Paused {
		return d
	}
	due, n := s.SlotsBetween(s.After, now, MaxCatchUp)
	if n == 0 {
		if s.Buffered != nil && !prev.Active {
			d.Register, d.Next.Buffered = []time.Time{*s.Buffered}, nil
		}
		return d
	}
	d.Next.After = due[len(due)-1]
	chosen := due
	switch s.CatchUp {
	case CatchUpLatest:
		chosen = due[len(due)-1:]
	case CatchUpNone:
		chosen = nil
		if last := due[len(due)-1]; now.Sub(last) <= OnTime {
			chosen = []time.Time{last}
		}
	}
	d.Skipped = n - len(chosen)
	switch {
	case !prev.Active || s.Overlap == OverlapAllow:
		d.Register = chosen
		d.Next.Buffered = nil
	case s.Overlap == OverlapCancelPrevious:
		d.Register, d.Cancel = chosen, prev.ID
		d.Next.Buffered = nil
	case s.Overlap == OverlapBufferOne && len(chosen) > 0:
		if s.Buffered != nil {
			d.Skipped++
		}
		last := chosen[len(chosen)-1]
		d.Next.Buffered = &last
		d.Skipped += len(chosen) - 1
	default:
		d.Skipped += len(chosen)
	}
	if len(d.Register) > 0 {
		d.Next.LastSlot = d.Register[len(d.Register)-1]
	}
	return d
}
