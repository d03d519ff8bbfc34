package events

import (
	"encoding/json"
	"fmt"
)

// DecodeRecord decodes one stored event. The record's payload may be a slice of
// data, which must not change while the record is in use.
func DecodeRecord(seq uint64, data []byte) (Record, error) {
	if ev, ok := readEnvelope(data); ok && (len(ev.Payload) == 0 || json.Valid(ev.Payload)) {
		return Record{Seq: seq, Event: ev}, nil
	}
	return decodeJSON(seq, data)
}

// decodeFolded is DecodeRecord for a reader that folds every event it reads: the
// payload is decoded along with the envelope, so the fold does not read it again.
// A payload that does not decode into its type is left to Decode, which reports it
// as it always has.
func decodeFolded(seq uint64, data []byte) (Record, error) {
	ev, ok := readEnvelope(data)
	if !ok {
		return decodeJSON(seq, data)
	}
	rec := Record{Seq: seq, Event: ev}
	if ev.V >= 1 && ev.V <= Version {
		if p, ok := readPayload(ev.Type, ev.Payload); ok {
			rec.decoded = p
			return rec, nil
		}
	}
	if p := newPayload(ev.Type); p != nil && ev.V >= 1 && ev.V <= Version {
		if len(ev.Payload) == 0 || json.Unmarshal(ev.Payload, p) == nil {
			rec.decoded = p
			return rec, nil
		}
	}
	if len(ev.Payload) == 0 || json.Valid(ev.Payload) {
		return rec, nil
	}
	return decodeJSON(seq, data)
}

// decodeJSON decodes an event with encoding/json, whatever its form.
func decodeJSON(seq uint64, data []byte) (Record, error) {
	var ev Event
	if err := json.Unmarshal(data, &ev); err != nil {
		return Record{Seq: seq}, fmt.Errorf("event at seq %d: %w", seq, err)
	}
	return Record{Seq: seq, Event: ev}, nil
}

// readEnvelope reads an event in the form json.Marshal writes an Event: its fields
// in their order, no spaces, and strings of printable ASCII without escapes. Its
// payload is left as it is, in data. Anything else is reported as not read (ok
// false), for encoding/json to decode: so what it reads, it reads as encoding/json
// would, without the cost of scanning every event twice (once to check it, once to
// decode it) and the payload twice more. An event with a field added by a later
// version takes the slower way until this one knows the field.
func readEnvelope(data []byte) (ev Event, ok bool) {
	r := envelopeReader{data: data}
	r.literal(`{"v":`)
	v := r.number()
	r.literal(`,"id":`)
	id := r.str()
	r.literal(`,"task_id":`)
	taskID := r.str()
	r.literal(`,"type":`)
	typ := r.str()
	r.literal(`,"time":`)
	at := r.quoted()
	r.literal(`,"writer":`)
	writer := r.str()
	r.literal(`,"epoch":`)
	epoch := r.number()
	if r.failed {
		return Event{}, false
	}
	ev = Event{V: int(v), ID: string(id), TaskID: string(taskID), Type: knownType(typ), Writer: string(writer), Epoch: epoch}
	if ev.Type == "" {
		ev.Type = Type(typ)
	}
	if err := ev.Time.UnmarshalJSON(at); err != nil {
		return Event{}, false
	}
	rest := data[r.at:]
	if string(rest) == "}" {
		return ev, true
	}
	r.literal(`,"payload":`)
	if r.failed || data[len(data)-1] != '}' {
		return Event{}, false
	}
	// The payload is the rest but the closing brace. Its callers check that it is
	// one JSON value; without spaces around it, it is what encoding/json would keep.
	payload := data[r.at : len(data)-1]
	if len(payload) == 0 || isSpace(payload[0]) || isSpace(payload[len(payload)-1]) {
		return Event{}, false
	}
	ev.Payload = payload
	return ev, true
}

// readPayload reads the payloads of the events a run appends most (its ticks,
// its spawn, its fire) in the form json.Marshal writes them, as readEnvelope reads
// an envelope: anything else is reported as not read (ok false), for
// encoding/json to decode.
func readPayload(t Type, data []byte) (p Payload, ok bool) {
	r := envelopeReader{data: data}
	r.literal(`{`)
	switch t {
	case TypeTick:
		var tick Tick
		if r.has(`"pid":`) {
			tick.PID = int(r.number())
			r.literal(`,`)
		}
		r.literal(`"output_bytes":`)
		tick.OutputBytes = int64(r.number())
		p = &tick
	case TypeSpawned:
		var spawned Spawned
		r.literal(`"worker":`)
		worker := r.str()
		var host []byte
		if r.has(`,"host":`) {
			host = r.str()
		}
		if !r.failed {
			spawned.Worker, spawned.Host = string(worker), string(host)
		}
		p = &spawned
	case TypeFired:
		var fired Fired
		r.literal(`"subject":`)
		subject := r.str()
		r.literal(`,"inbox_seq":`)
		fired.InboxSeq = r.number()
		if !r.failed {
			fired.Subject = string(subject)
		}
		p = &fired
	default:
		return nil, false
	}
	r.literal(`}`)
	if r.failed || r.at != len(data) {
		return nil, false
	}
	return p, true
}

// has reads s if the data goes on with it, and reports whether it did.
func (r *envelopeReader) has(s string) bool {
	if r.failed || len(r.data)-r.at < len(s) || string(r.data[r.at:r.at+len(s)]) != s {
		return false
	}
	r.at += len(s)
	return true
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// envelopeReader reads an event's envelope from the front; failed is set at the
// first byte that is not of the expected form, and every read after it fails too.
type envelopeReader struct {
	data   []byte
	at     int
	failed bool
}

func (r *envelopeReader) literal(s string) {
	if r.failed || len(r.data)-r.at < len(s) || string(r.data[r.at:r.at+len(s)]) != s {
		r.failed = true
		return
	}
	r.at += len(s)
}

// number reads a JSON integer of at most 18 digits: it fits every integer field.
func (r *envelopeReader) number() uint64 {
	start := r.at
	var n uint64
	for !r.failed && r.at < len(r.data) && r.at-start < 18 && r.data[r.at] >= '0' && r.data[r.at] <= '9' {
		n = n*10 + uint64(r.data[r.at]-'0')
		r.at++
	}
	digits := r.at - start
	if digits == 0 || (digits > 1 && r.data[start] == '0') || (r.at < len(r.data) && r.data[r.at] >= '0' && r.data[r.at] <= '9') {
		r.failed = true
	}
	return n
}

// quoted reads a string with its quotes.
func (r *envelopeReader) quoted() []byte {
	start := r.at
	r.literal(`"`)
	for !r.failed && r.at < len(r.data) && r.data[r.at] != '"' {
		if c := r.data[r.at]; c < 0x20 || c > 0x7e || c == '\\' {
			r.failed = true
		}
		r.at++
	}
	r.literal(`"`)
	if r.failed {
		return nil
	}
	return r.data[start:r.at]
}

// str reads a string's contents.
func (r *envelopeReader) str() []byte {
	q := r.quoted()
	if len(q) < 2 {
		return nil
	}
	return q[1 : len(q)-1]
}
