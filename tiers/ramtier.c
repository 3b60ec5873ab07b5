#include "tiers/ramtier.h"
#include "tiers/lifecycle.h"
#include "tiers/ec.h"
#include "common/log.h"
#include "common/util.h"
#include "common/walk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

struct ram_tier {
	char *path;
	int rootfd, nsfd, shardsfd;
	struct idx *idx;
	uint64_t cap;
	/* who gets a published shard whose manifest names no owners, and
	 * the umask of its modes (ram_set_owner) */
	pthread_mutex_t owner_mu;
	struct mf_owner owner;
	_Atomic int64_t used;
	/* Serialises reclaim, and is the outermost lock of the daemon:
	 * ram_reserve() holds it across the reclaim callback (fs/commit.c
	 * retain_reclaim), which takes fs->mu, the engine's mu, a shard key
	 * here (keys_mu, waiting on keys_cv), the catalog's LMDB write lock
	 * and a work queue's mu, one at a time. So no caller of ram_reserve()
	 * may hold any lock (the FUSE write path and tiers/xfer.c's
	 * xfer_recv_files, for pushes and peer restores, hold none), nor a
	 * shard key. */
	pthread_mutex_t reclaim_mu;
	ram_reclaim_fn reclaim;
	void *reclaim_arg;
	/* Keys a seal, publish or drop is working on: these replace or delete
	 * a shard's directory in several steps, and two of them on one key
	 * must not interleave (a drop would delete the files a publish just
	 * renamed into place, leaving a record that names nothing). keys_mu
	 * is a leaf lock. While a key is held only the files and the catalog
	 * are used: no reservation, so a reclaim, which waits for a key while
	 * holding reclaim_mu, never waits for a holder that waits for it. */
	pthread_mutex_t keys_mu;
	pthread_cond_t keys_cv;
	struct shard_key *busy;
	size_t nbusy, capbusy;
};

void (*ram_test_hook)(const char *point, const struct shard_key *k);

static void finish_drops(struct ram_tier *t);
static void sweep_shards(struct ram_tier *t);
static void migrate_frags(struct ram_tier *t);
static void scan_parity(struct ram_tier *t);

int ram_open(const char *ramdir, uint64_t cap, struct ram_tier **out)
{
	struct ram_tier *t;
	char db[PATH_MAX];
	int rc;

	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->rootfd = t->nsfd = t->shardsfd = -1;
	pthread_mutex_init(&t->reclaim_mu, NULL);
	pthread_mutex_init(&t->keys_mu, NULL);
	pthread_cond_init(&t->keys_cv, NULL);
	pthread_mutex_init(&t->owner_mu, NULL);
	t->path = realpath(ramdir, NULL);
	if (!t->path) {
		rc = -errno;
		log_err("ram", "RAMDIR %s: %s", ramdir, strerror(errno));
		goto fail;
	}
	t->rootfd = open(t->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (t->rootfd < 0) {
		rc = -errno;
		goto fail;
	}
	if ((mkdirat(t->rootfd, "ns", 0755) < 0 && errno != EEXIST) ||
	    (mkdirat(t->rootfd, "shards", STORE_DIR_MODE) < 0 && errno != EEXIST)) {
		rc = -errno;
		log_err("ram", "cannot create layout in %s: %s", t->path, strerror(errno));
		goto fail;
	}
	t->nsfd = openat(t->rootfd, "ns", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	t->shardsfd = openat(t->rootfd, "shards", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (t->nsfd < 0 || t->shardsfd < 0) {
		rc = -errno;
		goto fail;
	}
	/* an older mtcfs made it 0700: a restore marker pointed into a
	 * directory no trainer but root could pass */
	if (fchmod(t->shardsfd, STORE_DIR_MODE) < 0)
		log_warn("ram", "cannot make %s/shards traversable: %s", t->path, strerror(errno));
	{
		struct stat ns;
		if (fstat(t->nsfd, &ns) == 0)
			ram_set_owner(t, (uint32_t)ns.st_uid, (uint32_t)ns.st_gid, 022);
	}
	snprintf(db, sizeof(db), "%s/db", t->path);
	rc = idx_open(db, false, &t->idx);
	if (rc < 0)
		goto fail;
	if (cap == 0) {
		struct statvfs sv;
		if (fstatvfs(t->rootfd, &sv) == 0)
			cap = (uint64_t)sv.f_bavail * sv.f_frsize;
	}
	t->cap = cap;
	finish_drops(t);
	migrate_frags(t);
	sweep_shards(t);
	scan_parity(t);
	ram_recount(t);
	if ((uint64_t)atomic_load(&t->used) > cap)
		log_warn("ram", "RAMDIR already holds %llu bytes, more than ram_size=%llu",
			 (unsigned long long)atomic_load(&t->used), (unsigned long long)cap);
	*out = t;
	return 0;
fail:
	ram_close(t);
	return rc;
}

/* Crash injection for the tests: MTCFS_TEST_CRASH=NAME kills the process
 * at the point of that name (drop-marked: a drop marked its record, no file
 * gone yet; seal-started: a seal began, its record still SH_SEALING). */
static void crash_point(const char *name)
{
	const char *v = getenv("MTCFS_TEST_CRASH");
	if (v && !strcmp(v, name))
		raise(SIGKILL);
}

static bool key_eq(const struct shard_key *a, const struct shard_key *b)
{
	return a->step == b->step && a->rank == b->rank && a->worker == b->worker &&
	       !strcmp(a->job, b->job);
}

static ssize_t busy_find(const struct ram_tier *t, const struct shard_key *k)
{
	for (size_t i = 0; i < t->nbusy; i++)
		if (key_eq(&t->busy[i], k))
			return (ssize_t)i;
	return -1;
}

/* Take k for a seal, publish or drop, waiting while another one holds it.
 * 0 or -ENOMEM. */
static int key_lock(struct ram_tier *t, const struct shard_key *k)
{
	int rc = 0;

	pthread_mutex_lock(&t->keys_mu);
	while (busy_find(t, k) >= 0) {
		if (ram_test_hook)
			ram_test_hook("key-wait", k);
		pthread_cond_wait(&t->keys_cv, &t->keys_mu);
	}
	if (t->nbusy == t->capbusy) {
		size_t ncap = t->capbusy ? 2 * t->capbusy : 8;
		struct shard_key *nb = realloc(t->busy, ncap * sizeof(*nb));
		if (!nb) {
			rc = -ENOMEM;
			goto out;
		}
		t->busy = nb;
		t->capbusy = ncap;
	}
	t->busy[t->nbusy++] = *k;
out:
	pthread_mutex_unlock(&t->keys_mu);
	return rc;
}

static void key_unlock(struct ram_tier *t, const struct shard_key *k)
{
	ssize_t i;

	pthread_mutex_lock(&t->keys_mu);
	i = busy_find(t, k);
	if (i >= 0)
		t->busy[i] = t->busy[--t->nbusy];
	pthread_cond_broadcast(&t->keys_cv);
	pthread_mutex_unlock(&t->keys_mu);
}

/* Remove the now empty STEP and JOB directories above rel ("JOB/STEP/nR-wW"),
 * as far as they are empty. rel is modified. */
static void tidy_parents(struct ram_tier *t, char *rel)
{
	char *slash;
	while ((slash = strrchr(rel, '/')) != NULL) {
		*slash = '\0';
		if (unlinkat(t->shardsfd, rel, AT_REMOVEDIR) < 0)
			break;
	}
}

/* A drop that a crash interrupted (its record still SH_DROPPING): delete
 * the rest of its files, then the record. Start-up only. */
static void finish_drops(struct ram_tier *t)
{
	struct shard_key *keys = NULL;
	size_t n = 0;

	if (idx_list_dropping(t->idx, &keys, &n) < 0)
		return;
	for (size_t i = 0; i < n; i++) {
		char rel[PATH_MAX];
		int rc;
		if (ram_shard_relpath(&keys[i], rel, sizeof(rel)) < 0)
			continue;
		log_info("ram", "finishing the drop of %s, interrupted when mtcfs stopped", rel);
		rc = util_rmtree_at(t->shardsfd, rel, NULL);
		if (rc < 0) {
			log_err("ram", "cannot remove %s: %s", rel, strerror(-rc));
			continue;
		}
		tidy_parents(t, rel);
		life_drop_done(t->idx, &keys[i]);
	}
	free(keys);
}

/* Does the shard directory JOB/STEP/name belong to a catalog record? Any
 * answer but "no record" (a catalog error) keeps it. */
static bool shard_dir_orphan(struct ram_tier *t, const char *job, const char *step,
			     const char *name)
{
	struct shard_rec rec = { 0 };
	struct shard_key k = { 0 };
	char again[64];
	int rc;

	if (strlen(job) > IDX_JOB_MAX || !util_is_step_name(step, &k.step))
		return true;   /* nothing the tier ever makes */
	if (!strcmp(name, RAM_PARITY_DIR)) {
		k.rank = k.worker = IDX_PARITY;
		snprintf(again, sizeof(again), "%s", RAM_PARITY_DIR);
	} else if (sscanf(name, "n%u-w%u", &k.rank, &k.worker) != 2) {
		return true;
	} else {
		snprintf(again, sizeof(again), "n%u-w%u", k.rank, k.worker);
	}
	if (strcmp(again, name) || (snprintf(again, sizeof(again), "%llu",
					     (unsigned long long)k.step), strcmp(again, step)))
		return true;   /* "n01-w0", "007": not a name ram_shard_relpath gives */
	memcpy(k.job, job, strlen(job) + 1);
	rc = idx_get_shard(t->idx, &k, &rec);
	idx_rec_clear(&rec);
	return rc == -ENOENT;
}

/* Start-up, before anything seals or stages: under shards/JOB/STEP/,
 *  - staging directories (".nR-wW.staging", ".nR-wW.in-PID-SEQ") left by a
 *    crash are never part of a shard;
 *  - a shard directory that no catalog record names (a publish or drop cut
 *    short by a crash) is data nothing can reach, counted in ram_used;
 * both are removed, and STEP and JOB directories left empty. */
/* One STEP directory (sfd) of JOB: its unfinished and orphan shard
 * directories go. */
static void sweep_step(struct ram_tier *t, const char *job, const char *step, int sfd)
{
	const struct dirent *ke;
	struct walk_dir kd;

	if (walk_dir_open(&kd, sfd) < 0)
		return;
	while ((ke = walk_dir_next(&kd)) != NULL) {
		if (ke->d_name[0] == '.') {
			log_info("ram", "removing unfinished %s/%s/%s", job, step, ke->d_name);
		} else if (shard_dir_orphan(t, job, step, ke->d_name)) {
			log_warn("ram", "removing %s/%s/%s: no catalog record names it (left by a crash)",
				 job, step, ke->d_name);
		} else {
			continue;
		}
		util_rmtree_at(sfd, ke->d_name, NULL);
	}
	walk_dir_close(&kd);
}

static void sweep_shards(struct ram_tier *t)
{
	const struct dirent *je, *se;
	struct walk_dir jd, sd;

	if (walk_dir_open(&jd, t->shardsfd) < 0)
		return;
	while ((je = walk_dir_next(&jd)) != NULL) {
		int jfd;
		if (je->d_name[0] == '.')
			continue;
		jfd = openat(t->shardsfd, je->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (jfd < 0)
			continue;
		if (walk_dir_open(&sd, jfd) < 0) {
			close(jfd);
			continue;
		}
		fchmod(jfd, STORE_DIR_MODE);   /* 0700 from an older mtcfs */
		while ((se = walk_dir_next(&sd)) != NULL) {
			int sfd;
			if (se->d_name[0] == '.')
				continue;
			sfd = openat(jfd, se->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (sfd < 0)
				continue;
			fchmod(sfd, STORE_DIR_MODE);
			sweep_step(t, je->d_name, se->d_name, sfd);
			close(sfd);
			unlinkat(jfd, se->d_name, AT_REMOVEDIR);   /* if now empty */
		}
		walk_dir_close(&sd);
		close(jfd);
		unlinkat(t->shardsfd, je->d_name, AT_REMOVEDIR);
	}
	walk_dir_close(&jd);
}

void ram_close(struct ram_tier *t)
{
	if (!t)
		return;
	idx_close(t->idx);
	if (t->shardsfd >= 0)
		close(t->shardsfd);
	if (t->nsfd >= 0)
		close(t->nsfd);
	if (t->rootfd >= 0)
		close(t->rootfd);
	pthread_mutex_destroy(&t->reclaim_mu);
	pthread_mutex_destroy(&t->keys_mu);
	pthread_cond_destroy(&t->keys_cv);
	pthread_mutex_destroy(&t->owner_mu);
	free(t->busy);
	free(t->path);
	free(t);
}

void ram_set_owner(struct ram_tier *t, uint32_t uid, uint32_t gid, uint32_t umask)
{
	pthread_mutex_lock(&t->owner_mu);
	t->owner = (struct mf_owner){ uid, gid, umask & 077 };
	pthread_mutex_unlock(&t->owner_mu);
}

static struct mf_owner owner_of(struct ram_tier *t)
{
	struct mf_owner o;

	pthread_mutex_lock(&t->owner_mu);
	o = t->owner;
	pthread_mutex_unlock(&t->owner_mu);
	return o;
}

void ram_set_reclaim(struct ram_tier *t, ram_reclaim_fn fn, void *arg)
{
	t->reclaim = fn;
	t->reclaim_arg = arg;
}

int ram_ns_fd(const struct ram_tier *t) { return t->nsfd; }
int ram_root_fd(const struct ram_tier *t) { return t->rootfd; }
struct idx *ram_idx(const struct ram_tier *t) { return t->idx; }
const char *ram_path(const struct ram_tier *t) { return t->path; }
uint64_t ram_cap(const struct ram_tier *t) { return t->cap; }
uint64_t ram_used(const struct ram_tier *t)
{
	int64_t u = atomic_load(&((struct ram_tier *)t)->used);
	return u < 0 ? 0 : (uint64_t)u;
}

void ram_adjust(struct ram_tier *t, int64_t delta)
{
	atomic_fetch_add(&t->used, delta);
}

static bool try_take(struct ram_tier *t, uint64_t bytes)
{
	int64_t cur = atomic_load(&t->used);
	for (;;) {
		if (cur + (int64_t)bytes > (int64_t)t->cap)
			return false;
		if (atomic_compare_exchange_weak(&t->used, &cur, cur + (int64_t)bytes))
			return true;
	}
}

int ram_reserve(struct ram_tier *t, uint64_t bytes)
{
	if (bytes == 0 || try_take(t, bytes))
		return 0;
	if (bytes > t->cap)
		return -ENOSPC;
	/* Slow path: let policy free space, one reclaimer at a time. */
	pthread_mutex_lock(&t->reclaim_mu);
	if (!try_take(t, bytes) && t->reclaim) {
		t->reclaim(t->reclaim_arg, bytes);
	}
	if (try_take(t, bytes)) {
		pthread_mutex_unlock(&t->reclaim_mu);
		return 0;
	}
	pthread_mutex_unlock(&t->reclaim_mu);
	return -ENOSPC;
}

/* ---- counting every inode once ---- */

struct inoset { uint64_t *v; size_t cap, n; };

static bool inoset_add(struct inoset *s, uint64_t ino)
{
	size_t i;
	if (s->n * 2 >= s->cap) {
		struct inoset ns = { calloc(s->cap ? s->cap * 2 : 1024, sizeof(uint64_t)),
				     s->cap ? s->cap * 2 : 1024, 0 };
		if (!ns.v)
			return true;
		for (i = 0; i < s->cap; i++)
			if (s->v[i])
				inoset_add(&ns, s->v[i]);
		free(s->v);
		*s = ns;
	}
	ino = ino ? ino : 1;
	for (i = (ino * 0x9e3779b97f4a7c15ULL) & (s->cap - 1); s->v[i]; i = (i + 1) & (s->cap - 1))
		if (s->v[i] == ino)
			return false;
	s->v[i] = ino;
	s->n++;
	return true;
}

/* Deeper than this, a recount leaves a tree's bytes uncounted rather than
 * hold more descriptors: shards are at most MF_MAX_DEPTH deep, and only an
 * application's own uncommitted tree in the namespace can go further. */
#define RECOUNT_MAX_DEPTH 256u

struct count_ctx {
	struct inoset *seen;
	uint64_t total;
	bool deep;
};

static int count_cb(void *arg, const struct walk_ent *e)
{
	struct count_ctx *c = arg;

	if (S_ISDIR(e->st->st_mode) && e->depth >= RECOUNT_MAX_DEPTH) {
		c->deep = true;
		return WALK_SKIP;
	}
	if (S_ISREG(e->st->st_mode) &&
	    (e->st->st_nlink == 1 || inoset_add(c->seen, (uint64_t)e->st->st_ino)))
		c->total += (uint64_t)e->st->st_blocks * 512;
	return 0;
}

static uint64_t count_tree(int dirfd, struct inoset *seen)
{
	struct count_ctx c = { .seen = seen };
	int rc = walk_tree(dirfd, RECOUNT_MAX_DEPTH, WALK_NOPATH, count_cb, &c);

	if (rc < 0)
		log_warn("ram", "counting RAMDIR: %s (the count may be low)", strerror(-rc));
	if (c.deep)
		log_warn("ram", "RAMDIR holds a tree deeper than %u levels: the bytes below are not counted",
			 RECOUNT_MAX_DEPTH);
	return c.total;
}

void ram_recount(struct ram_tier *t)
{
	struct inoset seen = { 0 };
	/* parity holdings are under shards/ too */
	uint64_t total = count_tree(t->nsfd, &seen) + count_tree(t->shardsfd, &seen);
	free(seen.v);
	atomic_store(&t->used, (int64_t)total);
}

/* ---- shards ---- */

int ram_shard_relpath(const struct shard_key *k, char *buf, size_t len)
{
	if (life_is_parity(k)) {
		if ((size_t)snprintf(buf, len, "%s/%llu/%s", k->job, (unsigned long long)k->step,
				     RAM_PARITY_DIR) >= len)
			return -ENAMETOOLONG;
		return 0;
	}
	if ((size_t)snprintf(buf, len, "%s/%llu/n%u-w%u", k->job, (unsigned long long)k->step,
			     k->rank, k->worker) >= len)
		return -ENAMETOOLONG;
	return 0;
}

int ram_shard_open(struct ram_tier *t, const struct shard_key *k)
{
	char rel[PATH_MAX];
	int fd, rc = ram_shard_relpath(k, rel, sizeof(rel));
	if (rc < 0)
		return rc;
	fd = openat(t->shardsfd, rel, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

int ram_shard_walk(struct ram_tier *t, const struct shard_key *k, struct walk_dir *d)
{
	int sfd = ram_shard_open(t, k), rc;

	if (sfd < 0)
		return sfd;
	rc = walk_dir_open(d, sfd);
	close(sfd);   /* the walk reads its own open of the directory */
	return rc;
}

/* mkdir -p parent, then mkdir staging in it. Tidying after a drop or an
 * aborted stage removes empty STEP and JOB directories concurrently, so a
 * parent made a moment ago may be gone again: retry. Once the staging
 * directory exists, its parents are not empty and stay. */
static int make_staging(struct ram_tier *t, const char *parent, const char *staging, mode_t mode)
{
	int rc = 0;
	for (int attempt = 0; attempt < 64; attempt++) {
		/* either step can find a directory gone: JOB between making it and
		 * making STEP in it, STEP before the staging directory pins it */
		rc = util_mkdirs_at(t->shardsfd, parent, STORE_DIR_MODE);
		if (rc == 0 && mkdirat(t->shardsfd, staging, mode) == 0)
			return 0;
		if (rc == 0)
			rc = -errno;
		if (rc != -ENOENT)
			return rc;
	}
	return rc;
}

/* What the daemon made in a shard belongs to whoever owned the original
 * (the trainer that wrote it: a restore hands it back to that uid). A
 * daemon that is not root cannot, and owns everything itself. */
static int own_like(int dirfd, const char *path, int flags, const struct stat *st)
{
	if (fchownat(dirfd, path, st->st_uid, st->st_gid, flags | AT_SYMLINK_NOFOLLOW) < 0 &&
	    (errno != EPERM || geteuid() == 0))
		return -errno;
	return 0;
}

/* Mirror src into dst: directories made, files hard-linked, symlinks copied
 * (walk_tree callback; paths relative to dst). Directories, symlinks and
 * FIFOs get the original's owner; directories its mode without setuid and
 * setgid (mkdir takes neither from its mode, nor inherits setgid here). */
static int link_cb(void *arg, const struct walk_ent *e)
{
	int dst = *(const int *)arg;
	const struct stat *st = e->st;

	if (S_ISDIR(st->st_mode)) {
		if (mkdirat(dst, e->path, st->st_mode & 07777) < 0 && errno != EEXIST)
			return -errno;
		return own_like(dst, e->path, 0, st);
	} else if (S_ISREG(st->st_mode)) {
		if (linkat(e->dirfd, e->name, dst, e->path, 0) < 0)
			return -errno;
	} else if (S_ISLNK(st->st_mode)) {
		char tgt[PATH_MAX];
		ssize_t l = readlinkat(e->dirfd, e->name, tgt, sizeof(tgt) - 1);
		if (l < 0)
			return -errno;
		tgt[l] = 0;
		if (symlinkat(tgt, dst, e->path) < 0)
			return -errno;
		return own_like(dst, e->path, 0, st);
	} else if (S_ISFIFO(st->st_mode)) {
		/* a FIFO of its own, not a link: the shard keeps only its mode,
		 * exactly (fchmodat: mkfifoat is subject to the umask), and its
		 * owner (chown first: it would clear nothing, but keep order) */
		if (mkfifoat(dst, e->path, st->st_mode & 0777) < 0 || own_like(dst, e->path, 0, st) < 0 ||
		    fchmodat(dst, e->path, st->st_mode & 0777, 0) < 0)
			return -errno;
	}
	return 0;
}

/* As deep as a shard may be (MF_MAX_DEPTH): -ELOOP beyond. */
static int link_tree(int src, int dst)
{
	return walk_tree(src, MF_MAX_DEPTH, 0, link_cb, &dst);
}

/* The committed tree cannot be a shard (why): record the step as SH_BAD,
 * without a manifest, so that nothing tries to seal it again (after a
 * restart neither), and remove an older copy under the same key, which the
 * record no longer describes. */
static void record_unsealable(struct ram_tier *t, const struct shard_key *k, const char *rel,
			      uint64_t ns_ino, uint32_t rec_flags, const char *why)
{
	uint64_t freed = 0;
	int rc;

	log_err("ram", "job=%s step=%llu rank=%u cannot be sealed: %s; marked bad", k->job,
		(unsigned long long)k->step, k->rank, why);
	util_rmtree_at(t->shardsfd, rel, &freed);
	ram_adjust(t, -(int64_t)freed);
	rc = life_unsealable(t->idx, k, rec_flags, ns_ino);
	if (rc < 0)
		log_err("ram", "cannot record job=%s step=%llu as bad: %s", k->job,
			(unsigned long long)k->step, strerror(-rc));
}

static int seal_locked(struct ram_tier *t, const struct shard_key *k, int src_dirfd,
		       uint64_t ns_ino, uint32_t rec_flags, struct manifest **mfp, char *err,
		       size_t errlen)
{
	char rel[PATH_MAX], parent[PATH_MAX], staging[PATH_MAX], why[512] = "";
	struct manifest *mf = NULL;
	struct stat st;
	int sfd = -1, rc;
	uint64_t freed = 0;
	char *slash;

	crash_point("seal-started");
	rc = ram_shard_relpath(k, rel, sizeof(rel));
	if (rc < 0)
		return rc;
	memcpy(parent, rel, sizeof(rel));
	slash = strrchr(parent, '/');
	*slash = '\0';
	if ((size_t)snprintf(staging, sizeof(staging), "%s/.%s.staging", parent, slash + 1) >=
	    sizeof(staging))
		return -ENAMETOOLONG;
	util_rmtree_at(t->shardsfd, staging, NULL);
	if (fstat(src_dirfd, &st) < 0) {
		rc = -errno;
		goto out;
	}
	rc = make_staging(t, parent, staging, st.st_mode & 07777);
	if (rc < 0)
		goto out;
	sfd = openat(t->shardsfd, staging, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (sfd < 0) {
		rc = -errno;
		goto out;
	}
	/* the shard directory is the step directory's copy: its owner too */
	rc = own_like(sfd, "", AT_EMPTY_PATH, &st);
	if (rc < 0)
		goto out;
	rc = link_tree(src_dirfd, sfd);
	if (rc < 0) {
		rc = mf_refusal(rc, why, sizeof(why));
		goto out;
	}
	rc = mf_build_err(sfd, &mf, why, sizeof(why));
	if (rc < 0)
		goto out;
	/* A re-commit of the same step replaces the previous shard. */
	rc = util_rmtree_at(t->shardsfd, rel, &freed);
	if (rc < 0)
		goto out;
	ram_adjust(t, -(int64_t)freed);
	if (renameat(t->shardsfd, staging, t->shardsfd, rel) < 0) {
		rc = -errno;
		goto out;
	}
	rc = life_committed(t->idx, k, mf, rec_flags, ns_ino);
out:
	if (sfd >= 0)
		close(sfd);
	if (rc < 0) {
		util_rmtree_at(t->shardsfd, staging, NULL);
		mf_free(mf);
		if (rc == -EBADMSG)
			record_unsealable(t, k, rel, ns_ino, rec_flags, why);
		if (err && errlen)
			snprintf(err, errlen, "%s", why[0] ? why : strerror(-rc));
		return rc;
	}
	if (mfp)
		*mfp = mf;
	else
		mf_free(mf);
	return 0;
}

int ram_seal(struct ram_tier *t, const struct shard_key *k, int src_dirfd,
	     uint64_t ns_ino, uint32_t rec_flags, struct manifest **mfp, char *err, size_t errlen)
{
	int rc = key_lock(t, k);

	if (rc < 0)
		return rc;
	rc = seal_locked(t, k, src_dirfd, ns_ino, rec_flags, mfp, err, errlen);
	key_unlock(t, k);
	return rc;
}

static int drop_locked(struct ram_tier *t, const struct shard_key *k, uint64_t *freedp)
{
	char rel[PATH_MAX];
	uint64_t freed = 0;
	int rc = ram_shard_relpath(k, rel, sizeof(rel));
	bool marked;

	if (rc < 0)
		return rc;
	/* mark, delete the files, forget: a crash in between leaves a record
	 * that the next start finishes (finish_drops), never files that no
	 * record names */
	rc = life_drop_mark(t->idx, k);
	if (rc < 0 && rc != -ENOENT)
		return rc;
	marked = rc == 0;
	crash_point("drop-marked");
	if (ram_test_hook)
		ram_test_hook("drop-marked", k);
	rc = util_rmtree_at(t->shardsfd, rel, &freed);
	ram_adjust(t, -(int64_t)freed);
	if (freedp)
		*freedp += freed;
	if (rc < 0) {
		log_err("ram", "dropping %s: %s (finished at the next start)", rel, strerror(-rc));
		return rc;
	}
	tidy_parents(t, rel);
	if (marked)
		life_drop_done(t->idx, k);
	return 0;
}

int ram_drop(struct ram_tier *t, const struct shard_key *k, uint64_t *freedp)
{
	int rc = key_lock(t, k);

	if (rc < 0)
		return rc;
	rc = drop_locked(t, k, freedp);
	key_unlock(t, k);
	return rc;
}

int ram_verify(struct ram_tier *t, const struct shard_key *k, char *err, size_t errlen)
{
	struct shard_rec rec = { 0 };
	struct manifest *mf = NULL;
	int fd = -1, rc;

	rc = idx_get_shard(t->idx, k, &rec);
	if (rc < 0)
		return rc;
	if (!rec.mf) {
		snprintf(err, errlen, "no manifest (state %s)", shard_state_name(rec.state));
		rc = -EBADMSG;
		goto out;
	}
	rc = mf_decode(rec.mf, rec.mflen, &mf);
	if (rc < 0) {
		snprintf(err, errlen, "manifest in catalog does not decode");
		goto out;
	}
	fd = ram_shard_open(t, k);
	if (fd < 0) {
		snprintf(err, errlen, "shard directory missing");
		rc = -EBADMSG;
		goto out;
	}
	rc = mf_verify(fd, mf, err, errlen);
out:
	if (fd >= 0)
		close(fd);
	mf_free(mf);
	idx_rec_clear(&rec);
	return rc;
}

int ram_own(struct ram_tier *t, const struct shard_key *k)
{
	struct shard_rec rec = { 0 };
	struct manifest *mf = NULL;
	char why[300] = "";
	int fd = -1, rc;

	rc = idx_get_shard(t->idx, k, &rec);
	if (rc == 0 && !rec.mf)
		rc = -EBADMSG;
	if (rc == 0)
		rc = mf_decode(rec.mf, rec.mflen, &mf);
	if (rc == 0 && mf->owners)
		goto out;   /* sealed with its owners (own_like): nothing to do */
	if (rc == 0 && (fd = ram_shard_open(t, k)) < 0)
		rc = fd;
	/* an older mtcfs made the directories as root; its files are hard
	 * links of the writer's, with their owners */
	if (rc == 0) {
		/* the modes are the writer's own: no umask on them */
		struct mf_owner o = owner_of(t);
		o.umask = 0;
		rc = mf_apply_owners(fd, mf, &o, MF_OWN_NOT_FILES, why, sizeof(why));
	}
	if (rc < 0 && rc != -ENOENT)
		log_err("ram", "job=%s step=%llu rank=%u: cannot give the shard its owners: %s",
			k->job, (unsigned long long)k->step, k->rank, why[0] ? why : strerror(-rc));
out:
	if (fd >= 0)
		close(fd);
	mf_free(mf);
	idx_rec_clear(&rec);
	return rc;
}

/* Sizes only (start-up): see ramtier.h. */
int ram_check_sizes(struct ram_tier *t, const struct shard_rec *r, char *err, size_t errlen)
{
	struct manifest *mf = NULL;
	int fd, rc = mf_decode(r->mf, r->mflen, &mf);

	if (rc < 0) {
		snprintf(err, errlen, "manifest does not decode");
		return rc;
	}
	fd = ram_shard_open(t, &r->key);
	if (fd < 0) {
		snprintf(err, errlen, "shard directory missing");
		mf_free(mf);
		return -EBADMSG;
	}
	for (size_t i = 0; i < mf->n && rc == 0; i++) {
		struct stat st;
		if (fstatat(fd, mf->e[i].path, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			snprintf(err, errlen, "%s missing", mf->e[i].path);
			rc = -EBADMSG;
		} else if (mf->e[i].type == MF_FILE && (uint64_t)st.st_size != mf->e[i].size) {
			snprintf(err, errlen, "%s has %lld bytes, manifest says %llu", mf->e[i].path,
				 (long long)st.st_size, (unsigned long long)mf->e[i].size);
			rc = -EBADMSG;
		}
	}
	close(fd);
	mf_free(mf);
	return rc;
}

int ram_stage_begin(struct ram_tier *t, const struct shard_key *k, struct ram_stage *st)
{
	static _Atomic unsigned seq;
	char rel[PATH_MAX], parent[PATH_MAX];
	char *slash;
	int rc;

	memset(st, 0, sizeof(*st));
	st->fd = -1;
	st->key = *k;
	rc = ram_shard_relpath(k, rel, sizeof(rel));
	if (rc < 0)
		return rc;
	memcpy(parent, rel, sizeof(rel));
	slash = strrchr(parent, '/');
	*slash = '\0';
	if ((size_t)snprintf(st->rel, sizeof(st->rel), "%s/.%s.in-%d-%u", parent, slash + 1,
			     (int)getpid(), atomic_fetch_add(&seq, 1)) >= sizeof(st->rel))
		return -ENAMETOOLONG;
	rc = make_staging(t, parent, st->rel, 0755);
	if (rc < 0)
		return rc;
	st->fd = openat(t->shardsfd, st->rel, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (st->fd < 0) {
		rc = -errno;
		unlinkat(t->shardsfd, st->rel, AT_REMOVEDIR);
		return rc;
	}
	return 0;
}

void ram_stage_abort(struct ram_tier *t, struct ram_stage *st)
{
	uint64_t freed = 0;
	if (st->fd >= 0)
		close(st->fd);
	st->fd = -1;
	if (st->rel[0]) {
		char *slash;
		util_rmtree_at(t->shardsfd, st->rel, &freed);
		ram_adjust(t, -(int64_t)freed);
		/* and the STEP and JOB directories if that left them empty */
		while ((slash = strrchr(st->rel, '/')) != NULL) {
			*slash = '\0';
			if (unlinkat(t->shardsfd, st->rel, AT_REMOVEDIR) < 0)
				break;
		}
	}
	st->rel[0] = '\0';
}

static int publish_locked(struct ram_tier *t, struct ram_stage *st, const struct manifest *mf,
			  uint32_t flags)
{
	char rel[PATH_MAX], why[300] = "";
	uint64_t freed = 0;
	int rc;

	for (size_t i = 0; i < mf->n; i++) {
		struct stat sb;
		if (fstatat(st->fd, mf->e[i].path, &sb, AT_SYMLINK_NOFOLLOW) < 0)
			return -EBADMSG;
		if (mf->e[i].type == MF_FILE && (!S_ISREG(sb.st_mode) || (uint64_t)sb.st_size != mf->e[i].size))
			return -EBADMSG;
		if (mf->e[i].type == MF_FIFO && !S_ISFIFO(sb.st_mode))
			return -EBADMSG;
	}
	rc = ram_shard_relpath(&st->key, rel, sizeof(rel));
	if (rc < 0)
		return rc;
	/* the copy is the writer's, as the one it was sealed from (the
	 * manifest's owners, else this job's writer: ram_set_owner) */
	{
		struct mf_owner o = owner_of(t);
		rc = mf_apply_owners(st->fd, mf, &o, 0, why, sizeof(why));
	}
	if (rc < 0) {
		log_err("ram", "publishing %s: %s", rel, why);
		return rc;
	}
	/* the old copy (if any) goes first: its record, then its files */
	life_forget(t->idx, &st->key);
	util_rmtree_at(t->shardsfd, rel, &freed);
	ram_adjust(t, -(int64_t)freed);
	if (renameat(t->shardsfd, st->rel, t->shardsfd, rel) < 0)
		return -errno;
	close(st->fd);
	st->fd = -1;
	st->rel[0] = '\0';
	return life_committed(t->idx, &st->key, mf, flags, 0);
}

int ram_stage_publish(struct ram_tier *t, struct ram_stage *st, const struct manifest *mf,
		      uint32_t flags)
{
	struct shard_key k = st->key;
	int rc = key_lock(t, &k);

	if (rc < 0)
		return rc;
	rc = publish_locked(t, st, mf, flags);
	key_unlock(t, &k);
	return rc;
}

int ram_stage_link(struct ram_tier *t, struct ram_stage *st, const struct shard_key *from)
{
	int fd = ram_shard_open(t, from), rc;
	if (fd < 0)
		return fd;
	rc = link_tree(fd, st->fd);
	close(fd);
	return rc;
}

int ram_find_hash(struct ram_tier *t, const uint8_t hash[32], struct shard_key *out)
{
	struct shard_rec *recs = NULL;
	size_t n = 0;
	int rc = idx_list_shards(t->idx, NULL, &recs, &n);

	if (rc < 0)
		return rc;
	rc = -ENOENT;
	for (size_t i = n; i-- > 0;) {
		if (recs[i].state >= SH_COMMITTED && recs[i].state != SH_BAD && recs[i].mf &&
		    !memcmp(recs[i].hash, hash, 32)) {
			*out = recs[i].key;
			rc = 0;
			break;
		}
	}
	idx_recs_free(recs, n);
	return rc;
}

/* ---- erasure-code holdings (SHF_PARITY records) ---- */

int ram_parity_open(struct ram_tier *t, const char *job, uint64_t step, bool create)
{
	struct shard_key k;
	char rel[PATH_MAX], parent[PATH_MAX];
	int fd, rc;

	if (!job_name_ok(job))
		return -EINVAL;
	life_parity_key(job, step, &k);
	rc = ram_shard_relpath(&k, rel, sizeof(rel));
	if (rc < 0)
		return rc;
	if (!create) {
		fd = openat(t->shardsfd, rel, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		return fd < 0 ? -errno : fd;
	}
	/* the record first, then the directory, under k (a drop of the step
	 * in between would leave a directory no record names) */
	rc = key_lock(t, &k);
	if (rc < 0)
		return rc;
	rc = life_parity_begin(t->idx, &k);
	snprintf(parent, sizeof(parent), "%s/%llu", job, (unsigned long long)step);
	if (rc == 0) {
		rc = make_staging(t, parent, rel, 0700);
		if (rc == -EEXIST)
			rc = 0;
	}
	fd = rc < 0 ? rc : openat(t->shardsfd, rel, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 && rc == 0)
		fd = -errno;
	key_unlock(t, &k);
	return fd;
}

int ram_pfile_reserve(struct ram_tier *t, int dirfd, uint64_t bytes, struct ram_pfile *f)
{
	int rc;

	memset(f, 0, sizeof(*f));
	f->dirfd = dirfd;
	f->fd = -1;
	rc = ram_reserve(t, bytes);
	if (rc == 0)
		f->reserved = bytes;
	return rc;
}

int ram_pfile_create(struct ram_pfile *f, const char *name, const char *prefix)
{
	static atomic_uint seq;

	if (name) {
		if ((size_t)snprintf(f->name, sizeof(f->name), "%s", name) >= sizeof(f->name))
			return -ENAMETOOLONG;
		f->fd = openat(f->dirfd, f->name, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		return f->fd < 0 ? -errno : 0;
	}
	for (int i = 0; i < 100; i++) {
		unsigned n = atomic_fetch_add(&seq, 1) + 1;
		snprintf(f->name, sizeof(f->name), "%.16s-%d-%u.tmp", prefix, (int)getpid(), n);
		f->fd = openat(f->dirfd, f->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (f->fd >= 0 || errno != EEXIST)
			return f->fd < 0 ? -errno : 0;
	}
	return -EEXIST;
}

/* What the file takes now, and whether it is still linked. */
static uint64_t pfile_blocks(const struct ram_pfile *f, bool *linked)
{
	struct stat st;

	*linked = true;
	if (f->fd < 0 || fstat(f->fd, &st) < 0)
		return 0;
	*linked = st.st_nlink > 0;
	return (uint64_t)st.st_blocks * 512;
}

void ram_pfile_abort(struct ram_tier *t, struct ram_pfile *f)
{
	bool linked;
	uint64_t held = pfile_blocks(f, &linked), back = f->reserved;

	if (f->fd >= 0) {
		if (linked)
			unlinkat(f->dirfd, f->name, 0);
		else   /* its holding's drop removed it and counted what it held */
			back = held < back ? back - held : 0;
		close(f->fd);
	}
	ram_adjust(t, -(int64_t)back);
	f->fd = -1;
	f->reserved = 0;
}

int ram_pfile_publish(struct ram_tier *t, struct ram_pfile *f, const char *final)
{
	bool linked;
	uint64_t held = pfile_blocks(f, &linked), replaced = 0;
	struct stat old;

	if (f->fd < 0)
		return -EBADF;
	/* a file of that name goes with the rename: out of the account too
	 * (its holding's writer is the only one that names it) */
	if (fstatat(f->dirfd, final, &old, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(old.st_mode) &&
	    old.st_nlink == 1)
		replaced = (uint64_t)old.st_blocks * 512;
	if (renameat(f->dirfd, f->name, f->dirfd, final) < 0) {
		int rc = -errno;
		ram_pfile_abort(t, f);
		return rc;
	}
	ram_adjust(t, (int64_t)held - (int64_t)f->reserved - (int64_t)replaced);
	close(f->fd);
	f->fd = -1;
	f->reserved = 0;
	return 0;
}

/* An mtcfs before parity holdings were records kept them in
 * RAMDIR/frags/JOB/STEP/: each such directory becomes its step's holding
 * (record first, then the rename: a crash in between finds the record
 * without its directory, and the directory still in frags/ next time). */
static void migrate_job(struct ram_tier *t, int ffd, const char *job)
{
	const struct dirent *se;
	struct walk_dir sd;
	int jfd = openat(ffd, job, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	if (jfd < 0)
		return;
	if (!job_name_ok(job) || walk_dir_open(&sd, jfd) < 0) {
		close(jfd);
		return;
	}
	while ((se = walk_dir_next(&sd)) != NULL) {
		struct shard_key k;
		char rel[PATH_MAX], parent[PATH_MAX], again[32];
		uint64_t step;
		int rc;

		if (!util_is_step_name(se->d_name, &step) ||
		    (snprintf(again, sizeof(again), "%llu", (unsigned long long)step),
		     strcmp(again, se->d_name)))
			continue;
		life_parity_key(job, step, &k);
		if (ram_shard_relpath(&k, rel, sizeof(rel)) < 0)
			continue;
		snprintf(parent, sizeof(parent), "%s/%llu", job, (unsigned long long)step);
		rc = life_parity_begin(t->idx, &k);
		if (rc == 0)
			rc = util_mkdirs_at(t->shardsfd, parent, STORE_DIR_MODE);
		if (rc == 0 && renameat(jfd, se->d_name, t->shardsfd, rel) < 0)
			rc = -errno;
		if (rc < 0)
			log_warn("ram", "cannot move frags/%s/%s to shards/%s: %s", job, se->d_name, rel,
				 strerror(-rc));
		else
			log_info("ram", "frags/%s/%s (an older mtcfs's layout) is now shards/%s", job,
				 se->d_name, rel);
	}
	walk_dir_close(&sd);
	close(jfd);
}

static void migrate_frags(struct ram_tier *t)
{
	const struct dirent *je;
	struct walk_dir jd;
	int ffd = openat(t->rootfd, "frags", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	if (ffd < 0)
		return;
	if (walk_dir_open(&jd, ffd) == 0) {
		while ((je = walk_dir_next(&jd)) != NULL)
			if (je->d_name[0] != '.')
				migrate_job(t, ffd, je->d_name);
		walk_dir_close(&jd);
	}
	close(ffd);
	/* what could not move is nothing a record names */
	util_rmtree_at(t->rootfd, "frags", NULL);
}

struct parity_scan {
	uint64_t frags, frag_bytes, tmp, tmp_bytes, bad, bad_bytes, steps;
};

static int scan_one(void *arg, int stepfd, const struct ec_stored *s)
{
	struct parity_scan *c = arg;

	if (s->kind == ECS_TMP) {
		/* half written when the daemon stopped: nothing refers to it */
		if (unlinkat(stepfd, s->name, 0) == 0) {
			c->tmp++;
			c->tmp_bytes += s->bytes;
		}
		return 0;
	}
	if (s->kind != ECS_FRAG && s->kind != ECS_META)
		return 0;
	if (s->verdict == 0) {
		if (s->kind == ECS_FRAG) {
			c->frags++;
			c->frag_bytes += s->bytes;
		}
		return 0;
	}
	/* never served or used: the step is not protected here any more (the
	 * coordinator stops counting this node's parity of it; a restore of
	 * the step rebuilds what is missing, as after a cut-short encoding) */
	log_warn("ram", "ec: job=%s step=%llu: %s is corrupt (%s): removed, the step's parity on this node is incomplete",
		 s->job, (unsigned long long)s->step, s->name, s->why);
	if (unlinkat(stepfd, s->name, 0) == 0) {
		c->bad++;
		c->bad_bytes += s->bytes;
	}
	unlinkat(stepfd, "protected", 0);
	return 0;
}

/* Start-up, after the sweep: every parity holding's files are checked
 * (headers and trailers: a payload is checked by every restore that uses
 * it, and by mtcfs-admin verify); half-written and corrupt ones go (the
 * recount that follows gives their RAM back); a record whose directory is
 * gone is forgotten. */
static void scan_parity(struct ram_tier *t)
{
	struct parity_scan c = { 0 };
	struct shard_rec *recs = NULL;
	size_t n = 0;

	if (idx_list_records(t->idx, NULL, &recs, &n) < 0)
		return;
	for (size_t i = 0; i < n; i++) {
		const struct shard_key *k = &recs[i].key;
		int fd, rc;
		if (!life_is_parity(k))
			continue;
		c.steps++;
		fd = ram_shard_open(t, k);
		if (fd < 0) {
			log_info("ram", "ec: job=%s step=%llu: the parity holding's directory is missing: record forgotten",
				 k->job, (unsigned long long)k->step);
			life_forget(t->idx, k);
			continue;
		}
		rc = ec_stored_walk_dir(fd, k->job, k->step, EC_CHECK_HEAD, scan_one, &c);
		if (rc < 0)
			log_warn("ram", "ec: start-up scan of job=%s step=%llu: %s", k->job,
				 (unsigned long long)k->step, strerror(-rc));
		close(fd);
	}
	idx_recs_free(recs, n);
	if (c.steps)
		log_info("ram", "ec: start-up scan: %llu parity fragments in %llu job steps (%llu bytes); removed %llu half-written files (%llu bytes) and %llu corrupt ones",
			 (unsigned long long)c.frags, (unsigned long long)c.steps,
			 (unsigned long long)c.frag_bytes, (unsigned long long)c.tmp,
			 (unsigned long long)c.tmp_bytes, (unsigned long long)c.bad);
}
