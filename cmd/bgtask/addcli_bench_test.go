package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// BenchmarkAddCLI is the cost of one `bgtask add -- true`, a process of the built
// binary from its start to its exit, against a server in this process, beside
// the peer's `tsp true` (Debian's task-spooler) in the same run and the binary's
// start alone (`bgtask --version`). Each call is timed on a settled machine: the
// task of the one before has ended. It reports the medians and the ratio to tsp
// (issue 23's target: at most 3).
//
//	go test -run '^$' -bench BenchmarkAddCLI -benchtime 100x ./cmd/bgtask/
func BenchmarkAddCLI(b *testing.B) {
	tsp, err := exec.LookPath("tsp")
	if err != nil {
		b.Skip("tsp (Debian's task-spooler) is not installed: no baseline to measure against")
	}
	dir := b.TempDir()
	build := exec.Command("go", "build", "-o", dir+string(filepath.Separator), ".")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("build bgtask: %v\n%s", err, out)
	}
	bin := filepath.Join(dir, "bgtask")
	home := filepath.Join(dir, "home")
	startServer(b, home)
	// tsp keeps its queue server on its own socket, and each job's output in TMPDIR.
	tspEnv := append(os.Environ(), "TS_SOCKET="+filepath.Join(dir, "ts.sock"), "TMPDIR="+dir)
	b.Cleanup(func() { _ = runQuiet(tspEnv, tsp, "-K") })

	var add, peer, start []time.Duration
	for b.Loop() {
		d, id := timedOutput(b, nil, bin, "add", "--home", home, "--", "true")
		add = append(add, d)
		if err := Run(context.Background(), []string{"--home", home, "wait", id}, io.Discard, io.Discard); err != nil {
			b.Fatalf("wait %s: %v", id, err)
		}
		d, job := timedOutput(b, tspEnv, tsp, "true")
		peer = append(peer, d)
		if err := runQuiet(tspEnv, tsp, "-w", job); err != nil {
			b.Fatalf("tsp -w %s: %v", job, err)
		}
		d, _ = timedOutput(b, nil, bin, "--version")
		start = append(start, d)
	}
	b.ReportMetric(0, "ns/op") // the loop's time includes the waits for the tasks
	b.ReportMetric(median(add), "add-ms")
	b.ReportMetric(median(peer), "tsp-ms")
	b.ReportMetric(median(start), "start-ms")
	b.ReportMetric(median(add)/median(peer), "add/tsp")
}

// timedOutput runs a program to its end and returns how long it took and its
// output's first line.
func timedOutput(b *testing.B, env []string, prog string, args ...string) (time.Duration, string) {
	b.Helper()
	cmd := exec.Command(prog, args...)
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	t0 := time.Now()
	err := cmd.Run()
	d := time.Since(t0)
	if err != nil {
		b.Fatalf("%s %s: %v\n%s", prog, strings.Join(args, " "), err, out.String())
	}
	line, _, _ := strings.Cut(out.String(), "\n")
	return d, strings.TrimSpace(line)
}

// runQuiet runs a program to its end, its output dropped.
func runQuiet(env []string, prog string, args ...string) error {
	cmd := exec.Command(prog, args...)
	cmd.Env = env
	return cmd.Run()
}

// median is the middle of ds, in milliseconds.
func median(ds []time.Duration) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[len(s)/2]) / float64(time.Millisecond)
}
