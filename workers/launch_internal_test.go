package workers

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bgtask/bgtask/workers/shim"
)

// A shim that can neither start the command nor record why tells the worker on
// its stderr, which the worker reads until the start is recorded.
func TestAShimThatCannotRecordItsStartSaysWhy(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// No environ file, and the exit file's temporary name taken by a directory
	// (root may write anywhere, but not a file over a directory).
	if err := os.Mkdir(filepath.Join(dir, shim.ExitFile+".tmp"), 0o700); err != nil {
		t.Fatal(err)
	}
	err = launchShim([]string{self, "shim"}, dir, shimRun{Path: "/bin/true", Args: []string{"true"}, Dir: dir})
	if err == nil || !strings.Contains(err.Error(), shim.EnvironFile) || !strings.Contains(err.Error(), "is a directory") {
		t.Fatalf("launch = %v, want the shim's reasons: no environ file, no exit file written", err)
	}
}
