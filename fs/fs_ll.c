/* fs_ll.c: the low-level FUSE operations. A passthrough onto RAMDIR/ns with
 * an inode table of O_PATH descriptors (libfuse passthrough_ll's shape), plus
 * what mtcfs adds: commit detection on rename and on close of
 * commit_success.txt, read-only committed steps, the capacity account, and
 * the read-only store view ".mtcfs" that restore markers point into. */
#include "fs/fs_i.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define STORE_NAME ".mtcfs"
#define COMMIT_MARKER "commit_success.txt"
#define YAML_NAME "replicator.yaml"

struct fhandle {
	int fd;
	struct fnode *node;
	bool writable;
	bool cached;                /* read-write open: through the page cache */
	bool pt;                    /* reads go to the backing file in the kernel */
	_Atomic bool kill_priv;     /* the next write clears set-id bits */
	struct fhandle *prev, *next; /* fs->handles, under fs->hmu */
};

static void free_handle(struct fs *fs, struct fhandle *h);

struct dhandle {
	DIR *dp;
	struct dirent *entry;
	off_t offset;
	bool is_root;
};

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
		    strstr(line, " - fuse.mtcfs ") && mountinfo_field_is(mp, fs->mountpoint)) {
			maj = a;
			mnr = b;
			found = true;
		}
	}
	fclose(f);
	if (!found) {
		log_warn("fuse", "read-ahead stays 128 KiB: %s not in mountinfo", fs->mountpoint);
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

static inline struct fs *fs_of(fuse_req_t req)
{
	struct fs *fs = fuse_req_userdata(req);
	/* the kernel sends nothing before INIT's reply is processed */
	if (!atomic_load_explicit(&fs->served, memory_order_relaxed)) {
		pthread_once(&ra_once, ra_tune);
		atomic_store(&fs->served, true);
	}
	return fs;
}

static struct fnode *node_of(struct fs *fs, fuse_ino_t ino)
{
	if (ino == FUSE_ROOT_ID)
		return &fs->root;
	return (struct fnode *)(uintptr_t)ino;
}

/* Read-only? A node's own flag, or — while a commit is being sealed and its
 * tree not yet frozen node by node — a frozen ancestor. The ancestor walk
 * makes a committed step read-only the moment its rename returns. */
static bool is_frozen(struct fnode *n)
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

static struct fnode *htab_find(struct fs *fs, ino_t ino, dev_t dev)
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
static bool immutable(struct fs *fs, struct fnode *n)
{
	uint32_t fl = atomic_load(&n->flags);
	struct fs_step *s;
	bool r;

	if (fl & FN_STORE)
		return n->sdepth >= 4;
	if (!(fl & FN_FROZEN) || n == &fs->root)
		return false;
	pthread_mutex_lock(&fs->mu);
	s = commit_find(fs, n->step);
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
	return immutable(g_fs, parent) ? IMMUTABLE_TIMEOUT : 1.0;
}

static double attr_timeout(struct fnode *n)
{
	return immutable(g_fs, n) ? IMMUTABLE_TIMEOUT : 1.0;
}

static int proc_path(int fd, char *buf, size_t len)
{
	return snprintf(buf, len, "%i", fd);
}

static void node_unref(struct fs *fs, struct fnode *n, uint64_t count);

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
	n = htab_find(fs, ino, dev);
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
	node_unref(fs, n, 1);
}

struct inval_job {
	struct fs *fs;
	char name[256];
};

static void inval_run(void *arg)
{
	struct inval_job *j = arg;
	/* The kernel prunes the dentries below it; inodes nobody holds open
	 * are evicted and FORGET reaches us, closing our O_PATH handles. */
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
static void forget_pages(struct fs *fs, fuse_ino_t ino)
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
		free_handle(fs, fs->handles);
	for (size_t i = 0; i < fs->hsize; i++) {
		struct fnode *n = fs->htab[i];
		while (n) {
			struct fnode *next = n->hnext;
			close(n->fd);
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
	n = htab_find(fs, ino, dev);
	if (n)
		w = atomic_load(&n->writers);
	pthread_mutex_unlock(&fs->mu);
	return w;
}

/* --- inodes a shard holds --------------------------------------------------- */

static size_t frozen_slot(ino_t ino, size_t cap)
{
	return (size_t)((uint64_t)ino * 0x9e3779b97f4a7c15ULL) & (cap - 1);
}

/* fs->mu held. Is this backing inode part of a committed shard? */
static bool frozen_has(struct fs *fs, ino_t ino)
{
	if (!fs->frozen_cap || ino == 0)
		return false;
	for (size_t i = frozen_slot(ino, fs->frozen_cap);; i = (i + 1) & (fs->frozen_cap - 1)) {
		if (fs->frozen_ino[i] == ino)
			return true;
		if (fs->frozen_ino[i] == 0)
			return false;
	}
}

/* fs->mu held. 0 or -ENOMEM (the inode then stays writable under names
 * outside the step: logged by the caller). */
static int frozen_add(struct fs *fs, ino_t ino)
{
	size_t i;

	if (ino == 0 || frozen_has(fs, ino))
		return 0;
	if ((fs->frozen_n + 1) * 2 > fs->frozen_cap) {
		size_t ncap = fs->frozen_cap ? fs->frozen_cap * 2 : 1024;
		ino_t *nt = calloc(ncap, sizeof(*nt));
		if (!nt)
			return -ENOMEM;
		for (size_t j = 0; j < fs->frozen_cap; j++) {
			if (!fs->frozen_ino[j])
				continue;
			for (i = frozen_slot(fs->frozen_ino[j], ncap); nt[i]; i = (i + 1) & (ncap - 1))
				;
			nt[i] = fs->frozen_ino[j];
		}
		free(fs->frozen_ino);
		fs->frozen_ino = nt;
		fs->frozen_cap = ncap;
	}
	for (i = frozen_slot(ino, fs->frozen_cap); fs->frozen_ino[i]; i = (i + 1) & (fs->frozen_cap - 1))
		;
	fs->frozen_ino[i] = ino;
	fs->frozen_n++;
	return 0;
}

/* FIFOs are part of the shard (by their mode); these are not. */
static const char *special_kind(mode_t m)
{
	if (S_ISSOCK(m))
		return "a socket";
	if (S_ISCHR(m))
		return "a character device";
	if (S_ISBLK(m))
		return "a block device";
	return NULL;
}

struct freeze_arg {
	struct fs *fs;
	uint64_t step;
	unsigned reported;
};

static int freeze_one(void *arg, const struct util_walk_ent *e)
{
	struct freeze_arg *a = arg;
	struct fs *fs = a->fs;
	const struct stat *st = e->st;
	const char *rel = e->path;
	const char *kind = special_kind(st->st_mode);
	int rc = 0;

	/* Only a file with other names needs its inode remembered: the seal
	 * has not linked it into the store yet, and from now on link() of it
	 * is refused. So the set holds what hard links the application made,
	 * not every committed file. */
	if (!S_ISDIR(st->st_mode) && st->st_nlink > 1 && st->st_dev == fs->root.dev) {
		pthread_mutex_lock(&fs->mu);
		rc = frozen_add(fs, st->st_ino);
		pthread_mutex_unlock(&fs->mu);
		if (rc < 0)
			log_warn("commit", "step %llu: %s stays writable through other hard links: %s",
				 (unsigned long long)a->step, rel, strerror(-rc));
	}
	fs_node_set_frozen(fs, st->st_ino, st->st_dev, a->step);
	if (kind && a->reported++ < 16) {
		/* The shard (and so every peer and backup copy, and a restore)
		 * holds regular files, directories, symlinks and FIFOs only. */
		char line[PATH_MAX + 256];
		snprintf(line, sizeof(line),
			 "step %llu: %s is %s: not checkpointed (a shard holds regular files, directories, symlinks and FIFOs only)",
			 (unsigned long long)a->step, rel, kind);
		log_warn("commit", "%s", line);
		ctl_report_error(fs, line);
	}
	/* a tree deeper than a shard may be is refused by the seal (marked
	 * bad): what lies below that need not be frozen */
	if (S_ISDIR(st->st_mode) && e->depth > MF_MAX_DEPTH)
		return UTIL_WALK_SKIP;
	return 0;
}

/* Iterative (util_walk): the depth of the tree is the application's. */
void fs_freeze_subtree(struct fs *fs, int dirfd, uint64_t step)
{
	struct freeze_arg a = { .fs = fs, .step = step };
	int rc = util_walk(dirfd, MF_MAX_DEPTH + 2, 0, freeze_one, &a);
	if (rc < 0)
		log_warn("commit", "step %llu: freezing its tree stopped early: %s",
			 (unsigned long long)step, strerror(-rc));
}

struct load_arg {
	struct fs *fs;
	int err;
};

static int load_one(void *arg, const struct util_walk_ent *e)
{
	struct load_arg *a = arg;
	struct fs *fs = a->fs;
	const struct stat *st = e->st;

	/* one link is the store's own: no name in the namespace can reach it */
	if (!S_ISDIR(st->st_mode) && st->st_nlink > 1 && st->st_dev == fs->root.dev) {
		pthread_mutex_lock(&fs->mu);
		if (frozen_add(fs, st->st_ino) < 0)
			a->err = -ENOMEM;
		pthread_mutex_unlock(&fs->mu);
	}
	return 0;
}

/* Before the first request: the inodes every shard in RAMDIR/shards holds
 * (own steps and replicas), so a hard link made before a daemon restart
 * stays read-only after it. */
static void frozen_load(struct fs *fs)
{
	int sfd = openat(ram_root_fd(fs->ram), "shards", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct load_arg a = { .fs = fs };
	int err, rc;

	if (sfd < 0)
		return;
	/* shards/JOB/STEP/nR-wW/ above a tree of at most MF_MAX_DEPTH levels */
	rc = util_walk(sfd, MF_MAX_DEPTH + 4, UTIL_WALK_NOPATH, load_one, &a);
	err = a.err;
	close(sfd);
	if (rc < 0 || err < 0)
		log_warn("main", "cannot list every committed inode: %s; hard links to committed files made outside their step may be writable",
			 strerror(-(rc < 0 ? rc : err)));
	else
		log_info("main", "%zu committed inodes have other names", fs->frozen_n);
}

/* Find or create the node for an entry just opened as O_PATH `fd`
 * (consumed). Applies the classification rules. */
static struct fnode *node_get(struct fs *fs, struct fnode *parent, const char *name,
			      int fd, const struct stat *st)
{
	struct fnode *n;
	uint64_t step;

	pthread_mutex_lock(&fs->mu);
	n = htab_find(fs, st->st_ino, st->st_dev);
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
	n->fd = fd;
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
		struct fs_step *s = commit_find(fs, step);
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
		   frozen_has(fs, st->st_ino)) {
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
	n->hnext = fs->htab[hslot(fs, n->ino, n->dev)];
	fs->htab[hslot(fs, n->ino, n->dev)] = n;
	pthread_mutex_unlock(&fs->mu);
	return n;
}

/* Drop references; a node going away releases the one it holds on its
 * parent (iteratively: a chain of directories may go at once). */
static void node_unref(struct fs *fs, struct fnode *n, uint64_t count)
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
		close(n->fd);
		pthread_mutex_destroy(&n->amu);
		free(n);
		n = parent;
		count = 1;
	}
}

/* lookup of `name` under parent; fills e. 0 or -errno. */
static int do_lookup(struct fs *fs, struct fnode *parent, const char *name,
		     struct fuse_entry_param *e)
{
	struct fnode *n;
	int fd, dirfd = parent->fd, rc;
	const char *nm = name;

	memset(e, 0, sizeof(*e));
	if (parent == &fs->root && !strcmp(name, STORE_NAME)) {
		/* The store view: RAMDIR/shards, read-only. */
		dirfd = ram_root_fd(fs->ram);
		nm = "shards";
	}
	fd = openat(dirfd, nm, O_PATH | O_NOFOLLOW | O_CLOEXEC);
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
	    (nm != name || ((atomic_load(&n->flags) & FN_STEPDIR) && immutable(fs, n))))
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
	frozen_load(fs);
	/* splice only with pipes that hold a whole request (main.c checks) */
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
	int rc = do_lookup(fs, node_of(fs, parent), name, &e);

	if (rc < 0) {
		if (rc == -ENOENT) {
			memset(&e, 0, sizeof(e));
			/* a negative entry only where no name can appear: in
			 * a sealed step or inside a shard */
			e.entry_timeout = immutable(fs, node_of(fs, parent)) ? IMMUTABLE_TIMEOUT : 0;
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
	node_unref(fs_of(req), node_of(fs_of(req), ino), nlookup);
	fuse_reply_none(req);
}

static void ll_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *f)
{
	for (size_t i = 0; i < count; i++)
		node_unref(fs_of(req), node_of(fs_of(req), f[i].ino), f[i].nlookup);
	fuse_reply_none(req);
}

static void ll_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fnode *n = node_of(fs, ino);
	struct stat st;

	if (fstatat(n->fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0) {
		fuse_reply_err(req, errno);
		return;
	}
	fuse_reply_attr(req, &st, attr_timeout(n));
}

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

static void ll_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int valid,
		       struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fnode *n = node_of(fs, ino);
	char pp[64];
	int rc = 0, fd = fi ? ((struct fhandle *)(uintptr_t)fi->fh)->fd : -1;

	atomic_fetch_add(&n->inflight, 1);
	if (is_frozen(n)) {
		rc = EROFS;
		goto out;
	}
	proc_path(n->fd, pp, sizeof(pp));
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
		if (fchownat(n->fd, "", u, g, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0) {
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
	atomic_fetch_sub(&n->inflight, 1);
	if (rc) {
		fuse_reply_err(req, rc);
		return;
	}
	ll_getattr(req, ino, fi);
}

static void ll_readlink(fuse_req_t req, fuse_ino_t ino)
{
	struct fnode *n = node_of(fs_of(req), ino);
	char buf[PATH_MAX + 1];
	ssize_t r = readlinkat(n->fd, "", buf, sizeof(buf));

	if (r < 0) {
		fuse_reply_err(req, errno);
		return;
	}
	if (r == (ssize_t)sizeof(buf)) {
		fuse_reply_err(req, ENAMETOOLONG);
		return;
	}
	buf[r] = '\0';
	fuse_reply_readlink(req, buf);
}

/* May the app create `name` under parent? */
static int may_create(struct fs *fs, struct fnode *parent, const char *name)
{
	if (is_frozen(parent))
		return -EROFS;
	if (parent == &fs->root && !strcmp(name, STORE_NAME))
		return -EEXIST;
	return 0;
}

/* A new entry belongs to the caller, as on a local filesystem: the daemon
 * made it as root, so give it the request's uid, and its gid unless the
 * parent is setgid (tmpfs then gave it the parent's, as the kernel does).
 * chown clears set-id bits of non-directories: put the created mode back.
 * On failure the entry is removed again. st: in, the entry as created;
 * out, as the caller will see it. 0 or -errno. */
static int own_new(struct fs *fs, fuse_req_t req, struct fnode *dir, const char *name,
		   struct fnode *n, struct stat *st)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	uid_t u = ctx->uid;
	gid_t g = ctx->gid;
	char pp[64];
	int rc = 0;

	if (st->st_uid == u && st->st_gid == g)
		return 0;
	if (st->st_gid != g) {
		struct stat ds;
		if (fstatat(dir->fd, "", &ds, AT_EMPTY_PATH) == 0 && (ds.st_mode & S_ISGID))
			g = ds.st_gid;
	}
	if (st->st_uid == u && st->st_gid == g)
		return 0;
	if (fchownat(n->fd, "", u, g, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0) {
		rc = -errno;
		goto out;
	}
	proc_path(n->fd, pp, sizeof(pp));
	if (!S_ISLNK(st->st_mode) && !S_ISDIR(st->st_mode) && (st->st_mode & (S_ISUID | S_ISGID)) &&
	    fchmodat(fs->proc_self_fd, pp, st->st_mode & 07777, 0) < 0) {
		rc = -errno;
		goto out;
	}
	if (fstatat(n->fd, "", st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0)
		rc = -errno;
out:
	if (rc < 0) {
		log_warn("fs", "cannot give %s to uid %u gid %u: %s", name, (unsigned)u, (unsigned)g,
			 strerror(-rc));
		unlinkat(dir->fd, name, S_ISDIR(st->st_mode) ? AT_REMOVEDIR : 0);
	}
	return rc;
}

static void make_node(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		      dev_t rdev, const char *link)
{
	struct fs *fs = fs_of(req);
	struct fnode *dir = node_of(fs, parent);
	struct fuse_entry_param e;
	int rc = may_create(fs, dir, name);

	if (rc < 0) {
		fuse_reply_err(req, -rc);
		return;
	}
	if (S_ISDIR(mode))
		rc = mkdirat(dir->fd, name, mode);
	else if (link)
		rc = symlinkat(link, dir->fd, name);
	else
		rc = mknodat(dir->fd, name, mode, rdev);
	if (rc < 0) {
		fuse_reply_err(req, errno);
		return;
	}
	rc = do_lookup(fs, dir, name, &e);
	if (rc < 0) {
		fuse_reply_err(req, -rc);
		return;
	}
	rc = own_new(fs, req, dir, name, node_of(fs, e.ino), &e.attr);
	if (rc < 0) {
		node_unref(fs, node_of(fs, e.ino), 1);
		fuse_reply_err(req, -rc);
		return;
	}
	fuse_reply_entry(req, &e);
}

static void ll_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev)
{
	make_node(req, parent, name, mode, rdev, NULL);
}

static void ll_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	make_node(req, parent, name, S_IFDIR | mode, 0, NULL);
}

static void ll_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
	make_node(req, parent, name, S_IFLNK, 0, link);
}

static void ll_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t parent, const char *name)
{
	struct fs *fs = fs_of(req);
	struct fnode *n = node_of(fs, ino), *dir = node_of(fs, parent);
	struct fuse_entry_param e;
	char pp[64];
	int rc = may_create(fs, dir, name);

	/* A committed file gets no new names: a link outside its step would
	 * be a writable way to the shard's bytes (and the store is ours). */
	if (rc == 0 && is_frozen(n))
		rc = -EROFS;
	if (rc < 0) {
		fuse_reply_err(req, -rc);
		return;
	}
	proc_path(n->fd, pp, sizeof(pp));
	if (linkat(fs->proc_self_fd, pp, dir->fd, name, AT_SYMLINK_FOLLOW) < 0) {
		fuse_reply_err(req, errno);
		return;
	}
	rc = do_lookup(fs, dir, name, &e);
	if (rc < 0) {
		fuse_reply_err(req, -rc);
		return;
	}
	fuse_reply_entry(req, &e);
}

/* Removing an entry inside a committed step only takes it out of the app's
 * view: the shard keeps its own links. Wait until those exist. */
static int before_remove(struct fs *fs, struct fnode *dir, const char *name)
{
	if (atomic_load(&dir->flags) & FN_STORE)
		return -EROFS;
	if (dir == &fs->root && !strcmp(name, STORE_NAME))
		return -EPERM;
	if (atomic_load(&dir->flags) & FN_FROZEN)
		commit_wait_sealed(fs, dir->step);
	else if (is_frozen(dir))
		workq_drain(fs->sealq);   /* frozen through an ancestor: its seal is queued */
	return 0;
}

static void ll_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fs *fs = fs_of(req);
	struct fnode *dir = node_of(fs, parent);
	struct stat st;
	int rc = before_remove(fs, dir, name);

	if (rc < 0) {
		fuse_reply_err(req, -rc);
		return;
	}
	if (fstatat(dir->fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		fuse_reply_err(req, errno);
		return;
	}
	if (unlinkat(dir->fd, name, 0) < 0) {
		fuse_reply_err(req, errno);
		return;
	}
	if (S_ISREG(st.st_mode) && st.st_nlink == 1)
		ram_adjust(fs->ram, -(int64_t)st.st_blocks * 512);
	fuse_reply_err(req, 0);
}

static void ll_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fs *fs = fs_of(req);
	struct fnode *dir = node_of(fs, parent);
	struct stat st;
	uint64_t step;
	bool was_step = false;
	int rc = before_remove(fs, dir, name);

	if (rc < 0) {
		fuse_reply_err(req, -rc);
		return;
	}
	if (dir == &fs->root && util_is_step_name(name, &step) &&
	    fstatat(dir->fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
	    commit_is_step_dir(fs, step, st.st_ino)) {
		commit_wait_sealed(fs, step);
		was_step = true;
	}
	if (unlinkat(dir->fd, name, AT_REMOVEDIR) < 0) {
		fuse_reply_err(req, errno);
		return;
	}
	if (was_step)
		commit_hide(fs, step);
	fuse_reply_err(req, 0);
}

static void ll_rename(fuse_req_t req, fuse_ino_t parent, const char *name,
		      fuse_ino_t newparent, const char *newname, unsigned int flags)
{
	struct fs *fs = fs_of(req);
	struct fnode *src = node_of(fs, parent), *dst = node_of(fs, newparent);
	struct stat st, tst;
	uint64_t step = 0, tstep;
	bool commit = false, marker = false;
	ino_t marker_dir = 0;
	int rc;

	if (is_frozen(src) || is_frozen(dst)) {
		fuse_reply_err(req, EROFS);
		return;
	}
	if ((src == &fs->root && !strcmp(name, STORE_NAME)) ||
	    (dst == &fs->root && !strcmp(newname, STORE_NAME))) {
		fuse_reply_err(req, EPERM);
		return;
	}
	if (fstatat(src->fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		fuse_reply_err(req, errno);
		return;
	}
	/* A committed step can be neither moved nor replaced. */
	if (src == &fs->root && S_ISDIR(st.st_mode) && util_is_step_name(name, &tstep) &&
	    commit_is_step_dir(fs, tstep, st.st_ino)) {
		fuse_reply_err(req, EROFS);
		return;
	}
	if (dst == &fs->root && util_is_step_name(newname, &tstep) &&
	    fstatat(dst->fd, newname, &tst, AT_SYMLINK_NOFOLLOW) == 0 &&
	    S_ISDIR(tst.st_mode) && commit_is_step_dir(fs, tstep, tst.st_ino)) {
		fuse_reply_err(req, EROFS);
		return;
	}
	if (dst == &fs->root && S_ISDIR(st.st_mode) && !(flags & RENAME_EXCHANGE) &&
	    util_is_step_name(newname, &step)) {
		rc = commit_begin(fs, step, newname, st.st_ino);
		if (rc < 0) {
			fuse_reply_err(req, -rc);
			return;
		}
		commit = true;
	}
	if (renameat2(src->fd, name, dst->fd, newname, flags) < 0) {
		int e = errno;
		if (commit)
			commit_abort(fs, step);
		fuse_reply_err(req, e);
		return;
	}
	/* Reclassify the moved node if the kernel holds it. */
	pthread_mutex_lock(&fs->mu);
	{
		struct fnode *n = htab_find(fs, st.st_ino, st.st_dev);
		struct fnode *oldp = NULL;
		if (n && n->parent != (dst == &fs->root ? NULL : dst)) {
			/* the moved node now hangs under dst */
			oldp = n->parent;
			n->parent = dst == &fs->root ? NULL : dst;
			if (n->parent)
				n->parent->nlookup++;
		}
		if (oldp) {
			pthread_mutex_unlock(&fs->mu);
			node_unref(fs, oldp, 1);
			pthread_mutex_lock(&fs->mu);
			n = htab_find(fs, st.st_ino, st.st_dev);
		}
		if (n) {
			if (dst == &fs->root && S_ISDIR(st.st_mode) && util_is_step_name(newname, &tstep)) {
				n->step = tstep;
				atomic_fetch_or(&n->flags, FN_STEPDIR);
			} else {
				atomic_fetch_and(&n->flags, ~FN_STEPDIR);
			}
			if (dst == &fs->root && S_ISREG(st.st_mode) && !strcmp(newname, YAML_NAME))
				atomic_fetch_or(&n->flags, FN_YAML);
			else
				atomic_fetch_and(&n->flags, ~FN_YAML);
			n->marker_step = 0;
			if (S_ISREG(st.st_mode) && !strcmp(newname, COMMIT_MARKER) &&
			    (atomic_load(&dst->flags) & FN_STEPDIR)) {
				n->marker_step = dst->step + 1;
				n->marker_dir_ino = dst->ino;
			}
			if (commit)
				n->step = step;
		}
		/* commit_success.txt renamed into a top-level step directory
		 * (written as a tmp, then renamed): complete unless still open */
		if (S_ISREG(st.st_mode) && !strcmp(newname, COMMIT_MARKER) && dst != &fs->root &&
		    !dst->parent && (atomic_load(&dst->flags) & (FN_STEPDIR | FN_FROZEN)) == FN_STEPDIR &&
		    !(n && atomic_load(&n->writers) > 0)) {
			marker = true;
			marker_dir = dst->ino;
		}
	}
	pthread_mutex_unlock(&fs->mu);
	if (commit)
		fs_node_set_frozen(fs, st.st_ino, st.st_dev, step);
	fuse_reply_err(req, 0);
	/* the seal worker's wake-up stays off the rename's latency */
	if (commit)
		commit_queue(fs, step);
	if (marker)
		commit_marker_done(fs, marker_dir);
	if (dst == &fs->root && S_ISREG(st.st_mode))
		commit_top_file_done(fs);
	if (dst == &fs->root && !strcmp(newname, YAML_NAME))
		ctl_notify(fs);
}

static int open_flags_ok(struct fnode *n, int flags)
{
	if (is_frozen(n) && ((flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC)))
		return -EROFS;
	return 0;
}

static void fill_fi(struct fuse_file_info *fi, struct fhandle *h, struct fnode *n, int flags)
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
		fi->keep_cache = is_frozen(n) ? 1 : 0;
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
static void handle_attach(fuse_req_t req, struct fs *fs, struct fhandle *h,
			  struct fuse_file_info *fi)
{
	struct fnode *n = h->node;
#if MTCFS_PASSTHROUGH
	/* before amu: is_frozen may take fs->mu, which comes first */
	bool frozen = fs->passthrough && !h->writable && is_frozen(n);
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
static void free_handle(struct fs *fs, struct fhandle *h)
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

static void ll_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		      struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fnode *dir = node_of(fs, parent);
	struct fuse_entry_param e;
	struct fhandle *h;
	bool created = false;
	int fd, rc = may_create(fs, dir, name);

	if (rc < 0) {
		fuse_reply_err(req, -rc);
		return;
	}
	/* Only an entry made here is given to the caller: try an exclusive
	 * create, and open what another process made meanwhile (unless the
	 * caller asked for O_EXCL itself). */
	for (int attempt = 0;; attempt++) {
		fd = openat(dir->fd, name, (fi->flags | O_CREAT | O_EXCL | O_CLOEXEC) & ~O_NOFOLLOW,
			    mode);
		if (fd >= 0) {
			created = true;
			break;
		}
		if (errno != EEXIST || (fi->flags & O_EXCL) || attempt == 8)
			break;
		fd = openat(dir->fd, name, (fi->flags | O_CLOEXEC) & ~(O_NOFOLLOW | O_CREAT));
		if (fd >= 0 || errno != ENOENT)
			break;
	}
	if (fd < 0) {
		fuse_reply_err(req, errno);
		return;
	}
	rc = do_lookup(fs, dir, name, &e);
	if (rc == 0 && created) {
		rc = own_new(fs, req, dir, name, node_of(fs, e.ino), &e.attr);
		if (rc < 0)
			node_unref(fs, node_of(fs, e.ino), 1);
	}
	if (rc < 0) {
		close(fd);
		fuse_reply_err(req, -rc);
		return;
	}
	h = new_handle(fs, fd, node_of(fs, e.ino), fi->flags);
	if (!h) {
		close(fd);
		node_unref(fs, node_of(fs, e.ino), 1);
		fuse_reply_err(req, ENOMEM);
		return;
	}
	if (h->writable && wants_kill_priv(req, fd))
		atomic_store(&h->kill_priv, true);   /* created set-id: its first write clears it */
	fill_fi(fi, h, h->node, fi->flags);
	handle_attach(req, fs, h, fi);
	if (fuse_reply_create(req, &e, fi) == -ENOENT) {
		handle_detach(NULL, h);
		if (h->writable)
			atomic_fetch_sub(&h->node->writers, 1);
		free_handle(fs, h);
		node_unref(fs, node_of(fs, e.ino), 1);
	}
}

static void ll_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fnode *n = node_of(fs, ino);
	struct fhandle *h;
	char pp[64];
	int fd, rc = open_flags_ok(n, fi->flags);

	if (rc < 0) {
		fuse_reply_err(req, -rc);
		return;
	}
	proc_path(n->fd, pp, sizeof(pp));
	fd = openat(fs->proc_self_fd, pp, (fi->flags | O_CLOEXEC) & ~O_NOFOLLOW);
	if (fd < 0) {
		fuse_reply_err(req, errno);
		return;
	}
	if (fi->flags & O_TRUNC)
		account_after(fs, n, fd, 0);
	h = new_handle(fs, fd, n, fi->flags);
	if (!h) {
		close(fd);
		fuse_reply_err(req, ENOMEM);
		return;
	}
	if (h->writable && wants_kill_priv(req, fd))
		atomic_store(&h->kill_priv, true);
	fill_fi(fi, h, n, fi->flags);
	handle_attach(req, fs, h, fi);
	if (fuse_reply_open(req, fi) == -ENOENT) {
		handle_detach(NULL, h);
		if (h->writable)
			atomic_fetch_sub(&n->writers, 1);
		free_handle(fs, h);
	}
}

static void ll_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fhandle *h = (struct fhandle *)(uintptr_t)fi->fh;
	struct fnode *n = h->node;
	uint64_t mstep;
	ino_t mdir;
	bool writable = h->writable, cached = h->cached, yaml = false, frozen = is_frozen(n), top;

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
	free_handle(fs, h);
	fuse_reply_err(req, 0);
	if (cached)
		forget_pages(fs, ino);
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

static void ll_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	struct fhandle *h = (struct fhandle *)(uintptr_t)fi->fh;
	struct fuse_bufvec buf = FUSE_BUFVEC_INIT(size);

	buf.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
	buf.buf[0].fd = h->fd;
	buf.buf[0].pos = off;
	fuse_reply_data(req, &buf, FUSE_BUF_SPLICE_MOVE);
}

static void ll_write_buf(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *in_buf,
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
	if (is_frozen(n)) {
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

static void ll_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	struct fhandle *h = (struct fhandle *)(uintptr_t)fi->fh;
	int rc = datasync ? fdatasync(h->fd) : fsync(h->fd);
	fuse_reply_err(req, rc < 0 ? errno : 0);
}

static void ll_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len,
			 struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fhandle *h = (struct fhandle *)(uintptr_t)fi->fh;
	struct fnode *n = h->node;
	/* punching a hole frees space: nothing to reserve */
	uint64_t growth = (mode & FALLOC_FL_PUNCH_HOLE) ? 0 : (uint64_t)len + 4096;
	int rc = 0;

	atomic_fetch_add(&n->inflight, 1);
	if (is_frozen(n)) {
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

static void ll_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence,
		     struct fuse_file_info *fi)
{
	struct fhandle *h = (struct fhandle *)(uintptr_t)fi->fh;
	off_t r = lseek(h->fd, off, whence);
	if (r < 0)
		fuse_reply_err(req, errno);
	else
		fuse_reply_lseek(req, r);
}

static void ll_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fnode *n = node_of(fs, ino);
	struct dhandle *d = calloc(1, sizeof(*d));
	int fd;

	if (!d) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	fd = openat(n->fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || !(d->dp = fdopendir(fd))) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		free(d);
		fuse_reply_err(req, e);
		return;
	}
	d->is_root = n == &fs->root;
	fi->fh = (uintptr_t)d;
	/* An immutable directory's listing stays in the kernel across opens;
	 * an unlink or rmdir in it through the mount invalidates it there. */
	fi->cache_readdir = immutable(fs, n) ? 1 : 0;
	fi->keep_cache = fi->cache_readdir;
	if (fuse_reply_open(req, fi) == -ENOENT) {
		closedir(d->dp);
		free(d);
	}
}

static void ll_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t offset,
		       struct fuse_file_info *fi)
{
	struct dhandle *d = (struct dhandle *)(uintptr_t)fi->fh;
	char *buf = calloc(1, size), *p = buf;
	size_t rem = size;

	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	if (offset != d->offset) {
		seekdir(d->dp, offset);
		d->entry = NULL;
		d->offset = offset;
	}
	for (;;) {
		struct stat st;
		size_t es;
		off_t next;

		if (!d->entry) {
			errno = 0;
			d->entry = readdir(d->dp);
			if (!d->entry) {
				if (errno && rem == size) {
					free(buf);
					fuse_reply_err(req, errno);
					return;
				}
				break;
			}
		}
		next = d->entry->d_off;
		if (d->is_root && d->entry->d_name[0] == '.' &&
		    strstr(d->entry->d_name, ".mtcfs-tmp")) {
			/* our own tmp files of tmp+rename writes */
			d->entry = NULL;
			d->offset = next;
			continue;
		}
		memset(&st, 0, sizeof(st));
		st.st_ino = d->entry->d_ino;
		st.st_mode = (mode_t)d->entry->d_type << 12;
		es = fuse_add_direntry(req, p, rem, d->entry->d_name, &st, next);
		if (es > rem)
			break;
		p += es;
		rem -= es;
		d->entry = NULL;
		d->offset = next;
	}
	fuse_reply_buf(req, buf, size - rem);
	free(buf);
}

static void ll_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct dhandle *d = (struct dhandle *)(uintptr_t)fi->fh;
	closedir(d->dp);
	free(d);
	fuse_reply_err(req, 0);
}

static void ll_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	struct dhandle *d = (struct dhandle *)(uintptr_t)fi->fh;
	int rc = datasync ? fdatasync(dirfd(d->dp)) : fsync(dirfd(d->dp));
	fuse_reply_err(req, rc < 0 ? errno : 0);
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
