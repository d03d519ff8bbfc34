package httpapi

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// browserTools finds node, chromium and playwright-core (on NODE_PATH, as
// .ci/run installs it), or skips.
func browserTools(b *testing.B) (node, chromium string) {
	node, err := exec.LookPath("node")
	if err != nil {
		b.Skip("no node here")
	}
	if chromium, err = exec.LookPath("chromium"); err != nil {
		b.Skip("no chromium here (apt-get install chromium)")
	}
	if exec.Command(node, "-e", "require.resolve('playwright-core')").Run() != nil {
		b.Skip("no playwright-core on NODE_PATH (.ci/run installs it)")
	}
	return node, chromium
}

// BenchmarkEventDeliveryToABrowser appends an event and times its arrival at
// an EventSource on /v1/events in headless Chromium, logged in to the
// dashboard, and at a JetStream ordered consumer (Follow) in this process: both
// from the wall clock just before the append, the page's by its own clock
// (performance.timeOrigin + performance.now()), the machine's wall clock too.
// It reports p50 and p99 of each, and the least and the most the page's clock
// was ahead of Date.now(), read just after it (which counts whole milliseconds):
// 0 to 1 ms when the two agree, less where the page was held up between the two
// reads. An arrival before its append fails it.
//
//	go test -run '^$' -bench EventDeliveryToABrowser -benchtime 2000x ./internal/httpapi/
func BenchmarkEventDeliveryToABrowser(b *testing.B) {
	node, chromium := browserTools(b)
	h := start(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var link struct{ URL string }
	h.call(b, "POST", "/v1/login", "", 201, &link)
	page := openPage(b, ctx, node, chromium, link.URL)
	f := followStore(b, ctx, h)
	defer f.stop()
	var viaPage, viaFollow, offsets []time.Duration
	for b.Loop() {
		id, t0, followed := f.appendOne()
		viaFollow = append(viaFollow, followed)
		at, offset := page.arrival(id)
		if at.Before(t0) {
			b.Fatalf("the page got event %s %s before its append: the clocks disagree", id, t0.Sub(at))
		}
		viaPage = append(viaPage, at.Sub(t0))
		offsets = append(offsets, offset)
	}
	page.close()
	for name, took := range map[string][]time.Duration{"browser": viaPage, "follow": viaFollow} {
		slices.Sort(took)
		b.ReportMetric(µs(took[len(took)/2]), name+"-p50-µs")
		b.ReportMetric(µs(took[len(took)*99/100]), name+"-p99-µs")
	}
	slices.Sort(offsets)
	b.ReportMetric(µs(offsets[0]), "clock-offset-min-µs")
	b.ReportMetric(µs(offsets[len(offsets)-1]), "clock-offset-max-µs")
}

func µs(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// browserPage is testdata/eventsource.cjs running: its lines, and its stdin,
// whose end ends it.
type browserPage struct {
	b     *testing.B
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

func openPage(b *testing.B, ctx context.Context, node, chromium, link string) *browserPage {
	cmd := exec.CommandContext(ctx, node, filepath.Join("testdata", "eventsource.cjs"))
	cmd.Env = append(os.Environ(), "LINK="+link, "CHROMIUM="+chromium)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	p := &browserPage{b: b, cmd: cmd, stdin: stdin, lines: make(chan string, 1024)}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	if line := p.next(); line != "ready" {
		b.Fatalf("the page said %q, not ready", line)
	}
	return p
}

// next is the page's next line.
func (p *browserPage) next() string {
	select {
	case line, ok := <-p.lines:
		if !ok {
			p.b.Fatalf("the page ended: %v", p.cmd.Wait())
		}
		return line
	case <-time.After(60 * time.Second):
		p.b.Fatal("no line from the page in 60 s")
	}
	return ""
}

// arrival reads the page's lines to the one of task id: when the page got it,
// and how far its clock was from Date.now() then.
func (p *browserPage) arrival(id string) (time.Time, time.Duration) {
	for {
		f := strings.Fields(p.next())
		if len(f) != 4 || f[0] != "got" {
			p.b.Fatalf("not a line of the page's: %q", strings.Join(f, " "))
		}
		if f[1] != id {
			continue
		}
		ms, err1 := strconv.ParseFloat(f[2], 64)
		date, err2 := strconv.ParseInt(f[3], 10, 64)
		if err1 != nil || err2 != nil {
			p.b.Fatalf("not a line of the page's: %q", strings.Join(f, " "))
		}
		at := time.UnixMicro(int64(ms * 1e3))
		return at, at.Sub(time.UnixMilli(date))
	}
}

func (p *browserPage) close() {
	p.stdin.Close()
	if err := p.cmd.Wait(); err != nil {
		p.b.Errorf("the page: %v", err)
	}
}
