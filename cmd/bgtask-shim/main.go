// Command bgtask-shim is the parent of the commands a bgtask worker runs: see
// package shim. Workers start it from the directory of their own binary; it is a
// binary of its own so that it holds the memory of a small program, not of the
// whole of bgtask.
package main

import (
	"syscall"

	"github.com/bgtask/bgtask/workers/shim"
)

func main() {
	args, err := shim.Args()
	if err == nil {
		err = shim.Main(args)
	}
	if err != nil {
		_, _ = syscall.Write(2, []byte(err.Error()+"\n"))
		syscall.Exit(1)
	}
}
