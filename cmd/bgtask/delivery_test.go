package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bgtask/bgtask/engine"
)

// TestWebhookBearerFlag: --webhook-bearer declares a token by name, source and URL
// prefix; a repeat adds a prefix; a bad value, or a token that cannot be read at
// start, is refused with the reason.
func TestWebhookBearerFlag(t *testing.T) {
	t.Setenv("BGTASK_TEST_TOKEN", "env-token")
	t.Setenv("BGTASK_TEST_EMPTY", "")
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("file-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var bearers engine.WebhookBearers
	f := bearerFlag{m: &bearers}
	for _, arg := range []string{
		"openclaw=file:" + file + "@http://127.0.0.1:18789/hooks/",
		"openclaw=file:" + file + "@https://gateway.example/hooks/",
		"ci=env:BGTASK_TEST_TOKEN@https://ci.example/hook",
	} {
		if err := f.Set(arg); err != nil {
			t.Fatalf("Set(%s): %v", arg, err)
		}
	}
	oc, ci := bearers["openclaw"], bearers["ci"]
	if len(bearers) != 2 || oc.File != file || len(oc.Prefixes) != 2 || !oc.Allows("https://gateway.example/hooks/wake") ||
		ci.Env != "BGTASK_TEST_TOKEN" || !ci.Allows("https://ci.example/hook") || ci.Allows("https://ci.example/other") {
		t.Fatalf("bearers = %+v", bearers)
	}
	for arg, reason := range map[string]string{
		"openclaw":                                 "want NAME=file:PATH@URLPREFIX",
		"bad name=env:X@http://h/":                 "want NAME=file:PATH@URLPREFIX",
		"x=env:BGTASK_TEST_TOKEN":                  "no @URLPREFIX",
		"x=env:BGTASK_TEST_TOKEN@http://h/?q=1":    "no query or fragment",
		"x=token-itself@http://h/":                 `source "token-itself": want file:ABSOLUTE-PATH or env:VARIABLE`,
		"x=file:token@http://h/":                   "want file:ABSOLUTE-PATH",
		"x=env:BGTASK_TEST_UNSET@http://h/":        "$BGTASK_TEST_UNSET is not set",
		"x=env:BGTASK_TEST_EMPTY@http://h/":        "its token is empty",
		"x=file:/nonexistent/token@http://h/":      "its token file cannot be read",
		"openclaw=env:BGTASK_TEST_TOKEN@http://h/": "declared twice with different sources",
	} {
		if err := f.Set(arg); err == nil || !strings.Contains(err.Error(), reason) {
			t.Errorf("Set(%s) = %v, want ...%s", arg, err, reason)
		}
	}
	if len(bearers) != 2 || len(bearers["openclaw"].Prefixes) != 2 {
		t.Fatalf("a refused value changed the bearers: %+v", bearers)
	}
}
