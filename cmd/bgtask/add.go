package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine"
)

type addOptions struct {
	cwd, kind, prompt, target, key, origin string
	g                                      *globals // the home (for the delivery sink of a Codex session), the credentials
	env                                    []string
	environment                            string
	noCwd, keepRunning, asJSON, anywhere   bool
	labels                                 []string
	completeJSON                           []string
	completeRegex                          string
	stallAfter, onStall, deadline          string
	maxRespawns                            int
	result                                 string
	specFile                               string
	policy                                 string
	webhooks, execs                        []string
	delay, at                              string
	external                               bool
	wakeOn, after, afterPolicy             string
	probeEvery                             string
	notifyJSON                             []string
	notifyRegex, notifyBatch, notifyMin    string
	notifyMax                              int
	retry                                  int
	retryBackoff, retryOn                  string
	pid                                    int
	eachLine                               bool
}

const addLong = `Register a command. One word after -- is a shell command line, run with
'bash -c': bgtask add -- 'make test && ./deploy.sh'. Several words are a
program and its arguments, run exactly as given, without a shell (as env, nohup
and timeout run theirs): bgtask add -- grep "hello world" f.txt passes
"hello world" as one argument; the program is looked up in the command's PATH.
The task id is printed at once; the command runs in the background, and when it
ends the wake-up goes to the target's inbox ('bgtask inbox', 'bgtask wait ID').

The command runs in this shell's environment, captured by add and kept with the
task (its retries, respawns and reruns get it too): its PATH, an activated
virtualenv, node_modules/.bin, exported variables; PWD is its cwd, and bgtask's
credentials are left out. --env KEY=VALUE sets variables over it.
--environment login runs it in the worker's login environment instead (what
'bash -l' sets up for the worker's user), with the --env variables. Values of
the environment are shown by no command, API or page: 'show' and the others
give its names only.

By default the task is done when the command exits (exit 0: succeeded). A
completion rule ends it earlier, when a stdout line matches: the outcome is then
succeeded and the command's process group is stopped unless --keep-running.
A command that exits before its rule matched has failed.

--stall-after ends or reports a command that prints nothing for that long
(--on-stall notify: wake the caller once with status stalled and keep watching;
kill: stop it, outcome stalled; respawn: start it again, at most --max-respawns
times). --deadline stops it when the time passes, outcome timed_out.

The prompt template may use {{result}} {{exit_code}} {{status}} {{reason}}
{{task_id}} {{kind}} {{command}} {{tail}} {{duration}} and {{origin.KEY}}.

The wake-up always goes to the inbox. --webhook and --exec-json also push it:
a webhook gets it as a signed JSON POST, an exec sink runs a program with the
prompt on stdin and the wake-up's fields in BGTASK_* variables (its argv may use
the placeholders and {{prompt}} as arguments, never inside a shell's script:
sh -c 'notify "$1"' sh {{result}}). --policy says when: queue (default: at once
to an idle target, held while it is busy, see 'bgtask target'), defer_idle (also
after every earlier wake-up of the target was delivered), or immediate.
Placement: a task with a cwd (the default: the current directory) runs on this
host only, since a directory here means nothing on another machine: its
placement is {"labels": {"host": "THIS-HOST"}}. --label KEY=VALUE places it on
workers with those labels instead, --anywhere on any worker. A task that no live
worker can take stays armed; 'bgtask show ID' says what it waits for.

Time: --delay D or --at TIME starts the command later; with no command at all
the task is a timer, which fires once at that time with status succeeded and
kind timer (a reminder: --prompt says what it says). One that comes due while
the server is down fires as soon as it is back, and its wake-up says how late
(late_by). --retry N runs a command that ends failed, timed_out, stalled or lost
(--retry-on picks) again, up to N more times, waiting --retry-backoff between
attempts (doubling, with jitter); the caller is woken once, after the last, and
the wake-up lists the attempts. A relative --deadline counts from the start, and
with --retry bounds each attempt. --probe-every D makes the command a probe:
it is run again D after each run that does not meet its completion rule
(--complete-on-regex, --complete-on-json; with none, exit 0), until one does or
the deadline passes; every run is in the history, the wake-up gives the last
one's output and counts the others (probes).

Notices: --notify-on-regex RE (or --notify-on-json K=V) sends each stdout line
that matches to the target's inbox while the command runs, as a notice
("notice": "nK"); --notify-batch D gathers the lines of D into one,
--notify-min-interval D keeps D between two, --notify-max N stops after N
(default 100). The final wake-up still comes once, after them.

--pid N watches a process of this host that bgtask did not start, instead of
running a command: the task fires once when that process ends, with status
succeeded and exit_code null (only a process's parent can read its exit status),
or timed_out at its --deadline. The process is named by its PID, its start time
and the host's boot, so a PID reused by another process, or a restart of the
host, is seen as its end; a PID with no process is refused. The task is placed
on this host.

--spec reads a whole JSON spec (docs/api.md has its fields); flags given too override it.

--each-line registers one task for each line of standard input (blank lines
passed over), the line its command and the other flags the same for all, over
one connection: much cheaper than a loop of 'bgtask add'. Each id is printed as
its task is armed; an error, which names its line, stops it. With
--idempotency-key K the key of line N (blank lines counted) is K-N, so the same
input given again arms each task once; --timeout bounds each line's wait.`

const addExample = `  bgtask add -- make test
  bgtask add --kind deploy --target agent-7 --origin '{"session":"s1"}' -- ./deploy.sh prod
  bgtask add --complete-on-json type=watch.complete --result matched-line -- ./watch --json
  bgtask add --complete-on-regex '^BUILD (OK|FAILED)$' --stall-after 5m --on-stall kill -- make
  bgtask add --deadline 30m --result 'command:gh run view 42 --json conclusion' -- gh run watch 42
  bgtask add --target agent-7 --webhook https://hooks.example.com/bgtask -- make release
  bgtask add --exec-json '["claude","-p","--resume","SESSION"]' --policy defer_idle -- make test
  bgtask add --label pool=gpu --no-cwd -- ./train.sh
  bgtask add --delay 20m --prompt 'Check whether the deploy finished'
  bgtask add --at 09:00 -- ./nightly-report.sh
  bgtask add --pid 4242 --deadline 2h --prompt 'The migration (pid 4242) ended'
  bgtask add --retry 3 --retry-backoff 10s,5m --retry-on failed,lost -- ./flaky-upload.sh
  bgtask add --notify-on-regex '^Epoch [0-9]+' --notify-min-interval 10m -- ./train.sh
  bgtask add --probe-every 1m --deadline 2h --complete-on-json status=completed -- gh run view 123 --json status,conclusion
  id=$(bgtask add --json -- 'sleep 5; echo done' | jq -r .id)
  ls *.csv | sed 's/^/.\/import.sh /' | bgtask add --each-line --idempotency-key import-1`

func addCmd(g *globals) *cobra.Command {
	var o addOptions
	cmd := &cobra.Command{
		Use:     "add [flags] -- 'SHELL COMMAND' | PROGRAM ARG...",
		Short:   "Register a command to run in the background; prints the task id",
		Long:    addLong,
		Example: addExample,
		RunE: func(cmd *cobra.Command, args []string) error {
			if dash := cmd.ArgsLenAtDash(); dash > 0 {
				return &exitError{code: client.ExitUsage, err: fmt.Errorf("unexpected arguments before --: %q", args[:dash])}
			}
			o.g = g
			if o.eachLine {
				if len(args) > 0 || o.specFile == "-" {
					return usageErr("--each-line takes the commands from standard input, one a line: not after --, nor with --spec -")
				}
				if o.pid != 0 || o.external {
					return usageErr("--each-line registers commands: not with --pid or --external, which run none")
				}
				return o.addEach(cmd.Context(), g, cmd, cmd.InOrStdin())
			}
			raw, ownKey, err := o.spec(cmd, args)
			if err != nil {
				return err
			}
			return g.withClient(cmd.Context(), func(ctx context.Context, c *client.Client) error {
				return o.registerTask(ctx, g, c, raw, ownKey)
			})
		},
	}
	o.register(cmd.Flags())
	cmd.Flags().BoolVar(&o.eachLine, "each-line", false, "register a task for each line of standard input, its command, with the other flags; prints each id as it is armed")
	return cmd
}

// registerTask registers raw and prints the task's id, or with --json its
// registration.
func (o *addOptions) registerTask(ctx context.Context, g *globals, c *client.Client, raw []byte, ownKey bool) error {
	reg, err := c.RegisterJSON(ctx, raw)
	if err != nil {
		return err
	}
	// Nobody else has this command's own key: a task already under it is the one
	// an earlier attempt of this very command armed.
	reg.Created = reg.Created || ownKey
	if o.asJSON {
		return printJSONLine(g.stdout, reg)
	}
	_, err = fmt.Fprintln(g.stdout, reg.ID)
	return err
}

func (o *addOptions) register(f *pflag.FlagSet) {
	f.StringVar(&o.cwd, "cwd", "", "working directory of the command (default: the current directory)")
	f.BoolVar(&o.noCwd, "no-cwd", false, "run in the worker's home directory instead of the current directory")
	f.StringVar(&o.kind, "kind", "", "a label for the task (build, deploy, ...)")
	f.StringVar(&o.prompt, "prompt", "", "template of the wake-up's prompt (default: a summary with the output tail)")
	f.StringVar(&o.target, "target", "", "inbox the wake-up goes to (default: the agent session the command runs in, claude-$CLAUDE_CODE_SESSION_ID, codex-$CODEX_THREAD_ID, opencode-$OPENCODE_SESSION_ID or openclaw-$BGTASK_OPENCLAW_SESSION, else \"default\")")
	f.StringVar(&o.key, "idempotency-key", "", "the same key registers the same task once and returns its id (default: a key of this command's own, so that a request made again through a server restart arms once)")
	f.StringArrayVar(&o.env, "env", nil, "KEY=VALUE set in the command's environment (repeatable)")
	f.StringVar(&o.environment, "environment", "", "what the command's environment starts from: caller (default: this shell's, captured now and kept with the task) or login (the worker's login environment, as a --spec without environment says)")
	f.StringVar(&o.origin, "origin", "", "JSON returned as-is in the wake-up (routing data of the caller; default in an agent session: its runtime and id)")
	f.StringArrayVar(&o.completeJSON, "complete-on-json", nil, "done when a stdout line is a JSON object with KEY=VALUE (repeatable; VALUE* matches a prefix; a.b reaches nested keys)")
	f.StringVar(&o.completeRegex, "complete-on-regex", "", "done when a stdout line matches this Go regular expression")
	f.BoolVar(&o.keepRunning, "keep-running", false, "leave the command running when its completion rule matched")
	f.StringVar(&o.stallAfter, "stall-after", "", "a command that prints nothing for this long is stalled (e.g. 5m)")
	f.StringVar(&o.onStall, "on-stall", "", "notify (default), kill or respawn")
	f.IntVar(&o.maxRespawns, "max-respawns", engine.DefaultMaxRespawns, "how many times --on-stall respawn starts the command again")
	f.StringVar(&o.deadline, "deadline", "", "stop the command as timed_out after this long (30m) or at this RFC 3339 time")
	f.StringVar(&o.result, "result", "", "the wake-up's {{result}}: tail:N, matched-line, or command:ARGV (words, or a JSON array)")
	f.StringVar(&o.policy, "policy", "", "when push sinks get the wake-up: queue (default), defer_idle or immediate")
	f.StringArrayVar(&o.webhooks, "webhook", nil, "POST the wake-up to this http(s) URL (repeatable)")
	f.StringArrayVar(&o.execs, "exec-json", nil, `run this argv, a JSON array like '["notify","{{task_id}}"]', with the prompt on stdin (repeatable)`)
	f.StringArrayVar(&o.labels, "label", nil, "KEY=VALUE a worker must have to take the task (repeatable; replaces the default host placement)")
	f.BoolVar(&o.anywhere, "anywhere", false, "any worker may take the task, whatever host registered it")
	f.StringVar(&o.delay, "delay", "", "start the command this long from now (90s, 2h); with no command, a timer that fires then")
	f.StringVar(&o.at, "at", "", "start the command at this time: RFC 3339, or HH:MM[:SS] local (the next one); with no command, a timer")
	f.IntVar(&o.pid, "pid", 0, "run nothing: watch this process of this host, which bgtask did not start; the task fires when it ends (exit code unknown: null)")
	f.BoolVar(&o.external, "external", false, "run nothing: the task ends when 'bgtask complete ID' ends it, or at its --deadline")
	f.StringVar(&o.after, "after", "", "ID[,ID...]: start only once these tasks have ended (and, by --after-policy, succeeded)")
	f.StringVar(&o.afterPolicy, "after-policy", "", "succeeded (default: a dependency that did not succeed skips the task, status skipped) or ended")
	f.StringVar(&o.wakeOn, "wake-on", "", "the outcomes that wake the caller, comma separated (default: all); another ends the task quietly")
	f.IntVar(&o.retry, "retry", 0, "run a command whose attempt ends in a --retry-on status again, up to this many more times")
	f.StringVar(&o.retryBackoff, "retry-backoff", "", "INITIAL[,MAX]: the wait before the first retry (default 1s), doubled for each next up to MAX (default 5m), with jitter")
	f.StringVar(&o.retryOn, "retry-on", "", "the statuses retried, comma separated (default: failed,timed_out,stalled,lost)")
	f.StringVar(&o.probeEvery, "probe-every", "", "the command is a probe: run it again this long after each run until it meets the completion rule (default: exit 0)")
	f.StringVar(&o.notifyRegex, "notify-on-regex", "", "while the command runs, send a notice for each stdout line matching this Go regular expression")
	f.StringArrayVar(&o.notifyJSON, "notify-on-json", nil, "KEY=VALUE: send a notice for each stdout line that is a JSON object with these fields (repeatable)")
	f.StringVar(&o.notifyBatch, "notify-batch", "", "gather the matching lines of this long after the first into one notice (default: none)")
	f.StringVar(&o.notifyMin, "notify-min-interval", "", "at least this long between two notices; lines in between go into the next (default: none)")
	f.IntVar(&o.notifyMax, "notify-max", 0, fmt.Sprintf("at most this many notices (default %d, at most %d); the final wake-up still comes", engine.DefaultNoticesMax, engine.MaxNoticesLimit))
	f.StringVar(&o.specFile, "spec", "", "a whole JSON spec from a file ('-' for stdin); flags given too override it")
	f.BoolVar(&o.asJSON, "json", false, "print {\"id\": ...} as JSON")
}

// spec builds the registration: the --spec document if any, with every flag given on
// the command line set over it. The engine validates; the CLI only shapes it. A spec
// without an idempotency key gets one of this command's own (ownKey), so that a
// request made again through a restart of the server arms the task once.
func (o *addOptions) spec(cmd *cobra.Command, args []string) (raw []byte, ownKey bool, err error) {
	doc, err := o.fields(cmd, args)
	if err != nil {
		return nil, false, err
	}
	if !givenKey(doc["idempotency_key"]) {
		doc["idempotency_key"] = "add-" + uuid.NewString()
		ownKey = true
	}
	raw, err = json.Marshal(doc)
	return raw, ownKey, err
}

// givenKey reports whether v, a flag's string or a --spec field, is an idempotency key.
func givenKey(v any) bool {
	switch v := v.(type) {
	case nil:
		return false
	case string:
		return v != ""
	case json.RawMessage:
		var key *string
		if json.Unmarshal(v, &key) != nil {
			return true // not a string: the engine says so
		}
		return key != nil && *key != ""
	}
	return true
}

// fields are the spec's fields from --spec and the flags.
func (o *addOptions) fields(cmd *cobra.Command, args []string) (map[string]any, error) {
	doc := map[string]any{}
	if o.specFile != "" {
		if err := readSpecFile(o.specFile, doc); err != nil {
			return nil, err
		}
	}
	changed := cmd.Flags().Changed
	set := func(flag, field string, v any) {
		if changed(flag) {
			doc[field] = v
		}
	}
	setCommand(doc, args)
	if err := o.setTiming(doc, changed, time.Now()); err != nil {
		return nil, err
	}
	set("external", "external", o.external)
	if changed("wake-on") {
		doc["wake_on"] = strings.Split(o.wakeOn, ",")
	}
	if changed("after") {
		doc["after"] = strings.Split(o.after, ",")
	}
	set("after-policy", "after_policy", o.afterPolicy)
	set("probe-every", "probe_every", o.probeEvery)
	if doc["command"] != nil || doc["argv"] != nil {
		// A timer or an external task runs nothing: no directory, no host.
		if err := o.setCwd(doc, changed); err != nil {
			return nil, err
		}
		if err := o.placement(cmd, doc); err != nil {
			return nil, err
		}
	}
	if err := o.setProcess(cmd, doc); err != nil {
		return nil, err
	}
	set("kind", "kind", o.kind)
	set("prompt", "prompt", o.prompt)
	set("target", "target", o.target)
	set("idempotency-key", "idempotency_key", o.key)
	if changed("env") {
		env, err := parseKeyValues("--env", o.env)
		if err != nil {
			return nil, err
		}
		doc["env"] = env
	}
	if err := o.setEnvironment(doc, changed); err != nil {
		return nil, err
	}
	if changed("origin") {
		if !json.Valid([]byte(o.origin)) {
			return nil, usageErr("--origin: not valid JSON")
		}
		doc["origin"] = json.RawMessage(o.origin)
	}
	if err := o.setWatch(doc, changed); err != nil {
		return nil, err
	}
	set("policy", "policy", o.policy)
	if s, ok := currentSession(os.Getenv, o.g.home, cmd.ErrOrStderr()); ok {
		applySession(doc, s)
	}
	if changed("webhook") || changed("exec-json") {
		sinks, err := o.sinks()
		if err != nil {
			return nil, err
		}
		doc["deliver"] = sinks
	}
	return doc, nil
}

// setCommand sets what the words after -- run, over a --spec's: one word is a
// shell command line; several are an argv, run as given, as env, nohup and
// timeout run theirs (joined, "hello world" would become two arguments).
func setCommand(doc map[string]any, args []string) {
	switch {
	case len(args) == 1:
		doc["command"] = args[0]
		delete(doc, "argv")
	case len(args) > 1:
		doc["argv"] = args
		delete(doc, "command")
	}
}

// setEnvironment sets what the command's environment starts from: --environment,
// else the caller's for a command given after -- or on a line of --each-line; a
// --spec says its own. The caller's is captured now (withCallerEnv), so that the
// task, its retries and respawns and a rerun run in it wherever and whenever they
// run.
func (o *addOptions) setEnvironment(doc map[string]any, changed func(string) bool) error {
	environment := engine.EnvironmentCaller
	switch {
	case changed("environment"):
		environment = o.environment
		doc["environment"] = environment
	case o.specFile != "":
		return nil
	}
	if environment != engine.EnvironmentCaller {
		return nil
	}
	if doc["command"] == nil && doc["argv"] == nil {
		return nil // a timer or an external task runs nothing: no environment
	}
	return withCallerEnv(o.g, doc)
}

// setCwd sets the spec's cwd: none with --no-cwd, --cwd made absolute, else the
// --spec's, else the current directory.
func (o *addOptions) setCwd(doc map[string]any, changed func(string) bool) error {
	switch {
	case o.noCwd:
		delete(doc, "cwd")
	case changed("cwd"):
		cwd, err := filepath.Abs(o.cwd)
		if err != nil {
			return err
		}
		doc["cwd"] = cwd
	case doc["cwd"] == nil:
		cwd, err := os.Getwd()
		if err != nil {
			return fmt.Errorf("--cwd: %w", err)
		}
		doc["cwd"] = cwd
	}
	return nil
}

// setNotify sets the notify rule given as flags.
func (o *addOptions) setNotify(doc map[string]any, changed func(string) bool) error {
	var notify map[string]any
	switch {
	case changed("notify-on-json") && changed("notify-on-regex"):
		return usageErr("--notify-on-json and --notify-on-regex: give one notify rule")
	case changed("notify-on-json"):
		match, err := parseKeyValues("--notify-on-json", o.notifyJSON)
		if err != nil {
			return err
		}
		notify = map[string]any{"type": engine.CompleteOnJSON, "match": match}
	case changed("notify-on-regex"):
		notify = map[string]any{"type": engine.CompleteOnPattern, "regex": o.notifyRegex}
	default:
		for _, flag := range []string{"notify-batch", "notify-min-interval", "notify-max"} {
			if changed(flag) {
				return usageErr("--%s goes with --notify-on-regex or --notify-on-json", flag)
			}
		}
		return nil
	}
	for flag, set := range map[string]func(){
		"notify-batch":        func() { notify["batch"] = o.notifyBatch },
		"notify-min-interval": func() { notify["min_interval"] = o.notifyMin },
		"notify-max":          func() { notify["max"] = o.notifyMax },
	} {
		if changed(flag) {
			set()
		}
	}
	doc["notify"] = notify
	return nil
}

// setWatch sets the watch rules given as flags: completion, stall, deadline, result.
func (o *addOptions) setWatch(doc map[string]any, changed func(string) bool) error {
	if err := o.setNotify(doc, changed); err != nil {
		return err
	}
	if changed("complete-on-json") && changed("complete-on-regex") {
		return usageErr("--complete-on-json and --complete-on-regex: give one completion rule")
	}
	if changed("complete-on-json") {
		match, err := parseKeyValues("--complete-on-json", o.completeJSON)
		if err != nil {
			return err
		}
		doc["completion"] = map[string]any{"type": engine.CompleteOnJSON, "match": match}
	}
	if changed("complete-on-regex") {
		doc["completion"] = map[string]any{"type": engine.CompleteOnPattern, "regex": o.completeRegex}
	}
	for _, f := range []struct {
		flag, field string
		v           any
	}{
		{"keep-running", "keep_running", o.keepRunning},
		{"stall-after", "stall_after", o.stallAfter},
		{"on-stall", "on_stall", o.onStall},
		{"max-respawns", "max_respawns", o.maxRespawns},
		{"deadline", "deadline", o.deadline},
	} {
		if changed(f.flag) {
			doc[f.field] = f.v
		}
	}
	if changed("result") {
		r, err := parseResult(o.result)
		if err != nil {
			return err
		}
		doc["result"] = r
	}
	return nil
}

// setTiming sets the start and the retry rule given as flags.
func (o *addOptions) setTiming(doc map[string]any, changed func(string) bool, now time.Time) error {
	switch {
	case changed("delay") && changed("at"):
		return usageErr("--delay and --at: give one")
	case changed("delay"):
		if d, err := time.ParseDuration(o.delay); err != nil || d <= 0 {
			return usageErr("--delay %q: want a duration ahead, such as 90s or 2h", o.delay)
		}
		doc["start_at"] = o.delay
	case changed("at"):
		at, err := parseAt(o.at, now)
		if err != nil {
			return err
		}
		doc["start_at"] = at.Format(time.RFC3339Nano)
	}
	if !changed("retry") {
		if changed("retry-backoff") || changed("retry-on") {
			return usageErr("--retry-backoff and --retry-on go with --retry N")
		}
		return nil
	}
	retry := map[string]any{"max": o.retry}
	if o.retryBackoff != "" {
		initial, most, _ := strings.Cut(o.retryBackoff, ",")
		retry["backoff"] = initial
		if most != "" {
			retry["max_backoff"] = most
		}
	}
	if o.retryOn != "" {
		retry["on"] = strings.Split(o.retryOn, ",")
	}
	doc["retry"] = retry
	return nil
}

// parseAt reads --at: an RFC 3339 time, or a local time of day (HH:MM or
// HH:MM:SS), the next one after now.
func parseAt(v string, now time.Time) (time.Time, error) {
	if at, err := time.Parse(time.RFC3339, v); err == nil {
		return at, nil
	}
	for _, layout := range []string{"15:04", "15:04:05"} {
		clock, err := time.ParseInLocation(layout, v, now.Location())
		if err != nil {
			continue
		}
		at := time.Date(now.Year(), now.Month(), now.Day(), clock.Hour(), clock.Minute(), clock.Second(), 0, now.Location())
		if !at.After(now) {
			at = at.AddDate(0, 0, 1)
		}
		return at, nil
	}
	return time.Time{}, usageErr("--at %q: want an RFC 3339 time (2026-12-24T18:00:00+01:00) or a local time of day (18:00)", v)
}

// sinks are the push sinks of --webhook and --exec-json; they replace a --spec's.
func (o *addOptions) sinks() ([]engine.Sink, error) {
	var sinks []engine.Sink
	for _, url := range o.webhooks {
		sinks = append(sinks, engine.Sink{Type: engine.SinkWebhook, URL: url})
	}
	for _, raw := range o.execs {
		var argv []string
		if err := json.Unmarshal([]byte(raw), &argv); err != nil {
			return nil, usageErr(`--exec-json %q: want a JSON array of strings like '["prog","arg"]'`, raw)
		}
		sinks = append(sinks, engine.Sink{Type: engine.SinkExec, Argv: argv})
	}
	return sinks, nil
}

// placement sets the spec's placement: --label, --anywhere, else the registering
// host for a task with a cwd that names none.
func (o *addOptions) placement(cmd *cobra.Command, doc map[string]any) error {
	changed := cmd.Flags().Changed
	switch {
	case changed("label") && o.anywhere:
		return usageErr("--label and --anywhere: give one")
	case changed("label"):
		labels, err := parseKeyValues("--label", o.labels)
		if err != nil {
			return err
		}
		doc["placement"] = map[string]any{"labels": labels}
	case o.anywhere:
		delete(doc, "placement")
	case doc["cwd"] != nil && doc["placement"] == nil:
		doc["placement"] = map[string]any{"labels": map[string]string{engine.HostLabel: hostName()}}
	}
	return nil
}

func readSpecFile(path string, doc map[string]any) error {
	var data []byte
	var err error
	if path == "-" {
		data, err = io.ReadAll(io.LimitReader(os.Stdin, engine.MaxSpecWithEnvBytes+1))
	} else {
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return fmt.Errorf("--spec: %w", err)
	}
	// Decoded into a map, a repeated key would keep only its last value before the
	// engine could refuse it.
	if err := engine.CheckJSON(data, "spec"); err != nil {
		return usageErr("--spec %s: %v", path, err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		return usageErr("--spec %s: not a JSON object: %v", path, err)
	}
	for k, v := range fields {
		doc[k] = v
	}
	return nil
}

// parseResult reads --result: tail:N, matched-line, or command:ARGV.
func parseResult(v string) (map[string]any, error) {
	kind, arg, _ := strings.Cut(v, ":")
	switch kind {
	case "tail":
		var lines int
		if _, err := fmt.Sscan(arg, &lines); err != nil {
			return nil, usageErr("--result tail:N: %q is not a number of lines", arg)
		}
		return map[string]any{"type": engine.ResultTail, "lines": lines}, nil
	case "matched-line", "matched_line":
		return map[string]any{"type": engine.ResultMatchedLine}, nil
	case "command":
		var argv []string
		if strings.HasPrefix(strings.TrimSpace(arg), "[") {
			if err := json.Unmarshal([]byte(arg), &argv); err != nil {
				return nil, usageErr("--result command:[...]: %v", err)
			}
		} else {
			argv = strings.Fields(arg)
		}
		return map[string]any{"type": engine.ResultCommand, "argv": argv}, nil
	}
	return nil, usageErr("--result %q: want tail:N, matched-line or command:ARGV", v)
}

func parseKeyValues(flag string, pairs []string) (map[string]string, error) {
	out := make(map[string]string, len(pairs))
	for _, kv := range pairs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usageErr("%s %q: want KEY=VALUE", flag, kv)
		}
		out[k] = v
	}
	return out, nil
}

func usageErr(format string, args ...any) error {
	return &exitError{code: client.ExitUsage, err: fmt.Errorf(format, args...)}
}

// hostName is this host's name, the host label of a task that must run here.
func hostName() string {
	h, err := os.Hostname()
	if err != nil {
		return "localhost"
	}
	return h
}
