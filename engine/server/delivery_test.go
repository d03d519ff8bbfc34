package server

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bgtask/bgtask/internal/secretenv"
	"github.com/bgtask/bgtask/internal/serverhome"
)

// The webhook secret, given or generated (0600, in the home), is held: a
// variable that holds it reaches no command. One too short to sign with is a bad
// option.
func TestTheWebhookSecretIsHeld(t *testing.T) {
	dir := t.TempDir()
	given := filepath.Join(dir, "secret")
	const key = "0123456789abcdef0123456789abcdef"
	if err := os.WriteFile(given, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if secret, err := loadWebhookSecret(given, dir); err != nil || string(secret) != key {
		t.Fatalf("the given secret: %q, %v", secret, err)
	}
	generated, err := loadWebhookSecret("", dir)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(dir, serverhome.WebhookSecretFile)); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("the generated secret's file: %v, %v", st, err)
	}
	if again, err := loadWebhookSecret("", dir); err != nil || string(again) != string(generated) {
		t.Fatalf("the generated secret read again: %q, %v; want %q", again, err, generated)
	}
	if got := secretenv.Without([]string{"A=" + key, "B=" + string(generated)}); len(got) != 0 {
		t.Errorf("these secrets are not held: %q", got)
	}

	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("too-short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = loadWebhookSecret(short, dir)
	if !errors.As(err, new(*BadOption)) || !strings.Contains(err.Error(), "too short") {
		t.Fatalf("a secret of 9 bytes: %v, want a bad option", err)
	}
}

// The bearer tokens a home declares are read at each lookup: one written after
// the server started is found, one removed is gone; a declaration that cannot be
// read or has a bad prefix is an error that holds neither the token nor the
// home's path.
func TestHomeBearersAreReadAtEachLookup(t *testing.T) {
	home := t.TempDir()
	find := homeBearers(home)
	if _, ok, err := find("openclaw"); ok || err != nil {
		t.Fatalf("before any declaration: %v, %v", ok, err)
	}
	if err := serverhome.WriteBearer(home, "openclaw", serverhome.Bearer{Token: "tok-1", URLPrefixes: []string{"http://127.0.0.1:18789/hooks/agent"}}); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(home, serverhome.BearersDir, "openclaw.json")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("the declaration's file: %v, %v", st, err)
	}
	b, ok, err := find("openclaw")
	if err != nil || !ok || b.Held != "tok-1" || !b.Allows("http://127.0.0.1:18789/hooks/agent") || b.Allows("http://127.0.0.1:18789/hooks/wake") {
		t.Fatalf("the declared bearer: %+v, %v, %v", b, ok, err)
	}
	for content, reason := range map[string]string{
		`{"token": "tok-2", "url_prefixes": ["ftp://x/"]}`: "has a bad URL prefix",
		`{"token": "tok-2"}`:  "is damaged",
		`{"token": "tok-2", `: "is damaged",
	} {
		if err := os.WriteFile(filepath.Join(home, serverhome.BearersDir, "openclaw.json"), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		_, ok, err := find("openclaw")
		if ok || err == nil || !strings.Contains(err.Error(), reason) || strings.Contains(err.Error(), "tok-2") || strings.Contains(err.Error(), home) {
			t.Errorf("%s: %v, %v; want ...%s..., without the token or the home", content, ok, err, reason)
		}
	}
	if removed, err := serverhome.RemoveBearer(home, "openclaw"); !removed || err != nil {
		t.Fatalf("remove: %v, %v", removed, err)
	}
	if _, ok, err := find("openclaw"); ok || err != nil {
		t.Fatalf("once removed: %v, %v", ok, err)
	}
	if _, err := serverhome.ReadBearer(home, "../credentials"); err == nil || !strings.Contains(err.Error(), "want 1-128 letters") {
		t.Fatalf("a name that is a path: %v", err)
	}
}
