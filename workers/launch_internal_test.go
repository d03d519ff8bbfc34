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
	// The exit file's temporary name taken by a directory (root may write
	// anywhere, but not a file over a directory): its room cannot be reserved, so
	// nothing starts, and nor can the exit file be written.
	if err := os.Mkdir(filepath.Join(dir, shim.ExitFile+".tmp"), 0o700); err != nil {
		t.Fatal(err)
	}
	err = launchShim([]string{self, "shim"}, dir, shimRun{Path: "/bin/true", Args: []string{"true"}, Dir: dir})
	if err == nil || !strings.Contains(err.Error(), "reserve the exit file") || !strings.Contains(err.Error(), "is a directory") {
		t.Fatalf("launch = %v, want the shim's reasons: no room reserved for the exit file, none written", err)
	}
}
