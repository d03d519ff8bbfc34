package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/bgtask/bgtask/events"
)

// WebhookBearer is a bearer token a server may send with webhooks (Authorization:
// Bearer): a sink names it, the server holds it. Its token is read at each push,
// from File (re-read, so a rotated token is used at once), from the server's
// environment variable Env, or, for a bearer the server's home declares, from
// Held, read with that declaration; it is sent only to a URL under one of
// Prefixes: a client that can register a spec can neither read the token nor have
// it sent anywhere else.
type WebhookBearer struct {
	Name     string
	File     string
	Env      string
	Held     string
	Prefixes []URLPrefix
}

// Allows reports whether the token may be sent to the webhook URL raw.
func (b WebhookBearer) Allows(raw string) bool {
	return slices.ContainsFunc(b.Prefixes, func(p URLPrefix) bool { return p.Contains(raw) })
}

// WebhookBearers are the bearer tokens a server's flags declare, by name.
type WebhookBearers map[string]WebhookBearer

// Bearers are the bearer tokens a webhook may name: those the server's flags
// declare, and, for a name no flag declares, the one its home declares, which
// Home reads at each use (so a setup declares one, and its remove takes it back,
// without a restart of the server). A nil Home declares none.
type Bearers struct {
	Flags WebhookBearers
	Home  func(name string) (WebhookBearer, bool, error)
}

// Find is the bearer named name, and whether there is one. Its error, a
// declaration in the home that cannot be read, never holds the token.
func (b Bearers) Find(name string) (WebhookBearer, bool, error) {
	if c, ok := b.Flags[name]; ok {
		return c, true, nil
	}
	if b.Home == nil {
		return WebhookBearer{}, false, nil
	}
	return b.Home(name)
}

// Check refuses a spec with a webhook that names a bearer b does not declare, or
// whose URL is under none of its bearer's prefixes.
func (b Bearers) Check(s Spec) error {
	for i, k := range s.Deliver {
		if k.Bearer == "" {
			continue
		}
		c, ok, err := b.Find(k.Bearer)
		if err != nil {
			return fieldErr(fmt.Sprintf("deliver[%d].bearer", i), "%q: %v", k.Bearer, err)
		}
		if !ok {
			declared := "none"
			if len(b.Flags) > 0 {
				declared = strings.Join(slices.Sorted(maps.Keys(b.Flags)), ", ")
			}
			return fieldErr(fmt.Sprintf("deliver[%d].bearer", i), "%q: this server declares no such bearer token (server --webhook-bearer, or a setup such as 'bgtask setup openclaw'; declared by flags: %s)", k.Bearer, declared)
		}
		if !c.Allows(k.URL) {
			prefixes := make([]string, len(c.Prefixes))
			for j, p := range c.Prefixes {
				prefixes[j] = p.String()
			}
			return fieldErr(fmt.Sprintf("deliver[%d].url", i), "%q is not under a URL prefix of bearer %q (%s): its token is sent nowhere else", k.URL, k.Bearer, strings.Join(prefixes, " "))
		}
	}
	return nil
}

// URLPrefix is where a bearer token may be sent: a scheme, a host (with its port,
// if any) and a path that a URL's path must equal or lie below.
type URLPrefix struct {
	raw, scheme, host, path string
}

// ParseURLPrefix reads a URL prefix: an http or https URL with a host, no user
// information, query or fragment, and no dot segment in its path. An empty path
// is "/"; a path that does not end with "/" matches itself and what lies below it
// ("/hooks" matches "/hooks" and "/hooks/wake", not "/hooksmith").
func ParseURLPrefix(raw string) (URLPrefix, error) {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return URLPrefix{}, fmt.Errorf("%q is not a URL: %v", raw, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return URLPrefix{}, fmt.Errorf("%q: want an http or https URL", raw)
	case u.Host == "":
		return URLPrefix{}, fmt.Errorf("%q has no host", raw)
	case u.User != nil:
		return URLPrefix{}, fmt.Errorf("%q: a prefix has no user information", raw)
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return URLPrefix{}, fmt.Errorf("%q: a prefix is a scheme, a host and a path, with no query or fragment", raw)
	case !plainPath(u.Path):
		return URLPrefix{}, fmt.Errorf("%q: a prefix's path has no dot segment, backslash or semicolon", raw)
	}
	return URLPrefix{raw: raw, scheme: u.Scheme, host: strings.ToLower(u.Host), path: escapedPath(u)}, nil
}

func (p URLPrefix) String() string { return p.raw }

// Contains reports whether the URL raw is under p: the same scheme, the same host
// and port as written (https://h and https://h:443 differ), and a path, as it is
// sent, that is p's or below it by whole segments. A path with a dot segment,
// a backslash or a semicolon, even percent-encoded, is under no prefix, since a
// receiver may resolve it to a path outside.
func (p URLPrefix) Contains(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil || u.User != nil || u.Scheme != p.scheme || strings.ToLower(u.Host) != p.host || !plainPath(u.Path) {
		return false
	}
	path := escapedPath(u)
	if strings.HasSuffix(p.path, "/") {
		return strings.HasPrefix(path, p.path)
	}
	return path == p.path || strings.HasPrefix(path, p.path+"/")
}

func escapedPath(u *url.URL) string {
	if p := u.EscapedPath(); p != "" {
		return p
	}
	return "/"
}

// plainPath reports whether a decoded path has no segment that a receiver could
// resolve to another path.
func plainPath(path string) bool {
	if strings.ContainsAny(path, `\;`) {
		return false
	}
	for _, seg := range strings.Split(path, "/") {
		if seg == "." || seg == ".." {
			return false
		}
	}
	return true
}

// bodyFrame is an object or an array of a body template being walked.
type bodyFrame struct {
	object, key bool // key: a key was read, its value comes next
	path, name  string
	n           int // members or elements written
}

// next is the place in the body of the value that comes next in f, and the
// text written before it: a comma after the first, an object's key.
func (f *bodyFrame) next() (path, prefix string) {
	path = fmt.Sprintf("%s[%d]", f.path, f.n)
	if f.object {
		key, _ := json.Marshal(f.name)
		path, prefix, f.key = f.path+"."+f.name, string(key)+":", false
	}
	if f.n > 0 {
		prefix = "," + prefix
	}
	return path, prefix
}

// walkBody writes a body template's JSON again, keys and all but its string
// values as they are, and each string value as leaf makes it: leaf gets the
// value's place in the body (for errors, such as ".items[2]") and its template,
// and returns the JSON text that stands for it, and keep false to leave it out
// (an object's member with its key, an array's element). A body that is itself
// a string is always kept.
func walkBody(tmpl []byte, leaf func(path, value string) (out string, keep bool)) ([]byte, error) {
	var (
		out   bytes.Buffer
		stack []*bodyFrame
	)
	dec := json.NewDecoder(bytes.NewReader(tmpl))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return out.Bytes(), nil
		}
		if err != nil {
			return nil, err
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			out.WriteByte(byte(d))
			stack = stack[:len(stack)-1]
			continue
		}
		var f *bodyFrame
		path, prefix := "", ""
		if len(stack) > 0 {
			if f = stack[len(stack)-1]; f.object && !f.key {
				f.key, f.name = true, tok.(string)
				continue // the key is written with its value, if that is kept
			}
			path, prefix = f.next()
		}
		value := ""
		switch v := tok.(type) {
		case json.Delim:
			value = string(v)
			stack = append(stack, &bodyFrame{object: v == '{', path: path})
		case string:
			text, keep := leaf(path, v)
			if !keep && f != nil {
				continue
			}
			value = text
		case json.Number:
			value = v.String()
		case bool:
			value = strconv.FormatBool(v)
		case nil:
			value = "null"
		}
		out.WriteString(prefix + value)
		if f != nil {
			f.n++
		}
	}
}

// checkBody refuses a body template that is not JSON or has a string value with a
// bad template, naming the value.
func checkBody(tmpl json.RawMessage, field string) error {
	var bad error
	_, err := walkBody(tmpl, func(path, value string) (string, bool) {
		if err := checkTemplate(value, argvPlaceholders); err != nil && bad == nil {
			bad = fieldErr(field+path, "%v", err)
		}
		return "", true
	})
	if err != nil {
		return fieldErr(field, "not JSON: %v", err)
	}
	return bad
}

// RenderBody fills the string values of a webhook's body template for wake-up w:
// each may use the prompt's placeholders and {{prompt}}, and is written as a JSON
// string, so the body is JSON whatever the values hold; with omitEmpty, a value
// that renders empty is left out (with its key). It takes at most
// MaxWakeupBytes: over that, the values share what the template's own text
// leaves, each cut as a prompt is, with the byte budget's markers.
func RenderBody(tmpl json.RawMessage, w events.Wakeup, omitEmpty bool) ([]byte, error) {
	vars := promptVars(w, w.Kind)
	vars["prompt"] = w.Prompt
	vals := newValues(vars, w.Origin)
	var (
		parts [][]part
		needs []int
	)
	fixed, err := walkBody(tmpl, func(_, value string) (string, bool) {
		p := parseTemplate(value)
		parts, needs = append(parts, p), append(needs, promptLen(p, vals))
		return "", true
	})
	if err != nil {
		return nil, fmt.Errorf("body template: %w", err)
	}
	share := shares(MaxWakeupBytes-len(fixed), needs...)
	k := 0
	return walkBody(tmpl, func(_, _ string) (string, bool) {
		text := renderParts(parts[k], vals, share[k])
		k++
		out, _ := json.Marshal(text)
		return string(out), !omitEmpty || text != ""
	})
}
