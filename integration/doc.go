// Package integration holds bgtask's end-to-end tests: they build the real bgtask
// binary, start real servers and workers in temporary homes, run real commands, and
// stop the processes with signals, SIGKILL included.
package integration
