// Package waiter is what a shim becomes while its command runs long: a loop in
// C, run by the binary's constructor before the Go runtime starts, that holds a
// few pages of memory where a Go shim holds half a MiB (see hibernate.go in
// package shim). A binary that imports it has shims that hibernate, on Linux
// with cgo; bgtask-shim does. Elsewhere it is empty, and shims do not hibernate.
package waiter
