package openclaw

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/client/clienttest"
	"github.com/bgtask/bgtask/internal/serverhome"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// gatewayConfig is an openclaw.json as `openclaw onboard` leaves it, with the
// hooks of the old /hooks/wake recipe.
const gatewayConfig = `{"gateway": {"mode": "local", "port": 18790, "bind": "loopback", "auth": {"mode": "token", "token": "gw-t3"}},
 "hooks": {"enabled": true, "token": "hook-t3", "path": "/hooks/"}}
`

// fixture is an OpenClaw state directory with config as its openclaw.json, and a
// bgtask home.
type fixture struct {
	t            *testing.T
	config, home string
	stdout       bytes.Buffer
	stderr       bytes.Buffer
}

func newFixture(t *testing.T, config string) *fixture {
	t.Helper()
	f := &fixture{t: t, config: filepath.Join(t.TempDir(), "openclaw.json"), home: t.TempDir()}
	if config != "" {
		if err := os.WriteFile(f.config, []byte(config), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func (f *fixture) run(remove bool) error {
	f.stdout.Reset()
	f.stderr.Reset()
	return Setup{Config: f.config, Remove: remove, Bgtask: "/opt/bg task/bgtask", Home: f.home, Stdout: &f.stdout, Stderr: &f.stderr}.Run()
}

func (f *fixture) must(remove bool) {
	f.t.Helper()
	if err := f.run(remove); err != nil {
		f.t.Fatalf("setup (remove %v): %v", remove, err)
	}
}

func (f *fixture) read() []byte {
	f.t.Helper()
	data, err := os.ReadFile(f.config)
	if err != nil {
		f.t.Fatal(err)
	}
	return data
}

// value is the configuration's value at a dotted path, as JSON.
func (f *fixture) value(path string) string {
	f.t.Helper()
	var v any
	if err := json.Unmarshal(f.read(), &v); err != nil {
		f.t.Fatal(err)
	}
	for _, key := range strings.Split(path, ".") {
		m, _ := v.(map[string]any)
		v = m[key]
	}
	out, _ := json.Marshal(v)
	return string(out)
}

// TestSetupAndRemove: setup gives the gateway's hooks what /hooks/agent needs in
// a named session, loads and enables bgtask's plugin, writes it, and declares the
// hook token to the server for the /hooks/agent URL only; a second run changes
// nothing; --remove gives back every byte of the file and takes the plugin and
// the token away.
func TestSetupAndRemove(t *testing.T) {
	f := newFixture(t, gatewayConfig)
	f.must(false)
	for path, want := range map[string]string{
		"gateway.auth.token":              `"gw-t3"`,
		"hooks.enabled":                   `true`,
		"hooks.token":                     `"hook-t3"`,
		"hooks.path":                      `"/hooks/"`,
		"hooks.allowRequestSessionKey":    `true`,
		"hooks.allowedSessionKeyPrefixes": `["hook:","agent:"]`,
		"plugins.load.paths":              `["` + PluginDir(f.home) + `"]`,
		"plugins.entries.bgtask":          `{"enabled":true,"hooks":{"allowConversationAccess":true}}`,
	} {
		if got := f.value(path); got != want {
			t.Errorf("%s = %s, want %s", path, got, want)
		}
	}
	b, err := serverhome.ReadBearer(f.home, BearerName)
	if err != nil || b.Token != "hook-t3" || len(b.URLPrefixes) != 1 || b.URLPrefixes[0] != "http://127.0.0.1:18790/hooks/agent" {
		t.Fatalf("the declared bearer: %+v, %v", b, err)
	}
	index, err := os.ReadFile(filepath.Join(PluginDir(f.home), "index.js"))
	if err != nil || !bytes.Contains(index, []byte(`["/opt/bg task/bgtask","`+f.home+`","http://127.0.0.1:18790/hooks/agent"]`)) {
		t.Fatalf("the plugin's index.js (%v):\n%s", err, index)
	}
	if strings.Contains(f.stdout.String(), "hook-t3") {
		t.Errorf("setup printed the token: %s", f.stdout.String())
	}

	once := f.read()
	f.must(false)
	if !bytes.Equal(f.read(), once) || !strings.Contains(f.stdout.String(), "already set up") {
		t.Fatalf("a second setup changed the file or did not say so: %s", f.stdout.String())
	}

	f.must(true)
	if got := f.read(); string(got) != gatewayConfig {
		t.Fatalf("after --remove:\n%s\nwant the original bytes:\n%s", got, gatewayConfig)
	}
	if _, err := serverhome.ReadBearer(f.home, BearerName); !os.IsNotExist(err) {
		t.Errorf("the bearer after --remove: %v", err)
	}
	if _, err := os.Stat(filepath.Dir(PluginDir(f.home))); !os.IsNotExist(err) {
		t.Errorf("the plugin after --remove: %v", err)
	}
}

// TestSetupKeepsTheUsersSettings: prefixes, load paths and an allow list the user
// has stay, bgtask's are added to them; a gateway with no token gets one, which
// the server is given too; --remove takes out only what setup added, even after
// the user changed the file since, and a made token goes with it.
func TestSetupKeepsTheUsersSettings(t *testing.T) {
	f := newFixture(t, `{"hooks": {"enabled": false, "allowedSessionKeyPrefixes": ["hook:gmail:"], "defaultSessionKey": "hook:gmail:x"},
 "plugins": {"allow": ["voice-call"], "load": {"paths": ["/srv/voice"]}, "entries": {"voice-call": {"enabled": true}}}}`)
	f.must(false)
	for path, want := range map[string]string{
		"hooks.enabled":                   `true`,
		"hooks.allowedSessionKeyPrefixes": `["hook:gmail:","agent:"]`,
		"plugins.allow":                   `["voice-call","bgtask"]`,
		"plugins.load.paths":              `["/srv/voice","` + PluginDir(f.home) + `"]`,
		"plugins.entries.voice-call":      `{"enabled":true}`,
		"gateway.port":                    `null`,
	} {
		if got := f.value(path); got != want {
			t.Errorf("%s = %s, want %s", path, got, want)
		}
	}
	var token string
	if err := json.Unmarshal([]byte(f.value("hooks.token")), &token); err != nil || len(token) != 64 {
		t.Fatalf("the made token: %q, %v", token, err)
	}
	if b, err := serverhome.ReadBearer(f.home, BearerName); err != nil || b.Token != token || b.URLPrefixes[0] != "http://127.0.0.1:18789/hooks/agent" {
		t.Fatalf("the declared bearer: %+v, %v", b, err)
	}

	// The user adds a plugin of their own after setup.
	edited := strings.Replace(string(f.read()), `"/srv/voice",`, `"/srv/voice", "/srv/mine",`, 1)
	if err := os.WriteFile(f.config, []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}
	f.must(true)
	for path, want := range map[string]string{
		"hooks":              `{"allowedSessionKeyPrefixes":["hook:gmail:"],"defaultSessionKey":"hook:gmail:x","enabled":false}`,
		"plugins.allow":      `["voice-call"]`,
		"plugins.load.paths": `["/srv/voice","/srv/mine"]`,
		"plugins.entries":    `{"voice-call":{"enabled":true}}`,
	} {
		if got := f.value(path); got != want {
			t.Errorf("after --remove, %s = %s, want %s", path, got, want)
		}
	}
}

// TestSetupRefusesWhatItCannotEdit: a file that is not plain JSON, a key of the
// wrong kind, a token setup cannot hand over, or no file at all is refused with
// the file and the reason, and nothing changes; the token is never in the error.
func TestSetupRefusesWhatItCannotEdit(t *testing.T) {
	for name, c := range map[string]struct{ config, reason string }{
		"json5":        {"{\n  // my gateway\n  gateway: {port: 18789},\n}\n", "OpenClaw reads JSON5, setup only plain JSON"},
		"hooks":        {`{"hooks": ["x"]}`, "hooks is not an object"},
		"port":         {`{"gateway": {"port": "http"}}`, `gateway.port is "http": want a port number`},
		"path":         {`{"hooks": {"path": "/"}}`, `hooks.path "/"`},
		"secret ref":   {`{"hooks": {"token": {"source": "env", "id": "SEKRIT-HOOK"}}}`, "hooks.token is an object: want the token itself"},
		"env token":    {`{"hooks": {"token": "${SEKRIT_HOOK}"}}`, "hooks.token names an environment variable"},
		"number token": {`{"hooks": {"token": 12345}}`, "hooks.token is a number: want the token itself"},
		"paths":        {`{"plugins": {"load": {"paths": "/srv"}}}`, "plugins.load.paths is not an array of strings"},
		"entries":      {`{"plugins": {"entries": 3}}`, "plugins.entries is not an object"},
		"no such file": {"", "does not exist: set OpenClaw up first"},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, c.config)
			err := f.run(false)
			if err == nil || !strings.Contains(err.Error(), c.reason) || !strings.Contains(err.Error(), f.config) || strings.Contains(err.Error(), "SEKRIT") {
				t.Fatalf("setup: %v; want ...%s... naming %s", err, c.reason, f.config)
			}
			if c.config != "" && string(f.read()) != c.config {
				t.Errorf("the file changed: %s", f.read())
			}
			if entries, _ := os.ReadDir(f.home); len(entries) != 0 {
				t.Errorf("setup wrote into bgtask's home: %v", entries)
			}
		})
	}
}

// TestSetupFollowsALink: an openclaw.json that is a symbolic link stays one,
// through setup and --remove.
func TestSetupFollowsALink(t *testing.T) {
	f := newFixture(t, "")
	real := filepath.Join(t.TempDir(), "dotfiles-openclaw.json")
	if err := os.WriteFile(real, []byte(gatewayConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, f.config); err != nil {
		t.Fatal(err)
	}
	f.must(false)
	if st, err := os.Lstat(f.config); err != nil || st.Mode()&os.ModeSymlink == 0 || f.value("hooks.allowRequestSessionKey") != "true" {
		t.Fatalf("after setup: %v, %v", st, err)
	}
	f.must(true)
	if st, err := os.Lstat(f.config); err != nil || st.Mode()&os.ModeSymlink == 0 || string(f.read()) != gatewayConfig {
		t.Fatalf("after --remove: %v, %v, %s", st, err, f.read())
	}
}

// TestThePluginIsValidJavaScript: node parses the plugin setup writes, as an ES
// module (skipped where there is no node).
func TestThePluginIsValidJavaScript(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not on PATH")
	}
	dir := t.TempDir()
	if _, err := writePlugin(dir, pluginFiles(`/opt/it's "bg"/bgtask`, "/home/me/.local/state/bgtask", "http://127.0.0.1:18789/hooks/agent")); err != nil {
		t.Fatal(err)
	}
	// A program that loads it as OpenClaw does, with a stand-in api, and calls its hooks.
	probe := filepath.Join(dir, "probe.mjs")
	if err := os.WriteFile(probe, []byte(`import plugin from "./index.js";
const hooks = {};
plugin.register({ on: (name, fn) => { hooks[name] = fn; }, logger: console });
const env = hooks.resolve_exec_env({ sessionKey: "agent:main:main", toolName: "exec" }, {});
console.log(plugin.id, JSON.stringify(env), Object.keys(hooks).sort().join(","));
`), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(node, probe).CombinedOutput()
	want := `bgtask {"BGTASK_OPENCLAW_SESSION":"agent:main:main","BGTASK_OPENCLAW_URL":"http://127.0.0.1:18789/hooks/agent","BGTASK_HOME":"/home/me/.local/state/bgtask"} agent_end,before_model_resolve,resolve_exec_env`
	if err != nil || strings.TrimSpace(string(out)) != want {
		t.Fatalf("node: %v\n%s\nwant %s", err, out, want)
	}
}

// TestTarget: a session key names a target, whatever it holds and however long.
func TestTarget(t *testing.T) {
	long := "agent:main:telegram:group:" + strings.Repeat("9", 200)
	for key, want := range map[string]string{
		"agent:main:main":             "openclaw-agent_main_main",
		"agent:ops:discord:chan-1_x":  "openclaw-agent_ops_discord_chan-1_x",
		"agent:main:matrix:!room:é.x": "openclaw-agent_main_matrix__room___x",
	} {
		if got := Target(key); got != want || !client.ValidName(got) {
			t.Errorf("Target(%q) = %q, want %q", key, got, want)
		}
	}
	if got := Target(long); !client.ValidName(got) || got == Target(long+"0") {
		t.Errorf("Target of a long key: %q, the same as a longer one's or no valid name", got)
	}
}

// TestHookMarksTheSessionBusyAndIdle: `bgtask hook openclaw` sets the state of
// the session's target, busy with a bound.
func TestHookMarksTheSessionBusyAndIdle(t *testing.T) {
	srv := clienttest.Run(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hook := Hook{Config: client.Config{Home: srv.Home}}
	c, err := client.Connect(ctx, client.Config{Home: srv.Home})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, state := range []string{client.TargetBusy, client.TargetIdle} {
		if err := hook.Run(ctx, state, "agent:main:main"); err != nil {
			t.Fatalf("%s: %v", state, err)
		}
		states, err := c.Targets(ctx)
		if err != nil {
			t.Fatal(err)
		}
		st := states["openclaw-agent_main_main"]
		if busy := st.BusyAt(time.Now()); busy != (state == client.TargetBusy) || state == client.TargetBusy && (st.Until == nil || st.Until.After(time.Now().Add(BusyTTL))) {
			t.Fatalf("after %s: %+v", state, st)
		}
	}
	for _, args := range [][2]string{{"asleep", "agent:main:main"}, {"busy", " "}} {
		if err := hook.Run(ctx, args[0], args[1]); err == nil {
			t.Errorf("Run(%q, %q): no error", args[0], args[1])
		}
	}
}
