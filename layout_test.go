// Package bgtask_test holds the checks of the module's shape: which of its
// packages may import which.
package bgtask_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/bgtask/bgtask"

// rule is what a package may import of this module: imports in its code, and
// tests besides in its tests (which may also import the package itself).
type rule struct {
	imports []string
	tests   []string
	all     bool // the binary: it wires everything together
}

// layout is the "Layout" table of docs/architecture.md, package by package (paths
// relative to the module). A package missing here fails the test: add its row
// here and in the document.
var layout = map[string]rule{
	"events":                {tests: []string{"events/eventstest", "internal/testkit"}},
	"events/eventstest":     {},
	"internal/secretenv":    {},
	"internal/proc":         {tests: []string{"internal/testkit"}},
	"internal/testkit":      {},
	"internal/testsignal":   {},
	"internal/mcp":          {imports: []string{"client", "engine", "internal/proc"}},
	"internal/httpapi":      {imports: []string{"client", "engine", "engine/api"}, tests: []string{"engine/node", "engine/sinks", "events", "events/eventstest", "internal/testkit", "projections"}},
	"engine":                {imports: []string{"events", "internal/secretenv", "internal/testsignal"}, tests: []string{"engine/api", "engine/sinks", "events/eventstest", "internal/testkit", "projections"}},
	"engine/api":            {imports: []string{"engine", "events"}, tests: []string{"events/eventstest", "internal/testkit", "projections"}},
	"engine/server":         {imports: []string{"client", "engine", "engine/api", "engine/node", "engine/sinks", "events", "internal/httpapi", "internal/secretenv", "internal/serverhome", "projections", "workers"}, tests: []string{"internal/testkit", "workers/shim"}},
	"engine/node":           {imports: []string{"engine", "engine/api", "events", "internal/metrics", "projections"}, tests: []string{"engine/sinks", "events/eventstest", "internal/testkit"}},
	"internal/metrics":      {imports: []string{"engine", "events"}, tests: []string{"engine/api", "engine/node", "engine/sinks", "events/eventstest", "internal/testkit", "workers", "workers/shim"}},
	"client":                {imports: []string{"engine", "engine/api", "events", "internal/serverhome", "projections"}, tests: []string{"client/clienttest", "internal/testkit"}},
	"client/clienttest":     {imports: []string{"engine/node", "engine/sinks", "internal/serverhome"}},
	"internal/serverhome":   {imports: []string{"internal/secretenv"}},
	"engine/sinks":          {imports: []string{"engine", "events", "internal/secretenv"}, tests: []string{"internal/testkit"}},
	"projections":           {imports: []string{"engine", "events", "internal/testsignal"}, tests: []string{"events/eventstest"}},
	"workers":               {imports: []string{"engine", "events", "internal/proc", "internal/secretenv", "workers/shim"}, tests: []string{"events/eventstest", "internal/testkit", "projections"}},
	"workers/shim":          {tests: []string{"internal/testkit"}},
	"agents/internal/setup": {imports: []string{"internal/serverhome"}},
	"agents/claudecode":     {imports: []string{"agents/internal/setup", "client"}, tests: []string{"client/clienttest", "events", "internal/testkit"}},
	"agents/codex":          {imports: []string{"agents/internal/setup", "client"}, tests: []string{"client/clienttest", "events", "internal/testkit"}},
	"agents/opencode":       {imports: []string{"agents/internal/setup", "client"}, tests: []string{"client/clienttest", "internal/testkit"}},
	"agents/gemini":         {imports: []string{"agents/internal/setup", "client"}, tests: []string{"client/clienttest", "internal/testkit"}},
	"agents/openclaw":       {imports: []string{"agents/internal/setup", "client", "internal/serverhome"}, tests: []string{"client/clienttest"}},
	"internal/bench":        {imports: []string{"engine", "engine/api", "events", "internal/proc", "projections", "workers"}},
	"cmd/bgtask":            {all: true},
	"cmd/bgtask-shim":       {imports: []string{"workers/shim"}},
	"integration":           {tests: []string{"engine", "events", "events/eventstest", "internal/proc", "internal/testkit", "projections", "workers/shim"}},
}

// listed is what go list says of one package.
type listed struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

func listPackages(t *testing.T) []listed {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", "./...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	var pkgs []listed
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// ownImports are the packages of this module that paths name, relative to it.
func ownImports(paths []string) []string {
	var own []string
	for _, p := range paths {
		if rel, ok := strings.CutPrefix(p, module+"/"); ok {
			own = append(own, rel)
		}
	}
	return own
}

// Every package imports only what its row of the Layout table allows.
func TestPackagesImportOnlyWhatTheLayoutAllows(t *testing.T) {
	for _, p := range listPackages(t) {
		if p.ImportPath == module {
			continue // this test
		}
		name := strings.TrimPrefix(p.ImportPath, module+"/")
		r, ok := layout[name]
		if !ok {
			t.Errorf("package %s has no row in the Layout table: add one to layout in layout_test.go and to docs/architecture.md, saying what it owns and may import", name)
			continue
		}
		if r.all {
			continue
		}
		for _, imp := range ownImports(p.Imports) {
			if !slices.Contains(r.imports, imp) {
				t.Errorf("package %s imports %s, which its row of the Layout table (layout_test.go, docs/architecture.md) does not allow", name, imp)
			}
		}
		for _, imp := range ownImports(slices.Concat(p.TestImports, p.XTestImports)) {
			if imp != name && !slices.Contains(r.imports, imp) && !slices.Contains(r.tests, imp) {
				t.Errorf("the tests of package %s import %s, which its row of the Layout table (layout_test.go, docs/architecture.md) does not allow", name, imp)
			}
		}
	}
}

// docRow matches a row of the Layout table: its packages, what it owns, what they
// may import.
var docRow = regexp.MustCompile("^\\| (`[^|]*) \\| [^|]* \\| ([^|]*) \\|$")

// backticked matches a name in backticks.
var backticked = regexp.MustCompile("`([^`]+)`")

// The document's Layout table says what the test's table says, for every package
// there is.
func TestTheLayoutTableIsTheDocuments(t *testing.T) {
	exists := map[string]bool{}
	for _, p := range listPackages(t) {
		exists[strings.TrimPrefix(p.ImportPath, module+"/")] = true
	}
	doc, err := os.ReadFile("docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := bytes.Cut(doc, []byte("\n## Layout\n"))
	if !ok {
		t.Fatal(`docs/architecture.md has no "## Layout" section`)
	}
	documented := map[string]bool{}
	for _, line := range strings.Split(string(table), "\n") {
		m := docRow.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		for _, pm := range backticked.FindAllStringSubmatch(m[1], -1) {
			name := pm[1]
			r, ok := layout[name]
			if !ok {
				continue // not a package: the image, the deployment
			}
			documented[name] = true
			if r.all != strings.HasPrefix(m[2], "all") {
				t.Errorf("docs/architecture.md: row %s: may import %q, layout_test.go says all=%v", name, m[2], r.all)
				continue
			}
			code, tests, _ := strings.Cut(m[2], "tests also")
			if got := documentedImports(code); !slices.Equal(got, sorted(r.imports)) {
				t.Errorf("docs/architecture.md: row %s may import %v; layout_test.go says %v", name, got, r.imports)
			}
			if got := documentedImports(tests); !slices.Equal(got, sorted(r.tests)) {
				t.Errorf("docs/architecture.md: the tests of row %s may also import %v; layout_test.go says %v", name, got, r.tests)
			}
		}
	}
	for name := range layout {
		if exists[name] && !documented[name] {
			t.Errorf("package %s is in layout_test.go but has no row in the Layout table of docs/architecture.md", name)
		}
	}
}

// documentedImports are the packages of the layout named in text, sorted.
func documentedImports(text string) []string {
	var names []string
	for _, m := range backticked.FindAllStringSubmatch(text, -1) {
		if _, ok := layout[m[1]]; ok {
			names = append(names, m[1])
		}
	}
	return sorted(names)
}

func sorted(names []string) []string {
	names = slices.Clone(names)
	slices.Sort(names)
	return names
}
