//go:build !linux

package proc

// Of reads the identity of pid, a process running now.
func Of(pid int) (Identity, error) { return Identity{}, ErrUnsupported }

// Check reports, as a *GoneError, whether the process id names is not running.
func Check(id Identity) error { return ErrUnsupported }

// Start watches the end of the running process id names.
func Start(id Identity) (*Watch, error) { return nil, ErrUnsupported }
