package workers

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/bgtask/bgtask/engine"
)

// limitedBuffer keeps the first n bytes written to it and counts the rest.
type limitedBuffer struct {
	buf   bytes.Buffer
	limit int
	total int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.total += len(p)
	if room := b.limit - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

// resultCommand runs a spec's result command after its run ended, in the task's
// cwd and environment, and returns its stdout, the stdout's full size, and why it
// has none if it failed. The engine truncates the result to the spec's
// max_result_bytes; this keeps at most the limit of that setting. A nil env (none
// recorded) runs nothing: the command would get the worker's own environment,
// credentials and all.
func resultCommand(ctx context.Context, res engine.Result, env []string, dir string) (string, int, string) {
	if env == nil {
		return "", 0, "the run has no environment recorded: the result command was not run"
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), res.ResultTimeout())
	defer cancel()
	path, err := lookPath(res.Argv[0], env, dir)
	if err != nil {
		return "", 0, err.Error()
	}
	cmd := exec.CommandContext(ctx, path, res.Argv[1:]...)
	cmd.Args[0] = res.Argv[0]
	cmd.Dir, cmd.Env = dir, env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second // a grandchild holding its pipes must not hold the result
	stdout := &limitedBuffer{limit: engine.MaxResultBytesLimit + 1}
	stderr := &limitedBuffer{limit: 4096}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	err = cmd.Run()
	out := stdout.buf.String()
	switch {
	case ctx.Err() != nil:
		return out, stdout.total, fmt.Sprintf("timed out after %s", res.ResultTimeout())
	case err != nil:
		msg := err.Error()
		if first, _, _ := strings.Cut(strings.TrimSpace(stderr.buf.String()), "\n"); first != "" {
			msg += ": " + first
		}
		return out, stdout.total, msg
	}
	return out, stdout.total, ""
}
