package workers

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bgtask/bgtask/workers/shim"
)

// runPool keeps the directories of finished runs, cleaned, for the runs to come: a
// run then makes few new files. Each new file costs the file system an inode, and
// ext4 without a journal skips every inode deleted in the last few seconds when it
// looks for a free one: with a run's directory and its files made and removed for
// every task, that look was a fifth of all the CPU a short task cost. A directory
// keeps the inodes of the files its own writers alone write, under the name of
// their temp file (run.json, pid.json, exit.json and starting), which each writer
// opens and renames into place as it would a new one. The output files are kept,
// emptied, only where no process has them open for writing (emptyIfUnwritten): whoever
// the command handed them to, or left running past its shim (a process that
// escaped its containment), may write to them still, and must not write into
// another task's output; such a file is removed, and the next run makes its own.
//
// A free directory is named freePrefix and a number, which no task's run has
// (intentOf): a worker that starts again removes it with what else is not a run.
type runPool struct {
	runs string // the directory runs are in, STATE/runs
	max  int    // free directories kept at most

	mu   sync.Mutex
	free []string
	next uint64 // for the name of the next free directory
}

const freePrefix = ".free-"

// runsPattern matches the directories of runs in STATE/runs, and not free ones.
const runsPattern = "[^.]*"

// recycled are the files of a run directory whose inode a run writes again under
// the name of its temp file: the file itself must be gone for the next run.
var recycled = []string{runFile, shim.PIDFile, shim.ExitFile, shim.StartingFile}

func newRunPool(runs string, max int) *runPool {
	return &runPool{runs: runs, max: max, next: uint64(time.Now().UnixNano())}
}

// intent makes dir, a run's directory, from a free one if there is one, durably,
// as writeIntent does; like it, it fails with fs.ErrExist if dir exists.
func (p *runPool) intent(dir string) error {
	free := p.take()
	if free == "" {
		return writeIntent(dir)
	}
	// Nothing else makes dir meanwhile: a worker takes each task once at a time,
	// and no other process uses its state directory (lockStateDir).
	if _, err := os.Lstat(dir); err == nil {
		p.put(free)
		return fs.ErrExist
	}
	if err := os.Rename(free, dir); err != nil {
		_ = os.RemoveAll(free)
		return writeIntent(dir)
	}
	return shim.SyncDir(p.runs)
}

// recycle takes the directory of a run whose end is in the log: cleaned, it is
// kept for another run, or else removed.
func (p *runPool) recycle(dir string) {
	p.mu.Lock()
	full := len(p.free) >= p.max
	p.next++
	free := filepath.Join(p.runs, freePrefix+strconv.FormatUint(p.next, 10))
	p.mu.Unlock()
	if full || os.Rename(dir, free) != nil {
		_ = os.RemoveAll(dir)
		return
	}
	if err := clean(free); err != nil {
		_ = os.RemoveAll(free)
		return
	}
	p.put(free)
}

func (p *runPool) take() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) == 0 {
		return ""
	}
	free := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	return free
}

func (p *runPool) put(free string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.free = append(p.free, free)
}

// drain removes the free directories.
func (p *runPool) drain() {
	for free := p.take(); free != ""; free = p.take() {
		_ = os.RemoveAll(free)
	}
}

var errShimLingers = errors.New("the shim of the run still holds its start lock")

// clean readies the directory of a finished run for another: as the worker makes a
// new one, with the inodes of its own files kept (runPool). What it renames and
// removes is on disk before it returns: a crash of the host must not bring the
// files of one run back into the next.
func clean(dir string) error {
	// A shim that outlives its exit file (stopping what its command left) holds the
	// run's start lock, which is the directory: the next run's would be held too.
	if shimAlive(dir) {
		return errShimLingers
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		name, path := e.Name(), filepath.Join(dir, e.Name())
		switch {
		case slices.Contains(recycled, name):
			err = os.Rename(path, path+".tmp")
		case strings.HasSuffix(name, ".tmp") && slices.Contains(recycled, strings.TrimSuffix(name, ".tmp")):
			// Left by a writer that died before its rename; opened with truncation.
		case name == shim.StdoutFile || name == shim.StderrFile:
			var kept bool
			if kept, err = emptyIfUnwritten(path); err == nil && !kept {
				err = os.Remove(path) // someone may still write it
			}
		default: // stop.json, and anything else
			err = os.RemoveAll(path)
		}
		if err != nil {
			return err
		}
	}
	// The environment of the run (run.json) may hold secrets: not left in a free
	// directory. Not made durable: after a crash of the host the temp file may hold
	// it still, in the worker's own state directory (0600), as run.json did while
	// the run went on, until the next run's write truncates it.
	if err := os.Truncate(filepath.Join(dir, runFile+".tmp"), 0); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return shim.SyncDir(dir)
}
