/* daemon.c: the process around the daemon: its std streams, systemd's
 * notify socket, the RAMDIR lock. */
#include "tools/daemon_i.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

void daemon_stdio_reserve(void)
{
	/* Started by mount(8) or a supervisor with stdio closed, the first
	 * files opened would take fds 0-2: the RAMDIR lock among them, which
	 * fuse_daemonize() then replaces with /dev/null (the lock gone, a
	 * second daemon let in) and log lines would land in it. */
	for (;;) {
		int fd = open("/dev/null", O_RDWR | O_CLOEXEC);
		if (fd < 0 || fd > STDERR_FILENO) {
			if (fd >= 0)
				close(fd);
			break;
		}
		fcntl(fd, F_SETFD, 0);   /* a std stream is inherited like one */
	}
}

/* systemd's readiness protocol (sd_notify(3)), written here rather than
 * linked from libsystemd: it is one datagram of "KEY=VALUE" lines to the
 * unix socket named by $NOTIFY_SOCKET (a path, or '@' for the abstract
 * namespace), a stable interface systemd documents, and the binaries and
 * the container image then need no libsystemd. The address is read once,
 * before anything else could change the environment; unset: no-op. */
static struct sockaddr_un notify_addr;
static socklen_t notify_len;

void notify_init(void)
{
	const char *e = getenv("NOTIFY_SOCKET");
	size_t n;

	if (!e || (e[0] != '/' && e[0] != '@'))
		return;
	n = strlen(e);
	if (n < 2 || n >= sizeof(notify_addr.sun_path))
		return;
	notify_addr.sun_family = AF_UNIX;
	memcpy(notify_addr.sun_path, e, n);
	if (e[0] == '@')
		notify_addr.sun_path[0] = '\0';
	notify_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
}

/* Best effort: a manager that is gone must not stop the daemon. */
void notify_send(const char *msg)
{
	int fd;

	if (!notify_len)
		return;
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return;
	if (sendto(fd, msg, strlen(msg), MSG_NOSIGNAL, (const struct sockaddr *)&notify_addr,
		   notify_len) < 0)
		log_warn("main", "cannot notify systemd at %s: %s", getenv("NOTIFY_SOCKET"),
			 strerror(errno));
	close(fd);
}

#define LOCK_NAME "mtcfs.lock"

/* One daemon per RAMDIR: two would share the LMDB catalog and the shard
 * tree, each believing it owns them. An OFD lock on RAMDIR/mtcfs.lock is
 * held for the daemon's life; it belongs to the open file description, so
 * it survives fuse_daemonize()'s fork and goes away with the process
 * however it ends (kill -9 included). The file holds the holder's PID for
 * the refusal message (an OFD lock does not name its owner). Taken before
 * the mount so a refused daemon never shows a mount. *fd_out stays open
 * until exit. 0, -EBUSY (held: reported on stderr), other -errno. */
int ramdir_lock(const char *ramdir, int *fd_out)
{
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
	char path[PATH_MAX], buf[32] = "";
	ssize_t n;
	int fd, rc;

	*fd_out = -1;
	if (snprintf(path, sizeof(path), "%s/" LOCK_NAME, ramdir) >= (int)sizeof(path))
		return -ENAMETOOLONG;
	fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = -errno;
		fprintf(stderr, "mtcfs: cannot open %s: %s\n", path, strerror(-rc));
		return rc;
	}
	if (fcntl(fd, F_OFD_SETLK, &fl) == 0) {
		*fd_out = fd;
		return 0;
	}
	rc = -errno;
	if (rc != -EAGAIN && rc != -EACCES) {
		fprintf(stderr, "mtcfs: cannot lock %s: %s\n", path, strerror(-rc));
		close(fd);
		return rc;
	}
	n = pread(fd, buf, sizeof(buf) - 1, 0);
	close(fd);
	buf[n > 0 ? n : 0] = '\0';
	buf[strcspn(buf, "\n")] = '\0';
	if (buf[0])
		fprintf(stderr, "mtcfs: RAMDIR %s is in use by another mtcfs (pid %s, holding %s)\n",
			ramdir, buf, path);
	else
		fprintf(stderr, "mtcfs: RAMDIR %s is in use by another mtcfs that is starting "
			"(it holds %s)\n", ramdir, path);
	return -EBUSY;
}

/* After fuse_daemonize(): our PID is final now. */
void ramdir_lock_note_pid(int fd)
{
	char buf[32];
	int n = snprintf(buf, sizeof(buf), "%d\n", (int)getpid());

	if (ftruncate(fd, 0) < 0 || pwrite(fd, buf, (size_t)n, 0) != n)
		log_warn("main", "cannot write the PID into " LOCK_NAME ": %s", strerror(errno));
}

void ramdir_unlock(int fd)
{
	if (fd < 0)
		return;
	/* no stale PID for the next one to name; the lock goes with the fd */
	if (ftruncate(fd, 0) < 0) {
		/* harmless: the next daemon overwrites it */
	}
	close(fd);
}
