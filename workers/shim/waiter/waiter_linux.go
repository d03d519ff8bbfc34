//go:build linux && cgo && !bgtask_portable

package waiter

/*
#define _GNU_SOURCE // fallocate's flags, F_NOTIFY
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

// The waiter a shim becomes while its command runs long (see hibernate): it runs
// from the binary's constructor, before the Go runtime starts, and never returns
// to it. It reaps the shim's children, keeps the output files within their bound
// (bound.go in package shim), and when the command ends, its deadline passes or
// its output stalls, it execs the shim's Go side again with what it saw.

static int64_t clock_ns(clockid_t id) {
	struct timespec ts;
	clock_gettime(id, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int flag_value(const char *arg, const char *name, const char **value) {
	size_t n = strlen(name);
	if (strncmp(arg, name, n) != 0 || arg[n] != '=') return 0;
	*value = arg + n + 1;
	return 1;
}

// file_size is the size of the file name in the directory dir, 0 if there is none.
static int64_t file_size(int dir, const char *name) {
	struct stat st;
	if (fstatat(dir, name, &st, 0) != 0) return 0;
	return st.st_size;
}

// The waiter's watch of the output files' bound. No static variable holds it:
// the first write to one would make a page of the binary the waiter's own.
struct bound {
	int64_t keep;         // --output-keep-bytes; 0: the files are not bounded
	int polled;           // no dnotify (fs.dir-notify-enable is off): the files are polled
	int armed;            // the next write to a file in the run directory raises SIGIO
	int64_t looked, size; // the last look: when, and the files' size then
};

// The pace of the looks at the output's bound, as paceLooks in bound.go has it
// (boundGather, boundPoll).
static const int64_t bound_gather = 1000000, bound_poll = 20000000;

static int64_t pace_looks(int64_t grown, int64_t elapsed, int64_t keep) {
	if (grown <= 0) return bound_poll;
	int64_t pace = (elapsed < bound_poll ? elapsed : bound_poll) * (keep / 8) / grown;
	return pace < bound_gather ? bound_gather : pace > bound_poll ? bound_poll : pace;
}

// bound_file frees the start of the file name in the directory dir past its last
// keep bytes, as boundFile in bound.go does. It returns 0 where the file system
// cannot.
static int bound_file(int dir, const char *name, int64_t keep) {
	struct stat st;
	if (fstatat(dir, name, &st, 0) != 0 || (int64_t)st.st_blocks * 512 <= keep + keep / 8) return 1;
	int64_t block = st.st_blksize > 4096 ? st.st_blksize : 4096;
	int64_t upTo = (st.st_size - keep) / block * block;
	if (upTo <= 0) return 1;
	int fd = openat(dir, name, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0) return 1;
	int ok = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, upTo) == 0 || (errno != EOPNOTSUPP && errno != ENOSYS);
	close(fd);
	return ok;
}

// wake execs the shim's Go side, argv with its flag at argv[at] made "--woken"
// and what the waiter saw added; later flags win there.
static void wake(int argc, char **argv, int at, const char *status, int64_t size, int64_t since, int dir) {
	char **next = calloc(argc + 4, sizeof *next);
	char sizeArg[64], sinceArg[64];
	if (next == NULL) _exit(125);
	memcpy(next, argv, argc * sizeof *next);
	next[at] = "--woken";
	snprintf(sizeArg, sizeof sizeArg, "--stall-size=%lld", (long long)size);
	snprintf(sinceArg, sizeof sinceArg, "--stall-since-ns=%lld", (long long)since);
	int n = argc;
	next[n++] = sizeArg;
	next[n++] = sinceArg;
	if (status != NULL) next[n++] = (char *)status;
	next[n] = NULL;
	// The Go side watches no writes: a SIGIO pending or to come is ignored, not
	// the default's end of the process.
	signal(SIGIO, SIG_IGN);
	fcntl(dir, F_NOTIFY, 0);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	// The binary is the one running, replaced on disk or not; an exec that still
	// fails leaves the command's end unrecorded, as a shim that crashed does.
	for (int tries = 0; tries < 50; tries++) {
		execv("/proc/self/exe", next);
		if (errno != EAGAIN && errno != ENOMEM && errno != ETXTBSY) break;
		struct timespec pause = {0, 100000000};
		nanosleep(&pause, NULL);
	}
	_exit(126);
}

// bound_output looks at the output files in the run directory dir for their
// bound, if a look is due, after it watches for the next write: a write after the
// look is never missed. It lowers *wait to when the next look is due, where no
// write will wake the waiter for it.
static void bound_output(int dir, struct bound *b, int64_t *wait) {
	int64_t now = clock_ns(CLOCK_MONOTONIC), size = file_size(dir, "stdout") + file_size(dir, "stderr");
	int64_t due = b->looked + pace_looks(size - b->size, now - b->looked, b->keep);
	if (now < due) {
		if (*wait < 0 || due - now < *wait) *wait = due - now;
		return;
	}
	if (!b->polled && fcntl(dir, F_NOTIFY, DN_MODIFY) != 0) b->polled = 1;
	b->armed = !b->polled;
	if (!bound_file(dir, "stdout", b->keep) || !bound_file(dir, "stderr", b->keep)) {
		fcntl(dir, F_NOTIFY, 0);
		b->keep = b->armed = 0;
		return;
	}
	b->looked = now, b->size = size;
	if (!b->armed && (*wait < 0 || bound_poll < *wait)) *wait = bound_poll;
}

static void hibernate(int argc, char **argv, int at) {
	int64_t pid = 0, deadline = 0, stallAfter = 0, size = 0, since = clock_ns(CLOCK_MONOTONIC);
	int dir = -1; // the run directory, the start lock
	struct bound bound = {0};
	const char *v;
	for (int i = at + 1; i < argc; i++) {
		if (flag_value(argv[i], "--pid", &v)) pid = strtoll(v, NULL, 10);
		else if (flag_value(argv[i], "--deadline-unix-ns", &v)) deadline = strtoll(v, NULL, 10);
		else if (flag_value(argv[i], "--stall-after-ns", &v)) stallAfter = strtoll(v, NULL, 10);
		else if (flag_value(argv[i], "--stall-size", &v)) size = strtoll(v, NULL, 10);
		else if (flag_value(argv[i], "--stall-since-ns", &v)) since = strtoll(v, NULL, 10);
		else if (flag_value(argv[i], "--lock-fd", &v)) dir = (int)strtol(v, NULL, 10);
		else if (flag_value(argv[i], "--output-keep-bytes", &v)) bound.keep = strtoll(v, NULL, 10);
	}
	if (pid <= 0 || dir < 0) return; // not a shim's: the Go side says so
	// The command's end is awaited as SIGCHLD, and writes to its output as SIGIO,
	// both blocked so that none is missed between a look and the wait.
	signal(SIGCHLD, SIG_DFL);
	sigset_t wanted;
	sigemptyset(&wanted);
	sigaddset(&wanted, SIGCHLD);
	sigaddset(&wanted, SIGIO);
	sigprocmask(SIG_SETMASK, &wanted, NULL);
	int64_t check = stallAfter > 0 ? (stallAfter / 10 > 50000000 ? stallAfter / 10 : 50000000) : -1;
	for (;;) {
		int status;
		pid_t got;
		while ((got = waitpid(-1, &status, WNOHANG)) > 0) {
			if (got == pid) {
				char statusArg[32];
				snprintf(statusArg, sizeof statusArg, "--status=%d", status);
				wake(argc, argv, at, statusArg, size, since, dir);
			}
		}
		if (got < 0 && errno == ECHILD) wake(argc, argv, at, NULL, size, since, dir); // the Go side's reap sees it
		int64_t wait = -1;
		if (deadline != 0) {
			wait = deadline - clock_ns(CLOCK_REALTIME);
			if (wait <= 0) wake(argc, argv, at, NULL, size, since, dir);
		}
		if (check > 0) {
			int64_t now = clock_ns(CLOCK_MONOTONIC), seen = file_size(dir, "stdout") + file_size(dir, "stderr");
			if (seen != size) size = seen, since = now;
			else if (now - since >= stallAfter) wake(argc, argv, at, NULL, size, since, dir);
			if (wait < 0 || check < wait) wait = check;
		}
		if (bound.keep > 0 && !bound.armed) bound_output(dir, &bound, &wait);
		struct timespec ts = {wait / 1000000000, wait % 1000000000};
		if (sigtimedwait(&wanted, NULL, wait < 0 ? NULL : &ts) == SIGIO) bound.armed = 0;
	}
}

// begin runs the waiter if the shim is exec'd as one (--hibernated), and names a
// shim exec'd by one (--woken) as it was named.
static void begin(int argc, char **argv) {
	int at = argc > 2 && strcmp(argv[1], "shim") == 0 ? 2 : 1;
	if (argc <= at || (strcmp(argv[at], "--hibernated") != 0 && strcmp(argv[at], "--woken") != 0)) return;
	// Exec'd as /proc/self/exe, the process would be named "exe".
	const char *name = strrchr(argv[0], '/');
	prctl(PR_SET_NAME, name != NULL ? name + 1 : argv[0], 0, 0, 0);
	if (strcmp(argv[at], "--hibernated") == 0) hibernate(argc, argv, at);
}

#ifdef __GLIBC__
// glibc passes a constructor the program's arguments.
__attribute__((constructor)) static void bgtask_shim_constructor(int argc, char **argv, char **envp) {
	(void)envp;
	begin(argc, argv);
}
#else
// Other C libraries (musl) pass a constructor none: they are read from the
// kernel, into static memory (a waiter holds a few pages, and starts no malloc).
// Longer than a shim's ever are, they are not its.
__attribute__((constructor)) static void bgtask_shim_constructor(void) {
	static char buf[65536];
	static char *argv[256];
	int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
	if (fd < 0) return; // a hibernated shim's Go side then says it is not one
	size_t len = 0;
	for (;;) {
		ssize_t n = read(fd, buf + len, sizeof buf - 1 - len);
		if (n < 0 && errno == EINTR) continue;
		if (n <= 0) break;
		len += n;
	}
	close(fd);
	if (len == 0 || len == sizeof buf - 1) return;
	buf[len] = '\0'; // the last argument's end, where the kernel cut a long one
	int argc = 0;
	for (size_t i = 0; i < len; i += strlen(buf + i) + 1) {
		if (argc == (int)(sizeof argv / sizeof *argv) - 1) return;
		argv[argc++] = buf + i;
	}
	argv[argc] = NULL;
	begin(argc, argv);
}
#endif
*/
import "C"

import "github.com/bgtask/bgtask/workers/shim"

func init() { shim.EnableHibernation() }
