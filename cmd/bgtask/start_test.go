package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Every command pays at its start for what the packages it links do at theirs:
// bgtask's own packages build nothing there that a command may not need (a
// regexp or a schema is made when first used). The bound is on what the Go
// runtime counts, not on time: allocations are the same on every machine.
func TestOwnPackagesDoLittleAtStart(t *testing.T) {
	const maxAllocs, maxBytes = 100, 16 << 10
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	run := exec.Command(exe, "-test.run=^$")
	run.Env = append(os.Environ(), "GODEBUG=inittrace=1")
	out, err := run.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", exe, err, out)
	}
	seen := 0
	lines := bufio.NewScanner(bytes.NewReader(out))
	for lines.Scan() {
		// init PACKAGE @T ms, C ms clock, B bytes, N allocs
		var pkg string
		var at, clock float64
		var size, allocs int
		if _, err := fmt.Sscanf(lines.Text(), "init %s @%g ms, %g ms clock, %d bytes, %d allocs", &pkg, &at, &clock, &size, &allocs); err != nil {
			continue
		}
		seen++
		if strings.HasPrefix(pkg, "github.com/bgtask/bgtask/") && (allocs > maxAllocs || size > maxBytes) {
			t.Errorf("%s allocates %d times, %d bytes, at its start: more than %d, %d bytes", pkg, allocs, size, maxAllocs, maxBytes)
		}
	}
	if seen == 0 {
		t.Fatalf("no package's start traced:\n%s", out)
	}
}
