package integration

import "testing"

// mountTmpfs skips the test: a disk that fills is a tmpfs, which macOS does not
// have.
func mountTmpfs(t *testing.T, dir string, size int64) {
	t.Helper()
	t.Skip("a disk that fills is a tmpfs, which macOS does not have")
}
