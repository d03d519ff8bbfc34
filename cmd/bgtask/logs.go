package main

import (
	"context"
	"errors"
	"time"

	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/events"
)

// logsGrace is how long `logs --follow` waits for a run's end marks after the task
// ended: a worker that died cannot write them.
const logsGrace = 2 * time.Second

func logsCmd(g *globals) *cobra.Command {
	var following, stdout, stderr, asJSON bool
	cmd := &cobra.Command{
		Use:   "logs ID",
		Short: "Print a task's output (stdout and stderr)",
		Long: `Print the output a task's command wrote, stdout and stderr in the order they
were written. Each of stdout and stderr keeps its last 4 MiB; when older output
was dropped, the first chunk printed starts at its offset (shown with --json).
With --follow, keep printing until the command's output ends.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if stdout && stderr {
				return usageErr("--stdout and --stderr: give at most one")
			}
			var streams []string
			switch {
			case stdout:
				streams = []string{events.Stdout}
			case stderr:
				streams = []string{events.Stderr}
			}
			ctx := cmd.Context()
			reqCtx, cancel := g.bounded(ctx)
			defer cancel()
			c, err := g.dial(reqCtx, g.timeout)
			if err != nil {
				return err
			}
			defer c.Close()
			var t api.TaskView
			err = g.call(reqCtx, c, g.timeout, true, func(ctx context.Context) (err error) {
				t, err = c.api.Get(ctx, args[0])
				return err
			})
			if err != nil {
				return err
			}
			js, err := c.jetstream()
			if err != nil {
				return err
			}
			logs, err := events.ConnectLogs(ctx, js)
			if err != nil {
				return err
			}
			readCtx, stopReading := context.WithCancel(ctx)
			defer stopReading()
			if following {
				// A run whose worker died writes no end mark: stop a little after the task
				// has ended whatever the marks say.
				go func() {
					_, err := follow(readCtx, c, t.ID, func(s engine.State) bool {
						return s.Phase != engine.PhaseArmed && s.Phase != engine.PhaseRunning
					})
					if err == nil {
						select {
						case <-readCtx.Done():
						case <-time.After(logsGrace):
						}
					}
					stopReading() // ended, or the task can no longer be followed
				}()
			}
			err = logs.Read(readCtx, t.ID, streams, following, func(chunk events.LogChunk) error {
				if asJSON {
					return printJSONLine(g.stdout, logLine{Stream: chunk.Stream, Offset: chunk.Offset, Data: string(chunk.Data), EOF: chunk.EOF})
				}
				_, err := g.stdout.Write(chunk.Data)
				return err
			})
			if errors.Is(err, context.Canceled) && ctx.Err() == nil {
				return nil // stopped after the task ended
			}
			if ctx.Err() != nil {
				return nil // interrupted
			}
			return err
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&following, "follow", "f", false, "keep printing until the command's output ends")
	f.BoolVar(&stdout, "stdout", false, "only stdout")
	f.BoolVar(&stderr, "stderr", false, "only stderr")
	f.BoolVar(&asJSON, "json", false, "print chunks as JSON lines: stream, offset, data, eof")
	return cmd
}

type logLine struct {
	Stream string `json:"stream"`
	Offset int64  `json:"offset"`
	Data   string `json:"data,omitempty"`
	EOF    bool   `json:"eof,omitempty"`
}
