/* fs_ll_fd.c: the O_PATH descriptors of the inode table. The kernel may
 * remember any number of inodes (a 100k-file step keeps 100k in its cache
 * until memory pressure); one descriptor each made the daemon run out
 * (EMFILE at RLIMIT_NOFILE, the writer's creates failing with it). So at
 * most fs->fd_cap descriptors stay open, least recently used first out; an
 * evicted node keeps a file handle (name_to_handle_at, made at eviction) and
 * is reopened by it (open_by_handle_at, CAP_DAC_READ_SEARCH) at its next
 * operation. A handle names the inode, not a path: hard links, renames and
 * open files are unaffected. An inode with no name left (unlinked through
 * the mount while the kernel still knows it: an open file, a cwd) would be
 * freed by tmpfs once our descriptor closed, so such a node is pinned: its
 * descriptor stays until FORGET (bounded by what the kernel keeps alive).
 * So are the root and any node whose handle cannot be made (another file
 * system type under RAMDIR/ns). Without the capability (no root) nothing is
 * evicted, as before: logged once at start. */
#include "fs/fs_i.h"
#include "net/server.h"
#include "fs/fs_ll_i.h"
#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* The budget: 1/NSRV_FS_FD_SHARE of RLIMIT_NOFILE (soft, raised to the hard
 * one), within [64, 16384]; the rest is for the application's open files,
 * which hold one descriptor each, the network (rank 0: one connection per
 * node of the job), LMDB and the seal's walks (net/server.h). */
void fs_fd_init(struct fs *fs)
{
	uint64_t lim;
	char buf[sizeof(struct file_handle) + MAX_HANDLE_SZ];
	struct file_handle *fh = (struct file_handle *)(void *)buf;
	int mid, fd;
	size_t cap = 1024;

	pthread_mutex_init(&fs->fdmu, NULL);
	/* the soft limit up to the hard one (the peer server does the same
	 * later): 1024 by default, far below what a node allows */
	lim = util_nofile_raise(NULL);
	if (lim)
		cap = lim == UINT64_MAX ? 16384 : (size_t)(lim / NSRV_FS_FD_SHARE);
	if (cap < 64)
		cap = 64;
	if (cap > 16384)
		cap = 16384;
	fs->fd_cap = cap;
	fs->root.fd_pinned = true;
	/* Can we reopen by handle at all? Try it on the root. */
	fh->handle_bytes = MAX_HANDLE_SZ;
	fs->fd_mount = ram_ns_fd(fs->ram);
	if (name_to_handle_at(fs->root.fd, "", fh, &mid, AT_EMPTY_PATH) < 0) {
		log_warn("fuse", "one descriptor per inode the kernel remembers: RAMDIR gives no file "
			 "handles (%s)", strerror(errno));
		return;
	}
	fd = open_by_handle_at(fs->fd_mount, fh, O_PATH | O_CLOEXEC);
	if (fd < 0) {
		log_warn("fuse", "one descriptor per inode the kernel remembers: cannot open by "
			 "file handle (%s; needs CAP_DAC_READ_SEARCH)", strerror(errno));
		return;
	}
	close(fd);
	fs->fd_evict = true;
	log_dbg("fuse", "at most %zu inode descriptors open, the rest reopened by file handle", cap);
}

static void lru_unlink(struct fs *fs, struct fnode *n)
{
	if (n->lru_prev)
		n->lru_prev->lru_next = n->lru_next;
	else if (fs->lru_head == n)
		fs->lru_head = n->lru_next;
	else
		return;   /* not on the list */
	if (n->lru_next)
		n->lru_next->lru_prev = n->lru_prev;
	else
		fs->lru_tail = n->lru_prev;
	n->lru_prev = n->lru_next = NULL;
	fs->lru_n--;
}

static void lru_push(struct fs *fs, struct fnode *n)
{
	n->lru_prev = NULL;
	n->lru_next = fs->lru_head;
	if (fs->lru_head)
		fs->lru_head->lru_prev = n;
	else
		fs->lru_tail = n;
	fs->lru_head = n;
	fs->lru_n++;
}

/* Make n's handle from its open descriptor. fdmu held. 0 or -errno. */
static int make_handle(struct fnode *n)
{
	char buf[sizeof(struct file_handle) + MAX_HANDLE_SZ];
	struct file_handle *fh = (struct file_handle *)(void *)buf;
	int mid;

	fh->handle_bytes = MAX_HANDLE_SZ;
	if (name_to_handle_at(n->fd, "", fh, &mid, AT_EMPTY_PATH) < 0)
		return -errno;
	n->fh = malloc(sizeof(*fh) + fh->handle_bytes);
	if (!n->fh)
		return -ENOMEM;
	memcpy(n->fh, fh, sizeof(*fh) + fh->handle_bytes);
	return 0;
}

/* Close the least recently used idle descriptors over the budget. fdmu
 * held (close of an O_PATH descriptor is O(1)). */
static void evict(struct fs *fs)
{
	struct fnode *n = fs->lru_tail;

	while (fs->lru_n > fs->fd_cap && n) {
		struct fnode *prev = n->lru_prev;
		if (n->fd_users == 0) {
			lru_unlink(fs, n);
			if (!n->fh && make_handle(n) < 0) {
				n->fd_pinned = true;   /* keep it: it could not be found again */
			} else {
				close(n->fd);
				n->fd = -1;
			}
		}
		n = prev;
	}
}

void fs_node_fd_adopt(struct fs *fs, struct fnode *n, int fd)
{
	pthread_mutex_lock(&fs->fdmu);
	n->fd = fd;
	if (!fs->fd_evict || n->dev != fs->root.dev) {
		n->fd_pinned = true;   /* one handle decoder: the RAMDIR file system */
	} else {
		lru_push(fs, n);
		evict(fs);
	}
	pthread_mutex_unlock(&fs->fdmu);
}

int fs_nfd(struct fs *fs, struct fnode *n)
{
	int fd;

	pthread_mutex_lock(&fs->fdmu);
	if (n->fd >= 0) {
		n->fd_users++;
		if (!n->fd_pinned && fs->lru_head != n) {
			lru_unlink(fs, n);
			lru_push(fs, n);
		}
		fd = n->fd;
		pthread_mutex_unlock(&fs->fdmu);
		return fd;
	}
	pthread_mutex_unlock(&fs->fdmu);
	/* Reopen outside the lock; a racing thread may do the same. */
	fd = open_by_handle_at(fs->fd_mount, n->fh, O_PATH | O_CLOEXEC);
	if (fd < 0)
		return -errno;   /* ESTALE: the inode is gone */
	pthread_mutex_lock(&fs->fdmu);
	if (n->fd >= 0) {
		int mine = fd;
		fd = n->fd;
		n->fd_users++;
		pthread_mutex_unlock(&fs->fdmu);
		close(mine);
		return fd;
	}
	n->fd = fd;
	n->fd_users++;
	lru_push(fs, n);
	evict(fs);
	pthread_mutex_unlock(&fs->fdmu);
	return fd;
}

void fs_nfd_put(struct fs *fs, struct fnode *n)
{
	pthread_mutex_lock(&fs->fdmu);
	n->fd_users--;
	pthread_mutex_unlock(&fs->fdmu);
}

int fs_nfd2(struct fs *fs, struct fnode *a, struct fnode *b, int *fa, int *fb)
{
	*fa = fs_nfd(fs, a);
	if (*fa < 0)
		return *fa;
	*fb = fs_nfd(fs, b);
	if (*fb < 0) {
		fs_nfd_put(fs, a);
		return *fb;
	}
	return 0;
}

bool fs_nfd_pin(struct fs *fs, struct fnode *n)
{
	bool was = true;

	pthread_mutex_lock(&fs->fdmu);
	if (!n->fd_pinned && n->fd >= 0) {
		lru_unlink(fs, n);
		n->fd_pinned = true;
		was = false;
	}
	pthread_mutex_unlock(&fs->fdmu);
	return !was;
}

void fs_nfd_unpin(struct fs *fs, struct fnode *n)
{
	pthread_mutex_lock(&fs->fdmu);
	if (n->fd_pinned && n != &fs->root && fs->fd_evict && n->dev == fs->root.dev &&
	    n->fd >= 0) {
		n->fd_pinned = false;
		lru_push(fs, n);
		evict(fs);
	}
	pthread_mutex_unlock(&fs->fdmu);
}

void fs_node_fd_drop(struct fs *fs, struct fnode *n)
{
	pthread_mutex_lock(&fs->fdmu);
	if (!n->fd_pinned)
		lru_unlink(fs, n);
	pthread_mutex_unlock(&fs->fdmu);
	if (n->fd >= 0)
		close(n->fd);
	n->fd = -1;
	free(n->fh);
	n->fh = NULL;
}
