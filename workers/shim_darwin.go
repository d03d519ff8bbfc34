package workers

import "os"

// selfExe is this binary's path (macOS has no /proc/self/exe): after an upgrade
// replaced its file, the new binary at that path.
var selfExe = func() string {
	exe, err := os.Executable()
	if err != nil {
		return os.Args[0]
	}
	return exe
}()
