//go:build darwin || (linux && bgtask_portable)

package shim

// outputWatch is none: the shim looks at the bound of each run's output on a
// timer (boundPoll at most), changed or not. macOS frees no part of a file, so
// there it never looks; on Linux the tag bgtask_portable selects this, so that
// the polled path is tested.
type outputWatch struct{ fd int }

func newOutputWatch() outputWatch { return outputWatch{fd: -1} }

func (w *outputWatch) arm(*running) bool { return false }
func (w *outputWatch) changed()          {}
func (w *outputWatch) forget(*running)   {}
