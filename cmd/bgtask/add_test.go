package main

import (
	"slices"
	"strings"
	"testing"
)

// One word after -- is a shell command line; several are an argv, run exactly as
// given: an argument with a space in it stays one argument.
func TestTheWordsAfterDashRunAsGiven(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home) // no profile of this machine's in the workers' login shell
	startServer(t, home)
	argv := addTask(t, home, "--", "printf", "%s|", "hello world", "x")
	line := addTask(t, home, "--", `printf '%s|' "hello world" x; echo " shell"`)
	for id, want := range map[string]string{argv: "hello world|x|", line: "hello world|x| shell"} {
		r := bgtask(t, home, "wait", id, "--json", "--timeout", "30s").must(t, 0, "wait")
		if w := decode[struct{ Tail []string }](t, r.stdout); !slices.Contains(w.Tail, want) {
			t.Errorf("task %s printed %q, want the line %q", id, w.Tail, want)
		}
	}
	shown := decode[struct {
		Command string
		Spec    struct {
			Command string
			Argv    []string
		}
	}](t, bgtask(t, home, "show", argv, "--json").must(t, 0, "show").stdout)
	if want := []string{"printf", "%s|", "hello world", "x"}; !slices.Equal(shown.Spec.Argv, want) || shown.Spec.Command != "" {
		t.Errorf("the spec holds command %q and argv %q, want argv %q", shown.Spec.Command, shown.Spec.Argv, want)
	}
	if want := `printf '%s|' 'hello world' x`; shown.Command != want {
		t.Errorf("show says the command is %q, want %q", shown.Command, want)
	}
	if help := bgtask(t, home, "add", "--help").must(t, 0, "add --help").stdout; !strings.Contains(help, `"hello world" as one argument`) {
		t.Errorf("add --help does not say how the words after -- run:\n%s", help)
	}
}
