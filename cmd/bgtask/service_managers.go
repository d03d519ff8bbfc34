package main

import (
	"encoding/xml"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/bgtask/bgtask/internal/serverhome"
)

// systemdUnitFile is the user unit that runs `exe server --home home` with PATH.
func systemdUnitFile(exe, home, path string) []byte {
	return []byte(`# Written by 'bgtask service install --user'; 'bgtask service uninstall --user' removes it.
[Unit]
Description=bgtask server: a durable supervisor for background work
Documentation=https://github.com/bgtask/bgtask/blob/main/docs/operations.md

[Service]
Type=simple
ExecStart=` + systemdExecArg(exe) + ` server --home ` + systemdExecArg(home) + `
Restart=on-failure
RestartSec=2s
# Stop the server alone: the commands it started run on, and the server started
# again watches them again. The default (control-group) kills them all.
KillMode=process
# The installing shell's PATH, so that exec sinks find claude, codex and the like.
Environment=` + systemdQuote("PATH="+path) + `
# Tells clients that a server gone is started again, so they wait for it.
Environment=` + serverhome.SupervisedEnv + `=systemd

[Install]
WantedBy=default.target
`)
}

// systemdExecArg is one word of ExecStart: quoted when it needs to be, with
// systemd's specifiers (%) and variables ($) escaped.
func systemdExecArg(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t\"'\\;%$") {
		return s
	}
	return systemdQuote(strings.ReplaceAll(s, "$", "$$"))
}

// systemdQuote is a double-quoted unit-file value with % escaped.
func systemdQuote(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "%", "%%", "\n", `\n`)
	return `"` + r.Replace(s) + `"`
}

// systemd drives the user's systemd instance.
type systemd struct{}

func systemctl(args ...string) []string { return append([]string{"systemctl", "--user"}, args...) }

func (systemd) reachable(r *serviceRun) error {
	if _, err := exec.LookPath("systemctl"); err != nil {
		return fmt.Errorf("service: no systemctl on PATH: this system does not run systemd; run 'bgtask server' under your own supervisor")
	}
	if out, err := r.output(systemctl("show-environment")...); err != nil {
		return fmt.Errorf("service: no systemd user instance to install into (systemctl --user: %s). "+
			"One runs for a user with a login session on a systemd system; in a container, after su, or without a session there is none: "+
			"log in as the user (or, as root, 'loginctl enable-linger %s' and set XDG_RUNTIME_DIR=/run/user/%d), "+
			"or run 'bgtask server' under your own supervisor", strings.TrimSpace(out), currentUser(), os.Getuid())
	}
	return nil
}

func (systemd) installCmds(_ *serviceRun, changed bool) [][]string {
	if changed {
		return [][]string{systemctl("daemon-reload"), systemctl("enable", systemdUnit), systemctl("restart", systemdUnit)}
	}
	return [][]string{systemctl("enable", systemdUnit), systemctl("start", systemdUnit)}
}

func (systemd) uninstallCmds(*serviceRun) [][]string {
	return [][]string{systemctl("disable", "--now", systemdUnit)}
}

func (systemd) reloadCmds() [][]string { return [][]string{systemctl("daemon-reload")} }

func (systemd) state(r *serviceRun) string {
	// Both print their answer and fail when it is not enabled, not active.
	enabled, _ := r.output(systemctl("is-enabled", systemdUnit)...)
	active, _ := r.output(systemctl("is-active", systemdUnit)...)
	return strings.TrimSpace(enabled) + ", " + strings.TrimSpace(active)
}

func (systemd) notes(r *serviceRun) []string {
	name := currentUser()
	linger := ""
	if out, err := r.output("loginctl", "show-user", name, "--property=Linger", "--value"); err == nil {
		linger = " (lingering is " + map[bool]string{true: "on", false: "off"}[strings.TrimSpace(out) == "yes"] + " for " + name + ")"
	}
	return []string{
		"logs: journalctl --user -u " + systemdUnit + " -f",
		"at boot: your systemd user instance, and so this service, runs only while you are logged in; " +
			"'loginctl enable-linger " + name + "' starts it at boot and keeps it running after you log out" + linger,
	}
}

// launchdPlist is the LaunchAgent that runs `exe server --home home` with PATH,
// its output in the home.
func launchdPlist(exe, home, path string) []byte {
	var b strings.Builder
	esc := func(s string) string {
		var e strings.Builder
		_ = xml.EscapeText(&e, []byte(s))
		return e.String()
	}
	str := func(s string) string { return "<string>" + esc(s) + "</string>" }
	log := filepath.Join(home, serviceLogFile)
	b.WriteString(`<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<!-- Written by 'bgtask service install'; 'bgtask service uninstall' removes it. -->
<plist version="1.0">
<dict>
	<key>Label</key>
	` + str(launchdLabel) + `
	<key>ProgramArguments</key>
	<array>
		` + str(exe) + `
		<string>server</string>
		<string>--home</string>
		` + str(home) + `
	</array>
	<key>EnvironmentVariables</key>
	<dict>
		<key>PATH</key>
		` + str(path) + `
		<!-- Tells clients that a server gone is started again, so they wait for it. -->
		<key>` + serverhome.SupervisedEnv + `</key>
		<string>launchd</string>
	</dict>
	<key>RunAtLoad</key>
	<true/>
	<!-- Started again unless it exited cleanly. -->
	<key>KeepAlive</key>
	<dict>
		<key>SuccessfulExit</key>
		<false/>
	</dict>
	<!-- Stop the server alone: the commands it started run on, and the server
	     started again watches them again. By default launchd kills them all. -->
	<key>AbandonProcessGroup</key>
	<true/>
	<key>StandardOutPath</key>
	` + str(log) + `
	<key>StandardErrorPath</key>
	` + str(log) + `
</dict>
</plist>
`)
	return []byte(b.String())
}

// launchd drives the user's launchd domain.
type launchd struct{}

func guiDomain() string { return fmt.Sprintf("gui/%d", os.Getuid()) }

func launchdTarget() string { return guiDomain() + "/" + launchdLabel }

func (launchd) reachable(r *serviceRun) error {
	if _, err := exec.LookPath("launchctl"); err != nil {
		return fmt.Errorf("service: no launchctl on PATH: this is not macOS's launchd")
	}
	if out, err := r.output("launchctl", "print", guiDomain()); err != nil {
		return fmt.Errorf("service: no launchd session of yours to install into (launchctl print %s: %s): log in to the Mac as this user", guiDomain(), strings.TrimSpace(out))
	}
	return nil
}

// loaded reports whether launchd has the agent.
func (launchd) loaded(r *serviceRun) bool {
	_, err := r.output("launchctl", "print", launchdTarget())
	return err == nil
}

func (l launchd) installCmds(r *serviceRun, changed bool) [][]string {
	enable := []string{"launchctl", "enable", launchdTarget()}
	bootstrap := []string{"launchctl", "bootstrap", guiDomain(), r.path}
	switch loaded := l.loaded(r); {
	case !loaded:
		return [][]string{enable, bootstrap}
	case changed:
		return [][]string{enable, {"launchctl", "bootout", launchdTarget()}, bootstrap}
	}
	return [][]string{enable, {"launchctl", "kickstart", launchdTarget()}}
}

func (l launchd) uninstallCmds(r *serviceRun) [][]string {
	if !l.loaded(r) {
		return nil
	}
	return [][]string{{"launchctl", "bootout", launchdTarget()}}
}

func (launchd) reloadCmds() [][]string { return nil }

func (launchd) state(r *serviceRun) string {
	out, err := r.output("launchctl", "print", launchdTarget())
	if err != nil {
		return "not loaded"
	}
	for line := range strings.Lines(out) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "state = "); ok {
			return "loaded, " + v
		}
	}
	return "loaded"
}

func (launchd) notes(r *serviceRun) []string {
	return []string{
		"logs: " + filepath.Join(r.home, serviceLogFile),
		"at login: a LaunchAgent runs while you are logged in, from your login on; " +
			"Linux's 'loginctl enable-linger' (run at boot, without a login) has no LaunchAgent counterpart",
	}
}
