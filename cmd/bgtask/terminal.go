package main

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// printable is text as a terminal may be given it: every control character (C0,
// DEL, C1; a tab only where tabs is false), bidirectional override and line
// separator is shown as an escape (\x1b, \u009b, \u202e) instead of sent. A task's
// command, kind and output are written by whoever registered it, and list and show
// print them to other users' terminals, where ESC and OSC sequences could move the
// cursor, rewrite what is shown, set the title or write the clipboard. JSON output
// is left as it is: its encoding already escapes them.
func printable(s string, tabs bool) string {
	if !needsEscape(s, tabs) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r < 0x80 && escaped(r, tabs):
			fmt.Fprintf(&b, `\x%02x`, r)
		case escaped(r, tabs):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

func needsEscape(s string, tabs bool) bool {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 || escaped(r, tabs) {
			return true
		}
		i += size
	}
	return false
}

func escaped(r rune, tabs bool) bool {
	switch {
	case r == '\t':
		return !tabs
	case unicode.IsControl(r), r == '\u2028', r == '\u2029':
		return true
	case r >= '\u202a' && r <= '\u202e', r >= '\u2066' && r <= '\u2069', r == '\u200e', r == '\u200f', r == '\u061c':
		return true // bidirectional controls reorder what follows them on the line
	}
	return false
}
