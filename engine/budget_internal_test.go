package engine

import (
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// tricky are strings whose JSON size differs from their own.
var tricky = []string{
	"", "plain", "\x00\x01\x1b[31m\x7f", "\b\f\n\r\t\"\\", "<a href=\"x\">&amp;</a>",
	"\u2028\u2029", "é€😀", "\xff\xfe", "a\xe2\x82", "\xe2\x82\xac\xac", "\xf0\x9f\x98", "\x80\x80x",
}

// randomString mixes the bytes that encoding/json escapes with valid and invalid
// UTF-8.
func randomString(r *rand.Rand, n int) string {
	pieces := []string{"a", "\x00", "\x1b", "\n", "\"", "<", "&", "é", "€", "😀", "\u2028", "\xff", "\xe2\x82", "\x80"}
	var b strings.Builder
	for range n {
		b.WriteString(pieces[r.IntN(len(pieces))])
	}
	return b.String()
}

func marshalLen(t *testing.T, v any) int {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return len(raw)
}

func TestJSONLenIsWhatEncodingJSONWrites(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	cases := slices.Clone(tricky)
	for range 500 {
		cases = append(cases, randomString(r, r.IntN(40)))
	}
	for _, s := range cases {
		if got, want := jsonLen(s), marshalLen(t, s); got != want {
			t.Fatalf("jsonLen(%q) = %d, encoding/json writes %d", s, got, want)
		}
	}
}

// TestJSONPrefixAndSuffixTakeAllThatFits: each cut fits its limit once encoded,
// and one more character would not.
func TestJSONPrefixAndSuffixTakeAllThatFits(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(3, 4))
	cases := slices.Clone(tricky)
	for range 300 {
		cases = append(cases, randomString(r, r.IntN(30)))
	}
	for _, s := range cases {
		for limit := range jsonLen(s) + 1 {
			p := jsonPrefix(s, limit)
			if !strings.HasPrefix(s, p) || jsonLen(p)-2 > limit {
				t.Fatalf("jsonPrefix(%q, %d) = %q (%d bytes as JSON)", s, limit, p, jsonLen(p)-2)
			}
			if p != s {
				next := s[:len(p)+1]
				if c, _ := jsonRune(s[len(p):]); jsonLen(p)-2+c <= limit {
					t.Fatalf("jsonPrefix(%q, %d) = %q leaves out %q that fits", s, limit, p, next)
				}
			}
			x := jsonSuffix(s, limit)
			if !strings.HasSuffix(s, x) || jsonLen(x)-2 > limit {
				t.Fatalf("jsonSuffix(%q, %d) = %q (%d bytes as JSON)", s, limit, x, jsonLen(x)-2)
			}
			if limit >= jsonLen(s)-2 && x != s {
				t.Fatalf("jsonSuffix(%q, %d) = %q, want all of it", s, limit, x)
			}
		}
	}
}

func TestCutsFitTheirLimitWithAMarker(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(5, 6))
	for range 200 {
		s := randomString(r, 50+r.IntN(500))
		limit := r.IntN(jsonLen(s) + 50)
		for name, cut := range map[string]func(string, int) string{"cutStart": cutStart, "cutEnd": cutEnd} {
			got := cut(s, limit)
			switch {
			case jsonLen(got) > limit && got != "":
				t.Fatalf("%s(%q, %d) = %q, %d bytes as JSON", name, s, limit, got, jsonLen(got))
			case jsonLen(s) <= limit && got != s:
				t.Fatalf("%s of a string that fits changed it to %q", name, got)
			case jsonLen(s) > limit && got != "" && !strings.Contains(got, "cut to fit bgtask's byte budget"):
				t.Fatalf("%s(%q, %d) = %q has no marker", name, s, limit, got)
			}
		}
	}
	long := strings.Repeat("-", 100)
	tail := "first line" + long + "\nsecond line" + long + "\nthird line\nthe last line"
	want := "[2 earlier lines cut to fit bgtask's byte budget]\nthird line\nthe last line"
	if got := cutEnd(tail, jsonLen(want)+5); got != want {
		t.Fatalf("cutEnd = %q, want %q", got, want)
	}
	if got, want := cutStart(strings.Repeat("0123456789", 10), 60), "01234567890123 [86 bytes cut to fit bgtask's byte budget]"; got != want {
		t.Fatalf("cutStart = %q, want %q", got, want)
	}
}

func TestCutLinesKeepsTheLastLinesAfterAMarker(t *testing.T) {
	t.Parallel()
	lines := make([]string, 100)
	for i := range lines {
		lines[i] = strings.Repeat("\x00", 100) + string(rune('a'+i%26))
	}
	if got := cutLines(lines, listLen(lines)); !slices.Equal(got, lines) {
		t.Fatalf("lines that fit were cut to %d", len(got))
	}
	for _, limit := range []int{listLen(lines) - 1, 10_000, 700, 300, 100} {
		got := cutLines(lines, limit)
		if n := listLen(got); n > limit {
			t.Fatalf("cutLines(%d) takes %d bytes", limit, n)
		}
		if len(got) < 2 || !strings.HasPrefix(got[0], "[") || !strings.HasSuffix(got[0], "earlier lines cut to fit bgtask's byte budget]") {
			t.Fatalf("cutLines(%d) = %d lines starting %q, want a marker and the last line", limit, len(got), got[0])
		}
		if last := got[len(got)-1]; !strings.HasSuffix(lines[99], last) || last == "" {
			t.Fatalf("cutLines(%d) ends %q, want the end of the last line", limit, last)
		}
	}
	if got := cutLines(lines, 20); got != nil {
		t.Fatalf("cutLines below the marker's size = %q, want nothing", got)
	}
}

func TestSharesGiveEachWhatItNeedsUpToAFairPart(t *testing.T) {
	t.Parallel()
	cases := []struct {
		room  int
		needs []int
		want  []int
	}{
		{90, []int{10, 20, 30}, []int{10, 20, 30}},
		{90, []int{100, 100, 100}, []int{30, 30, 30}},
		{90, []int{10, 100, 100}, []int{10, 40, 40}},
		{90, []int{100, 0, 20}, []int{70, 0, 20}},
		{-5, []int{1, 2}, []int{0, 0}},
	}
	for _, tc := range cases {
		if got := shares(tc.room, tc.needs...); !slices.Equal(got, tc.want) {
			t.Errorf("shares(%d, %v) = %v, want %v", tc.room, tc.needs, got, tc.want)
		}
	}
}

// A tail cut again keeps counting the lines the first cut left out, and not the
// first cut's marker as one of them.
func TestCutEndCountsTheLinesOfAnEarlierCut(t *testing.T) {
	s := tailMarker(5) + "\nA\n" + strings.Repeat("B", 100)
	got := cutEnd(s, 150)
	if first, _, _ := strings.Cut(got, "\n"); first != tailMarker(6) {
		t.Fatalf("cutEnd(%q) starts %q, want %q", s, first, tailMarker(6))
	}
	if jsonLen(got) > 150 {
		t.Fatalf("cutEnd kept %d bytes as JSON, over 150", jsonLen(got))
	}
}
