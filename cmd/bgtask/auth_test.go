package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nkeys"

	"github.com/bgtask/bgtask/internal/secretenv"
)

// Every credential bgtask reads to connect, from a flag, a variable or a file, is
// held: a variable that holds it under any name reaches no command.
func TestTheCredentialsBgtaskConnectsWithAreHeld(t *testing.T) {
	dir := t.TempDir()
	seed := func() string {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		s, err := kp.Seed()
		if err != nil {
			t.Fatal(err)
		}
		return string(s)
	}
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	nkeySeed, credsSeed := seed(), seed()
	creds := write("user.creds", "-----BEGIN NATS USER JWT-----\neyJ0eXAiOiJKV1QifQ.e30.c2ln\n------END NATS USER JWT------\n\n"+
		"-----BEGIN USER NKEY SEED-----\n"+credsSeed+"\n------END USER NKEY SEED------\n")
	t.Setenv("BGTASK_NATS_PASSWORD", "password-from-the-variable")
	for _, a := range []natsAuth{
		{user: "u", password: "password-from-the-flag"},
		{user: "u"},
		{nkey: write("user.nkey", nkeySeed+"\n")},
		{creds: creds},
	} {
		if _, err := a.options(); err != nil {
			t.Fatalf("%+v: %v", a, err)
		}
	}
	env := []string{"A=password-from-the-flag", "B=password-from-the-variable", "C=" + nkeySeed, "D=" + credsSeed}
	if got := secretenv.Without(env); len(got) != 0 {
		t.Errorf("these credentials are not held: %q", got)
	}
}
