package openclaw

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/bgtask/bgtask/agents/internal/setup"
)

// ConfigPath is OpenClaw's configuration file, as its gateway finds it:
// $OPENCLAW_CONFIG_PATH, else openclaw.json in the state directory (dir if
// given, else $OPENCLAW_STATE_DIR, else ~/.openclaw).
func ConfigPath(dir string) (string, error) {
	if dir == "" {
		if path := os.Getenv("OPENCLAW_CONFIG_PATH"); path != "" {
			return filepath.Abs(path)
		}
		dir = os.Getenv("OPENCLAW_STATE_DIR")
	}
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("no home directory: give --state-dir or set OPENCLAW_STATE_DIR: %w", err)
		}
		dir = filepath.Join(home, ".openclaw")
	}
	return filepath.Abs(filepath.Join(dir, "openclaw.json"))
}

// Defaults of OpenClaw's gateway.
const (
	defaultPort      = 18789
	defaultHooksPath = "/hooks"
)

// Gateway is what setup reads of a gateway's configuration.
type Gateway struct {
	Port      int
	HooksPath string // as the gateway normalizes it: a leading slash, none at the end
	Token     string // hooks.token; "" when there is none yet
}

// AgentURL is the gateway's /hooks/agent on loopback.
func (g Gateway) AgentURL() string {
	return fmt.Sprintf("http://127.0.0.1:%d%s/agent", g.Port, g.HooksPath)
}

// readGateway reads gateway.port, hooks.path and hooks.token, refusing values
// the gateway would refuse, or that setup cannot use, with the key that holds
// them.
func readGateway(cfg setup.Object) (Gateway, error) {
	g := Gateway{Port: defaultPort, HooksPath: defaultHooksPath}
	gateway, err := child(cfg, "gateway")
	if err != nil {
		return g, err
	}
	if raw, ok := gateway.Get("port"); ok {
		if err := json.Unmarshal(raw, &g.Port); err != nil || g.Port < 1 || g.Port > 65535 {
			return g, fmt.Errorf("gateway.port is %s: want a port number", raw)
		}
	}
	hooks, err := child(cfg, "hooks")
	if err != nil {
		return g, err
	}
	if raw, ok := hooks.Get("path"); ok {
		var path string
		if err := json.Unmarshal(raw, &path); err != nil {
			return g, fmt.Errorf("hooks.path is %s: want a string", raw)
		}
		path = "/" + strings.Trim(strings.TrimSpace(path), "/")
		if path == "/" || strings.ContainsAny(path, "?#%\\;") {
			return g, fmt.Errorf("hooks.path %q: want a path such as /hooks", path)
		}
		g.HooksPath = path
	}
	if raw, ok := hooks.Get("token"); ok {
		if err := json.Unmarshal(raw, &g.Token); err != nil {
			return g, fmt.Errorf("hooks.token is %s: want the token itself, a string (OpenClaw takes no SecretRef there)", kind(raw))
		}
		switch {
		case strings.Contains(g.Token, "${"):
			return g, fmt.Errorf("hooks.token names an environment variable: setup hands the token itself to the bgtask server, so write it there")
		case strings.IndexFunc(g.Token, func(c rune) bool { return c <= ' ' || c >= 0x7f }) >= 0:
			return g, fmt.Errorf("hooks.token holds a character other than visible ASCII, which a header cannot carry")
		}
	}
	return g, nil
}

// kind names a JSON value's kind, never its content (it may be a secret).
func kind(raw json.RawMessage) string {
	var v any
	_ = json.Unmarshal(raw, &v)
	switch v.(type) {
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return "a number"
}

// newToken is a hook token for a gateway that has none.
func newToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// The session key prefixes setup allows: OpenClaw's agent sessions, and the
// hook: keys it generates itself, which a prefix list must admit when no
// hooks.defaultSessionKey is set.
var sessionPrefixes = []string{"hook:", "agent:"}

// edits are the values setup gives OpenClaw's configuration, by path.
type edits struct {
	token, pluginDir string
}

// install returns cfg with the hooks /hooks/agent needs to run a turn in a
// named session, and bgtask's plugin loaded and allowed.
func (e edits) install(cfg setup.Object) (setup.Object, error) {
	hooks, err := child(cfg, "hooks")
	if err != nil {
		return nil, err
	}
	hooks = hooks.Set("enabled", json.RawMessage("true"))
	if _, ok := hooks.Get("token"); !ok {
		hooks = hooks.Set("token", mustJSON(e.token))
	}
	hooks = hooks.Set("allowRequestSessionKey", json.RawMessage("true"))
	prefixes, err := stringsAt(hooks, "hooks", "allowedSessionKeyPrefixes")
	if err != nil {
		return nil, err
	}
	if len(prefixes) == 0 {
		prefixes = sessionPrefixes
	} else if !slices.ContainsFunc(prefixes, func(p string) bool { return strings.EqualFold(strings.TrimSpace(p), "agent:") }) {
		prefixes = append(prefixes, "agent:")
	}
	hooks = hooks.Set("allowedSessionKeyPrefixes", mustJSON(prefixes))

	plugins, err := child(cfg, "plugins")
	if err != nil {
		return nil, err
	}
	if plugins, err = e.addPlugin(plugins); err != nil {
		return nil, err
	}
	cfg, err = setChild(cfg, "hooks", hooks)
	if err != nil {
		return nil, err
	}
	return setChild(cfg, "plugins", plugins)
}

// addPlugin loads bgtask's plugin (plugins.load.paths), enables it with the
// conversation hooks it uses (plugins.entries.bgtask), and, where the user keeps
// an allow list, allows it.
func (e edits) addPlugin(plugins setup.Object) (setup.Object, error) {
	load, err := child(plugins, "load")
	if err != nil {
		return nil, fmt.Errorf("plugins.%w", err)
	}
	paths, err := stringsAt(load, "plugins.load", "paths")
	if err != nil {
		return nil, err
	}
	if !slices.Contains(paths, e.pluginDir) {
		paths = append(paths, e.pluginDir)
	}
	load = load.Set("paths", mustJSON(paths))
	if plugins, err = setChild(plugins, "load", load); err != nil {
		return nil, err
	}
	entries, err := child(plugins, "entries")
	if err != nil {
		return nil, fmt.Errorf("plugins.%w", err)
	}
	entries = entries.Set(PluginID, json.RawMessage(`{"enabled":true,"hooks":{"allowConversationAccess":true}}`))
	if plugins, err = setChild(plugins, "entries", entries); err != nil {
		return nil, err
	}
	if _, ok := plugins.Get("allow"); ok {
		allow, err := stringsAt(plugins, "plugins", "allow")
		if err != nil {
			return nil, err
		}
		if !slices.Contains(allow, PluginID) {
			plugins = plugins.Set("allow", mustJSON(append(allow, PluginID)))
		}
	}
	return plugins, nil
}

// remove returns cfg without bgtask's plugin, and with the hooks settings setup
// changed as they were in orig, the configuration before setup (nil: not kept,
// and they stay as they are).
func (e edits) remove(cfg, orig setup.Object) (setup.Object, error) {
	plugins, err := child(cfg, "plugins")
	if err != nil {
		return nil, err
	}
	load, err := child(plugins, "load")
	if err != nil {
		return nil, fmt.Errorf("plugins.%w", err)
	}
	paths, err := stringsAt(load, "plugins.load", "paths")
	if err != nil {
		return nil, err
	}
	paths = slices.DeleteFunc(paths, func(p string) bool { return p == e.pluginDir })
	load = restoreKey(load, "paths", mustJSON(paths), len(paths) > 0, lookup(orig, "plugins", "load"))
	plugins = restoreChild(plugins, "load", load, lookup(orig, "plugins"))
	entries, err := child(plugins, "entries")
	if err != nil {
		return nil, fmt.Errorf("plugins.%w", err)
	}
	plugins = restoreChild(plugins, "entries", entries.Without(PluginID), lookup(orig, "plugins"))
	if _, ok := plugins.Get("allow"); ok {
		allow, err := stringsAt(plugins, "plugins", "allow")
		if err != nil {
			return nil, err
		}
		if origAllow, _ := stringsAt(lookup(orig, "plugins"), "plugins", "allow"); !slices.Contains(origAllow, PluginID) {
			allow = slices.DeleteFunc(allow, func(id string) bool { return id == PluginID })
			plugins = plugins.Set("allow", mustJSON(allow))
		}
	}
	cfg = restoreChild(cfg, "plugins", plugins, orig)
	if orig == nil {
		return cfg, nil
	}
	hooks, err := child(cfg, "hooks")
	if err != nil {
		return nil, err
	}
	origHooks := lookup(orig, "hooks")
	for _, key := range []string{"enabled", "token", "allowRequestSessionKey", "allowedSessionKeyPrefixes"} {
		value, had := origHooks.Get(key)
		hooks = restoreKey(hooks, key, value, had, origHooks)
	}
	return restoreChild(cfg, "hooks", hooks, orig), nil
}

// restoreKey sets key to value when keep, else to its value in orig, else
// takes it out.
func restoreKey(obj setup.Object, key string, value json.RawMessage, keep bool, orig setup.Object) setup.Object {
	if keep {
		return obj.Set(key, value)
	}
	if was, ok := orig.Get(key); ok {
		return obj.Set(key, was)
	}
	return obj.Without(key)
}

// restoreChild sets the object at key, or, when setup's removal left it empty
// and orig had no such key, takes it out.
func restoreChild(obj setup.Object, key string, value setup.Object, orig setup.Object) setup.Object {
	if _, had := orig.Get(key); len(value) == 0 && !had {
		return obj.Without(key)
	}
	raw, _ := value.Encode()
	return obj.Set(key, raw)
}

// child is the object at key ("" when there is none).
func child(obj setup.Object, key string) (setup.Object, error) {
	raw, ok := obj.Get(key)
	if !ok {
		return setup.Object{}, nil
	}
	c, err := setup.ParseObject(raw, key)
	if err != nil {
		return nil, fmt.Errorf("%s is not an object", key)
	}
	return c, nil
}

// lookup is the object at the path in obj, or none.
func lookup(obj setup.Object, path ...string) setup.Object {
	for _, key := range path {
		c, err := child(obj, key)
		if err != nil {
			return nil
		}
		obj = c
	}
	return obj
}

func setChild(obj setup.Object, key string, value setup.Object) (setup.Object, error) {
	raw, err := value.Encode()
	if err != nil {
		return nil, err
	}
	return obj.Set(key, raw), nil
}

// stringsAt is the array of strings at key, named in errors as where.key.
func stringsAt(obj setup.Object, where, key string) ([]string, error) {
	raw, ok := obj.Get(key)
	if !ok {
		return nil, nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("%s.%s is not an array of strings", where, key)
	}
	return list, nil
}

func mustJSON(v any) json.RawMessage {
	raw, _ := setup.Marshal(v)
	return raw
}
