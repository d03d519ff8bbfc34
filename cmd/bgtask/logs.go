package main

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/events"
)

const logsLong = `Print the output a task's command wrote, stdout and stderr in the order they
were written. Each of stdout and stderr keeps its last 4 MiB; when older output
was dropped, the first chunk printed starts at its offset (shown with --json).
With --follow, keep printing until the command's output ends.`

type logsOptions struct {
	following, stdout, stderr, asJSON bool
}

func logsCmd(g *globals) *cobra.Command {
	var o logsOptions
	cmd := &cobra.Command{
		Use:   "logs ID",
		Short: "Print a task's output (stdout and stderr)",
		Long:  logsLong,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.stdout && o.stderr {
				return usageErr("--stdout and --stderr: give at most one")
			}
			return g.printLogs(cmd.Context(), args[0], o)
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&o.following, "follow", "f", false, "keep printing until the command's output ends")
	f.BoolVar(&o.stdout, "stdout", false, "only stdout")
	f.BoolVar(&o.stderr, "stderr", false, "only stderr")
	f.BoolVar(&o.asJSON, "json", false, "print chunks as JSON lines: stream, offset, data, eof")
	return cmd
}

// streams are the output streams to print; nil is both.
func (o logsOptions) streams() []string {
	switch {
	case o.stdout:
		return []string{events.Stdout}
	case o.stderr:
		return []string{events.Stderr}
	}
	return nil
}

// printLogs prints the output of task id, and with following, what it prints until
// its output ends.
func (g *globals) printLogs(ctx context.Context, id string, o logsOptions) error {
	reqCtx, cancel := g.bounded(ctx)
	defer cancel()
	c, err := g.dial(reqCtx, g.timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	var t api.TaskView
	err = g.call(reqCtx, c, g.timeout, true, func(ctx context.Context) (err error) {
		t, err = c.api.Get(ctx, id)
		return err
	})
	if err != nil {
		return err
	}
	logs, err := c.logs(ctx)
	if err != nil {
		return err
	}
	write := func(chunk events.LogChunk) error {
		if o.asJSON {
			return printJSONLine(g.stdout, logLine{Stream: chunk.Stream, Offset: chunk.Offset, Data: string(chunk.Data), EOF: chunk.EOF})
		}
		_, err := g.stdout.Write(chunk.Data)
		return err
	}
	if !o.following {
		return logs.Read(ctx, t.ID, o.streams(), write)
	}
	watchCtx, stopWatching := context.WithCancel(ctx)
	taskEnded := make(chan struct{})
	defer func() { stopWatching(); <-taskEnded }()
	go func() {
		defer close(taskEnded)
		// An error too ends the wait: the task can no longer be followed, and what
		// its log holds is all there will be to read.
		_, _ = follow(watchCtx, c, t.ID, func(s engine.State) bool { return !s.Phase.Runs() })
	}()
	err = logs.Follow(ctx, t.ID, o.streams(), 0, taskEnded, write)
	if ctx.Err() != nil {
		return nil // interrupted
	}
	return err
}

// logs reads the tasks' output, through the client's connection.
func (c *client) logs(ctx context.Context) (*events.Logs, error) {
	js, err := c.jetstream()
	if err != nil {
		return nil, err
	}
	return events.ConnectLogs(ctx, js)
}

type logLine struct {
	Stream string `json:"stream"`
	Offset int64  `json:"offset"`
	Data   string `json:"data,omitempty"`
	EOF    bool   `json:"eof,omitempty"`
}
