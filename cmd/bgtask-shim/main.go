// Command bgtask-shim is the parent of each command a bgtask worker runs: see
// package shim. Workers start it from the directory of their own binary; it is a
// binary of its own so that a running task costs the memory of a small program,
// not of the whole of bgtask.
package main

import (
	"os"

	"github.com/bgtask/bgtask/workers/shim"
)

func main() {
	if err := shim.Main(os.Args[1:]); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(1)
	}
}
