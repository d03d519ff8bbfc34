//go:build linux && !bgtask_portable

package workers

import (
	"bytes"
	"encoding/binary"
	"errors"
	"log/slog"
	"os"

	"golang.org/x/sys/unix"
)

const (
	// recordMask: the shim's records (exit.json, pid.json) land whole in the run
	// directory by rename.
	recordMask = unix.IN_MOVED_TO | unix.IN_ONLYDIR
	// growthMask: output files grow by writes, and every write raises the event. A
	// watch that lives for one event, armed again before each look, costs a chatty
	// command and its worker one event per look rather than one per write.
	growthMask = unix.IN_MODIFY | unix.IN_ONESHOT
)

// oneshotMask marks a watch that the kernel removes with its first event.
const oneshotMask = unix.IN_ONESHOT

// newNotifier returns a notifier; without inotify, its waiters poll.
func newNotifier(log *slog.Logger) *notifier {
	n := &notifier{log: log, safety: safetyPoll, unwatched: unwatchedPoll, fd: -1, watches: map[int32]*kernelWatch{}}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		log.Warn("no inotify: run directories are polled every "+unwatchedPoll.String(), "err", err)
		n.closed = true
		return n
	}
	n.fd, n.file = fd, os.NewFile(uintptr(fd), "inotify")
	n.read.Go(n.readEvents)
	return n
}

func (n *notifier) readEvents() {
	buf := make([]byte, 64<<10) // room for many events; one needs at most 16+256 bytes
	for {
		k, err := n.file.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				n.log.Warn("inotify failed: run directories are polled every "+unwatchedPoll.String(), "err", err)
				n.shutdown()
			}
			return
		}
		n.dispatch(buf[:k])
	}
}

// dispatch calls the looks of the waiters of the events in buf, each a struct inotify_event:
// wd, mask, cookie and len, then len bytes of NUL-padded file name.
func (n *notifier) dispatch(buf []byte) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for len(buf) >= unix.SizeofInotifyEvent {
		wd := int32(binary.NativeEndian.Uint32(buf[0:]))
		mask := binary.NativeEndian.Uint32(buf[4:])
		end := unix.SizeofInotifyEvent + int(binary.NativeEndian.Uint32(buf[12:]))
		if end > len(buf) {
			return
		}
		name := bytes.TrimRight(buf[unix.SizeofInotifyEvent:end], "\x00")
		buf = buf[end:]
		x := n.watches[wd]
		switch {
		case mask&unix.IN_Q_OVERFLOW != 0:
			for _, x := range n.watches {
				for w := range x.waiters {
					w.look()
				}
			}
		case x == nil:
			// Queued before its watch was removed.
		case mask&unix.IN_IGNORED != 0:
			n.forget(x, true) // the file is gone, and the kernel removed its watch
		default:
			for w := range x.waiters {
				if w.wants(name) {
					w.look()
				}
			}
			if x.oneshot {
				n.forget(x, false) // the kernel removed it with this event
			}
		}
	}
}

func addWatch(fd int, path string, mask uint32) (int, error) {
	return unix.InotifyAddWatch(fd, path, mask)
}

func removeWatch(fd int, wd int32) { _, _ = unix.InotifyRmWatch(fd, uint32(wd)) }

// wants reports whether an event on a file named name (empty for the watched
// file itself) is one the waiter waits for.
func (w *waiter) wants(name []byte) bool {
	if w.path != "" {
		return true
	}
	for _, want := range w.names {
		if string(name) == want {
			return true
		}
	}
	return false
}
