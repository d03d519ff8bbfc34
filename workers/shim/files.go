package shim

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// ProcRef names a process for as long as it lives: a PID alone may be reused.
type ProcRef struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"` // clock ticks after boot, from /proc/PID/stat
}

// PIDs is pid.json.
type PIDs struct {
	Shim    ProcRef   `json:"shim"`
	Command ProcRef   `json:"command"`
	Started time.Time `json:"started_at"`
}

// Exit is exit.json: how the command ended, or why it could not start.
type Exit struct {
	ExitCode   int       `json:"exit_code"`
	Signal     string    `json:"signal,omitempty"`
	StoppedBy  string    `json:"stopped_by,omitempty"` // StoppedByDeadline or StoppedByStall
	StartedAt  time.Time `json:"started_at"`
	EndedAt    time.Time `json:"ended_at"`
	StartError string    `json:"start_error,omitempty"`
}

// The shim writes its files as JSON by hand (see the package comment); a test holds
// encoding/json to reading back the same values.

func (p ProcRef) appendJSON(b []byte) []byte {
	b = strconv.AppendInt(append(b, `{"pid":`...), int64(p.PID), 10)
	b = strconv.AppendUint(append(b, `,"start":`...), p.Start, 10)
	return append(b, '}')
}

func (p PIDs) appendJSON(b []byte) []byte {
	b = p.Shim.appendJSON(append(b, `{"shim":`...))
	b = p.Command.appendJSON(append(b, `,"command":`...))
	b = appendTime(append(b, `,"started_at":`...), p.Started)
	return append(b, '}')
}

func (e Exit) appendJSON(b []byte) []byte {
	b = strconv.AppendInt(append(b, `{"exit_code":`...), int64(e.ExitCode), 10)
	if e.Signal != "" {
		b = appendString(append(b, `,"signal":`...), e.Signal)
	}
	if e.StoppedBy != "" {
		b = appendString(append(b, `,"stopped_by":`...), e.StoppedBy)
	}
	b = appendTime(append(b, `,"started_at":`...), e.StartedAt)
	b = appendTime(append(b, `,"ended_at":`...), e.EndedAt)
	if e.StartError != "" {
		b = appendString(append(b, `,"start_error":`...), e.StartError)
	}
	return append(b, '}')
}

func appendTime(b []byte, t time.Time) []byte {
	return append(t.AppendFormat(append(b, '"'), time.RFC3339Nano), '"')
}

// appendString quotes s as a JSON string; invalid UTF-8 becomes U+FFFD.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b = append(b, '\\', byte(r))
		case r < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[r>>4], hex[r&0xf])
		default:
			b = utf8.AppendRune(b, r)
		}
	}
	return append(b, '"')
}

// WriteDurable writes a file so that a reader sees all of it or none, and it
// survives the host's crash: a temp file, fsync, rename, fsync of the directory.
func WriteDurable(path string, data []byte) error {
	return writeFile(path, data, true)
}

// WriteAtomic writes a file so that a reader sees all of it or none: a temp file
// renamed. A crash of the host may lose it.
func WriteAtomic(path string, data []byte) error {
	return writeFile(path, data, false)
}

func writeFile(path string, data []byte, durable bool) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if durable {
		if err := f.Sync(); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	if !durable {
		return nil
	}
	// The rename is on disk once its directory is: best effort, the file's data is.
	_ = SyncDir(filepath.Dir(path))
	return nil
}

// SyncDir makes a directory's entries durable: the files made, renamed or removed
// in it.
func SyncDir(path string) error {
	d, err := os.Open(path)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// ProcStart reads a process's start time, which with its PID names it uniquely.
func ProcStart(pid int) (uint64, error) {
	_, _, start, err := procStat(pid)
	return start, err
}

// Alive reports whether the process p names is still running (a zombie is not).
func (p ProcRef) Alive() bool {
	if p.PID <= 0 {
		return false
	}
	state, _, start, err := procStat(p.PID)
	return err == nil && start == p.Start && state != "Z"
}

// procStat reads a process's state letter, parent and start time from
// /proc/PID/stat.
func procStat(pid int) (state string, ppid int, start uint64, err error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", 0, 0, err
	}
	// pid (comm) state ppid ...: comm may hold spaces; field 22 is the start time.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return "", 0, 0, errors.New("unreadable /proc stat")
	}
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 20 {
		return "", 0, 0, errors.New("unreadable /proc stat")
	}
	if ppid, err = strconv.Atoi(fields[1]); err != nil {
		return "", 0, 0, err
	}
	start, err = strconv.ParseUint(fields[19], 10, 64)
	return fields[0], ppid, start, err
}
