package engine

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/bgtask/bgtask/events"
)

// The byte budget. NATS refuses a message over its max_payload (1 MiB by default),
// and an event or a wake-up it refuses is tried again for ever: the task never
// fires. So every event holds within MaxEventBytes after JSON encoding, where a
// control byte takes six: what the command printed (tail, result, matched line),
// the prompt rendered from it and the reasons are cut to fit, with a marker that
// says so. A quarter of the default max_payload leaves a whole task (its spec, its
// exit and its wake-up) room in one reply to show or wait.
const (
	MaxEventBytes = 256 << 10
	// envelopeBytes is what an event's envelope takes around its payload: ids,
	// type, time, writer and epoch.
	envelopeBytes   = 1 << 10
	maxPayloadBytes = MaxEventBytes - envelopeBytes
	// MaxWakeupBytes is the most a wake-up takes as JSON: it is the payload of
	// completion-persisted, and the inbox message.
	MaxWakeupBytes = maxPayloadBytes - len(`{"wakeup":}`)
	// MaxReasonBytes bounds a reason (of a failure, a loss, a cancel) and a result
	// command's error, as JSON.
	MaxReasonBytes = 4 << 10
	// maxCommandShown bounds the command a wake-up repeats, as JSON; the spec
	// keeps it whole.
	maxCommandShown = 4 << 10
	// maxMatchedBytes bounds a matched line as JSON: a worker keeps 2,000 bytes of
	// it, 12,000 once its control bytes are escaped.
	maxMatchedBytes = 16 << 10
	// MaxCarriedBytes bounds, as JSON, what a wake-up carries whole from the spec:
	// its origin, target and kind. The rest of the wake-up is left for the prompt,
	// the result and the tail.
	MaxCarriedBytes = 64 << 10
)

// jsonLen is how many bytes s takes as a JSON string, quotes included, as
// encoding/json writes it (HTML characters, control bytes, U+2028 and U+2029
// escaped as \u00XX, invalid UTF-8 as \ufffd).
func jsonLen(s string) int {
	n := 2
	for i := 0; i < len(s); {
		c, size := jsonRune(s[i:])
		n += c
		i += size
	}
	return n
}

// jsonRune is the JSON size of the first rune of s, and its size in s.
func jsonRune(s string) (cost, size int) {
	b := s[0]
	if b < utf8.RuneSelf {
		switch {
		case b == '"' || b == '\\' || b == '\b' || b == '\f' || b == '\n' || b == '\r' || b == '\t':
			return 2, 1
		case b < 0x20 || b == '<' || b == '>' || b == '&':
			return 6, 1
		}
		return 1, 1
	}
	r, size := utf8.DecodeRuneInString(s)
	switch {
	case r == utf8.RuneError && size == 1:
		return 6, 1
	case r == '\u2028' || r == '\u2029':
		return 6, size
	}
	return size, size
}

// jsonPrefix is the longest prefix of s, cut between runes, whose characters take
// at most limit bytes as JSON (quotes not counted).
func jsonPrefix(s string, limit int) string {
	n := 0
	for i := 0; i < len(s); {
		c, size := jsonRune(s[i:])
		if n+c > limit {
			return s[:i]
		}
		n += c
		i += size
	}
	return s
}

// jsonSuffix is the longest suffix of s, cut between runes, whose characters take
// at most limit bytes as JSON (quotes not counted).
func jsonSuffix(s string, limit int) string {
	n := 0
	for i := len(s); i > 0; {
		start := i - 1
		for start > 0 && i-start < utf8.UTFMax && !utf8.RuneStart(s[start]) {
			start--
		}
		if _, size := utf8.DecodeRuneInString(s[start:i]); start+size != i {
			start = i - 1 // not one whole rune: the last byte is invalid on its own
		}
		c, _ := jsonRune(s[start:i])
		if n+c > limit {
			return s[i:]
		}
		n += c
		i = start
	}
	return s
}

// cutStart keeps the start of s within limit bytes as JSON (quotes included),
// ending with a marker when it cut. Below the marker's own size it keeps nothing.
func cutStart(s string, limit int) string {
	if jsonLen(s) <= limit {
		return s
	}
	marker := cutMarker(len(s))
	room := limit - jsonLen(marker)
	if room < 0 {
		return ""
	}
	kept := jsonPrefix(s, room)
	return kept + cutMarker(len(s)-len(kept))
}

// cutEnd keeps the end of s within limit bytes as JSON (quotes included), from
// the start of a line where it can, after a first line that says how many lines
// were cut. Below the marker's own size it keeps nothing.
func cutEnd(s string, limit int) string {
	if jsonLen(s) <= limit {
		return s
	}
	// The marker of every line is at least as long as the one written.
	room := limit - jsonLen(tailMarker(strings.Count(s, "\n")+1)+"\n")
	if room < 0 {
		return ""
	}
	kept := jsonSuffix(s, room)
	if i := strings.IndexByte(kept, '\n'); i >= 0 && i < len(kept)-1 {
		kept = kept[i+1:]
	}
	cut := strings.Count(s[:len(s)-len(kept)], "\n")
	first, _, _ := strings.Cut(s, "\n")
	if earlier, ok := cutBefore(first); ok {
		cut += earlier - 1 // the earlier marker's own line is none of the output's
	}
	return tailMarker(cut) + "\n" + kept
}

// cutMarker ends a value cut to the budget; n, the bytes cut, is at most the
// value's size, so the marker of the size is never shorter than the marker
// written.
func cutMarker(n int) string { return fmt.Sprintf(" [%d bytes cut to fit bgtask's byte budget]", n) }

// tailMarker is the first line of a tail whose earlier lines were cut.
func tailMarker(n int) string {
	return fmt.Sprintf("[%d earlier lines cut to fit bgtask's byte budget]", n)
}

// cutBefore reads the number of lines a tail's first line says were cut before
// it, so that a tail cut again counts them too; ok is false for any other line.
func cutBefore(line string) (int, bool) {
	digits, _, _ := strings.Cut(strings.TrimPrefix(line, "["), " ")
	n, err := strconv.Atoi(digits)
	if err != nil || line != tailMarker(n) {
		return 0, false
	}
	return n, true
}

// listLen is how many bytes lines take as a JSON array.
func listLen(lines []string) int {
	if len(lines) == 0 {
		return 2
	}
	n := 1 + len(lines) // brackets and commas
	for _, l := range lines {
		n += jsonLen(l)
	}
	return n
}

// cutLines keeps the last lines that fit in limit bytes as a JSON array, after a
// first line that says how many were cut. When not even the last line fits whole,
// its end is kept. Below the marker's own size it keeps nothing.
func cutLines(lines []string, limit int) []string {
	if listLen(lines) <= limit || len(lines) == 0 {
		return lines
	}
	earlier, ok := cutBefore(lines[0])
	if ok {
		lines = lines[1:]
	}
	// The marker of every line is at least as long as the one written.
	room := limit - 2 - jsonLen(tailMarker(earlier+len(lines))) - 1
	if room < 2 || len(lines) == 0 {
		return nil
	}
	keep := len(lines)
	for used := 0; keep > 0; keep-- {
		n := jsonLen(lines[keep-1]) + 1
		if used+n > room {
			break
		}
		used += n
	}
	if keep == len(lines) {
		// Not even the last line: its end, in what is left.
		last := lines[len(lines)-1]
		return []string{tailMarker(earlier + len(lines) - 1), jsonSuffix(last, room-3)}
	}
	return append([]string{tailMarker(earlier + keep)}, lines[keep:]...)
}

// shares splits room between fields that need needs[i] bytes: each gets what it
// needs, up to an equal part of what the fields needing less leave.
func shares(room int, needs ...int) []int {
	order := make([]int, len(needs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return needs[a] - needs[b] })
	out := make([]int, len(needs))
	left := max(room, 0)
	for k, i := range order {
		out[i] = min(needs[i], left/(len(needs)-k))
		left -= out[i]
	}
	return out
}

// encodedLen is how many bytes v takes as JSON.
func encodedLen(v any) int {
	raw, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("engine: a value of the byte budget does not encode: %v", err))
	}
	return len(raw)
}

// fitExited cuts what a worker recorded of a run to the budget of an event: the
// result command's error and the matched line first, then the result (its start)
// and the tail (its last lines) share what is left.
func fitExited(run events.Exited) events.Exited {
	run.ResultError = cutStart(run.ResultError, MaxReasonBytes)
	run.MatchedLine = cutStart(run.MatchedLine, maxMatchedBytes)
	tail, result := run.Tail, run.Result
	run.Tail, run.Result = nil, ""
	room := maxPayloadBytes - encodedLen(&run)
	const tailKey, resultKey = len(`,"tail":`), len(`,"result":`)
	need := [2]int{0, 0}
	if len(tail) > 0 {
		need[0] = tailKey + listLen(tail)
	}
	if result != "" {
		need[1] = resultKey + jsonLen(result)
	}
	share := shares(room, need[0], need[1])
	if len(tail) > 0 {
		run.Tail = cutLines(tail, share[0]-tailKey)
	}
	if result != "" {
		// No marker: ResultBytes keeps the result's size, and the wake-up's result
		// says how much of it is left.
		run.Result = jsonPrefix(result, share[1]-resultKey-2)
	}
	return run
}

// checkCarried refuses a spec whose fields a wake-up carries whole would leave it
// too little room for the rest.
func (s Spec) checkCarried() error {
	carried := struct {
		Kind   string          `json:"kind"`
		Target string          `json:"target"`
		Origin json.RawMessage `json:"origin,omitempty"`
	}{s.Kind, s.Target, s.Origin}
	if n := encodedLen(carried); n > MaxCarriedBytes {
		return fieldErr("origin", "%d bytes as JSON with kind and target; a wake-up carries them whole and has room for %d", n, MaxCarriedBytes)
	}
	return nil
}
