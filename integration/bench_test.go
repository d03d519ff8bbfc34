package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestBenchRunsAndLeavesNothing runs a scenario of `bgtask bench` at its
// smallest, so the command cannot rot: its report must hold the figures, and no
// process or temporary home of it may be left afterwards. (CI runs every
// scenario with `bgtask bench --quick`.)
func TestBenchRunsAndLeavesNothing(t *testing.T) {
	t.Parallel()
	tmp := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "bench", "--quick", "--json", "--repeat", "1", "--scenario", "register")
	cmd.Env = append(childEnv(tmp), "TMPDIR="+tmp)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("bench: %v\n%s", err, stderr.String())
	}
	var rep struct {
		Scenarios []struct {
			Name    string
			Error   string
			Results []struct {
				Name   string
				Bgtask struct{ N int }
			}
			Targets []struct{ Goal string }
		}
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("bench --json: %v\n%s", err, stdout.String())
	}
	if len(rep.Scenarios) != 1 || rep.Scenarios[0].Name != "register" {
		t.Fatalf("scenarios = %+v, want register", rep.Scenarios)
	}
	for _, s := range rep.Scenarios {
		if s.Error != "" || len(s.Results) == 0 || len(s.Targets) == 0 {
			t.Fatalf("scenario %s: error %q, %d results, %d targets", s.Name, s.Error, len(s.Results), len(s.Targets))
		}
		for _, r := range s.Results {
			if r.Bgtask.N == 0 {
				t.Fatalf("scenario %s, %s: no measurement", s.Name, r.Name)
			}
		}
	}
	if left, _ := filepath.Glob(filepath.Join(tmp, "bgtask-bench-*")); len(left) > 0 {
		t.Fatalf("temporary homes left: %v", left)
	}
	environs, _ := filepath.Glob("/proc/[0-9]*/environ")
	for _, f := range environs {
		if env, err := os.ReadFile(f); err == nil && bytes.Contains(env, []byte("BGTASK_BENCH_HOME="+tmp)) {
			t.Fatalf("a process of the bench is still running: %s", f)
		}
	}
}
