package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/internal/serverhome"
	"github.com/bgtask/bgtask/internal/testkit"
)

// browserTools finds node, chromium and playwright-core (on NODE_PATH, as
// .ci/run installs it); without one the test is skipped, unless in CI.
func browserTools(t *testing.T) (node, chromium string) {
	t.Helper()
	missing := func(why string) {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and %s", why)
		}
		t.Skip(why)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("no node here")
	}
	chromium, err = exec.LookPath("chromium")
	if err != nil {
		missing("no chromium here (apt-get install chromium)")
	}
	if err := exec.Command(node, "-e", "require.resolve('playwright-core')").Run(); err != nil {
		missing("no playwright-core on NODE_PATH (.ci/run installs it)")
	}
	return node, chromium
}

// The dashboard in a real browser, through a task's life: logged in by the
// one-time link of `bgtask ui --print`, the list shows a task registered from
// the API without a reload, its page shows its output growing and its timeline
// to its wake-up, another is cancelled from its page; a screenshot of each page
// goes to $BGTASK_SCREENSHOTS (or a temporary folder).
func TestDashboardInABrowser(t *testing.T) {
	testkit.FullOnly(t)
	node, chromium := browserTools(t)
	home := t.TempDir()
	startServer(t, home)
	info, err := serverhome.ReadHTTPInfo(home)
	if err != nil {
		t.Fatal(err)
	}
	link := strings.TrimSpace(bgtask(t, home, "ui", "--print").must(t, 0, "ui --print").stdout)
	shots := os.Getenv("BGTASK_SCREENSHOTS")
	if shots == "" {
		shots = t.TempDir()
	}
	if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join("testdata", "dashboard.cjs"))
	cmd.Env = append(os.Environ(), "URL="+info.URL, "TOKEN="+info.Token, "LINK="+link, "SHOTS="+shots,
		"CHROMIUM="+chromium, "TASK_CWD="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the browser's run: %v\n%s", err, out)
	}
	t.Logf("%s", out)
	for _, name := range []string{"tasks", "task", "task-dark", "task-cancelled", "workers", "targets", "audit"} {
		if fi, err := os.Stat(filepath.Join(shots, name+".png")); err != nil || fi.Size() == 0 {
			t.Errorf("no screenshot %s: %v", name, err)
		}
	}
}
