package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/engine"
)

func addCmd(g *globals) *cobra.Command {
	var (
		spec   engine.Spec
		env    []string
		origin string
		asJSON bool
		noCwd  bool
	)
	cmd := &cobra.Command{
		Use:   "add [flags] -- COMMAND...",
		Short: "Register a command to run in the background; prints the task id",
		Long: `Register a command. The words after -- are joined with spaces into one shell
command, run with 'bash -c' in the worker's login environment. The task id is
printed at once; the command runs in the background, and when it ends the wake-up
goes to the target's inbox ('bgtask inbox', 'bgtask wait ID').

The prompt template may use {{result}} {{exit_code}} {{status}} {{reason}}
{{task_id}} {{kind}} {{command}} {{tail}} {{duration}} and {{origin.KEY}}.`,
		Example: `  bgtask add -- make test
  bgtask add --kind deploy --target agent-7 --origin '{"session":"s1"}' -- ./deploy.sh prod
  id=$(bgtask add --json -- 'sleep 5; echo done' | jq -r .id)`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if dash := cmd.ArgsLenAtDash(); dash > 0 {
				return &exitError{code: exitUsage, err: fmt.Errorf("unexpected arguments before --: %q", args[:dash])}
			}
			spec.Command = strings.Join(args, " ")
			var err error
			if !noCwd && spec.Cwd == "" {
				if spec.Cwd, err = os.Getwd(); err != nil {
					return fmt.Errorf("--cwd: %w", err)
				}
			}
			if spec.Cwd != "" && !filepath.IsAbs(spec.Cwd) {
				if spec.Cwd, err = filepath.Abs(spec.Cwd); err != nil {
					return err
				}
			}
			if spec.Env, err = parseEnv(env); err != nil {
				return err
			}
			if origin != "" {
				if !json.Valid([]byte(origin)) {
					return &exitError{code: exitUsage, err: fmt.Errorf("--origin: not valid JSON")}
				}
				spec.Origin = json.RawMessage(origin)
			}
			// The engine validates; the CLI only shapes the request.
			raw, err := json.Marshal(spec)
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, cancel := requestContext(cmd.Context())
			defer cancel()
			reg, err := c.api.Register(ctx, raw)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSONLine(g.stdout, reg)
			}
			_, err = fmt.Fprintln(g.stdout, reg.ID)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&spec.Cwd, "cwd", "", "working directory of the command (default: the current directory)")
	f.BoolVar(&noCwd, "no-cwd", false, "run in the worker's home directory instead of the current directory")
	f.StringVar(&spec.Kind, "kind", "", "a label for the task (build, deploy, ...)")
	f.StringVar(&spec.Prompt, "prompt", "", "template of the wake-up's prompt (default: a summary with the output tail)")
	f.StringVar(&spec.Target, "target", "", "inbox the wake-up goes to (default \"default\")")
	f.StringVar(&spec.IdempotencyKey, "idempotency-key", "", "the same key registers the same task once and returns its id")
	f.StringArrayVar(&env, "env", nil, "KEY=VALUE added to the command's environment (repeatable)")
	f.StringVar(&origin, "origin", "", "JSON returned as-is in the wake-up (routing data of the caller)")
	f.BoolVar(&asJSON, "json", false, "print {\"id\": ...} as JSON")
	return cmd
}

func parseEnv(pairs []string) (map[string]string, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	env := make(map[string]string, len(pairs))
	for _, kv := range pairs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, &exitError{code: exitUsage, err: fmt.Errorf("--env %q: want KEY=VALUE", kv)}
		}
		env[k] = v
	}
	return env, nil
}
