#include "tiers/ramtier.h"
#include "common/log.h"
#include "common/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
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
	_Atomic int64_t used;
	pthread_mutex_t reclaim_mu;   /* serialises reclaim; taken before nothing else */
	ram_reclaim_fn reclaim;
	void *reclaim_arg;
};

static void remove_stale_staging(struct ram_tier *t);

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
	    (mkdirat(t->rootfd, "shards", 0700) < 0 && errno != EEXIST)) {
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
	remove_stale_staging(t);
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

/* Staging directories (".nR-wW.staging", ".nR-wW.in-*") left by a crash
 * are never part of a shard: remove them (JOB/STEP/.name). */
static void remove_stale_staging(struct ram_tier *t)
{
	DIR *jd = NULL;
	struct dirent *je;
	int fd = dup(t->shardsfd);

	if (fd < 0 || !(jd = fdopendir(fd))) {
		if (fd >= 0)
			close(fd);
		return;
	}
	while ((je = readdir(jd)) != NULL) {
		int jfd;
		DIR *sd;
		struct dirent *se;
		if (je->d_name[0] == '.')
			continue;
		jfd = openat(t->shardsfd, je->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (jfd < 0)
			continue;
		sd = fdopendir(jfd);
		if (!sd) {
			close(jfd);
			continue;
		}
		while ((se = readdir(sd)) != NULL) {
			int sfd;
			DIR *kd;
			struct dirent *ke;
			if (se->d_name[0] == '.')
				continue;
			sfd = openat(jfd, se->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (sfd < 0)
				continue;
			kd = fdopendir(sfd);
			if (!kd) {
				close(sfd);
				continue;
			}
			while ((ke = readdir(kd)) != NULL) {
				if (ke->d_name[0] != '.' || !strcmp(ke->d_name, ".") || !strcmp(ke->d_name, ".."))
					continue;
				log_info("ram", "removing unfinished %s/%s/%s", je->d_name, se->d_name, ke->d_name);
				util_rmtree_at(sfd, ke->d_name, NULL);
			}
			closedir(kd);
		}
		closedir(sd);
	}
	closedir(jd);
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
	free(t->path);
	free(t);
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

static uint64_t count_tree(int dirfd, struct inoset *seen)
{
	uint64_t total = 0;
	struct dirent *de;
	DIR *d;
	int fd = dup(dirfd);

	if (fd < 0)
		return 0;
	d = fdopendir(fd);
	if (!d) {
		close(fd);
		return 0;
	}
	rewinddir(d);
	while ((de = readdir(d)) != NULL) {
		struct stat st;
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (fstatat(dirfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue;
		if (S_ISDIR(st.st_mode)) {
			int sub = openat(dirfd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (sub >= 0) {
				total += count_tree(sub, seen);
				close(sub);
			}
		} else if (S_ISREG(st.st_mode)) {
			if (st.st_nlink == 1 || inoset_add(seen, (uint64_t)st.st_ino))
				total += (uint64_t)st.st_blocks * 512;
		}
	}
	closedir(d);
	return total;
}

void ram_recount(struct ram_tier *t)
{
	struct inoset seen = { 0 };
	uint64_t total = count_tree(t->nsfd, &seen) + count_tree(t->shardsfd, &seen);
	free(seen.v);
	atomic_store(&t->used, (int64_t)total);
}

/* ---- shards ---- */

int ram_shard_relpath(const struct shard_key *k, char *buf, size_t len)
{
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
		rc = util_mkdirs_at(t->shardsfd, parent, 0700);
		if (rc == 0 && mkdirat(t->shardsfd, staging, mode) == 0)
			return 0;
		if (rc == 0)
			rc = -errno;
		if (rc != -ENOENT)
			return rc;
	}
	return rc;
}

/* Mirror src into dst: directories made, files hard-linked, symlinks copied. */
static int link_tree(int src, int dst)
{
	struct dirent *de;
	DIR *d;
	int fd = dup(src), rc = 0;

	if (fd < 0)
		return -errno;
	d = fdopendir(fd);
	if (!d) {
		close(fd);
		return -errno;
	}
	rewinddir(d);
	while ((de = readdir(d)) != NULL) {
		struct stat st;
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (fstatat(src, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			rc = -errno;
			break;
		}
		if (S_ISDIR(st.st_mode)) {
			int s2, d2;
			if (mkdirat(dst, de->d_name, st.st_mode & 07777) < 0 && errno != EEXIST) {
				rc = -errno;
				break;
			}
			s2 = openat(src, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			d2 = openat(dst, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (s2 >= 0 && d2 >= 0)
				rc = link_tree(s2, d2);
			else
				rc = -errno;
			if (s2 >= 0)
				close(s2);
			if (d2 >= 0)
				close(d2);
			if (rc < 0)
				break;
		} else if (S_ISREG(st.st_mode)) {
			if (linkat(src, de->d_name, dst, de->d_name, 0) < 0) {
				rc = -errno;
				break;
			}
		} else if (S_ISLNK(st.st_mode)) {
			char tgt[PATH_MAX];
			ssize_t l = readlinkat(src, de->d_name, tgt, sizeof(tgt) - 1);
			if (l < 0) {
				rc = -errno;
				break;
			}
			tgt[l] = 0;
			if (symlinkat(tgt, dst, de->d_name) < 0) {
				rc = -errno;
				break;
			}
		}
	}
	closedir(d);
	return rc;
}

int ram_seal(struct ram_tier *t, const struct shard_key *k, int src_dirfd,
	     uint64_t ns_ino, uint32_t rec_flags, struct manifest **mfp)
{
	char rel[PATH_MAX], parent[PATH_MAX], staging[PATH_MAX];
	struct manifest *mf = NULL;
	struct shard_rec rec = { 0 };
	struct stat st;
	int sfd = -1, rc;
	uint64_t freed = 0;
	char *slash;

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
	rc = link_tree(src_dirfd, sfd);
	if (rc < 0)
		goto out;
	rc = mf_build(sfd, &mf);
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
	rec.key = *k;
	rec.state = SH_COMMITTED;
	rec.flags = rec_flags;
	memcpy(rec.hash, mf->hash, 32);
	rec.bytes = mf->total;
	rec.nfiles = mf->nfiles;
	rec.commit_time = (uint64_t)time(NULL);
	rec.ns_ino = ns_ino;
	rc = mf_encode(mf, &rec.mf, &rec.mflen);
	if (rc < 0)
		goto out;
	rc = idx_put_shard(t->idx, &rec);
	free(rec.mf);
out:
	if (sfd >= 0)
		close(sfd);
	if (rc < 0) {
		util_rmtree_at(t->shardsfd, staging, NULL);
		mf_free(mf);
		return rc;
	}
	if (mfp)
		*mfp = mf;
	else
		mf_free(mf);
	return 0;
}

int ram_drop(struct ram_tier *t, const struct shard_key *k, uint64_t *freedp)
{
	char rel[PATH_MAX], parent[PATH_MAX];
	uint64_t freed = 0;
	int rc = ram_shard_relpath(k, rel, sizeof(rel));
	char *slash;

	if (rc < 0)
		return rc;
	rc = idx_del_shard(t->idx, k);
	if (rc < 0 && rc != -ENOENT)
		return rc;
	rc = util_rmtree_at(t->shardsfd, rel, &freed);
	ram_adjust(t, -(int64_t)freed);
	/* tidy empty STEP and JOB directories */
	memcpy(parent, rel, sizeof(rel));
	while ((slash = strrchr(parent, '/')) != NULL) {
		*slash = '\0';
		if (unlinkat(t->shardsfd, parent, AT_REMOVEDIR) < 0)
			break;
	}
	if (freedp)
		*freedp += freed;
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

int ram_stage_publish(struct ram_tier *t, struct ram_stage *st, const struct manifest *mf,
		      uint32_t flags)
{
	char rel[PATH_MAX];
	struct shard_rec rec = { 0 };
	uint64_t freed = 0;
	int rc;

	for (size_t i = 0; i < mf->n; i++) {
		struct stat sb;
		if (fstatat(st->fd, mf->e[i].path, &sb, AT_SYMLINK_NOFOLLOW) < 0)
			return -EBADMSG;
		if (mf->e[i].type == MF_FILE && (!S_ISREG(sb.st_mode) || (uint64_t)sb.st_size != mf->e[i].size))
			return -EBADMSG;
	}
	rc = ram_shard_relpath(&st->key, rel, sizeof(rel));
	if (rc < 0)
		return rc;
	/* the old copy (if any) goes first: its record, then its files */
	idx_del_shard(t->idx, &st->key);
	util_rmtree_at(t->shardsfd, rel, &freed);
	ram_adjust(t, -(int64_t)freed);
	if (renameat(t->shardsfd, st->rel, t->shardsfd, rel) < 0)
		return -errno;
	close(st->fd);
	st->fd = -1;
	st->rel[0] = '\0';
	rec.key = st->key;
	rec.state = SH_COMMITTED;
	rec.flags = flags;
	memcpy(rec.hash, mf->hash, 32);
	rec.bytes = mf->total;
	rec.nfiles = mf->nfiles;
	rec.commit_time = (uint64_t)time(NULL);
	rc = mf_encode(mf, &rec.mf, &rec.mflen);
	if (rc < 0)
		return rc;
	rc = idx_put_shard(t->idx, &rec);
	free(rec.mf);
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
