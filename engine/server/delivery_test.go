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
