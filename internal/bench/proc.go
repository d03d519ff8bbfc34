package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// markerEnv is set, to its home, in the environment of every bgtask process a run
// starts. Servers and workers pass their environment on to the shims and commands
// they start, and those leave the servers' process groups and sessions on purpose,
// so the marker is how the run finds all of them to kill them.
const markerEnv = "BGTASK_BENCH_HOME"

// proc is a bgtask process of the run: a server or a worker.
type proc struct {
	name string
	home string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
}

// spawn starts the bgtask binary with args on home, its output going to a log file
// in the home.
func (r *runner) spawn(home, name string, args ...string) (*proc, error) {
	logPath := filepath.Join(home, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child has its own copy
	cmd := exec.Command(r.opts.Exe, append([]string{"--home", home}, args...)...)
	cmd.Env = append(environWithout(markerEnv), markerEnv+"="+home)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// A group of its own, so it can be killed with whatever it started in it, and
	// a Ctrl-C at the terminal reaches only the bench, which stops it in order.
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start bgtask %s: %w", strings.Join(args, " "), err)
	}
	p := &proc{name: name, home: home, log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop asks the process to stop (SIGTERM) and kills its process group if it has
// not within grace.
func (p *proc) stop(grace time.Duration) {
	if !p.exited() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-p.done:
	case <-time.After(grace):
	}
	_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
	<-p.done
}

// failure is an error about the process, with the end of its log.
func (p *proc) failure(format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if data, err := os.ReadFile(p.log); err == nil && len(data) > 0 {
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		msg += "; its log ends:\n  " + strings.Join(lines[max(0, len(lines)-8):], "\n  ")
	}
	return fmt.Errorf("bgtask %s (%s): %s", p.name, p.home, msg)
}

func environWithout(name string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, name+"=") {
			env = append(env, kv)
		}
	}
	return env
}

// marked lists the processes marked with dir or a home under it, with their
// command lines.
func marked(dir string) map[int][]string {
	out := map[int][]string{}
	entries, _ := os.ReadDir("/proc")
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil || !hasMarker(env, dir) {
			continue
		}
		cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		out[pid] = strings.Split(strings.TrimSuffix(string(cmdline), "\x00"), "\x00")
	}
	return out
}

func hasMarker(environ []byte, dir string) bool {
	exact, under := []byte(markerEnv+"="+dir), []byte(markerEnv+"="+dir+"/")
	for kv := range bytes.SplitSeq(environ, []byte{0}) {
		if bytes.Equal(kv, exact) || bytes.HasPrefix(kv, under) {
			return true
		}
	}
	return false
}

// sweep kills every process marked with dir or a home under it, and looks again
// until none is left: a shim may be starting its command while it is killed.
func sweep(dir string) error {
	clean := 0
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		procs := marked(dir)
		if len(procs) == 0 {
			if clean++; clean == 3 {
				return nil
			}
		} else {
			clean = 0
		}
		for pid := range procs {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.New("processes of the bench still alive after 30 s of killing them")
}

// memInfo is a process's memory: its resident set now and at its peak, and its
// proportional set (shared pages divided among the processes that map them, so the
// PSS of many copies of one binary adds up to what they really use).
type memInfo struct {
	RSS, HWM, PSS int64 // bytes
}

func readMem(pid int) (memInfo, error) {
	status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return memInfo{}, err
	}
	m := memInfo{RSS: meminfoKiB(string(status), "VmRSS") << 10, HWM: meminfoKiB(string(status), "VmHWM") << 10}
	if rollup, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup"); err == nil {
		m.PSS = meminfoKiB(string(rollup), "Pss") << 10
	}
	return m, nil
}

// cpuTime is the CPU time a process's own threads have used, user and system.
func cpuTime(pid int) (time.Duration, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// pid (comm) state ... : comm may hold spaces; utime and stime are the 14th
	// and 15th fields, in clock ticks of 1/100 s on Linux.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, errors.New("unreadable /proc stat")
	}
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 13 {
		return 0, errors.New("unreadable /proc stat")
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// machineCPU is the CPU time of the whole machine so far, busy (every process, and
// the kernel's work for them) and idle (waiting for the disk included), from the
// first line of /proc/stat, in clock ticks of 1/100 s.
func machineCPU() (busy, idle time.Duration, err error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := bytes.Cut(data, []byte("\n"))
	fields := strings.Fields(string(line))
	// cpu user nice system idle iowait irq softirq steal ...
	if len(fields) < 9 || fields[0] != "cpu" {
		return 0, 0, errors.New("unreadable /proc/stat")
	}
	var ticks [8]int64
	for i := range ticks {
		if ticks[i], err = strconv.ParseInt(fields[i+1], 10, 64); err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: %w", err)
		}
	}
	tick := 10 * time.Millisecond
	busy = time.Duration(ticks[0]+ticks[1]+ticks[2]+ticks[5]+ticks[6]+ticks[7]) * tick
	return busy, time.Duration(ticks[3]+ticks[4]) * tick, nil
}

// machineUse is the machine's CPU over some work, per item of it.
type machineUse struct{ busy, idle []float64 }

// measure runs work, which does n items, and keeps the machine's busy and idle CPU
// per item, in milliseconds.
func (m *machineUse) measure(n int, work func() error) error {
	busy0, idle0, err := machineCPU()
	if err != nil {
		return err
	}
	if err := work(); err != nil {
		return err
	}
	busy1, idle1, err := machineCPU()
	if err != nil {
		return err
	}
	m.busy = append(m.busy, ms(busy1-busy0)/float64(n))
	m.idle = append(m.idle, ms(idle1-idle0)/float64(n))
	return nil
}

// startCost runs a short command n times and returns the wall and CPU time of
// each run, in milliseconds: what starting a process of it costs.
func startCost(ctx context.Context, n int, name string, args ...string) (wall, cpu []float64, err error) {
	for range n {
		cmd := exec.CommandContext(ctx, name, args...)
		start := time.Now()
		if err := cmd.Run(); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", name, err)
		}
		wall = append(wall, ms(time.Since(start)))
		cpu = append(cpu, ms(cmd.ProcessState.UserTime()+cmd.ProcessState.SystemTime()))
	}
	return wall, cpu, nil
}

// sleepCtx waits for d or the end of ctx.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
