//go:build !linux && !darwin

package proc

// Start watches the end of the running process id names.
func Start(id Identity) (*Watch, error) { return nil, ErrUnsupported }

func startOf(pid int) (uint64, error) { return 0, ErrUnsupported }

func bootID() (string, error) { return "", ErrUnsupported }
