package main

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/client"
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
		return []string{client.Stdout}
	case o.stderr:
		return []string{client.Stderr}
	}
	return nil
}

// printLogs prints the output of task id, and with following, what it prints until
// its output ends.
func (g *globals) printLogs(ctx context.Context, id string, o logsOptions) error {
	reqCtx, cancel := g.bounded(ctx)
	defer cancel()
	c, err := g.open(reqCtx, g.timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	write := func(chunk client.LogChunk) error {
		if o.asJSON {
			return printJSONLine(g.stdout, logLine{Stream: chunk.Stream, Offset: chunk.Offset, Data: string(chunk.Data), EOF: chunk.EOF})
		}
		_, err := g.stdout.Write(chunk.Data)
		return err
	}
	t, err := c.Get(reqCtx, id) // only the read of the task waits for the server
	if err != nil {
		return err
	}
	err = c.Logs(ctx, t.ID, client.LogOptions{Streams: o.streams(), Follow: o.following}, write)
	if o.following && ctx.Err() != nil {
		return nil // interrupted
	}
	return err
}

type logLine struct {
	Stream string `json:"stream"`
	Offset int64  `json:"offset"`
	Data   string `json:"data,omitempty"`
	EOF    bool   `json:"eof,omitempty"`
}
