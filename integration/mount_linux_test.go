package integration

import (
	"fmt"
	"os"
	"syscall"
	"testing"
)

// mountTmpfs mounts a tmpfs of size bytes on dir, made if need be, until the test
// ends.
func mountTmpfs(t *testing.T, dir string, size int64) {
	t.Helper()
	if os.Geteuid() != 0 {
		skipUnlessCI(t, "a disk that fills is a tmpfs, and mounting one needs root")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0700", size)); err != nil {
		skipUnlessCI(t, "cannot mount a tmpfs: "+err.Error())
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
}

// skipUnlessCI skips t for a reason the machine gives, or fails it under CI, whose
// runner must run every test.
func skipUnlessCI(t *testing.T, reason string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(reason + " (CI runs the tests as root)")
	}
	t.Skip(reason)
}
