package workers

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/bgtask/bgtask/workers/shim"
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

// LightShim is bgtask-shim beside the bgtask binary exe, if it is there and
// speaks this worker's protocol (shim.Protocol): one left from another build
// would start no run this worker hands it.
func LightShim(exe string) (string, bool) {
	light := filepath.Join(filepath.Dir(exe), "bgtask-shim")
	info, err := os.Stat(light)
	if err != nil || !info.Mode().IsRegular() || info.Mode()&0o111 == 0 {
		return light, false
	}
	said, err := exec.Command(light, "--protocol").Output()
	return light, err == nil && string(bytes.TrimSpace(said)) == shim.Protocol
}
