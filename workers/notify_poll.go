//go:build darwin || (linux && bgtask_portable)

package workers

import (
	"log/slog"

	"golang.org/x/sys/unix"
)

// Without inotify (macOS has none; on Linux the tag bgtask_portable selects this
// file) a notifier watches no file: every waiter polls every unwatchedPoll. A
// process's end still comes from the kernel (procEnds).
const (
	recordMask  = 0
	growthMask  = 0
	oneshotMask = 0
)

// newNotifier returns a notifier whose waiters poll.
func newNotifier(log *slog.Logger) *notifier {
	log.Debug("no inotify: run directories are polled every " + unwatchedPoll.String())
	return &notifier{log: log, safety: safetyPoll, unwatched: unwatchedPoll, fd: -1, closed: true, watches: map[int32]*kernelWatch{}}
}

// addWatch is never reached: the notifier is closed from the start.
func addWatch(fd int, path string, mask uint32) (int, error) { return -1, unix.ENOTSUP }

func removeWatch(fd int, wd int32) {}
