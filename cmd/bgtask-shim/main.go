// Command bgtask-shim is the parent of each command a bgtask worker runs: see
// package shim. Workers start it from the directory of their own binary; it is a
// binary of its own so that a running task costs the memory of a small program,
// not of the whole of bgtask, and its start is that of a small program too.
package main

import (
	"syscall"

	"github.com/bgtask/bgtask/workers/shim"
	_ "github.com/bgtask/bgtask/workers/shim/waiter" // its shims hibernate
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
