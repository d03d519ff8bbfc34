package bench

import (
	"context"
	"fmt"
	"os/exec"
	"time"

	"github.com/bgtask/bgtask/workers"
)

func runLoginEnv(ctx context.Context, r *runner, s *Scenario) error {
	s.param("bgtask", "the worker's way: the login environment resolved once (workers.LoginEnv), then bash -c per task in it")
	s.param("shells", r.size.loginShells)
	s.param("tasks", r.size.loginTasks)
	start := time.Now()
	env, err := workers.LoginEnv(ctx)
	if err != nil {
		return err
	}
	resolve := time.Since(start)
	var inEnv, login []float64
	run := func(env []string, args ...string) (float64, error) {
		cmd := exec.CommandContext(ctx, "bash", args...)
		cmd.Env = env
		start := time.Now()
		if err := cmd.Run(); err != nil {
			return 0, fmt.Errorf("bash %v: %w", args, err)
		}
		return ms(time.Since(start)), nil
	}
	// Rounds interleave the two, so a change of the machine's load hits both alike.
	for round := range r.repeats {
		r.progress("loginenv: round %d of %d", round+1, r.repeats)
		for range share(r.size.loginTasks, r.repeats, round) {
			d, err := run(env, "-c", "true")
			if err != nil {
				return err
			}
			inEnv = append(inEnv, d)
		}
		for range share(r.size.loginShells, r.repeats, round) {
			d, err := run(nil, "-lc", "true")
			if err != nil {
				return err
			}
			login = append(login, d)
		}
	}
	row := s.compare("task start: bash -c true in the login environment", "ms", summarize(inEnv, true),
		"bash -lc true per task", summarize(login, true))
	s.add("resolving the login environment, once per worker start", "ms", summarize([]float64{ms(resolve)}, false))
	s.target("≥ 20× faster than bash -lc per task", 1 / *row.Ratio >= 20, "%.0f× faster", 1 / *row.Ratio)
	return nil
}

// share is round's part of n things done over rounds, the rest to the last ones,
// so that n = 1 still runs once.
func share(n, rounds, round int) int {
	return n*(round+1)/rounds - n*round/rounds
}
