package main

import (
	"bytes"
	"encoding/xml"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fakeSystemctl stands for the user's systemd, which no test machine runs for
// it: it records each call and keeps whether the unit is enabled and active.
const fakeSystemctl = `#!/bin/sh
echo "systemctl $*" >> "$BGTASK_TEST_CALLS"
case "$*" in
*show-environment*)
	if [ -n "$BGTASK_TEST_NO_BUS" ]; then echo "Failed to connect to bus: No medium found" >&2; exit 1; fi
	echo PATH=/usr/bin ;;
*is-enabled*) if [ -f "$BGTASK_TEST_STATE/enabled" ]; then echo enabled; else echo disabled; exit 1; fi ;;
*is-active*) if [ -f "$BGTASK_TEST_STATE/active" ]; then echo active; else echo inactive; exit 3; fi ;;
*"disable --now"*) rm -f "$BGTASK_TEST_STATE/enabled" "$BGTASK_TEST_STATE/active" ;;
*" enable "*) touch "$BGTASK_TEST_STATE/enabled" ;;
*" restart "*|*" start "*) touch "$BGTASK_TEST_STATE/active" ;;
esac
`

// fakeLaunchctl stands for launchd likewise.
const fakeLaunchctl = `#!/bin/sh
echo "launchctl $*" >> "$BGTASK_TEST_CALLS"
case "$1" in
print) case "$2" in */*/*) if [ -f "$BGTASK_TEST_STATE/loaded" ]; then echo "	state = running"; else exit 113; fi ;; esac ;;
bootstrap) touch "$BGTASK_TEST_STATE/loaded" ;;
bootout) rm -f "$BGTASK_TEST_STATE/loaded" ;;
esac
`

const fakeLoginctl = "#!/bin/sh\necho \"loginctl $*\" >> \"$BGTASK_TEST_CALLS\"\necho no\n"

// serviceEnv is a test's user: its home and config, the fake service managers
// first on PATH, and the binary the service would run.
type serviceEnv struct {
	home, exe, calls, path string
}

func newServiceEnv(t *testing.T, os_ string) *serviceEnv {
	t.Helper()
	dir := t.TempDir()
	bin, state := filepath.Join(dir, "bin"), filepath.Join(dir, "state")
	for _, d := range []string{bin, state} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, script := range map[string]string{"systemctl": fakeSystemctl, "launchctl": fakeLaunchctl, "loginctl": fakeLoginctl} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	e := &serviceEnv{home: filepath.Join(dir, "bgtask home"), exe: filepath.Join(dir, "bgtask"), calls: filepath.Join(dir, "calls")}
	if err := os.WriteFile(e.exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	e.path = bin + ":" + os.Getenv("PATH")
	t.Setenv("PATH", e.path)
	t.Setenv("HOME", dir)
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(dir, "config"))
	t.Setenv("BGTASK_TEST_CALLS", e.calls)
	t.Setenv("BGTASK_TEST_STATE", state)
	t.Setenv("BGTASK_TEST_NO_BUS", "")
	oldOS, oldBinary := serviceOS, serviceBinary
	serviceOS, serviceBinary = os_, func() (string, error) { return e.exe, nil }
	t.Cleanup(func() { serviceOS, serviceBinary = oldOS, oldBinary })
	return e
}

func (e *serviceEnv) unitPath() string {
	return filepath.Join(os.Getenv("XDG_CONFIG_HOME"), "systemd", "user", systemdUnit)
}

// takeCalls returns the commands run since the last call, and forgets them.
func (e *serviceEnv) takeCalls(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(e.calls)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	os.Remove(e.calls)
	return slices.DeleteFunc(strings.Split(strings.TrimSpace(string(data)), "\n"), func(s string) bool { return s == "" })
}

// changing are the calls that change something, of calls.
func changing(calls []string) []string {
	var out []string
	for _, c := range calls {
		if !strings.Contains(c, "show-environment") && !strings.Contains(c, " is-") && !strings.HasPrefix(c, "loginctl") &&
			!strings.HasPrefix(c, "launchctl print") {
			out = append(out, c)
		}
	}
	return out
}

func (e *serviceEnv) run(t *testing.T, args ...string) result {
	t.Helper()
	return bgtask(t, e.home, append([]string{"service"}, args...)...)
}

// The dry run prints the unit, whose stop leaves the commands running, and the
// commands install would run, and changes nothing.
func TestServiceInstallDryRunPrintsTheUnitAndChangesNothing(t *testing.T) {
	e := newServiceEnv(t, "linux")
	out := e.run(t, "install", "--user", "--dry-run").must(t, 0, "install --dry-run").stdout
	for _, want := range []string{
		"# would write " + e.unitPath(),
		"\nKillMode=process\n", "\nRestart=on-failure\n",
		"\nExecStart=" + e.exe + ` server --home "` + e.home + `"` + "\n",
		"\nEnvironment=\"PATH=" + e.path + "\"\n",
		"\nWantedBy=default.target\n",
		"systemctl --user daemon-reload\nsystemctl --user enable bgtask.service\nsystemctl --user restart bgtask.service\n",
		"journalctl --user -u bgtask.service", "loginctl enable-linger ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the dry run does not print %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(e.unitPath()); !os.IsNotExist(err) {
		t.Errorf("the dry run wrote the unit: %v", err)
	}
	if c := changing(e.takeCalls(t)); len(c) > 0 {
		t.Errorf("the dry run ran %q", c)
	}
}

// Install writes the unit and starts it; again, with nothing changed, it only
// makes sure it is enabled and started; with another PATH it restarts it.
// Uninstall stops, disables and removes it, and a second one has nothing to do.
func TestServiceInstallAndUninstallAreIdempotent(t *testing.T) {
	e := newServiceEnv(t, "linux")
	out := e.run(t, "install", "--user").must(t, 0, "install").stdout
	unit, err := os.ReadFile(e.unitPath())
	if err != nil || !bytes.Equal(unit, systemdUnitFile(e.exe, e.home, e.path)) {
		t.Fatalf("the unit after install: %v\n%s", err, unit)
	}
	wantCalls(t, e, "install", "systemctl --user daemon-reload", "systemctl --user enable bgtask.service", "systemctl --user restart bgtask.service")
	if !strings.Contains(out, "enabled, active") || !strings.Contains(out, "journalctl --user -u bgtask.service -f") || !strings.Contains(out, "lingering is off") {
		t.Errorf("install says:\n%s", out)
	}
	status := e.run(t, "status", "--user").must(t, 0, "status").stdout
	if !strings.Contains(status, "as install would write it now") || !strings.Contains(status, "state: enabled, active") {
		t.Errorf("status says:\n%s", status)
	}

	out = e.run(t, "install", "--user").must(t, 0, "install again").stdout
	wantCalls(t, e, "install again", "systemctl --user enable bgtask.service", "systemctl --user start bgtask.service")
	if !strings.Contains(out, "is up to date") {
		t.Errorf("install again says:\n%s", out)
	}
	t.Setenv("PATH", e.path+":/opt/agents/bin")
	e.run(t, "install", "--user").must(t, 0, "install with another PATH")
	wantCalls(t, e, "install with another PATH", "systemctl --user daemon-reload", "systemctl --user enable bgtask.service", "systemctl --user restart bgtask.service")
	t.Setenv("PATH", e.path)
	if status := e.run(t, "status", "--user").must(t, 0, "status").stdout; !strings.Contains(status, "not as install would write it now") {
		t.Errorf("status of a unit with another PATH says:\n%s", status)
	}

	out = e.run(t, "uninstall", "--user").must(t, 0, "uninstall").stdout
	wantCalls(t, e, "uninstall", "systemctl --user disable --now bgtask.service", "systemctl --user daemon-reload")
	if _, err := os.Stat(e.unitPath()); !os.IsNotExist(err) || !strings.Contains(out, "The commands it started go on") {
		t.Errorf("after uninstall (%v):\n%s", err, out)
	}
	out = e.run(t, "uninstall", "--user").must(t, 0, "uninstall again").stdout
	wantCalls(t, e, "uninstall again")
	if !strings.Contains(out, "nothing to do") {
		t.Errorf("uninstall again says:\n%s", out)
	}
	if status := e.run(t, "status", "--user").must(t, 0, "status").stdout; !strings.HasPrefix(status, "not installed") {
		t.Errorf("status after uninstall says:\n%s", status)
	}
}

func wantCalls(t *testing.T, e *serviceEnv, what string, want ...string) {
	t.Helper()
	if got := changing(e.takeCalls(t)); !slices.Equal(got, want) {
		t.Errorf("%s ran %q, want %q", what, got, want)
	}
}

// Where no systemd user instance runs, install says so and writes nothing.
func TestServiceWithoutASystemdUserInstanceSaysSo(t *testing.T) {
	e := newServiceEnv(t, "linux")
	t.Setenv("BGTASK_TEST_NO_BUS", "1")
	r := e.run(t, "install", "--user").must(t, 1, "install")
	if !strings.Contains(r.stderr, "no systemd user instance") || !strings.Contains(r.stderr, "Failed to connect to bus") {
		t.Errorf("install says:\n%s", r.stderr)
	}
	if _, err := os.Stat(e.unitPath()); !os.IsNotExist(err) {
		t.Errorf("the unit was written: %v", err)
	}
	if c := changing(e.takeCalls(t)); len(c) > 0 {
		t.Errorf("install ran %q", c)
	}
}

// Without --user, or from go run's temporary binary, nothing is installed.
func TestServiceRefusesWhatItCannotInstall(t *testing.T) {
	e := newServiceEnv(t, "linux")
	if r := e.run(t, "install", "--dry-run").must(t, 2, "install without --user"); !strings.Contains(r.stderr, "--user") {
		t.Errorf("install without --user says: %s", r.stderr)
	}
	tmp := filepath.Join(t.TempDir(), "go-build1234", "b001", "exe")
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(tmp, "bgtask")
	if err := os.WriteFile(exe, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	serviceBinary = func() (string, error) { return exe, nil }
	if r := e.run(t, "install", "--user").must(t, 1, "install from go run"); !strings.Contains(r.stderr, "go install") {
		t.Errorf("install from go run's build says: %s", r.stderr)
	}
	if _, err := os.Stat(e.unitPath()); !os.IsNotExist(err) {
		t.Errorf("the unit was written: %v", err)
	}
}

// systemd reads the unit without a complaint, also for paths with spaces and
// the characters it gives a meaning.
func TestServiceUnitPassesSystemdAnalyzeVerify(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("no systemd-analyze on this machine")
	}
	dir := t.TempDir()
	exe := filepath.Join(dir, "bin dir", "bgtask")
	if err := os.MkdirAll(filepath.Dir(exe), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	unit := filepath.Join(dir, systemdUnit)
	home := filepath.Join(dir, `a home at 100%h "$HOME" \x`)
	content := systemdUnitFile(exe, home, "/usr/bin:/bin:/opt/100%/bin")
	// What systemd reads back as the very words: %h would be the user's home,
	// $HOME its variable and \x an escape.
	for _, want := range []string{
		`ExecStart="` + filepath.Join(dir, "bin dir", "bgtask") + `" server --home "` + dir + `/a home at 100%%h \"$$HOME\" \\x"`,
		`Environment="PATH=/usr/bin:/bin:/opt/100%%/bin"`,
	} {
		if !strings.Contains(string(content), want+"\n") {
			t.Errorf("the unit has no line %s:\n%s", want, content)
		}
	}
	if err := os.WriteFile(unit, content, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", "--user", unit).CombinedOutput()
	if err != nil && strings.Contains(string(out), "Failed to initialize manager") {
		// No user instance to verify against: the system manager reads a unit
		// file the same way.
		out, err = exec.Command(analyze, "verify", unit).CombinedOutput()
	}
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s\n%s", err, out, content)
	}
}

// plistNode is an element of a property list.
type plistNode struct {
	XMLName xml.Name
	Text    string      `xml:",chardata"`
	Nodes   []plistNode `xml:",any"`
}

// dict is a plist dict by its keys.
func (n plistNode) dict(t *testing.T) map[string]plistNode {
	t.Helper()
	if n.XMLName.Local != "dict" || len(n.Nodes)%2 != 0 {
		t.Fatalf("not a dict: %+v", n)
	}
	out := map[string]plistNode{}
	for i := 0; i < len(n.Nodes); i += 2 {
		out[n.Nodes[i].Text] = n.Nodes[i+1]
	}
	return out
}

// On macOS the LaunchAgent keeps the server alive, leaves its commands running
// when it stops, and gives it PATH; install loads it once, and uninstall unloads it.
func TestServiceLaunchAgent(t *testing.T) {
	e := newServiceEnv(t, "darwin")
	plist := filepath.Join(os.Getenv("HOME"), "Library", "LaunchAgents", launchdLabel+".plist")
	out := e.run(t, "install", "--user", "--dry-run").must(t, 0, "install --dry-run").stdout
	_, content, ok := strings.Cut(out, "# would write "+plist+":\n")
	content, _, _ = strings.Cut(content, "# would run:")
	if !ok || !strings.HasPrefix(content, "<?xml") {
		t.Fatalf("the dry run does not print the plist:\n%s", out)
	}
	var root plistNode
	if err := xml.Unmarshal([]byte(content), &root); err != nil || len(root.Nodes) != 1 {
		t.Fatalf("the plist does not parse: %v\n%s", err, content)
	}
	d := root.Nodes[0].dict(t)
	var args []string
	for _, a := range d["ProgramArguments"].Nodes {
		args = append(args, a.Text)
	}
	log := filepath.Join(e.home, serviceLogFile)
	switch {
	case d["Label"].Text != launchdLabel:
		t.Errorf("Label %q", d["Label"].Text)
	case !slices.Equal(args, []string{e.exe, "server", "--home", e.home}):
		t.Errorf("ProgramArguments %q", args)
	case d["AbandonProcessGroup"].XMLName.Local != "true" || d["RunAtLoad"].XMLName.Local != "true":
		t.Errorf("AbandonProcessGroup %+v, RunAtLoad %+v", d["AbandonProcessGroup"], d["RunAtLoad"])
	case d["KeepAlive"].dict(t)["SuccessfulExit"].XMLName.Local != "false":
		t.Errorf("KeepAlive %+v", d["KeepAlive"])
	case d["EnvironmentVariables"].dict(t)["PATH"].Text != e.path:
		t.Errorf("EnvironmentVariables %+v", d["EnvironmentVariables"])
	case d["StandardOutPath"].Text != log || d["StandardErrorPath"].Text != log:
		t.Errorf("logs to %q and %q, want %q", d["StandardOutPath"].Text, d["StandardErrorPath"].Text, log)
	}
	if _, err := os.Stat(plist); !os.IsNotExist(err) {
		t.Fatalf("the dry run wrote the plist: %v", err)
	}
	e.takeCalls(t)

	target := launchdTarget()
	e.run(t, "install", "--user").must(t, 0, "install")
	wantCalls(t, e, "install", "launchctl enable "+target, "launchctl bootstrap "+guiDomain()+" "+plist)
	e.run(t, "install", "--user").must(t, 0, "install again")
	wantCalls(t, e, "install again", "launchctl enable "+target, "launchctl kickstart "+target)
	if status := e.run(t, "status", "--user").must(t, 0, "status").stdout; !strings.Contains(status, "state: loaded, running") {
		t.Errorf("status says:\n%s", status)
	}
	e.run(t, "uninstall", "--user").must(t, 0, "uninstall")
	wantCalls(t, e, "uninstall", "launchctl bootout "+target)
	if _, err := os.Stat(plist); !os.IsNotExist(err) {
		t.Errorf("the plist is still there: %v", err)
	}
}
