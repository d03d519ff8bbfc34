package events

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

// decodeCorpus is events as bgtask writes them, of every type, and the forms a
// stream may hold besides: written by other code, by later versions, or corrupt.
func decodeCorpus(t testing.TB) [][]byte {
	t.Helper()
	at := time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC)
	code := 3
	payloads := []Payload{
		&Armed{Spec: json.RawMessage(`{"command":"go test ./...","origin":{"n":12345678901234567890}}`)},
		&Spawned{Worker: "w1", Host: "höst"},
		&Spawned{Worker: "w1", Host: "host-1"},
		&Spawned{Worker: "w1"},
		&Tick{PID: 4242, OutputBytes: 1 << 40},
		&Tick{OutputBytes: 0},
		&Exited{ExitCode: 1, Signal: "SIGKILL", Tail: []string{"ok  \tpkg\t0.1s", `a "quoted" \ line`, "ü\u2028", "\x00bin"}, StartedAt: at, EndedAt: at.Add(time.Minute)},
		&Exited{ExitCode: -1, Tail: []string{"ok  \tpkg\t0.1s", `a "quoted" \ line/`, "ü <nil> & \u2028\r\b\f", "\x7f"}, StartedAt: at, EndedAt: at.Add(time.Minute),
			Matched: true, MatchedLine: "PASS", StoppedBy: "match", KeptRunning: true, NotStarted: true, Result: "r\n", ResultBytes: 3, ResultError: "e", OutputBytes: 1 << 40, OutputDropped: 7, WatchedPID: 4242},
		&Exited{StartedAt: at, EndedAt: at},
		&Stalled{SilentFor: "5m", Action: "notify"},
		&Lost{Worker: "w1", Action: "fail"},
		&Failed{Reason: "cwd gone"},
		&CompletionPersisted{Wakeup: Wakeup{ID: "t", Status: "failed", ExitCode: &code, Prompt: "line 1\nline 2", Tail: []string{"x"}, Origin: json.RawMessage(`{"k":[1,"ü"]}`)}},
		&Fired{Subject: "bgtask.deliver.default", InboxSeq: 9},
		&Cancelled{},
		&DeliveryAttempt{},
		&DeliveryResult{},
		&DeliveryFailed{},
		&Archived{ArchiveSeq: 4},
	}
	var corpus [][]byte
	for i, p := range payloads {
		ev, err := New("01a22a60-c563-7096-9a88-ac2479fc52d0", "engine@host", uint64(i), at, p)
		if err != nil {
			t.Fatal(err)
		}
		data, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		corpus = append(corpus, data)
	}
	tick := string(corpus[4])
	const head = `{"v":1,"id":"e1","task_id":"t1","type":"exited","time":"2025-03-01T12:00:00Z","writer":"w1","epoch":1`
	for _, s := range []string{
		strings.Replace(tick, `"writer":"engine@host"`, `"writer":"engine@höst"`, 1),
		strings.Replace(tick, `"writer":"engine@host"`, `"writer":"engine\"host"`, 1),
		strings.Replace(tick, `"writer":"engine@host"`, `"writer":"engine\u0040host"`, 1),
		strings.Replace(tick, `"v":1`, `"v":2`, 1),
		strings.Replace(tick, `"v":1`, `"v":01`, 1),
		strings.Replace(tick, `"v":1`, `"v":-1`, 1),
		strings.Replace(tick, `"v":1`, `"v":1.0`, 1),
		strings.Replace(tick, `"v":1`, `"V":1`, 1),
		strings.Replace(tick, `"epoch":4`, `"epoch":18446744073709551615`, 1),
		strings.Replace(tick, `"epoch":4`, `"epoch":18446744073709551616`, 1),
		strings.Replace(tick, `"epoch":4`, `"epoch":999999999999999999`, 1),
		strings.Replace(tick, `"type":"tick"`, `"type":"stretch"`, 1),
		strings.Replace(tick, `"type":"tick"`, `"type":"TICK"`, 1),
		strings.Replace(tick, `"time":"`, `"time":null,"x":"`, 1),
		strings.Replace(tick, `"time":"2025-03-01T12:00:00.123456789Z"`, `"time":"2025-03-01 12:00:00Z"`, 1),
		strings.Replace(tick, `"time":"2025-03-01T12:00:00.123456789Z"`, `"time":"2025-03-01T13:00:00.5+01:00"`, 1),
		strings.Replace(tick, `{"v":1,`, `{"v":1,"id":"dup",`, 1),
		strings.Replace(tick, `{"v":1,`, `{ "v":1,`, 1),
		strings.Replace(tick, `"payload":`, `"payload": `, 1),
		strings.Replace(tick, `"payload":{`, `"payload":{"pid":"x",`, 1),
		strings.Replace(tick, `"payload":{`, `"payload":{"pid":1}, "later":{`, 1),
		strings.Replace(tick, `"pid":4242`, `"pid":-1`, 1),
		strings.Replace(tick, `"pid":4242`, `"pid":1e3`, 1),
		strings.Replace(tick, `"pid":4242`, `"pid":99999999999999999999`, 1),
		strings.Replace(tick, `"pid":4242`, `"PID":4242`, 1),
		strings.Replace(tick, `"pid":4242,`, ``, 1),
		strings.Replace(tick, `"pid":4242,"output_bytes":1099511627776`, `"output_bytes":1,"pid":2`, 1),
		strings.Replace(tick, `"output_bytes":1099511627776`, `"output_bytes":1,"more":2`, 1),
		strings.Replace(tick, `"output_bytes":1099511627776`, `"output_bytes":1,"output_bytes":2`, 1),
		strings.Replace(tick, `"type":"tick"`, `"type":"fired"`, 1),
		strings.Replace(tick, `"type":"tick"`, `"type":"spawned"`, 1),
		strings.Replace(string(corpus[2]), `"host":"host-1"`, `"host":null`, 1),
		strings.Replace(string(corpus[2]), `"worker":"w1"`, `"worker":"w\u0031"`, 1),
		strings.Replace(string(corpus[2]), `"host":"host-1"`, `"host":"h","host":"i"`, 1),
		tick + " ",
		tick + "}",
		tick[:len(tick)-1] + " }",
		tick[:len(tick)-2],
		head + `}`,
		head + `,"payload":null}`,
		head + `,"payload":[1]}`,
		head + `,"payload":"x"}`,
		head + `,"payload":}`,
		head + `,"payload":{"exit_code":1}}}`,
		head + `,"payload":{"exit_code":-0,"started_at":"2025-03-01T12:00:00Z","ended_at":"2025-03-01T12:00:00Z"}}`,
		head + `,"payload":{"exit_code":1,"tail":[],"started_at":"2025-03-01T12:00:00Z","ended_at":"2025-03-01T12:00:00Z"}}`,
		head + `,"payload":{"exit_code":1,"tail":["\ud83d\ude00","\u00e9"],"started_at":"2025-03-01T12:00:00Z","ended_at":"2025-03-01T12:00:00Z"}}`,
		head + `,"payload":{"exit_code":1,"tail":["\u00e9","\u00G9","\x"],"started_at":"2025-03-01T12:00:00Z","ended_at":"2025-03-01T12:00:00Z"}}`,
		head + `,"payload":{"exit_code":1,"tail":["\u00e"],"started_at":"2025-03-01T12:00:00Z","ended_at":"2025-03-01T12:00:00Z"}}`,
		head + `,"payload":{"exit_code":1,"tail":["a\"],"started_at":"2025-03-01T12:00:00Z","ended_at":"2025-03-01T12:00:00Z"}}`,
		head + `,"payload":{"exit_code":1,"tail":["` + "\xff\xfe" + `"],"started_at":"2025-03-01T12:00:00Z","ended_at":"2025-03-01T12:00:00Z"}}`,
		head + `,"payload":{"exit_code":1,"tail":["` + "\xff\\t" + `"],"started_at":"2025-03-01T12:00:00Z","ended_at":"2025-03-01T12:00:00Z"}}`,
		head + `,"payload":{"exit_code":1,"tail":["\u00e9"],"started_at":"2025-03-01T12:00:00Z","ended_at":"2025-03-01T12:00:00Z","matched":false}}`,
		head + `,"payload":{"exit_code":1,"started_at":"2025-03-01T12:00:00Z","ended_at":"2025-03-01T12:00:00Z","output_bytes":-5}}`,
		head + `,"payload":{"exit_code":1,"started_at":"2025-03-01T12:00:00Z","ended_at":"2025-03-01T12:00:00Z","signal":"late"}}`,
		head + `,"payload":{"exit_code":1,"started_at":"yesterday","ended_at":"2025-03-01T12:00:00Z"}}`,
		head + `,"payload":{"exit_code":1},"payload":{"exit_code":2}}`,
		head + `,"payload":{"tail":["\ud800"]}}`,
		head + `,"payload":{"exit_code":1}`,
		head + `,"extra":true}`,
		`{}`, `null`, `[]`, ``, `{"v":1}`, `{"v":1,"id":"`,
	} {
		corpus = append(corpus, []byte(s))
	}
	return corpus
}

// checkDecoding checks that the fast ways of decoding an event agree with
// encoding/json on it: the same record or an error, and the same payload or error.
func checkDecoding(t *testing.T, data []byte) {
	t.Helper()
	want, wantErr := decodeJSON(7, data)
	for name, decode := range map[string]func(uint64, []byte) (Record, error){"DecodeRecord": DecodeRecord, "decodeFolded": decodeFolded} {
		got, err := decode(7, data)
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("%s(%s): error %v, encoding/json: %v", name, data, err, wantErr)
		}
		if err != nil {
			if err.Error() != wantErr.Error() {
				t.Errorf("%s(%s): error %q, encoding/json: %q", name, data, err, wantErr)
			}
			continue
		}
		if !reflect.DeepEqual(got.Event, want.Event) || got.Seq != want.Seq {
			t.Fatalf("%s(%s):\n got %+v\nwant %+v", name, data, got, want)
		}
		gotP, gotErr := got.Decode()
		wantP, wantErr := want.Decode()
		if !reflect.DeepEqual(gotP, wantP) || (gotErr == nil) != (wantErr == nil) || (gotErr != nil && gotErr.Error() != wantErr.Error()) {
			t.Fatalf("%s(%s).Decode() = %+v, %v; encoding/json: %+v, %v", name, data, gotP, gotErr, wantP, wantErr)
		}
	}
}

func TestFastDecodingAgreesWithEncodingJSON(t *testing.T) {
	t.Parallel()
	fast := 0
	for _, data := range decodeCorpus(t) {
		checkDecoding(t, data)
		if _, ok := readEnvelope(data); ok {
			fast++
		}
	}
	// Every event as bgtask writes it takes the fast way, and so do the payloads
	// of its spawns, ticks and fires.
	payloads := 0
	for _, data := range decodeCorpus(t)[:20] {
		if ev, ok := readEnvelope(data); ok {
			if _, ok := readPayload(ev.Type, ev.Payload); ok {
				payloads++
			}
		}
	}
	if payloads != 8 {
		t.Errorf("%d payloads read the fast way, want the 8 spawned, tick, exited and fired ones", payloads)
	}
	if fast < 20 {
		t.Fatalf("%d events read the fast way, want at least the 20 bgtask wrote", fast)
	}
}

func FuzzDecodeRecord(f *testing.F) {
	for _, data := range decodeCorpus(f) {
		f.Add(data)
	}
	f.Fuzz(checkDecoding)
}

// BenchmarkDecodeFolded decodes a finished task's events as a replay does, in the
// mix a run writes them: armed, spawned, five ticks, exited, completion persisted
// and fired.
func BenchmarkDecodeFolded(b *testing.B) {
	corpus := decodeCorpus(b)
	byType := map[Type][]byte{}
	for _, data := range corpus[:20] {
		if ev, ok := readEnvelope(data); ok && byType[ev.Type] == nil {
			byType[ev.Type] = data
		}
	}
	var mix [][]byte
	for _, t := range []Type{TypeArmed, TypeSpawned, TypeTick, TypeTick, TypeTick, TypeTick, TypeTick, TypeExited, TypeCompletionPersisted, TypeFired} {
		mix = append(mix, byType[t])
	}
	b.ReportAllocs()
	for b.Loop() {
		for _, data := range mix {
			if _, err := decodeFolded(1, data); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(mix)), "ns/event")
}
