package openclaw

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/bgtask/bgtask/internal/serverhome"
)

// PluginID is the id of bgtask's plugin in OpenClaw's configuration
// (plugins.entries.bgtask, plugins.allow).
const PluginID = "bgtask"

// PluginDir is where setup writes bgtask's plugin: a folder of bgtask's home,
// which OpenClaw loads through plugins.load.paths.
func PluginDir(home string) string { return filepath.Join(home, "openclaw", "plugin") }

// pluginFiles are the files of bgtask's plugin for a bgtask binary and home and
// the gateway's /hooks/agent URL: a package with a manifest, as the gateway
// loads at its start only a plugin that asks to be (activation.onStartup).
func pluginFiles(bgtask, home, hookURL string) map[string][]byte {
	manifest, _ := json.MarshalIndent(map[string]any{
		"id":           PluginID,
		"name":         "bgtask",
		"description":  "Gives exec commands their session's key, and tells bgtask when a session runs a turn, so that the wake-ups of the tasks a session registered come back to it between turns.",
		"activation":   map[string]any{"onStartup": true},
		"configSchema": map[string]any{"type": "object", "additionalProperties": false},
	}, "", "  ")
	pkg, _ := json.MarshalIndent(map[string]any{
		"name": "bgtask-openclaw-plugin", "version": "1.0.0", "private": true, "type": "module",
		"openclaw": map[string]any{"extensions": []string{"./index.js"}},
	}, "", "  ")
	constants, _ := json.Marshal([]string{bgtask, home, hookURL})
	return map[string][]byte{
		"openclaw.plugin.json": append(manifest, '\n'),
		"package.json":         append(pkg, '\n'),
		"index.js":             fmt.Appendf(nil, pluginSource, constants, SessionEnv, URLEnv, BusyTTL),
	}
}

// pluginSource is the plugin's code; its first %s is [bgtask, home, hook URL].
const pluginSource = `// bgtask's plugin for OpenClaw, written by 'bgtask setup openclaw' (which
// 'bgtask setup openclaw --remove' takes out again; edits here are overwritten).
//
// It gives every exec command the key of the session it runs for, and the home
// of the bgtask server, so that 'bgtask add' sends the task's wake-up back to that
// session, and it tells bgtask
// when a session runs a turn, so that a wake-up waits for the turn's end instead
// of starting a run that would cut into it.
import { execFile } from "node:child_process";

const [bgtask, home, hookURL] = %s;

// The last state change of each session still on its way, so that a session's
// busy and idle reach bgtask in the order they happened; and the latest of each,
// so that a change that could not reach bgtask (its server restarting) is tried
// again for a minute, unless a newer one came.
const pending = new Map();
const latest = new Map();

function report(api, key, state) {
  const mine = {};
  latest.set(key, mine);
  const previous = pending.get(key) ?? Promise.resolve();
  const next = previous.then(() => attempt(api, key, state, mine, 1));
  pending.set(key, next);
  next.then(() => {
    if (pending.get(key) === next) {
      pending.delete(key);
      latest.delete(key);
    }
  });
}

function attempt(api, key, state, mine, n) {
  return new Promise((resolve) => {
    execFile(bgtask, ["--home", home, "hook", "openclaw", state, key], { timeout: 30000 }, (err, _stdout, stderr) => {
      resolve(err ? String(stderr).trim() || err.message : "");
    });
  }).then((failure) => {
    if (!failure || latest.get(key) !== mine) return;
    if (n >= 6) {
      api.logger?.warn?.("bgtask: marking session " + key + " " + state + " failed: " + failure);
      return;
    }
    return new Promise((wait) => setTimeout(wait, 1000 * 2 ** n).unref?.()).then(() => attempt(api, key, state, mine, n + 1));
  });
}

export default {
  id: "bgtask",
  name: "bgtask",
  description: "Wake-ups of bgtask tasks back to the session that registered them",
  register(api) {
    api.on("resolve_exec_env", (event, ctx) => {
      const key = event?.sessionKey ?? ctx?.sessionKey;
      return key ? { %q: key, %q: hookURL, BGTASK_HOME: home } : undefined;
    });
    // %s is bgtask's own bound of a busy state, for a gateway killed in a turn.
    api.on("before_model_resolve", (_event, ctx) => {
      if (ctx?.sessionKey) report(api, ctx.sessionKey, "busy");
    });
    api.on("agent_end", (_event, ctx) => {
      if (ctx?.sessionKey) report(api, ctx.sessionKey, "idle");
    });
  },
};
`

// writePlugin writes bgtask's plugin into dir, and reports whether that changed
// a file.
func writePlugin(dir string, files map[string][]byte) (bool, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, err
	}
	changed := false
	for name, data := range files {
		path := filepath.Join(dir, name)
		if old, err := os.ReadFile(path); err == nil && string(old) == string(data) {
			continue
		}
		if err := serverhome.ReplaceFile(path, data, 0o600); err != nil {
			return false, fmt.Errorf("write %s: %w", path, err)
		}
		changed = true
	}
	return changed, nil
}
