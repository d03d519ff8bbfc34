package bench

import (
	"fmt"
	"io"
	"maps"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is the outcome of a run: the machine, and each scenario's figures.
type Report struct {
	Quick   bool      `json:"quick"`
	Repeats int       `json:"repeats"`
	Machine Machine   `json:"machine"`
	Started time.Time `json:"started"`
	Seconds float64   `json:"seconds"`
	// Peer says which peer ran beside bgtask, or that none is installed.
	Peer      string     `json:"peer,omitempty"`
	Scenarios []Scenario `json:"scenarios"`
}

// Machine describes where the figures were measured: they mean little without it.
type Machine struct {
	CPUs       int    `json:"cpus"`
	CPUModel   string `json:"cpu_model"`
	MemoryMiB  int64  `json:"memory_mib"`
	OS         string `json:"os"`
	Go         string `json:"go"`
	LoadBefore string `json:"load_before"`
	LoadAfter  string `json:"load_after"`
	// ProcessStart is what one start of `bash -c true` costs here, in CPU and
	// wall time (medians). A ratio against a peer that starts a process per
	// task moves with it: where a start is dear, the peer pays most; where it
	// is cheap, bgtask's own work shows. Read every ratio beside it.
	ProcessStart ProcessStart `json:"process_start"`
}

// ProcessStart is the cost of a process start on the machine, in ms.
type ProcessStart struct {
	CPU  float64 `json:"cpu_ms"`
	Wall float64 `json:"wall_ms"`
}

func (p ProcessStart) String() string {
	return fmt.Sprintf("a process start (bash -c true) costs %s ms of CPU, %s ms wall", num(p.CPU), num(p.Wall))
}

// Scenario is one scenario's figures: rows of bgtask against its baseline, and the
// issue's targets with whether this run met them.
type Scenario struct {
	Name    string         `json:"name"`
	Title   string         `json:"title"`
	Params  map[string]any `json:"params,omitempty"`
	Rows    []Row          `json:"results"`
	Targets []Target       `json:"targets,omitempty"`
	Notes   []string       `json:"notes,omitempty"`
	Error   string         `json:"error,omitempty"`
	Seconds float64        `json:"seconds"`
}

// Row is one measured quantity. Ratio is bgtask's median over the baseline's: a
// fraction of the baseline's rate, or how many times its latency.
type Row struct {
	Name     string   `json:"name"`
	Unit     string   `json:"unit"`
	Bgtask   Stat     `json:"bgtask"`
	Baseline *Stat    `json:"baseline,omitempty"`
	Against  string   `json:"baseline_name,omitempty"`
	Ratio    *float64 `json:"ratio,omitempty"`
	Peer     *Peer    `json:"peer,omitempty"`
}

// Peer is a row's quantity measured on another tool doing the same work in the
// same run (task-spooler), and bgtask's ratio to it, read as Ratio is.
type Peer struct {
	Name  string   `json:"name"`
	Stat  Stat     `json:"stat"`
	Ratio *float64 `json:"ratio,omitempty"`
}

// Target is one of the targets, as measured in this run.
type Target struct {
	Goal     string `json:"goal"`
	Measured string `json:"measured"`
	Met      bool   `json:"met"`
}

func (s *Scenario) param(name string, v any) {
	if s.Params == nil {
		s.Params = map[string]any{}
	}
	s.Params[name] = v
}

// add appends a row of bgtask alone.
func (s *Scenario) add(name, unit string, st Stat) *Row {
	s.Rows = append(s.Rows, Row{Name: name, Unit: unit, Bgtask: st})
	return &s.Rows[len(s.Rows)-1]
}

// compare appends a row of bgtask against a baseline.
func (s *Scenario) compare(name, unit string, st Stat, against string, base Stat) *Row {
	r := s.add(name, unit, st)
	r.Baseline, r.Against = &base, against
	if base.Median != 0 {
		ratio := st.Median / base.Median
		r.Ratio = &ratio
	}
	return r
}

// against sets the row's figure of the peer.
func (r *Row) against(name string, st Stat) {
	r.Peer = &Peer{Name: name, Stat: st}
	if st.Median != 0 {
		ratio := r.Bgtask.Median / st.Median
		r.Peer.Ratio = &ratio
	}
}

func (s *Scenario) target(goal string, met bool, measured string, args ...any) {
	s.Targets = append(s.Targets, Target{Goal: goal, Measured: fmt.Sprintf(measured, args...), Met: met})
}

func (s *Scenario) note(format string, args ...any) {
	s.Notes = append(s.Notes, fmt.Sprintf(format, args...))
}

// machine describes this machine, with its load average now.
func machine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), OS: runtime.GOOS + "/" + runtime.GOARCH, Go: runtime.Version(), LoadBefore: loadAverage()}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(data), "\n") {
			if name, value, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(name) == "model name" {
				m.CPUModel = strings.TrimSpace(value)
				break
			}
		}
	}
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		m.MemoryMiB = meminfoKiB(string(data), "MemTotal") >> 10
	}
	return m
}

// loadAverage is the 1, 5 and 15 minute load averages: the machines are shared,
// and a figure measured under load says so.
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// meminfoKiB reads one "Name:   123 kB" field of /proc/meminfo or /proc/PID/status.
func meminfoKiB(text, field string) int64 {
	for line := range strings.SplitSeq(text, "\n") {
		name, value, ok := strings.Cut(line, ":")
		if !ok || name != field {
			continue
		}
		f := strings.Fields(value)
		if len(f) == 0 {
			return 0
		}
		n, _ := strconv.ParseInt(f[0], 10, 64)
		return n
	}
	return 0
}

// Print writes the report for people: one table per scenario, then its targets.
func (r *Report) Print(w io.Writer) {
	mode := "full"
	if r.Quick {
		mode = "quick: smaller sizes, targets indicative"
	}
	m := r.Machine
	fmt.Fprintf(w, "bgtask bench (%s), %d repeats, %.0f s\n", mode, r.Repeats, r.Seconds)
	fmt.Fprintf(w, "machine: %d CPUs (%s), %d MiB, %s, %s; load average before %s, after %s\n",
		m.CPUs, m.CPUModel, m.MemoryMiB, m.OS, m.Go, m.LoadBefore, m.LoadAfter)
	fmt.Fprintf(w, "process start: %s (medians); read each ratio beside it\n", m.ProcessStart)
	if r.Peer != "" {
		fmt.Fprintf(w, "peer: %s\n", r.Peer)
	}
	for _, s := range r.Scenarios {
		fmt.Fprintf(w, "\n== %s: %s (%.1f s)\n", s.Name, s.Title, s.Seconds)
		if len(s.Params) > 0 {
			fmt.Fprintf(w, "   %s\n", formatParams(s.Params))
		}
		if s.Error != "" {
			fmt.Fprintf(w, "   ERROR: %s\n", s.Error)
		}
		printRows(w, s.Rows)
		for _, t := range s.Targets {
			verdict := "MET"
			if !t.Met {
				verdict = "MISSED"
			}
			fmt.Fprintf(w, "   target %s: %s (%s)\n", t.Goal, verdict, t.Measured)
		}
		for _, n := range s.Notes {
			fmt.Fprintf(w, "   note: %s\n", n)
		}
	}
}

// printRows writes a scenario's rows as a table, with the peer's columns when a
// row has a peer figure, then the peers the rows were measured against.
func printRows(w io.Writer, rows []Row) {
	if len(rows) == 0 {
		return
	}
	var peers []string
	for _, row := range rows {
		if row.Peer != nil && !slices.Contains(peers, row.Peer.Name) {
			peers = append(peers, row.Peer.Name)
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	header := "   \tunit\tbgtask p50/median\tp99\tmin…max\tbaseline p50/median\tp99\tmin…max\tratio"
	if len(peers) > 0 {
		header += "\tpeer p50/median\tp99\tmin…max\tratio to peer"
	}
	fmt.Fprintln(tw, header+"\tbaseline")
	for _, row := range rows {
		fmt.Fprintf(tw, "   %s\t%s\t%s", row.Name, row.Unit, formatStat(row.Bgtask))
		if row.Baseline != nil {
			fmt.Fprintf(tw, "\t%s", formatStat(*row.Baseline))
		} else {
			fmt.Fprint(tw, "\t\t\t")
		}
		fmt.Fprintf(tw, "\t%s", formatRatio(row.Ratio))
		if len(peers) > 0 {
			if row.Peer != nil {
				fmt.Fprintf(tw, "\t%s\t%s", formatStat(row.Peer.Stat), formatRatio(row.Peer.Ratio))
			} else {
				fmt.Fprint(tw, "\t\t\t\t")
			}
		}
		fmt.Fprintf(tw, "\t%s\n", row.Against)
	}
	tw.Flush()
	for _, p := range peers {
		fmt.Fprintf(w, "   peer: %s\n", p)
	}
}

func formatRatio(ratio *float64) string {
	if ratio == nil {
		return ""
	}
	return num(*ratio)
}

func formatParams(p map[string]any) string {
	keys := slices.Sorted(maps.Keys(p))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%v", k, p[k])
	}
	return strings.Join(parts, " ")
}

func formatStat(s Stat) string {
	p99 := ""
	if s.P99 != nil {
		p99 = num(*s.P99)
	}
	return fmt.Sprintf("%s\t%s\t%s…%s (n=%d)", num(s.Median), p99, num(s.Min), num(s.Max), s.N)
}

// num prints a figure with three significant digits, the precision a noisy
// machine allows.
func num(v float64) string {
	switch a := max(v, -v); {
	case a == 0:
		return "0"
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	default:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}
