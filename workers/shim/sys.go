package shim

import "syscall"

// The shim calls the kernel through package syscall alone, not through os, time
// or strconv: every package it links adds to the text that each running shim has
// resident, and their start to every task's (see the package comment).

// fileError says what was done to which file, like os.PathError.
type fileError struct {
	op, path string
	err      error
}

func (e *fileError) Error() string { return e.op + " " + e.path + ": " + e.err.Error() }
func (e *fileError) Unwrap() error { return e.err }

// open opens path, never into a child the shim starts (close-on-exec).
func open(path string, flags int, perm uint32) (int, error) {
	for {
		fd, err := syscall.Open(path, flags|syscall.O_CLOEXEC, perm)
		if err != syscall.EINTR {
			if err != nil {
				return -1, &fileError{"open", path, err}
			}
			return fd, nil
		}
	}
}

func readFile(path string) ([]byte, error) {
	fd, err := open(path, syscall.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer syscall.Close(fd)
	return readAll(fd, path, 512)
}

// readAll reads fd, named name in errors, to its end.
func readAll(fd int, name string, size int) ([]byte, error) {
	buf := make([]byte, 0, size+1) // room to read the end at once
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := syscall.Read(fd, buf[len(buf):cap(buf)])
		switch {
		case err == syscall.EINTR:
		case err != nil:
			return nil, &fileError{"read", name, err}
		case n == 0:
			return buf, nil
		default:
			buf = buf[:len(buf)+n]
		}
	}
}

func writeAll(fd int, data []byte) error {
	for len(data) > 0 {
		n, err := syscall.Write(fd, data)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

// fileSize is the size of the file at path, 0 if there is none.
func fileSize(path string) int64 {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) != nil {
		return 0
	}
	return st.Size
}

// dirOf is the directory part of a path, as filepath.Dir has it for the absolute,
// clean paths of a run directory.
func dirOf(path string) string {
	for i := len(path) - 1; i > 0; i-- {
		if path[i] == '/' {
			return path[:i]
		}
	}
	if len(path) > 0 && path[0] == '/' {
		return "/"
	}
	return "."
}

func join(dir, name string) string { return dir + "/" + name }

func appendInt(b []byte, n int64) []byte {
	if n < 0 {
		b = append(b, '-')
		return appendUint(b, uint64(-n))
	}
	return appendUint(b, uint64(n))
}

func appendUint(b []byte, n uint64) []byte {
	var digits [20]byte
	i := len(digits)
	for {
		i--
		digits[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			break
		}
	}
	return append(b, digits[i:]...)
}

// parseUint reads a decimal number of digits alone, no sign.
func parseUint(s string) (uint64, bool) {
	if s == "" || len(s) > 20 {
		return 0, false
	}
	var n uint64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		next := n*10 + uint64(c-'0')
		if next/10 != n {
			return 0, false // overflow
		}
		n = next
	}
	return n, true
}

// parseInt64 reads a decimal int64, with an optional minus sign.
func parseInt64(s string) (int64, bool) {
	neg := len(s) > 0 && s[0] == '-'
	if neg {
		s = s[1:]
	}
	u, ok := parseUint(s)
	switch {
	case !ok || u > 1<<63 || u == 1<<63 && !neg:
		return 0, false
	case neg:
		return int64(-u), true
	}
	return int64(u), true
}

// appendTime writes an instant as encoding/json writes a time.Time in UTC
// (RFC 3339 with the nanoseconds it has): the worker reads it into one.
func appendTime(b []byte, unixNano int64) []byte {
	secs, nanos := unixNano/1e9, unixNano%1e9
	if nanos < 0 {
		secs, nanos = secs-1, nanos+1e9
	}
	days, rem := secs/86400, secs%86400
	if rem < 0 {
		days, rem = days-1, rem+86400
	}
	year, month, day := civilDate(days)
	b = append(b, '"')
	b = appendPadded(b, year, 4)
	b = appendPadded(append(b, '-'), month, 2)
	b = appendPadded(append(b, '-'), day, 2)
	b = appendPadded(append(b, 'T'), rem/3600, 2)
	b = appendPadded(append(b, ':'), rem/60%60, 2)
	b = appendPadded(append(b, ':'), rem%60, 2)
	if nanos != 0 {
		digits := 9
		for nanos%10 == 0 {
			nanos /= 10
			digits--
		}
		b = appendPadded(append(b, '.'), nanos, digits)
	}
	return append(b, 'Z', '"')
}

// appendPadded writes n (not negative) in at least width digits.
func appendPadded(b []byte, n int64, width int) []byte {
	var buf [20]byte
	digits := appendUint(buf[:0], uint64(n))
	for i := len(digits); i < width; i++ {
		b = append(b, '0')
	}
	return append(b, digits...)
}

// civilDate is the proleptic Gregorian date of a day counted from 1970-01-01
// (Howard Hinnant's days_from_civil, inverted).
func civilDate(days int64) (year, month, day int64) {
	z := days + 719468
	era := z / 146097
	if z < 0 && z%146097 != 0 {
		era--
	}
	doe := z - era*146097
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365
	doy := doe - (365*yoe + yoe/4 - yoe/100)
	mp := (5*doy + 2) / 153
	day = doy - (153*mp+2)/5 + 1
	month = mp + 3
	if month > 12 {
		month -= 12
	}
	year = yoe + era*400
	if month <= 2 {
		year++
	}
	return year, month, day
}

// nullify points fd at /dev/null.
func nullify(fd int) {
	if devnull, err := open("/dev/null", syscall.O_RDWR, 0); err == nil {
		_ = dup(devnull, fd)
		syscall.Close(devnull)
	}
}
