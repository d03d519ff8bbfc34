package secretenv

import (
	"slices"
	"testing"
)

// A credential is dropped by its name, by the name of a variable it was read
// from, and by its value under any name; every other variable stays, in order.
func TestWithoutDropsCredentialsByNameOrValue(t *testing.T) {
	Hold("  held-password\n")
	HoldName("HOOK_TOKEN")
	env := []string{
		"PATH=/bin",
		"BGTASK_NATS_PASSWORD=a", "BGTASK_CLIENT_PASSWORD=b", "BGTASK_ENGINE_PASSWORD=c", "BGTASK_WORKER_PASSWORD=d",
		"HOOK_TOKEN=e",
		"ANY_NAME=held-password", "PADDED=held-password ",
		"EMPTY=", "HOME=/home/me",
	}
	want := []string{"PATH=/bin", "EMPTY=", "HOME=/home/me"}
	if got := Without(env); !slices.Equal(got, want) {
		t.Errorf("Without(%q) = %q, want %q", env, got, want)
	}
	if env[1] != "BGTASK_NATS_PASSWORD=a" {
		t.Error("Without changed its argument")
	}
}

// An empty value is no credential: holding one drops no empty variable.
func TestAnEmptyValueIsNotHeld(t *testing.T) {
	Hold("")
	Hold(" ")
	if got := Without([]string{"EMPTY=", "BLANK= "}); len(got) != 2 {
		t.Errorf("Without dropped an empty variable: %q", got)
	}
}
