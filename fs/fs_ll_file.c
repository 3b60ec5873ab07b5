/* fs_ll_file.c: the FUSE operations on open files: setattr, create, open
 * (passthrough), release (commit of the marker), read, write, fsync,
 * fallocate, lseek, and the capacity account of writes (see fs_ll_i.h). */
#include "fs/fs_i.h"
#include "fs/fs_ll_i.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

/* Measure the node's allocation after a change and correct the account. */
static void account_after(struct fs *fs, struct fnode *n, int fd, uint64_t reserved)
{
	struct stat st;
	int64_t delta = -(int64_t)reserved;

	pthread_mutex_lock(&n->amu);
	if (fstat(fd, &st) == 0) {
		delta += ((int64_t)st.st_blocks - (int64_t)n->blocks) * 512;
		n->blocks = (uint64_t)st.st_blocks;
		n->size = (uint64_t)st.st_size;
	}
	pthread_mutex_unlock(&n->amu);
	if (delta)
		ram_adjust(fs->ram, delta);
}

/* Bytes a write of len at off may add: 0 when it lands inside an existing,
 * fully allocated file. */
static uint64_t write_growth(struct fnode *n, uint64_t off, uint64_t len)
{
	uint64_t g;
	pthread_mutex_lock(&n->amu);
	if (off + len <= n->size && n->blocks * 512 >= n->size)
		g = 0;
	else
		g = len + 4096;
	pthread_mutex_unlock(&n->amu);
	return g;
}

/* The kernel leaves clearing set-id bits on write and truncate to us
 * (FUSE_CAP_HANDLE_KILLPRIV, and direct_io writes never clear them): as a
 * local filesystem does for a caller without CAP_FSETID, taken here to be
 * every uid but root's. fd is open on the file, any access mode. */
static bool wants_kill_priv(fuse_req_t req, int fd)
{
	struct stat st;
	if (fuse_req_ctx(req)->uid == 0 || fstat(fd, &st) < 0)
		return false;
	return (st.st_mode & S_ISUID) || (st.st_mode & (S_ISGID | S_IXGRP)) == (S_ISGID | S_IXGRP);
}

static void kill_priv(int fd)
{
	struct stat st;
	if (fstat(fd, &st) == 0 && (st.st_mode & (S_ISUID | S_ISGID)))
		fchmod(fd, st.st_mode & ~(S_ISUID | ((st.st_mode & S_IXGRP) ? S_ISGID : 0)) & 07777);
}

void ll_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int valid,
		struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fnode *n = fs_node_of(fs, ino);
	char pp[64];
	int rc = 0, fd = fi ? ((struct fhandle *)(uintptr_t)fi->fh)->fd : -1, nfd = -1;

	atomic_fetch_add(&n->inflight, 1);
	if (fs_is_frozen(n)) {
		rc = EROFS;
		goto out;
	}
	nfd = fs_nfd(fs, n);
	if (nfd < 0) {
		rc = -nfd;
		goto out;
	}
	fs_proc_path(nfd, pp, sizeof(pp));
	if (valid & FUSE_SET_ATTR_MODE) {
		if ((fd >= 0 ? fchmod(fd, attr->st_mode) :
		     fchmodat(fs->proc_self_fd, pp, attr->st_mode, 0)) < 0) {
			rc = errno;
			goto out;
		}
	}
	/* chown(f, -1, -1) reaches us as a SETATTR with no attribute bit
	 * (the kernel sends ctime only with a write-back cache); a local
	 * filesystem still stamps ctime for it, so let tmpfs do that. */
	if ((valid & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)) ||
	    !(valid & (FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_SIZE | FUSE_SET_ATTR_ATIME |
		       FUSE_SET_ATTR_MTIME))) {
		uid_t u = (valid & FUSE_SET_ATTR_UID) ? attr->st_uid : (uid_t)-1;
		gid_t g = (valid & FUSE_SET_ATTR_GID) ? attr->st_gid : (gid_t)-1;
		if (fchownat(nfd, "", u, g, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0) {
			rc = errno;
			goto out;
		}
	}
	if (valid & FUSE_SET_ATTR_SIZE) {
		int tfd = fd >= 0 ? fd : openat(fs->proc_self_fd, pp, O_WRONLY | O_CLOEXEC);
		if (tfd < 0) {
			rc = errno;
			goto out;
		}
		if (ftruncate(tfd, attr->st_size) < 0)
			rc = errno;
		else if (!(valid & FUSE_SET_ATTR_MODE) && wants_kill_priv(req, tfd))
			kill_priv(tfd);
		account_after(fs, n, tfd, 0);
		if (fd < 0)
			close(tfd);
		if (rc)
			goto out;
	}
	if (valid & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME)) {
		struct timespec tv[2];
		tv[0].tv_sec = 0;
		tv[1].tv_sec = 0;
		tv[0].tv_nsec = UTIME_OMIT;
		tv[1].tv_nsec = UTIME_OMIT;
		if (valid & FUSE_SET_ATTR_ATIME_NOW)
			tv[0].tv_nsec = UTIME_NOW;
		else if (valid & FUSE_SET_ATTR_ATIME)
			tv[0] = attr->st_atim;
		if (valid & FUSE_SET_ATTR_MTIME_NOW)
			tv[1].tv_nsec = UTIME_NOW;
		else if (valid & FUSE_SET_ATTR_MTIME)
			tv[1] = attr->st_mtim;
		if (fd >= 0 ? futimens(fd, tv) < 0 :
		    utimensat(fs->proc_self_fd, pp, tv, 0) < 0) {
			rc = errno;
			goto out;
		}
	}
out:
	if (nfd >= 0)
		fs_nfd_put(fs, n);
	atomic_fetch_sub(&n->inflight, 1);
	if (rc) {
		fuse_reply_err(req, rc);
		return;
	}
	ll_getattr(req, ino, fi);
}

static int open_flags_ok(struct fnode *n, int flags)
{
	if (fs_is_frozen(n) && ((flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC)))
		return -EROFS;
	return 0;
}

void fs_fill_fi(struct fuse_file_info *fi, struct fhandle *h, struct fnode *n, int flags)
{
	fi->fh = (uintptr_t)h;
	if ((flags & O_ACCMODE) == O_WRONLY) {
		/* Write-only opens (torch.save, TensorStore, tofile) bypass the
		 * page cache: large writes go to RAMDIR in one request each. */
		fi->direct_io = 1;
	} else if ((flags & O_ACCMODE) == O_RDWR) {
		h->cached = true;
		/* Read-write opens must allow MAP_SHARED writable mappings
		 * (np.memmap r+/w+). With FUSE_CAP_DIRECT_IO_ALLOW_MMAP they
		 * are direct I/O like write-only opens (large write()s 1.8x
		 * faster: 0.86 -> 1.58 GiB/s): the kernel writes a mapping's
		 * dirty pages back before each direct read or write of the
		 * range and drops the cached range after a direct write, so
		 * read(), write() and the mapping agree. Without it they keep
		 * the page cache. Either way (no writeback cache) write()
		 * reaches RAMDIR before it returns, and the kernel writes a
		 * mapping's dirty pages back on close (flush) and when it is
		 * unmapped, before the release: a step renamed after that
		 * holds them. */
		fi->direct_io = g_fs->dio_mmap;
		fi->keep_cache = 0;
	} else {
		fi->keep_cache = fs_is_frozen(n) ? 1 : 0;
	}
}

/* Count h by kind and choose how its reads go. A read-only open of a
 * frozen regular file (a committed or restored step, the store view) gets a
 * backing file: the kernel then reads and maps RAMDIR's tmpfs pages itself
 * and the daemon never sees its READs. Its bytes never change again, so
 * nothing is lost by the daemon not looking. Writes are never passed
 * through: EROFS after commit (also for writers still open at the rename)
 * and the ram_size account need the daemon to see each one.
 * The kernel insists that an inode's opens are all passthrough (one backing
 * file) or all not: a frozen file that still has handles from before its
 * commit keeps going through the daemon until they close, and a file with
 * passthrough opens (frozen, so every open of it is read-only) passes every
 * later open through. */
void fs_handle_attach(fuse_req_t req, struct fs *fs, struct fhandle *h,
		      struct fuse_file_info *fi)
{
	struct fnode *n = h->node;
#if MTCFS_PASSTHROUGH
	/* before amu: is_frozen may take fs->mu, which comes first */
	bool frozen = fs->passthrough && !h->writable && fs_is_frozen(n);
#endif

	pthread_mutex_lock(&n->amu);
#if MTCFS_PASSTHROUGH
	if (fs->passthrough && !h->writable && !(fi->flags & O_TRUNC) &&
	    (n->pt_open > 0 || (n->np_open == 0 && frozen))) {
		/* an id left by an open whose reply failed is for the same inode */
		if (n->pt_id <= 0)
			n->pt_id = fuse_passthrough_open(req, h->fd);
		if (n->pt_id > 0) {
			n->pt_open++;
			h->pt = true;
			fi->backing_id = n->pt_id;
			/* the FUSE inode has no pages of its own to keep */
			fi->keep_cache = 0;
		} else {
			n->pt_id = 0;
			log_dbg("fuse", "passthrough refused for ino %llu: reads via the daemon",
				(unsigned long long)n->ino);
		}
	}
#else
	(void)req;
	(void)fs;
	(void)fi;
#endif
	if (!h->pt)
		n->np_open++;
	pthread_mutex_unlock(&n->amu);
}

/* The handle is gone. With req (its release), the node's backing id is
 * closed with its last passthrough handle; without (an open whose reply
 * failed), it stays for the node's next passthrough open. */
static void handle_detach(fuse_req_t req, struct fhandle *h)
{
	struct fnode *n = h->node;

	pthread_mutex_lock(&n->amu);
	if (!h->pt) {
		n->np_open--;
	} else if (--n->pt_open == 0 && req) {
#if MTCFS_PASSTHROUGH
		fuse_passthrough_close(req, n->pt_id);
#endif
		n->pt_id = 0;
	}
	pthread_mutex_unlock(&n->amu);
}

static struct fhandle *new_handle(struct fs *fs, int fd, struct fnode *n, int flags)
{
	struct fhandle *h = calloc(1, sizeof(*h));
	if (!h)
		return NULL;
	h->fd = fd;
	h->node = n;
	h->writable = (flags & O_ACCMODE) != O_RDONLY;
	if (h->writable)
		atomic_fetch_add(&n->writers, 1);
	pthread_mutex_lock(&fs->hmu);
	h->next = fs->handles;
	if (h->next)
		h->next->prev = h;
	fs->handles = h;
	pthread_mutex_unlock(&fs->hmu);
	return h;
}

/* Closes the handle's file and frees it (its node's counters are the
 * caller's business). */
void fs_free_handle(struct fs *fs, struct fhandle *h)
{
	pthread_mutex_lock(&fs->hmu);
	if (h->prev)
		h->prev->next = h->next;
	else
		fs->handles = h->next;
	if (h->next)
		h->next->prev = h->prev;
	pthread_mutex_unlock(&fs->hmu);
	close(h->fd);
	free(h);
}

/* Race injection for the tests: MTCFS_TEST_CREATE_PAUSE=SUFFIX:MS makes the
 * create of a name ending in SUFFIX wait MS milliseconds once the file
 * exists in RAMDIR, before its handle counts as a writer (test_pytorch_mode:
 * another worker's close in that window must not commit the file). */
static struct {
	pthread_once_t once;
	char suffix[64];
	size_t len;
	uint64_t ms;               /* 0: no pause (the variable is unset or bad) */
} pause_cfg = { .once = PTHREAD_ONCE_INIT };

/* Read once, not on every create (a FUSE request thread's path). */
static void pause_cfg_load(void)
{
	const char *v = getenv("MTCFS_TEST_CREATE_PAUSE"), *colon;

	if (!v || !(colon = strrchr(v, ':')) || (size_t)(colon - v) >= sizeof(pause_cfg.suffix) ||
	    util_parse_u64(colon + 1, 60000, &pause_cfg.ms) < 0) {
		pause_cfg.ms = 0;
		return;
	}
	pause_cfg.len = (size_t)(colon - v);
	memcpy(pause_cfg.suffix, v, pause_cfg.len);
}

static void test_pause_create(const char *name)
{
	size_t nl = strlen(name);

	pthread_once(&pause_cfg.once, pause_cfg_load);
	if (!pause_cfg.ms || pause_cfg.len > nl ||
	    memcmp(name + nl - pause_cfg.len, pause_cfg.suffix, pause_cfg.len))
		return;
	struct timespec ts = { (time_t)(pause_cfg.ms / 1000), (long)(pause_cfg.ms % 1000) * 1000000L };
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

void ll_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
	       struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fnode *dir = fs_node_of(fs, parent);
	struct fuse_entry_param e;
	struct fhandle *h;
	bool created = false;
	int fd, rc, dfd;

	pthread_rwlock_rdlock(&fs->open_lk);
	rc = fs_may_create(fs, dir, name);
	if (rc < 0)
		goto fail;
	dfd = fs_nfd(fs, dir);
	if (dfd < 0) {
		rc = dfd;
		goto fail;
	}
	/* Only an entry made here is given to the caller: try an exclusive
	 * create, and open what another process made meanwhile (unless the
	 * caller asked for O_EXCL itself). */
	for (int attempt = 0;; attempt++) {
		fd = openat(dfd, name, (fi->flags | O_CREAT | O_EXCL | O_CLOEXEC) & ~O_NOFOLLOW,
			    mode);
		if (fd >= 0) {
			created = true;
			break;
		}
		if (errno != EEXIST || (fi->flags & O_EXCL) || attempt == 8)
			break;
		fd = openat(dfd, name, (fi->flags | O_CLOEXEC) & ~(O_NOFOLLOW | O_CREAT));
		if (fd >= 0 || errno != ENOENT)
			break;
	}
	rc = fd < 0 ? -errno : 0;
	fs_nfd_put(fs, dir);
	if (fd < 0)
		goto fail;
	if (created)
		test_pause_create(name);
	rc = fs_do_lookup(fs, dir, name, &e);
	if (rc == 0 && created) {
		rc = fs_own_new(fs, req, dir, name, fs_node_of(fs, e.ino), &e.attr);
		if (rc < 0)
			fs_node_unref(fs, fs_node_of(fs, e.ino), 1);
	}
	if (rc < 0) {
		close(fd);
		goto fail;
	}
	h = new_handle(fs, fd, fs_node_of(fs, e.ino), fi->flags);
	if (!h) {
		close(fd);
		fs_node_unref(fs, fs_node_of(fs, e.ino), 1);
		rc = -ENOMEM;
		goto fail;
	}
	pthread_rwlock_unlock(&fs->open_lk);   /* it counts as a writer now */
	if (h->writable && wants_kill_priv(req, fd))
		atomic_store(&h->kill_priv, true);   /* created set-id: its first write clears it */
	fs_fill_fi(fi, h, h->node, fi->flags);
	fs_handle_attach(req, fs, h, fi);
	if (fuse_reply_create(req, &e, fi) == -ENOENT) {
		handle_detach(NULL, h);
		if (h->writable)
			atomic_fetch_sub(&h->node->writers, 1);
		fs_free_handle(fs, h);
		fs_node_unref(fs, fs_node_of(fs, e.ino), 1);
	}
	return;
fail:
	pthread_rwlock_unlock(&fs->open_lk);
	fuse_reply_err(req, -rc);
}

void ll_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fnode *n = fs_node_of(fs, ino);
	struct fhandle *h;
	char pp[64];
	bool wr = (fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC);
	int fd, rc;

	if (wr)   /* from the frozen check until it counts as a writer */
		pthread_rwlock_rdlock(&fs->open_lk);
	rc = open_flags_ok(n, fi->flags);
	if (rc < 0)
		goto fail;
	fd = fs_nfd(fs, n);
	if (fd < 0) {
		rc = fd;
		goto fail;
	}
	fs_proc_path(fd, pp, sizeof(pp));
	fd = openat(fs->proc_self_fd, pp, (fi->flags | O_CLOEXEC) & ~O_NOFOLLOW);
	rc = fd < 0 ? -errno : 0;
	fs_nfd_put(fs, n);
	if (fd < 0)
		goto fail;
	if (fi->flags & O_TRUNC)
		account_after(fs, n, fd, 0);
	h = new_handle(fs, fd, n, fi->flags);
	if (!h) {
		close(fd);
		rc = -ENOMEM;
		goto fail;
	}
	if (wr)
		pthread_rwlock_unlock(&fs->open_lk);
	if (h->writable && wants_kill_priv(req, fd))
		atomic_store(&h->kill_priv, true);
	fs_fill_fi(fi, h, n, fi->flags);
	fs_handle_attach(req, fs, h, fi);
	if (fuse_reply_open(req, fi) == -ENOENT) {
		handle_detach(NULL, h);
		if (h->writable)
			atomic_fetch_sub(&n->writers, 1);
		fs_free_handle(fs, h);
	}
	return;
fail:
	if (wr)
		pthread_rwlock_unlock(&fs->open_lk);
	fuse_reply_err(req, -rc);
}

void ll_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fhandle *h = (struct fhandle *)(uintptr_t)fi->fh;
	struct fnode *n = h->node;
	uint64_t mstep;
	ino_t mdir;
	bool writable = h->writable, cached = h->cached, yaml = false, frozen = fs_is_frozen(n), top;

	pthread_mutex_lock(&fs->mu);   /* a rename may update them concurrently */
	mstep = n->marker_step;
	mdir = n->marker_dir_ino;
	top = writable && n != &fs->root && !n->parent;
	pthread_mutex_unlock(&fs->mu);

	/* Everything about the node is read before the reply: after it the
	 * kernel may forget the node on another thread. */
	if (writable)
		yaml = atomic_fetch_sub(&n->writers, 1) == 1 && (atomic_load(&n->flags) & FN_YAML);
	handle_detach(req, h);
	fs_free_handle(fs, h);
	fuse_reply_err(req, 0);
	if (cached)
		fs_forget_pages(fs, ino);
	if (yaml)
		ctl_notify(fs);
	/* Closing a written commit_success.txt in a top-level digits directory
	 * created in place commits that directory. */
	if (writable && mstep && !frozen)
		commit_marker_done(fs, mdir);
	/* framework: pytorch commits .save files at the top on their close */
	if (top && !frozen)
		commit_top_file_done(fs);
}

void ll_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
	     struct fuse_file_info *fi)
{
	struct fhandle *h = (struct fhandle *)(uintptr_t)fi->fh;
	struct fuse_bufvec buf = FUSE_BUFVEC_INIT(size);

	buf.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
	buf.buf[0].fd = h->fd;
	buf.buf[0].pos = off;
	fuse_reply_data(req, &buf, FUSE_BUF_SPLICE_MOVE);
}

void ll_write_buf(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *in_buf,
		  off_t off, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fhandle *h = (struct fhandle *)(uintptr_t)fi->fh;
	struct fnode *n = h->node;
	size_t len = fuse_buf_size(in_buf);
	struct fuse_bufvec out = FUSE_BUFVEC_INIT(len);
	uint64_t growth;
	ssize_t res;

	atomic_fetch_add(&n->inflight, 1);
	if (fs_is_frozen(n)) {
		atomic_fetch_sub(&n->inflight, 1);
		fuse_reply_err(req, EROFS);
		return;
	}
	if (atomic_load_explicit(&h->kill_priv, memory_order_relaxed) &&
	    atomic_exchange(&h->kill_priv, false))
		kill_priv(h->fd);
	growth = write_growth(n, (uint64_t)off, len);
	if (growth && ram_reserve(fs->ram, growth) < 0) {
		atomic_fetch_sub(&n->inflight, 1);
		fuse_reply_err(req, ENOSPC);
		return;
	}
	out.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
	out.buf[0].fd = h->fd;
	out.buf[0].pos = off;
	res = fuse_buf_copy(&out, in_buf, 0);
	if (growth)
		account_after(fs, n, h->fd, growth);
	else if (res > 0)
		pthread_mutex_lock(&n->amu), n->size = n->size > (uint64_t)off + (uint64_t)res ? n->size : (uint64_t)off + (uint64_t)res, pthread_mutex_unlock(&n->amu);
	atomic_fetch_sub(&n->inflight, 1);
	if (res < 0) {
		fuse_reply_err(req, (int)-res);
	} else {
		metrics_add(MC_BYTES_WRITTEN, (uint64_t)res);
		fuse_reply_write(req, (size_t)res);
	}
}

void ll_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	struct fhandle *h = (struct fhandle *)(uintptr_t)fi->fh;
	int rc = datasync ? fdatasync(h->fd) : fsync(h->fd);
	fuse_reply_err(req, rc < 0 ? errno : 0);
}

void ll_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len,
		  struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fhandle *h = (struct fhandle *)(uintptr_t)fi->fh;
	struct fnode *n = h->node;
	/* punching a hole frees space: nothing to reserve */
	uint64_t growth = (mode & FALLOC_FL_PUNCH_HOLE) ? 0 : (uint64_t)len + 4096;
	int rc = 0;

	atomic_fetch_add(&n->inflight, 1);
	if (fs_is_frozen(n)) {
		rc = EROFS;
		goto out;
	}
	if (growth && ram_reserve(fs->ram, growth) < 0) {
		rc = ENOSPC;
		goto out;
	}
	if (fallocate(h->fd, mode, off, len) < 0)
		rc = errno;
	account_after(fs, n, h->fd, growth);
out:
	atomic_fetch_sub(&n->inflight, 1);
	fuse_reply_err(req, rc);
}

void ll_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence,
	      struct fuse_file_info *fi)
{
	struct fhandle *h = (struct fhandle *)(uintptr_t)fi->fh;
	off_t r = lseek(h->fd, off, whence);
	if (r < 0)
		fuse_reply_err(req, errno);
	else
		fuse_reply_lseek(req, r);
}
