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
// from File (re-read, so a rotated token is used at once) or from the server's
// environment variable Env, and is sent only to a URL under one of Prefixes: a
// client that can register a spec can neither read the token nor have it sent
// anywhere else.
type WebhookBearer struct {
	Name     string
	File     string
	Env      string
	Prefixes []URLPrefix
}

// Allows reports whether the token may be sent to the webhook URL raw.
func (b WebhookBearer) Allows(raw string) bool {
	return slices.ContainsFunc(b.Prefixes, func(p URLPrefix) bool { return p.Contains(raw) })
}

// WebhookBearers are the bearer tokens a server declares, by name.
type WebhookBearers map[string]WebhookBearer

// Check refuses a spec with a webhook that names a bearer b does not declare, or
// whose URL is under none of its bearer's prefixes.
func (b WebhookBearers) Check(s Spec) error {
	for i, k := range s.Deliver {
		if k.Bearer == "" {
			continue
		}
		c, ok := b[k.Bearer]
		if !ok {
			declared := "none"
			if len(b) > 0 {
				declared = strings.Join(slices.Sorted(maps.Keys(b)), ", ")
			}
			return fieldErr(fmt.Sprintf("deliver[%d].bearer", i), "%q: this server declares no such bearer token (server --webhook-bearer; declared: %s)", k.Bearer, declared)
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

// bodyPiece is a piece of a webhook's body template: JSON text written as it is,
// or a string value's template.
type bodyPiece struct {
	raw   string
	leaf  bool
	path  string // the string value's place in the body, for errors
	value string
}

// parseBody splits a body template into its JSON text and its string values, in
// the order written; keys stay as they are.
func parseBody(tmpl []byte) ([]bodyPiece, error) {
	type frame struct {
		object, key bool // key: a key was read, its value comes next
		path, name  string
		n           int
	}
	var (
		pieces []bodyPiece
		text   strings.Builder
		stack  []*frame
	)
	dec := json.NewDecoder(bytes.NewReader(tmpl))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			text.WriteByte(byte(d))
			stack = stack[:len(stack)-1]
			continue
		}
		path := ""
		if len(stack) > 0 {
			f := stack[len(stack)-1]
			switch {
			case f.object && !f.key:
				if f.n > 0 {
					text.WriteByte(',')
				}
				f.n++
				key, _ := json.Marshal(tok.(string))
				text.Write(key)
				text.WriteByte(':')
				f.key, f.name = true, tok.(string)
				continue
			case f.object:
				f.key = false
				path = f.path + "." + f.name
			default:
				if f.n > 0 {
					text.WriteByte(',')
				}
				path = fmt.Sprintf("%s[%d]", f.path, f.n)
				f.n++
			}
		}
		switch v := tok.(type) {
		case json.Delim:
			text.WriteByte(byte(v))
			stack = append(stack, &frame{object: v == '{', path: path})
		case string:
			pieces = append(pieces, bodyPiece{raw: text.String()}, bodyPiece{leaf: true, path: path, value: v})
			text.Reset()
		case json.Number:
			text.WriteString(v.String())
		case bool:
			text.WriteString(strconv.FormatBool(v))
		case nil:
			text.WriteString("null")
		}
	}
	return append(pieces, bodyPiece{raw: text.String()}), nil
}

// checkBody refuses a body template that is not JSON or has a string value with a
// bad template, naming the value.
func checkBody(tmpl json.RawMessage, field string) error {
	pieces, err := parseBody(tmpl)
	if err != nil {
		return fieldErr(field, "not JSON: %v", err)
	}
	for _, p := range pieces {
		if p.leaf {
			if err := checkTemplate(p.value, argvPlaceholders); err != nil {
				return fieldErr(field+p.path, "%v", err)
			}
		}
	}
	return nil
}

// RenderBody fills the string values of a webhook's body template for wake-up w:
// each may use the prompt's placeholders and {{prompt}}, and is written as a JSON
// string, so the body is JSON whatever the values hold. It takes at most
// MaxWakeupBytes: over that, the values share what the template's own text
// leaves, each cut as a prompt is, with the byte budget's markers.
func RenderBody(tmpl json.RawMessage, w events.Wakeup) ([]byte, error) {
	pieces, err := parseBody(tmpl)
	if err != nil {
		return nil, fmt.Errorf("body template: %w", err)
	}
	vars := promptVars(w, w.Kind)
	vars["prompt"] = w.Prompt
	vals := newValues(vars, w.Origin)
	parts := make([][]part, len(pieces))
	fixed := 0
	var needs []int
	for i, p := range pieces {
		if p.leaf {
			parts[i] = parseTemplate(p.value)
			needs = append(needs, promptLen(parts[i], vals))
		} else {
			fixed += len(p.raw)
		}
	}
	share := shares(MaxWakeupBytes-fixed, needs...)
	var out bytes.Buffer
	k := 0
	for i, p := range pieces {
		if !p.leaf {
			out.WriteString(p.raw)
			continue
		}
		s, _ := json.Marshal(renderParts(parts[i], vals, share[k]))
		out.Write(s)
		k++
	}
	return out.Bytes(), nil
}
