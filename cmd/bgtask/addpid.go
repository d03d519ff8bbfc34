package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/internal/proc"
)

// setProcess makes the spec the watch of --pid, a process of this host that
// bgtask did not start: its identity is read here, where it runs, and the task is
// placed on this host, whose worker alone can watch it. Without --pid it does
// nothing.
func (o *addOptions) setProcess(cmd *cobra.Command, doc map[string]any) error {
	switch {
	case !cmd.Flags().Changed("pid"):
		return nil
	case doc["command"] != nil || doc["argv"] != nil:
		return usageErr("--pid and a command: give one (--pid watches a process bgtask did not start)")
	case o.anywhere:
		return usageErr("--pid and --anywhere: a process can be watched only on the host it runs on")
	}
	if o.pid <= 0 {
		return usageErr("--pid %d: want the id of a running process, above 0", o.pid)
	}
	id, err := proc.Of(o.pid)
	if errors.Is(err, proc.ErrGone) {
		return usageErr("--pid %d: %v on this host (%s)", o.pid, err, hostName())
	}
	if err != nil {
		return fmt.Errorf("--pid %d: %w", o.pid, err)
	}
	doc["process"] = engine.Process(id)
	labels := map[string]string{}
	if cmd.Flags().Changed("label") {
		if labels, err = parseKeyValues("--label", o.labels); err != nil {
			return err
		}
	}
	if h, ok := labels[engine.HostLabel]; ok && h != hostName() {
		return usageErr("--label host=%s: --pid %d runs on this host, %s", h, o.pid, hostName())
	}
	labels[engine.HostLabel] = hostName()
	doc["placement"] = map[string]any{"labels": labels}
	return nil
}
