package workers

import (
	"os"
	"path/filepath"
)

// DefaultShim is how a worker starts shims: bgtask-shim from the directory of its
// own binary, a small program, or else this binary in shim mode, which costs every
// running task the memory of all of bgtask.
func DefaultShim() []string {
	if exe, err := os.Executable(); err == nil {
		if light, ok := LightShim(exe); ok {
			return []string{light}
		}
	}
	return []string{selfExe, "shim"}
}

// LightShim is bgtask-shim beside the bgtask binary exe, if it is there.
func LightShim(exe string) (string, bool) {
	light := filepath.Join(filepath.Dir(exe), "bgtask-shim")
	info, err := os.Stat(light)
	return light, err == nil && info.Mode().IsRegular() && info.Mode()&0o111 != 0
}
