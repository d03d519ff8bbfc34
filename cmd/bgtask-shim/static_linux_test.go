//go:build cgo && !bgtask_portable

package main

import (
	"debug/elf"
	"os/exec"
	"path/filepath"
	"testing"
)

// bgtask-shim, built as a user builds it, asks for no dynamic loader and no
// shared library (static_linux.go).
func TestTheShimIsLinkedStatically(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "bgtask-shim")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("bgtask-shim has a dynamic loader (PT_INTERP)")
		}
	}
	if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
		t.Errorf("bgtask-shim needs shared libraries %q (%v)", libs, err)
	}
}
