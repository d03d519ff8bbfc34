package gemini

import (
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/bgtask/bgtask/agents/internal/setup"
)

// RunsAdd reports whether a shell command line registers a task: one of its
// simple commands (those that ;, &, |, ( and ) and newlines separate, as in
// 'cd app && bgtask add -- make' or 'id=$(bgtask add -- make)') runs bgtask,
// by name or by path, past variable assignments and an env, exec or command
// before it, with the subcommand add, past the global flags, which all take a
// value. One that asks add for its help (-h, --help) registers nothing.
func RunsAdd(command string) bool {
	for _, words := range simpleCommands(command) {
		if addsTask(words) {
			return true
		}
	}
	return false
}

// addsTask reports whether the words of one simple command run 'bgtask add'.
func addsTask(words []string) bool {
	for len(words) > 0 && (isAssignment(words[0]) || slices.Contains([]string{"env", "exec", "command"}, words[0])) {
		words = words[1:]
	}
	if len(words) == 0 || path.Base(words[0]) != "bgtask" {
		return false
	}
	args := words[1:]
	for len(args) > 0 && strings.HasPrefix(args[0], "-") && args[0] != "--" {
		if strings.Contains(args[0], "=") || len(args) == 1 {
			args = args[1:]
		} else {
			args = args[2:]
		}
	}
	if len(args) == 0 || args[0] != "add" {
		return false
	}
	for _, a := range args[1:] {
		if a == "--" {
			break
		}
		if a == "-h" || a == "--help" {
			return false
		}
	}
	return true
}

// isAssignment reports whether a word is a shell variable assignment, NAME=VALUE.
func isAssignment(word string) bool {
	name, _, ok := strings.Cut(word, "=")
	if !ok || name == "" {
		return false
	}
	for i, c := range name {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// simpleCommands splits a shell command line into its simple commands, each
// its words with the quotes taken off: enough of the shell's grammar to find
// the commands it runs, not to run them.
func simpleCommands(line string) [][]string {
	var (
		all     [][]string
		words   []string
		word    strings.Builder
		inWord  bool
		quote   rune // the quote we are in: ', " or 0
		escaped bool
	)
	endWord := func() {
		if inWord {
			words = append(words, word.String())
			word.Reset()
			inWord = false
		}
	}
	endCommand := func() {
		endWord()
		if len(words) > 0 {
			all = append(all, words)
			words = nil
		}
	}
	for _, c := range line {
		switch {
		case escaped:
			word.WriteRune(c)
			escaped = false
		case c == '\\' && quote != '\'':
			escaped, inWord = true, true
		case quote != 0 && c == quote:
			quote = 0
		case quote != 0:
			word.WriteRune(c)
		case c == '\'' || c == '"':
			quote, inWord = c, true
		case strings.ContainsRune(";&|()\n`", c):
			endCommand()
		case c == ' ' || c == '\t':
			endWord()
		default:
			word.WriteRune(c)
			inWord = true
		}
	}
	endCommand()
	return all
}

// Attach is the argument of the command a rewritten shell call runs instead of
// the model's: bgtask ... hook gemini attach --pid GEMINI_PID SESSION_ID -- COMMAND.
const Attach = "attach"

// Rewrite is the shell call the model asked for (command) as BeforeTool gives
// it back when it registers a task: run in the background by a waiter, prefix
// (the shell words that start bgtask) hook gemini attach, which runs command in
// the session sid and, once it has registered its task, waits for the session's
// next wake-up and prints it, while the Gemini CLI process gemini runs. Gemini
// CLI turns the end of a background command into a new turn of the session. ok
// is false for a command that registers no task: it runs as it is.
func Rewrite(prefix, sid string, gemini int, command string) (toolInput map[string]any, ok bool) {
	if !RunsAdd(command) {
		return nil, false
	}
	return map[string]any{
		"command":       fmt.Sprintf("%s%s%s --pid %d %s -- %s", prefix, CommandMarker, Attach, gemini, sid, setup.Quote(command)),
		"is_background": true,
	}, true
}
