/* fs_ll.c: the low-level FUSE operations. A passthrough onto RAMDIR/ns with
 * an inode table of O_PATH descriptors (libfuse passthrough_ll's shape; at
 * most a budget of them open, the rest reopened by file handle: fs_ll_fd.c),
 * plus what mtcfs adds: commit detection on rename and on close of
 * commit_success.txt, read-only committed steps, the capacity account, and
 * the read-only store view ".mtcfs" that restore markers point into.
 * This file: inodes (table, lookup, forget, attributes' timeouts),
 * invalidation, INIT, statfs and the ops table; frozen steps are
 * fs_ll_freeze.c, names (create, link, rename, remove, readdir) fs_ll_dir.c,
 * open files and data fs_ll_file.c; what they share fs_ll_i.h. */
#include "fs/fs_i.h"
#include "fs/fs_ll_i.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* Kernel read-ahead on a FUSE mount defaults to 128 KiB; 1 MiB matches the
 * largest request (a cold 1 GiB read: 2.3 -> 3.6 GB/s). INIT can only lower
 * it (the kernel offers its current value and takes min(offered, reply)),
 * and processing INIT's reply sets it, so it is raised through sysfs after
 * that. Done by the first request, before it is answered, and every other
 * request thread waits in pthread_once: no file of the mount can be opened
 * (and take its read-ahead window) before the value is in. Our bdi is found
 * in mountinfo, not by stat() of our own mount (a request to ourselves).
 * The last mount of ours on the mountpoint is ours (mounts stack). */
static pthread_once_t ra_once = PTHREAD_ONCE_INIT;

static bool mountinfo_field_is(const char *field, const char *want)
{
	/* mountinfo escapes space, tab, newline and backslash as \ooo */
	while (*field && *want) {
		char c = *field;
		if (c == '\\' && field[1] >= '0' && field[1] <= '3' && field[2] >= '0' &&
		    field[2] <= '7' && field[3] >= '0' && field[3] <= '7') {
			c = (char)((field[1] - '0') * 64 + (field[2] - '0') * 8 + (field[3] - '0'));
			field += 3;
		}
		if (c != *want)
			return false;
		field++;
		want++;
	}
	return !*field && !*want;
}

static void ra_tune(void)
{
	struct fs *fs = g_fs;
	char path[128], line[8192], mp[4096];
	unsigned maj = 0, mnr = 0;
	bool found = false;
	FILE *f;
	int fd;

	f = fopen("/proc/self/mountinfo", "re");
	if (!f) {
		log_warn("fuse", "read-ahead stays 128 KiB: cannot read mountinfo: %s",
			 strerror(errno));
		return;
	}
	while (fgets(line, sizeof(line), f)) {
		unsigned a, b;
		if (sscanf(line, "%*u %*u %u:%u %*s %4095s", &a, &b, mp) == 3 &&
		    strstr(line, " - fuse.mtcfs ") && mountinfo_field_is(mp, fs->o.mountpoint)) {
			maj = a;
			mnr = b;
			found = true;
		}
	}
	fclose(f);
	if (!found) {
		log_warn("fuse", "read-ahead stays 128 KiB: %s not in mountinfo", fs->o.mountpoint);
		return;
	}
	snprintf(path, sizeof(path), "/sys/class/bdi/%u:%u/read_ahead_kb", maj, mnr);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write(fd, "1024", 4) != 4)
		log_warn("fuse", "read-ahead stays 128 KiB: cannot set %s: %s", path,
			 strerror(errno));
	else
		log_dbg("fuse", "read-ahead 1024 KiB (%s)", path);
	if (fd >= 0)
		close(fd);
}

struct fs *fs_of(fuse_req_t req)
{
	struct fs *fs = fuse_req_userdata(req);
	/* the kernel sends nothing before INIT's reply is processed */
	if (!atomic_load_explicit(&fs->served, memory_order_relaxed)) {
		pthread_once(&ra_once, ra_tune);
		atomic_store(&fs->served, true);
	}
	return fs;
}

struct fnode *fs_node_of(struct fs *fs, fuse_ino_t ino)
{
	if (ino == FUSE_ROOT_ID)
		return &fs->root;
	return (struct fnode *)(uintptr_t)ino;
}

/* Read-only? A node's own flag, or — while a commit is being sealed and its
 * tree not yet frozen node by node — a frozen ancestor. The ancestor walk
 * makes a committed step read-only the moment its rename returns. */
bool fs_is_frozen(struct fnode *n)
{
	bool r;
	if (atomic_load(&n->flags) & (FN_FROZEN | FN_STORE))
		return true;
	if (atomic_load(&g_fs->sealing) == 0)
		return false;
	pthread_mutex_lock(&g_fs->mu);
	for (r = false; n && !r; n = n->parent)
		r = atomic_load(&n->flags) & (FN_FROZEN | FN_STORE);
	pthread_mutex_unlock(&g_fs->mu);
	return r;
}

static inline size_t hslot(struct fs *fs, ino_t ino, dev_t dev)
{
	return (size_t)(((uint64_t)ino * 0x9e3779b97f4a7c15ULL) ^ (uint64_t)dev) & (fs->hsize - 1);
}

struct fnode *fs_htab_find(struct fs *fs, ino_t ino, dev_t dev)
{
	struct fnode *n;
	for (n = fs->htab[hslot(fs, ino, dev)]; n; n = n->hnext)
		if (n->ino == ino && n->dev == dev)
			return n;
	return NULL;
}

static void htab_remove(struct fs *fs, struct fnode *n)
{
	struct fnode **pp = &fs->htab[hslot(fs, n->ino, n->dev)];
	while (*pp && *pp != n)
		pp = &(*pp)->hnext;
	if (*pp)
		*pp = n->hnext;
}

/* How long the kernel may keep what never changes (seconds). */
#define IMMUTABLE_TIMEOUT 3600.0

/* Can neither n's bytes, attributes nor (for a directory) its names
 * change except through this mount? True for what a sealed step holds in
 * the namespace and for what is inside a shard directory of the store view
 * (shards appear whole, by rename from staging, and are never modified).
 * The kernel sees every change the application makes itself (unlink, rmdir
 * in a committed step) and updates its cache; what changes behind its back
 * is a whole step or shard going, and the levels above (top-level names,
 * .mtcfs/<job>/<step>/<shard>) keep short timeouts, so a path walk finds it
 * gone. Not yet sealed steps keep short ones: the seal links every file
 * into the store, changing its link count. */
bool fs_immutable(struct fs *fs, struct fnode *n)
{
	uint32_t fl = atomic_load(&n->flags);
	struct fs_step *s;
	bool r;

	if (fl & FN_STORE)
		return n->sdepth >= 4;
	if (!(fl & FN_FROZEN) || n == &fs->root)
		return false;
	pthread_mutex_lock(&fs->mu);
	s = fs_step_find(fs, n->step);
	r = s && s->sealed && !s->failed;
	pthread_mutex_unlock(&fs->mu);
	return r;
}

static double entry_timeout(struct fnode *parent)
{
	/* The top level changes behind the kernel's back (control files,
	 * markers, policy dropping steps): never cache its names. */
	if (parent == &g_fs->root)
		return 0.0;
	return fs_immutable(g_fs, parent) ? IMMUTABLE_TIMEOUT : 1.0;
}

static double attr_timeout(struct fnode *n)
{
	return fs_immutable(g_fs, n) ? IMMUTABLE_TIMEOUT : 1.0;
}

int fs_proc_path(int fd, char *buf, size_t len)
{
	return snprintf(buf, len, "%i", fd);
}

/* Dekker with the writers (they increment inflight, then test the flag):
 * once the flag is visible, wait until no write that passed the test is
 * still running. */
static void wait_writers(struct fnode *n)
{
	while (atomic_load(&n->inflight) > 0)
		sched_yield();
}

void fs_node_set_frozen(struct fs *fs, ino_t ino, dev_t dev, uint64_t step)
{
	struct fnode *n;
	pthread_mutex_lock(&fs->mu);
	n = fs_htab_find(fs, ino, dev);
	if (!n || (atomic_load(&n->flags) & FN_FROZEN)) {
		pthread_mutex_unlock(&fs->mu);
		return;
	}
	/* hold a reference: the wait for writers happens without fs->mu
	 * (a writer may need it to reclaim space) */
	n->step = step;
	atomic_fetch_or(&n->flags, FN_FROZEN);
	n->nlookup++;
	pthread_mutex_unlock(&fs->mu);
	wait_writers(n);
	fs_node_unref(fs, n, 1);
}

struct inval_job {
	struct fs *fs;
	char name[256];
};

static void inval_run(void *arg)
{
	struct inval_job *j = arg;
	/* The kernel prunes the dentries below it; inodes nobody holds open
	 * are evicted and FORGET reaches us, freeing our nodes. */
	fuse_lowlevel_notify_inval_entry(j->fs->se, FUSE_ROOT_ID, j->name, strlen(j->name));
	free(j);
}

struct inval_inode_job {
	struct fs *fs;
	fuse_ino_t ino;
};

static void inval_inode_run(void *arg)
{
	struct inval_inode_job *j = arg;
	/* -ENOENT when the kernel has forgotten the inode meanwhile: fine */
	fuse_lowlevel_notify_inval_inode(j->fs->se, j->ino, 0, 0);
	free(j);
}

/* After the last use of a read-write handle its pages in the kernel's
 * cache of the mount are clean copies of what RAMDIR holds: drop them, so
 * the data is not held twice in RAM. Off the request path (the kernel may
 * need a request thread to finish while it invalidates). */
void fs_forget_pages(struct fs *fs, fuse_ino_t ino)
{
	struct inval_inode_job *j;
	if (!fs->se || !fs->notifyq || !(j = calloc(1, sizeof(*j))))
		return;
	j->fs = fs;
	j->ino = ino;
	if (workq_submit(fs->notifyq, inval_inode_run, j) < 0)
		free(j);
}

void fs_forget_name_now(struct fs *fs, const char *name)
{
	if (fs->se)
		fuse_lowlevel_notify_inval_entry(fs->se, FUSE_ROOT_ID, name, strlen(name));
}

void fs_forget_name(struct fs *fs, const char *name)
{
	struct inval_job *j;
	if (!fs->se || !fs->notifyq)
		return;
	j = calloc(1, sizeof(*j));
	if (!j)
		return;
	j->fs = fs;
	snprintf(j->name, sizeof(j->name), "%s", name);
	if (workq_submit(fs->notifyq, inval_run, j) < 0)
		free(j);
}

/* At unmount the kernel sends no FORGET for what it still holds, nor a
 * RELEASE for files still open: both are freed here, after the loop. */
void fs_nodes_free(struct fs *fs)
{
	while (fs->handles)
		fs_free_handle(fs, fs->handles);
	for (size_t i = 0; i < fs->hsize; i++) {
		struct fnode *n = fs->htab[i];
		while (n) {
			struct fnode *next = n->hnext;
			fs_node_fd_drop(fs, n);
			pthread_mutex_destroy(&n->amu);
			free(n);
			n = next;
		}
		fs->htab[i] = NULL;
	}
	free(fs->frozen_ino);
	fs->frozen_ino = NULL;
	fs->frozen_n = fs->frozen_cap = 0;
}

int fs_node_writers(struct fs *fs, ino_t ino, dev_t dev)
{
	struct fnode *n;
	int w = 0;
	pthread_mutex_lock(&fs->mu);
	n = fs_htab_find(fs, ino, dev);
	if (n)
		w = atomic_load(&n->writers);
	pthread_mutex_unlock(&fs->mu);
	return w;
}

const struct fs_front_ops fs_ll_front = {
	.forget_name = fs_forget_name,
	.forget_name_now = fs_forget_name_now,
	.node_writers = fs_node_writers,
	.node_set_frozen = fs_node_set_frozen,
	.freeze_subtree = fs_freeze_subtree,
};

/* Find or create the node for an entry just opened as O_PATH `fd`
 * (consumed). Applies the classification rules. */
static struct fnode *node_get(struct fs *fs, struct fnode *parent, const char *name,
			      int fd, const struct stat *st)
{
	struct fnode *n;
	uint64_t step;

	pthread_mutex_lock(&fs->mu);
	n = fs_htab_find(fs, st->st_ino, st->st_dev);
	if (n) {
		close(fd);
		n->nlookup++;
		pthread_mutex_unlock(&fs->mu);
		return n;
	}
	n = calloc(1, sizeof(*n));
	if (!n) {
		pthread_mutex_unlock(&fs->mu);
		close(fd);
		return NULL;
	}
	n->fd = -1;
	n->ino = st->st_ino;
	n->dev = st->st_dev;
	n->nlookup = 1;
	if (parent != &fs->root) {
		n->parent = parent;
		parent->nlookup++;
	}
	n->blocks = (uint64_t)st->st_blocks;
	n->size = (uint64_t)st->st_size;
	pthread_mutex_init(&n->amu, NULL);
	if (atomic_load(&parent->flags) & FN_STORE) {
		atomic_store(&n->flags, FN_STORE);
		n->sdepth = parent->sdepth < 255 ? parent->sdepth + 1 : 255;
	} else if (atomic_load(&parent->flags) & FN_FROZEN) {
		n->step = parent->step;
		atomic_store(&n->flags, FN_FROZEN);
	} else if (parent == &fs->root && S_ISDIR(st->st_mode) && util_is_step_name(name, &step)) {
		struct fs_step *s = fs_step_find(fs, step);
		uint32_t fl = FN_STEPDIR;
		n->step = step;
		if (s && s->dir_ino == st->st_ino)
			fl |= FN_FROZEN;
		atomic_store(&n->flags, fl);
	} else if (parent == &fs->root && S_ISREG(st->st_mode) &&
		   commit_file_frozen_locked(fs, st->st_ino, &step)) {
		n->step = step;   /* a committed .save file (framework: pytorch) */
		atomic_store(&n->flags, FN_FROZEN);
	} else if (!S_ISDIR(st->st_mode) && st->st_nlink > 1 && st->st_dev == fs->root.dev &&
		   fs_frozen_has(fs, st->st_ino)) {
		/* another name of a committed file (a hard link made before
		 * the commit, found again after the kernel forgot the node) */
		atomic_store(&n->flags, FN_FROZEN);
	}
	if (parent == &fs->root && S_ISREG(st->st_mode) && !strcmp(name, YAML_NAME))
		atomic_fetch_or(&n->flags, FN_YAML);
	if (S_ISREG(st->st_mode) && !strcmp(name, COMMIT_MARKER) &&
	    (atomic_load(&parent->flags) & (FN_STEPDIR | FN_FROZEN)) == FN_STEPDIR) {
		n->marker_step = parent->step + 1;
		n->marker_dir_ino = parent->ino;
	}
	fs_node_fd_adopt(fs, n, fd);
	n->hnext = fs->htab[hslot(fs, n->ino, n->dev)];
	fs->htab[hslot(fs, n->ino, n->dev)] = n;
	pthread_mutex_unlock(&fs->mu);
	return n;
}

/* Drop references; a node going away releases the one it holds on its
 * parent (iteratively: a chain of directories may go at once). */
void fs_node_unref(struct fs *fs, struct fnode *n, uint64_t count)
{
	while (n && n != &fs->root) {
		struct fnode *parent;
		pthread_mutex_lock(&fs->mu);
		if (count > n->nlookup)
			count = n->nlookup;
		n->nlookup -= count;
		if (n->nlookup != 0) {
			pthread_mutex_unlock(&fs->mu);
			return;
		}
		htab_remove(fs, n);
		parent = n->parent;
		pthread_mutex_unlock(&fs->mu);
		fs_node_fd_drop(fs, n);
		pthread_mutex_destroy(&n->amu);
		free(n);
		n = parent;
		count = 1;
	}
}

/* lookup of `name` under parent; fills e. 0 or -errno. */
int fs_do_lookup(struct fs *fs, struct fnode *parent, const char *name,
		 struct fuse_entry_param *e)
{
	struct fnode *n;
	int fd, dirfd, rc;
	const char *nm = name;

	memset(e, 0, sizeof(*e));
	if (parent == &fs->root && !strcmp(name, STORE_NAME)) {
		/* The store view: RAMDIR/shards, read-only. */
		fd = openat(ram_root_fd(fs->ram), "shards", O_PATH | O_NOFOLLOW | O_CLOEXEC);
		nm = "shards";
	} else {
		dirfd = fs_nfd(fs, parent);
		if (dirfd < 0)
			return dirfd;
		fd = openat(dirfd, nm, O_PATH | O_NOFOLLOW | O_CLOEXEC);
		rc = -errno;
		fs_nfd_put(fs, parent);
		errno = -rc;
	}
	if (fd < 0)
		return -errno;
	rc = fstatat(fd, "", &e->attr, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW);
	if (rc < 0) {
		rc = -errno;
		close(fd);
		return rc;
	}
	if (nm != name) {
		n = node_get(fs, parent, name, fd, &e->attr);
		if (n) {
			n->sdepth = 1;
			atomic_fetch_or(&n->flags, FN_STORE);
		}
	} else {
		n = node_get(fs, parent, name, fd, &e->attr);
	}
	if (!n)
		return -ENOMEM;
	e->ino = (uintptr_t)n;
	/* Names at the top level are looked up every time (entry timeout 0),
	 * but their attributes, like everyone's, may be kept a second: with
	 * default_permissions every path walk would otherwise GETATTR the root
	 * and the top-level directory again (7 requests per small-file open
	 * instead of 5). Nothing behind the kernel changes a top-level entry's
	 * mode or owner; its times and link count may lag by that second. */
	e->attr_timeout = attr_timeout(n);
	e->entry_timeout = entry_timeout(parent);
	/* Two top-level names are kept too: a sealed step's directory and the
	 * store view. With timeout 0 the kernel drops a name at its last use,
	 * and with it every cached name, attribute and page below it (each
	 * read of a committed file cost a LOOKUP, OPEN and READs again).
	 * Neither changes behind the kernel's back except when policy drops a
	 * step or shard, and that path invalidates them (fs_forget_name). */
	if (parent == &fs->root &&
	    (nm != name || ((atomic_load(&n->flags) & FN_STEPDIR) && fs_immutable(fs, n))))
		e->entry_timeout = IMMUTABLE_TIMEOUT;
	return 0;
}

static void ll_init(void *userdata, struct fuse_conn_info *conn)
{
	struct fs *fs = userdata;

	/* New entries get exactly the mode the kernel sends: it has applied
	 * the caller's umask already (no FUSE_CAP_DONT_MASK), and ours must not
	 * apply a second time (umask 000; touch f gave 0644). Every file the
	 * daemon makes for itself names its mode. */
	umask(0);
	conn->want &= ~FUSE_CAP_DONT_MASK;
	fs_frozen_load(fs);
	/* splice only with pipes that hold a whole request (front.c checks) */
	if (fs->splice_ok && (conn->capable & FUSE_CAP_SPLICE_WRITE))
		conn->want |= FUSE_CAP_SPLICE_WRITE;
	if (fs->splice_ok && (conn->capable & FUSE_CAP_SPLICE_READ))
		conn->want |= FUSE_CAP_SPLICE_READ;
#ifdef FUSE_CAP_DIRECT_IO_ALLOW_MMAP
	/* read-write opens: direct I/O that still maps (fill_fi) */
	if (conn->capable & FUSE_CAP_DIRECT_IO_ALLOW_MMAP) {
		conn->want |= FUSE_CAP_DIRECT_IO_ALLOW_MMAP;
		fs->dio_mmap = true;
	}
#endif
	if (conn->capable & FUSE_CAP_PARALLEL_DIROPS)
		conn->want |= FUSE_CAP_PARALLEL_DIROPS;
	/* No writeback cache: writes go straight to RAMDIR so the commit rename
	 * sees every byte the app wrote. */
	conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
	/* Locks stay in the kernel (local to this node): flock and OFD/POSIX
	 * locks then work without round trips. */
	conn->want &= ~(FUSE_CAP_POSIX_LOCKS | FUSE_CAP_FLOCK_LOCKS);
#if MTCFS_PASSTHROUGH
	/* Reads of committed and restored files go from the kernel straight
	 * to RAMDIR's tmpfs (see handle_attach). RAMDIR is no stacked file
	 * system itself: the default backing depth (0) is right. */
	if (conn->capable & FUSE_CAP_PASSTHROUGH) {
		conn->want |= FUSE_CAP_PASSTHROUGH;
		fs->passthrough = true;
	}
	log_info("fuse", "passthrough reads of committed files: %s",
		 fs->passthrough ? "on" : "off (the kernel does not offer FUSE passthrough)");
#else
	log_info("fuse", "passthrough reads of committed files: off (built with libfuse %d.%d < 3.17)",
		 FUSE_MAJOR_VERSION, FUSE_MINOR_VERSION);
#endif
}

static void ll_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fs *fs = fs_of(req);
	struct fuse_entry_param e;
	int rc = fs_do_lookup(fs, fs_node_of(fs, parent), name, &e);

	if (rc < 0) {
		if (rc == -ENOENT) {
			memset(&e, 0, sizeof(e));
			/* a negative entry only where no name can appear: in
			 * a sealed step or inside a shard */
			e.entry_timeout = fs_immutable(fs, fs_node_of(fs, parent)) ? IMMUTABLE_TIMEOUT : 0;
			fuse_reply_entry(req, &e);
			return;
		}
		fuse_reply_err(req, -rc);
		return;
	}
	fuse_reply_entry(req, &e);
}

static void ll_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	fs_node_unref(fs_of(req), fs_node_of(fs_of(req), ino), nlookup);
	fuse_reply_none(req);
}

static void ll_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *f)
{
	for (size_t i = 0; i < count; i++)
		fs_node_unref(fs_of(req), fs_node_of(fs_of(req), f[i].ino), f[i].nlookup);
	fuse_reply_none(req);
}

void ll_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fnode *n = fs_node_of(fs, ino);
	struct stat st;
	int fd = fs_nfd(fs, n), rc;

	if (fd < 0) {
		fuse_reply_err(req, -fd);
		return;
	}
	rc = fstatat(fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0 ? errno : 0;
	fs_nfd_put(fs, n);
	if (rc) {
		fuse_reply_err(req, rc);
		return;
	}
	fuse_reply_attr(req, &st, attr_timeout(n));
}

static void ll_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct fs *fs = fs_of(req);
	struct statvfs sv;
	uint64_t cap = ram_cap(fs->ram), used = ram_used(fs->ram);

	if (fstatvfs(ram_ns_fd(fs->ram), &sv) < 0) {
		fuse_reply_err(req, errno);
		return;
	}
	sv.f_bsize = 4096;
	sv.f_frsize = 4096;
	sv.f_blocks = cap / 4096;
	sv.f_bfree = used >= cap ? 0 : (cap - used) / 4096;
	sv.f_bavail = sv.f_bfree;
	fuse_reply_statfs(req, &sv);
}

static void ll_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
	fuse_reply_err(req, ENOTSUP);
}

static void ll_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	if (size == 0)
		fuse_reply_xattr(req, 0);
	else
		fuse_reply_buf(req, NULL, 0);
}

static void ll_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
			size_t size, int flags)
{
	fuse_reply_err(req, ENOTSUP);
}

static void ll_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	fuse_reply_err(req, ENOTSUP);
}

static void ll_ioctl(fuse_req_t req, fuse_ino_t ino, unsigned int cmd, void *arg,
		     struct fuse_file_info *fi, unsigned flags, const void *in_buf,
		     size_t in_bufsz, size_t out_bufsz)
{
	fuse_reply_err(req, ENOTTY);
}

const struct fuse_lowlevel_ops fs_ll_ops = {
	.init = ll_init,
	.lookup = ll_lookup,
	.forget = ll_forget,
	.forget_multi = ll_forget_multi,
	.getattr = ll_getattr,
	.setattr = ll_setattr,
	.readlink = ll_readlink,
	.mknod = ll_mknod,
	.mkdir = ll_mkdir,
	.symlink = ll_symlink,
	.link = ll_link,
	.unlink = ll_unlink,
	.rmdir = ll_rmdir,
	.rename = ll_rename,
	.create = ll_create,
	.open = ll_open,
	.release = ll_release,
	.read = ll_read,
	.write_buf = ll_write_buf,
	.fsync = ll_fsync,
	.fallocate = ll_fallocate,
	.lseek = ll_lseek,
	.opendir = ll_opendir,
	.readdir = ll_readdir,
	.releasedir = ll_releasedir,
	.fsyncdir = ll_fsyncdir,
	.statfs = ll_statfs,
	.getxattr = ll_getxattr,
	.listxattr = ll_listxattr,
	.setxattr = ll_setxattr,
	.removexattr = ll_removexattr,
	.ioctl = ll_ioctl,
};
