//go:build cgo && !bgtask_portable

package main

// The shim is linked statically: a hibernated shim (the waiter, C run before the
// Go runtime starts) then holds no pages of its own that the dynamic loader wrote
// into libc and itself, and a shim starts without loading libraries. On the
// machine of docs/benchmarks/log-2026.md ("Issue 38: a static shim"): 60 KiB of
// PSS per hibernated shim where it held 94, 6.8 ms of CPU per start where it
// took 11.1.

// #cgo LDFLAGS: -static
import "C"
