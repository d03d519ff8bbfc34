package events

import (
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf16"
	"unicode/utf8"
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
	case TypeExited:
		return readExited(&r)
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

// readExited reads an exited payload after its opening brace: its fields in the
// order json.Marshal writes them, each optional one if it is there.
func readExited(r *envelopeReader) (Payload, bool) {
	var e Exited
	r.literal(`"exit_code":`)
	e.ExitCode = int(r.signed())
	if r.has(`,"signal":`) {
		e.Signal = r.text()
	}
	if r.has(`,"tail":[`) {
		e.Tail = make([]string, 0, 16)
		for first := true; !r.failed && !r.has(`]`); first = false {
			if !first {
				r.literal(`,`)
			}
			e.Tail = append(e.Tail, r.text())
		}
		if len(e.Tail) == 0 {
			r.failed = true // json.Marshal leaves an empty tail out
		}
	}
	r.literal(`,"started_at":`)
	r.time(&e.StartedAt)
	r.literal(`,"ended_at":`)
	r.time(&e.EndedAt)
	e.Matched = r.has(`,"matched":true`)
	if r.has(`,"matched_line":`) {
		e.MatchedLine = r.text()
	}
	if r.has(`,"stopped_by":`) {
		e.StoppedBy = r.text()
	}
	e.KeptRunning = r.has(`,"kept_running":true`)
	e.NotStarted = r.has(`,"not_started":true`)
	if r.has(`,"result":`) {
		e.Result = r.text()
	}
	if r.has(`,"result_bytes":`) {
		e.ResultBytes = int(r.signed())
	}
	if r.has(`,"result_error":`) {
		e.ResultError = r.text()
	}
	if r.has(`,"output_bytes":`) {
		e.OutputBytes = r.signed()
	}
	if r.has(`,"output_dropped":`) {
		e.OutputDropped = r.signed()
	}
	if r.has(`,"watched_pid":`) {
		e.WatchedPID = int(r.signed())
	}
	r.literal(`}`)
	if r.failed || r.at != len(r.data) {
		return nil, false
	}
	return &e, true
}

// signed reads a JSON integer that may be negative.
func (r *envelopeReader) signed() int64 {
	if r.has(`-`) {
		if r.at < len(r.data) && r.data[r.at] == '0' {
			r.failed = true // -0: encoding/json reads it, json.Marshal never writes it
		}
		return -int64(r.number())
	}
	return int64(r.number())
}

// time reads a quoted time into t.
func (r *envelopeReader) time(t *time.Time) {
	q := r.quoted()
	if !r.failed && t.UnmarshalJSON(q) != nil {
		r.failed = true
	}
}

// text reads a JSON string with the escapes json.Marshal writes for the
// characters of output lines (a quote, a backslash, a tab, a newline...) and
// UTF-8 as it is, and \u escapes but of surrogates; anything else, or a string
// that is not valid UTF-8, fails the read, for encoding/json to decode.
func (r *envelopeReader) text() string {
	r.literal(`"`)
	if r.failed {
		return ""
	}
	start, plain := r.at, true
	for ; r.at < len(r.data); r.at++ {
		c := r.data[r.at]
		if c == '"' {
			break
		}
		if c < 0x20 {
			r.failed = true
			return ""
		}
		if c == '\\' || c >= 0x80 {
			plain = false
			if c == '\\' {
				r.at++
			}
		}
	}
	if r.at >= len(r.data) {
		r.failed = true
		return ""
	}
	raw := r.data[start:r.at]
	r.literal(`"`)
	if r.failed {
		return ""
	}
	if plain {
		return string(raw)
	}
	out, ok := unescape(raw)
	if !ok {
		r.failed = true
		return ""
	}
	return string(out)
}

// unescape decodes the escapes of a JSON string's raw text as text reads them; ok
// is false for one it leaves to encoding/json, or text that is not UTF-8.
func unescape(raw []byte) (out []byte, ok bool) {
	out = make([]byte, 0, len(raw))
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		i++
		switch raw[i] {
		case '"', '\\', '/':
			out = append(out, raw[i])
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			// json.Marshal writes <, > and & so, and U+2028 and U+2029; a
			// surrogate is left to encoding/json, which pairs them.
			v, ok := hexRune(raw[i+1:])
			if !ok || utf16.IsSurrogate(v) {
				return nil, false
			}
			out = utf8.AppendRune(out, v)
			i += 4
		default:
			return nil, false
		}
	}
	return out, utf8.Valid(out)
}

// hexRune is the rune of the four hex digits b starts with.
func hexRune(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var v rune
	for _, h := range b[:4] {
		switch {
		case h >= '0' && h <= '9':
			v = v<<4 | rune(h-'0')
		case h >= 'a' && h <= 'f':
			v = v<<4 | rune(h-'a'+10)
		case h >= 'A' && h <= 'F':
			v = v<<4 | rune(h-'A'+10)
		default:
			return 0, false
		}
	}
	return v, true
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
