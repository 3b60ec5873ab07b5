/* commit.c: committed steps of this node. A commit is recorded in the
 * catalog as SEALING on the FUSE thread (one small LMDB transaction, before
 * the rename itself, so a crash right after the rename is recovered), then
 * the seal worker freezes the tree, hard-links it into the shard store and
 * builds the manifest. What may go, and its execution, are retain.c and
 * tiers/retention.c. */
#include "fs/fs_i.h"
#include "cluster/rcfg.h"
#include "common/log.h"
#include "tiers/lifecycle.h"
#include "tiers/restore.h"
#include "common/metrics.h"
#include "common/util.h"
#include "common/walk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

bool commit_is_step_dir(struct fs *fs, uint64_t step, ino_t ino)
{
	struct fs_step *s;
	bool r;
	pthread_mutex_lock(&fs->mu);
	s = fs_step_find(fs, step);
	r = s && s->visible && s->dir_ino == ino;
	pthread_mutex_unlock(&fs->mu);
	return r;
}

/* Record step `step` (spelled `name`) as SEALING: a directory (dir_ino)
 * or, with files != NULL, worker w's .save file (ownership of files
 * passes to the step table in every case). */
static int begin(struct fs *fs, uint64_t step, const char *name, ino_t dir_ino,
		 ino_t *files, uint32_t nfiles, uint32_t w)
{
	struct job_now now;
	struct shard_key k;
	struct fs_step *s;
	int rc;

	if (strlen(name) >= sizeof(s->name)) {
		free(files);
		return -ENAMETOOLONG;
	}
	fs_identity(fs, &now);
	pthread_mutex_lock(&fs->mu);
	s = fs_step_find_w(fs, step, w);
	if (s && s->visible && !s->sealed) {
		/* the previous commit of this name is still sealing */
		pthread_mutex_unlock(&fs->mu);
		free(files);
		return -EBUSY;
	}
	for (size_t i = 0; i < fs->nsteps; i++) {
		s = &fs->steps[i];
		if (s->step != step || !s->visible || !strcmp(s->name, name))
			continue;
		/* "5" and "05" are the same step of the job: one shard (per
		 * worker), one name; the first stays until the app deletes it */
		log_warn("commit", "step %s is already committed as %s: %s is not committed",
			 name, s->name, name);
		pthread_mutex_unlock(&fs->mu);
		free(files);
		return -EEXIST;
	}
	s = fs_step_add(fs, step, w);
	if (!s) {
		pthread_mutex_unlock(&fs->mu);
		free(files);
		return -ENOMEM;
	}
	snprintf(s->job, sizeof(s->job), "%s", now.job);
	snprintf(s->name, sizeof(s->name), "%s", name);
	s->rank = (uint32_t)now.rank;
	s->dir_ino = dir_ino;
	free(s->files);
	s->files = files;
	s->nfiles = nfiles;
	s->visible = true;
	s->sealed = false;
	s->failed = false;
	fs_step_key(s, &k);
	pthread_mutex_unlock(&fs->mu);
	if (life_name_set(ram_idx(fs->ram), &k, name) < 0)
		log_warn("commit", "cannot record the name %s of step %" PRIu64 ": it restores as %" PRIu64,
			 name, k.step, k.step);

	atomic_fetch_add(&fs->sealing, 1);
	rc = life_seal_begin(ram_idx(fs->ram), &k, SHF_OWN, dir_ino);
	if (rc < 0) {
		log_err("commit", "cannot record step %llu in the catalog: %s",
			(unsigned long long)step, strerror(-rc));
		pthread_mutex_lock(&fs->mu);
		fs_step_remove(fs, step, w);
		pthread_mutex_unlock(&fs->mu);
		atomic_fetch_sub(&fs->sealing, 1);
		return -EIO;
	}
	return 0;
}

int commit_begin(struct fs *fs, uint64_t step, const char *name, ino_t dir_ino)
{
	return begin(fs, step, name, dir_ino, NULL, 0, 0);
}

static void abort_w(struct fs *fs, uint64_t step, uint32_t w)
{
	struct shard_key k;
	struct fs_step *s;

	pthread_mutex_lock(&fs->mu);
	s = fs_step_find_w(fs, step, w);
	if (!s) {
		pthread_mutex_unlock(&fs->mu);
		return;
	}
	fs_step_key(s, &k);
	fs_step_remove(fs, step, w);
	pthread_mutex_unlock(&fs->mu);
	atomic_fetch_sub(&fs->sealing, 1);
	life_forget(ram_idx(fs->ram), &k);
	life_name_forget(ram_idx(fs->ram), &k);
}

void commit_abort(struct fs *fs, uint64_t step)
{
	abort_w(fs, step, 0);
}

/* The .save file of worker w of a step, as GKE's pytorch mode names it. */
static void save_name(const struct shard_key *k, const char *stepname, uint32_t w,
		      char *buf, size_t len)
{
	snprintf(buf, len, "%s-s%s-n%u-w%u.save", k->job, stepname, k->rank, w);
}

/* A framework: pytorch step is files at the top, not a directory: gather
 * hard links of them in a private directory of RAMDIR (outside the app's
 * namespace and the shard store) for ram_seal to take. Returns the open
 * directory (its name in scratch) or -errno. */
static int gather_files(struct fs *fs, const struct shard_key *k, const char *stepname,
			const ino_t *files, uint32_t nfiles, char *scratch, size_t slen)
{
	int rootfd = ram_root_fd(fs->ram), nsfd = ram_ns_fd(fs->ram), dfd = -1, rc = 0;

	snprintf(scratch, slen, ".seal-%s-n%u-w%u-%" PRIu64, k->job, k->rank, k->worker, k->step);
	util_rmtree_at(rootfd, scratch, NULL);
	if (mkdirat(rootfd, scratch, 0755) < 0)
		return -errno;
	dfd = openat(rootfd, scratch, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0) {
		rc = -errno;
		goto out;
	}
	for (uint32_t w = 0; w < nfiles; w++) {
		char fn[NAME_MAX + 1];
		struct stat st;
		save_name(k, stepname, k->worker + w, fn, sizeof(fn));
		if (linkat(nsfd, fn, dfd, fn, 0) < 0) {
			rc = -errno;
			goto out;
		}
		/* the name may have been replaced since the commit */
		if (fstatat(dfd, fn, &st, AT_SYMLINK_NOFOLLOW) < 0 || st.st_ino != files[w]) {
			rc = -ESTALE;
			goto out;
		}
		/* the shard directory (a restore marker's target's parent) is
		 * the writer's, as a directory step's is */
		if (w == 0 && geteuid() == 0 && fchown(dfd, st.st_uid, st.st_gid) < 0) {
			rc = -errno;
			goto out;
		}
	}
out:
	if (rc < 0) {
		if (dfd >= 0)
			close(dfd);
		util_rmtree_at(rootfd, scratch, NULL);
		scratch[0] = '\0';
		return rc;
	}
	return dfd;
}

struct seal_arg {
	uint64_t step;
	uint32_t worker;
};

static void seal_job(void *arg)
{
	struct fs *fs = g_fs;
	struct seal_arg *sa = arg;
	uint64_t step = sa->step, t0 = util_now_ns();
	uint32_t worker = sa->worker;
	struct manifest *mf = NULL;
	struct fs_step *s;
	struct shard_key k;
	struct stat st;
	char name[sizeof(s->name)], hex[65], scratch[256] = "";
	ino_t ino, *files = NULL;
	uint32_t nfiles = 0;
	int dfd = -1, rc;
	bool frozen = false;

	free(sa);
	pthread_mutex_lock(&fs->mu);
	s = fs_step_find_w(fs, step, worker);
	if (!s || s->sealed) {
		pthread_mutex_unlock(&fs->mu);
		atomic_fetch_sub(&fs->sealing, 1);
		return;
	}
	fs_step_key(s, &k);
	ino = s->dir_ino;
	snprintf(name, sizeof(name), "%s", s->name);
	if (s->nfiles) {
		files = malloc(s->nfiles * sizeof(*files));
		if (files) {
			memcpy(files, s->files, s->nfiles * sizeof(*files));
			nfiles = s->nfiles;
		}
	}
	pthread_mutex_unlock(&fs->mu);

	if (nfiles) {
		/* the files were made read-only when the last one closed */
		dfd = gather_files(fs, &k, name, files, nfiles, scratch, sizeof(scratch));
		if (dfd < 0) {
			rc = dfd;
			log_err("commit", "step %s: a .save file vanished before it was sealed: %s",
				name, strerror(-rc));
			goto out;
		}
	} else {
		if (ino == 0) {
			rc = -ENOMEM;
			goto out;
		}
		dfd = openat(ram_ns_fd(fs->ram), name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (dfd < 0 || fstat(dfd, &st) < 0 || st.st_ino != ino) {
			rc = dfd < 0 ? -errno : -ESTALE;
			log_err("commit", "step %s vanished before it was sealed: %s", name,
				strerror(-rc));
			goto out;
		}
		fs->front->freeze_subtree(fs, dfd, step);
	}
	frozen = true;
	atomic_fetch_sub(&fs->sealing, 1);
	/* a failure may be passing (a directory tidied away under the seal by
	 * another thread, a short ENOMEM): try again before giving the step up */
	for (int attempt = 1;; attempt++) {
		char why[512] = "", line[700];
		rc = ram_seal(fs->ram, &k, dfd, ino, SHF_OWN, &mf, why, sizeof(why));
		if (rc == 0)
			break;
		/* -EBADMSG: the tree can never be a shard; ram_seal recorded it
		 * bad, so neither a retry nor a restart seals it again */
		if (rc == -EBADMSG || attempt == 3) {
			snprintf(line, sizeof(line), "step %llu was not committed: %s",
				 (unsigned long long)step, why);
			log_err("commit", "%s", line);
			fs_report_error(fs, line);
			goto out;
		}
		log_warn("commit", "sealing step %llu failed (%s), attempt %d: trying again",
			 (unsigned long long)step, strerror(-rc), attempt);
		usleep(20000u * (unsigned)attempt);
	}
	mf_hash_hex(mf->hash, hex);
	metrics_add(MC_COMMITS, 1);
	metrics_observe(MH_SEAL_SECONDS, (double)(util_now_ns() - t0) / 1e9);
	eng_committed(fs->eng, &k, mf->hash);
	log_info("commit", "committed job=%s step=%s rank=%u files=%u bytes=%llu hash=%s seal_ms=%.1f worker=%u",
		 k.job, name, k.rank, mf->nfiles,
		 (unsigned long long)mf->total, hex, (double)(util_now_ns() - t0) / 1e6, k.worker);
out:
	if (dfd >= 0)
		close(dfd);
	if (scratch[0])
		util_rmtree_at(ram_root_fd(fs->ram), scratch, NULL);   /* links only */
	free(files);
	if (!frozen)
		atomic_fetch_sub(&fs->sealing, 1);
	mf_free(mf);
	if (rc < 0)
		metrics_add(MC_COMMIT_FAILURES, 1);
	pthread_mutex_lock(&fs->mu);
	s = fs_step_find_w(fs, step, worker);
	if (s && s->dir_ino == ino) {
		s->sealed = true;
		s->failed = rc < 0;
	}
	pthread_cond_broadcast(&fs->sealed_cv);
	bool eager = fs->eager_gc;
	pthread_mutex_unlock(&fs->mu);
	if (rc == 0 && eager)
		retain_gc(fs);
}

static int queue_w(struct fs *fs, uint64_t step, uint32_t w)
{
	struct seal_arg *sa = malloc(sizeof(*sa));
	int rc = -ENOMEM;

	if (sa) {
		sa->step = step;
		sa->worker = w;
		rc = workq_submit(fs->sealq, seal_job, sa);
		if (rc < 0)
			free(sa);
	}
	if (rc < 0)
		log_err("commit", "cannot queue sealing of step %llu: %s",
			(unsigned long long)step, strerror(-rc));
	return rc;
}

int commit_queue(struct fs *fs, uint64_t step)
{
	return queue_w(fs, step, 0);
}

static bool any_unsealed_locked(struct fs *fs, uint64_t step)
{
	for (size_t i = 0; i < fs->nsteps; i++)
		if (fs->steps[i].step == step && !fs->steps[i].sealed)
			return true;
	return false;
}

void commit_wait_sealed(struct fs *fs, uint64_t step)
{
	pthread_mutex_lock(&fs->mu);
	while (any_unsealed_locked(fs, step))
		pthread_cond_wait(&fs->sealed_cv, &fs->mu);
	pthread_mutex_unlock(&fs->mu);
}

void commit_hide(struct fs *fs, uint64_t step)
{
	struct shard_key k[RCFG_WORKERS_MAX];
	size_t n = 0;

	pthread_mutex_lock(&fs->mu);
	for (size_t i = 0; i < fs->nsteps && n < RCFG_WORKERS_MAX; i++) {
		struct fs_step *s = &fs->steps[i];
		if (s->step != step)
			continue;
		s->visible = false;
		fs_step_key(s, &k[n++]);
	}
	pthread_mutex_unlock(&fs->mu);
	for (size_t i = 0; i < n; i++)
		life_hide(ram_idx(fs->ram), &k[i]);
}

static void adopt_files(struct fs *fs, const struct shard_key *k);

int commit_init(struct fs *fs)
{
	struct shard_rec *recs = NULL;
	size_t n = 0;
	int rc = idx_list_shards(ram_idx(fs->ram), NULL, &recs, &n);

	if (rc < 0)
		return rc;
	for (size_t i = 0; i < n; i++) {
		struct shard_rec *r = &recs[i];
		char name[sizeof(((struct fs_step *)0)->name)], err[512];
		struct stat st;
		bool in_ns;

		if (r->key.step > INT64_MAX) {
			/* recorded before such names stopped being steps: the
			 * peers' plans cannot carry it */
			log_warn("commit", "job %s step %llu node %u is above the largest step (2^63-1): forgotten",
				 r->key.job, (unsigned long long)r->key.step, r->key.rank);
			ram_drop(fs->ram, &r->key, NULL);
			continue;
		}
		if (!(r->flags & SHF_OWN))
			continue;
		life_name_get(ram_idx(fs->ram), &r->key, name, sizeof(name));
		in_ns = fstatat(ram_ns_fd(fs->ram), name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
			S_ISDIR(st.st_mode) && st.st_ino == r->ns_ino;
		if (r->state == SH_SEALING) {
			if (!in_ns && r->ns_ino == 0) {
				/* .save files: the scan after the configuration
				 * is loaded commits them again if complete */
				log_info("commit", "step %llu (.save files) was being committed when mtcfs stopped: it is committed again from the files",
					 (unsigned long long)r->key.step);
				life_forget(ram_idx(fs->ram), &r->key);
				continue;
			}
			if (!in_ns) {
				log_warn("commit", "step %llu was being committed when mtcfs stopped and its directory is gone; forgetting it",
					 (unsigned long long)r->key.step);
				life_forget(ram_idx(fs->ram), &r->key);
				continue;
			}
		} else if (r->state != SH_BAD && ram_check_sizes(fs->ram, r, err, sizeof(err)) < 0) {
			log_err("commit", "job=%s step=%llu rank=%u does not match its manifest (%s): marked bad, it will not be restored",
				r->key.job, (unsigned long long)r->key.step, r->key.rank, err);
			life_bad(ram_idx(fs->ram), &r->key);
			r->state = SH_BAD;
		}
		if (!in_ns && r->ns_ino == 0 && r->state >= SH_COMMITTED && r->state != SH_BAD)
			adopt_files(fs, &r->key);   /* .save files: read-only again */
		if (in_ns) {
			struct fs_step *s;
			pthread_mutex_lock(&fs->mu);
			s = fs_step_add(fs, r->key.step, r->key.worker);
			if (s) {
				snprintf(s->job, sizeof(s->job), "%s", r->key.job);
				snprintf(s->name, sizeof(s->name), "%s", name);
				s->rank = r->key.rank;
				s->dir_ino = st.st_ino;
				s->visible = !(r->flags & SHF_HIDDEN);
				s->sealed = r->state != SH_SEALING;
			}
			pthread_mutex_unlock(&fs->mu);
			if (r->state == SH_SEALING) {
				log_info("commit", "resuming the seal of step %llu", (unsigned long long)r->key.step);
				atomic_fetch_add(&fs->sealing, 1);
				if (queue_w(fs, r->key.step, r->key.worker) < 0)
					atomic_fetch_sub(&fs->sealing, 1);
			}
		}
	}
	idx_recs_free(recs, n);
	return 0;
}

/* ---- commits detected by name: commit_success.txt, .save files ---- */

/* Name of the top-level step directory with inode ino. 0 or -ENOENT. */
static int find_top_dir(struct fs *fs, ino_t ino, char *name, size_t len, uint64_t *step)
{
	const struct dirent *de;
	struct walk_dir d;
	int rc = walk_dir_open(&d, ram_ns_fd(fs->ram));

	if (rc < 0)
		return rc;
	rc = -ENOENT;
	while ((de = walk_dir_next(&d)) != NULL) {
		if (de->d_ino == ino && util_is_step_name(de->d_name, step) &&
		    strlen(de->d_name) < len) {
			snprintf(name, len, "%s", de->d_name);
			rc = 0;
			break;
		}
	}
	walk_dir_close(&d);
	return rc;
}

void commit_marker_done(struct fs *fs, ino_t dir_ino)
{
	char name[sizeof(((struct fs_step *)0)->name)];
	struct stat st;
	uint64_t step;

	if (find_top_dir(fs, dir_ino, name, sizeof(name), &step) < 0)
		return;
	if (fstatat(ram_ns_fd(fs->ram), name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
	    S_ISDIR(st.st_mode) && st.st_ino == dir_ino &&
	    !commit_is_step_dir(fs, step, st.st_ino) &&
	    commit_begin(fs, step, name, st.st_ino) == 0) {
		fs->front->node_set_frozen(fs, st.st_ino, st.st_dev, step);
		commit_queue(fs, step);
	}
}

/* "<job>-s<digits>-n<rank>-w<w>.save" (GKE's file_naming): the step's
 * value and spelling, and the worker. Rank and worker are plain decimals
 * (the names GKE's replicator builds). */
static bool parse_save(const char *fn, const char *job, uint32_t rank, uint64_t *step,
		       char *stepname, size_t slen, uint32_t *w)
{
	size_t jl = strlen(job), dl;
	const char *p = fn, *q;
	char num[24], want[48];
	uint64_t v;

	if (strncmp(p, job, jl) || strncmp(p + jl, "-s", 2))
		return false;
	p += jl + 2;
	dl = strspn(p, "0123456789");
	if (dl == 0 || dl >= slen)
		return false;
	memcpy(stepname, p, dl);
	stepname[dl] = '\0';
	if (!util_is_step_name(stepname, step))
		return false;
	p += dl;
	snprintf(want, sizeof(want), "-n%u-w", rank);
	if (strncmp(p, want, strlen(want)))
		return false;
	p += strlen(want);
	q = strstr(p, ".save");
	if (!q || strcmp(q, ".save") || q == p || (size_t)(q - p) >= sizeof(num))
		return false;
	memcpy(num, p, (size_t)(q - p));
	num[q - p] = '\0';
	if (util_parse_u64(num, UINT32_MAX, &v) < 0 || (num[0] == '0' && num[1]))
		return false;
	*w = (uint32_t)v;
	return true;
}

/* At start-up: a committed framework: pytorch shard whose .save files are
 * still in the app's view (same inodes) is a step of the table again, so
 * the files stay read-only across a restart of mtcfs. A shard of worker
 * w > 0 holds that worker's file only; a worker-0 shard holds worker 0's
 * file, or (written by an earlier mtcfs, or restored from the bucket) the
 * files of every worker. */
static void adopt_files(struct fs *fs, const struct shard_key *k)
{
	int sfd, nsfd = ram_ns_fd(fs->ram);
	char stepname[sizeof(((struct fs_step *)0)->name)] = "";
	ino_t *files = NULL;
	uint32_t nf = 0;
	const struct dirent *de;
	struct fs_step *s;
	struct walk_dir d;

	if (ram_shard_walk(fs->ram, k, &d) < 0)
		return;
	sfd = walk_dir_fd(&d);
	while ((de = walk_dir_next(&d)) != NULL) {
		char sn[sizeof(stepname)];
		struct stat a, b;
		uint64_t step;
		uint32_t w;
		if (!parse_save(de->d_name, k->job, k->rank, &step, sn, sizeof(sn), &w) ||
		    step != k->step || w >= RCFG_WORKERS_MAX || (k->worker && w != k->worker))
			continue;
		if (k->worker)
			w = 0;   /* files[0] is the shard's one file */
		if (fstatat(sfd, de->d_name, &a, AT_SYMLINK_NOFOLLOW) < 0 ||
		    fstatat(nsfd, de->d_name, &b, AT_SYMLINK_NOFOLLOW) < 0 || a.st_ino != b.st_ino)
			continue;
		if (w >= nf) {
			ino_t *nv = realloc(files, (w + 1) * sizeof(*nv));
			if (!nv)
				goto out;
			memset(nv + nf, 0, (w + 1 - nf) * sizeof(*nv));
			files = nv;
			nf = w + 1;
		}
		files[w] = a.st_ino;
		snprintf(stepname, sizeof(stepname), "%s", sn);
	}
	for (uint32_t w = 0; w < nf; w++)
		if (!files[w])
			goto out;
	if (!nf)
		goto out;
	pthread_mutex_lock(&fs->mu);
	s = fs_step_add(fs, k->step, k->worker);
	if (s) {
		snprintf(s->job, sizeof(s->job), "%s", k->job);
		snprintf(s->name, sizeof(s->name), "%s", stepname);
		s->rank = k->rank;
		s->dir_ino = 0;
		free(s->files);
		s->files = files;
		s->nfiles = nf;
		files = NULL;
		s->visible = true;
		s->sealed = true;
	}
	pthread_mutex_unlock(&fs->mu);
out:
	walk_dir_close(&d);
	free(files);
}

struct save_ent {
	uint64_t step;
	uint32_t w;
	ino_t ino;
	dev_t dev;
	char name[sizeof(((struct fs_step *)0)->name)];
};

static int cmp_save(const void *a, const void *b)
{
	const struct save_ent *x = a, *y = b;
	if (x->step != y->step)
		return x->step < y->step ? -1 : 1;
	return x->w < y->w ? -1 : x->w > y->w;
}

#define SAVE_SCAN_MAX 65536u   /* top-level .save files looked at per scan */

/* Worker e->w's file e is this node's committed shard of its step
 * already: nothing to do (also after a restart of mtcfs: the catalog says
 * so). A file of another inode under the name is a new save of that
 * worker: it replaces the worker's shard. */
static bool file_committed(struct fs *fs, const struct save_ent *e, const char *job,
			   uint32_t rank)
{
	struct shard_rec rec = { 0 };
	struct shard_key k = { 0 };
	bool same = false, known = false;
	char fn[NAME_MAX + 1];
	struct stat st;
	int sfd;

	pthread_mutex_lock(&fs->mu);
	for (size_t i = 0; i < fs->nsteps && !same; i++) {
		struct fs_step *s = &fs->steps[i];
		if (s->step != e->step || !s->nfiles || strcmp(s->job, job) || s->rank != rank)
			continue;
		if (s->worker == e->w)
			known = true;
		for (uint32_t x = 0; x < s->nfiles && !same; x++)
			same = s->files[x] == e->ino;
	}
	pthread_mutex_unlock(&fs->mu);
	if (same || known)
		return same;
	snprintf(k.job, sizeof(k.job), "%s", job);
	k.step = e->step;
	k.rank = rank;
	k.worker = e->w;
	if (idx_get_shard(ram_idx(fs->ram), &k, &rec) < 0) {
		/* a worker-0 shard holding every worker's file (restored from
		 * the bucket, or written by an earlier mtcfs) */
		k.worker = 0;
		if (e->w == 0 || idx_get_shard(ram_idx(fs->ram), &k, &rec) < 0)
			return false;
	}
	same = rec.state >= SH_COMMITTED && rec.state != SH_BAD;
	idx_rec_clear(&rec);
	if (!same || (sfd = ram_shard_open(fs->ram, &k)) < 0)
		return false;
	save_name(&k, e->name, e->w, fn, sizeof(fn));
	same = fstatat(sfd, fn, &st, AT_SYMLINK_NOFOLLOW) == 0 && st.st_ino == e->ino;
	close(sfd);
	return same;
}

static void commit_file(struct fs *fs, const struct save_ent *e)
{
	ino_t *files = malloc(sizeof(*files));

	if (!files)
		return;
	files[0] = e->ino;
	if (begin(fs, e->step, e->name, 0, files, 1, e->w) < 0)
		return;
	fs->front->node_set_frozen(fs, e->ino, e->dev, e->step);
	if (queue_w(fs, e->step, e->w) < 0)
		abort_w(fs, e->step, e->w);
}

void commit_top_file_done(struct fs *fs)
{
	struct save_ent *v = NULL;
	size_t n = 0, cap = 0;
	uint32_t rank, workers;
	char job[JOB_NAME_MAX + 1];
	const struct dirent *de;
	struct walk_dir d;
	struct job_now now;

	fs_identity(fs, &now);
	if (!now.save_files)
		return;
	snprintf(job, sizeof(job), "%s", now.job);
	rank = (uint32_t)now.rank;
	workers = now.workers;   /* with save_files: workers-per-node (>= 1) */

	/* no create or write open is between its open and its writer count */
	pthread_rwlock_wrlock(&fs->open_lk);
	if (walk_dir_open(&d, ram_ns_fd(fs->ram)) < 0) {
		pthread_rwlock_unlock(&fs->open_lk);
		return;
	}
	while (n < SAVE_SCAN_MAX && (de = walk_dir_next(&d)) != NULL) {
		struct save_ent e, *nv;
		struct stat st;
		if (de->d_type != DT_REG && de->d_type != DT_UNKNOWN)
			continue;
		if (!parse_save(de->d_name, job, rank, &e.step, e.name, sizeof(e.name), &e.w) ||
		    e.w >= workers)
			continue;
		if (fstatat(ram_ns_fd(fs->ram), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
		    !S_ISREG(st.st_mode))
			continue;
		e.ino = st.st_ino;
		e.dev = st.st_dev;
		nv = util_grow(v, n, &cap, sizeof(*nv), 16);
		if (!nv)
			break;
		v = nv;
		v[n++] = e;
	}
	walk_dir_close(&d);
	if (n > 1)
		qsort(v, n, sizeof(*v), cmp_save);
	/* Each worker's file commits on its own once it is closed (GKE waits
	 * for the close of each, and replicates each as it comes): the job's
	 * step is complete when every (node, worker) has committed it, which
	 * the coordinator decides. Two spellings of one (step, worker) ("5",
	 * "05") are ambiguous: neither commits. */
	for (size_t i = 0; i < n;) {
		size_t j = i;
		while (j < n && v[j].step == v[i].step && v[j].w == v[i].w)
			j++;
		if (j - i == 1 && fs->front->node_writers(fs, v[i].ino, v[i].dev) == 0 &&
		    !file_committed(fs, &v[i], job, rank))
			commit_file(fs, &v[i]);
		i = j;
	}
	pthread_rwlock_unlock(&fs->open_lk);
	free(v);
}

bool commit_file_frozen_locked(struct fs *fs, ino_t ino, uint64_t *step)
{
	for (size_t i = 0; i < fs->nsteps; i++) {
		struct fs_step *s = &fs->steps[i];
		for (uint32_t w = 0; w < s->nfiles; w++) {
			if (s->files[w] == ino) {
				*step = s->step;
				return true;
			}
		}
	}
	return false;
}

/* ---- restore markers ---- */

/* The restored shard's file of worker w (framework: pytorch): its name
 * and spelling of the step. 0, -ENOENT (no such file), -ENODATA (the
 * shard has no .save file at all: a directory step). */
static int find_save(struct fs *fs, const struct shard_key *k, uint32_t w, char *fn, size_t fnlen,
		     char *stepname, size_t slen)
{
	const struct dirent *de;
	struct walk_dir d;
	int rc = ram_shard_walk(fs->ram, k, &d);

	if (rc < 0)
		return rc;
	rc = -ENODATA;
	while ((de = walk_dir_next(&d)) != NULL) {
		uint64_t step;
		uint32_t fw;
		size_t l = strlen(de->d_name);
		if (l > 5 && !strcmp(de->d_name + l - 5, ".save") && rc == -ENODATA)
			rc = -ENOENT;
		if (parse_save(de->d_name, k->job, k->rank, &step, stepname, slen, &fw) &&
		    fw == w && step == k->step && l < fnlen) {
			snprintf(fn, fnlen, "%s", de->d_name);
			rc = 0;
			break;
		}
	}
	walk_dir_close(&d);
	return rc;
}

int commit_marker(struct fs *fs, const char *job, int rank, const struct restore_plan *p,
		  int w, char *name, size_t nlen, char *target, size_t tlen)
{
	char rel[512], stepname[sizeof(((struct fs_step *)0)->name)], fn[NAME_MAX + 1];
	struct job_now now;
	int rc;

	target[0] = '\0';
	if (!p->found) {
		snprintf(name, nlen, "%s-s0-n%d-w%d.restore", job, rank, w);
		return 0;
	}
	rc = ram_shard_relpath(&p->key, rel, sizeof(rel));
	if (rc < 0)
		return rc;
	fs_identity(fs, &now);
	/* framework: pytorch restores a file per worker: the marker points at
	 * that worker's file, as GKE's points at its <hash>.data */
	rc = -ENODATA;
	if (now.save_files && w > 0) {
		/* worker w's own shard; a worker-0 shard holding every worker's
		 * file (a bucket restore, an earlier mtcfs) is looked at next */
		struct shard_key wk = p->key;
		char wrel[512];
		wk.worker = (uint32_t)w;
		rc = find_save(fs, &wk, (uint32_t)w, fn, sizeof(fn), stepname, sizeof(stepname));
		if (rc == 0 && ram_shard_relpath(&wk, wrel, sizeof(wrel)) == 0) {
			if ((size_t)snprintf(target, tlen, ".mtcfs/%s/%s", wrel, fn) >= tlen)
				return -ENAMETOOLONG;
			goto named;
		}
	}
	rc = now.save_files ? find_save(fs, &p->key, (uint32_t)w, fn, sizeof(fn), stepname,
					sizeof(stepname)) : -ENODATA;
	if (rc == 0) {
		if ((size_t)snprintf(target, tlen, ".mtcfs/%s/%s", rel, fn) >= tlen)
			return -ENAMETOOLONG;
	} else if (rc == -ENODATA) {
		life_name_get(ram_idx(fs->ram), &p->key, stepname, sizeof(stepname));
		if ((size_t)snprintf(target, tlen, ".mtcfs/%s", rel) >= tlen)
			return -ENAMETOOLONG;
	} else {
		log_err("commit", "restored step %llu has no .save file for worker %d",
			(unsigned long long)p->step, w);
		return rc;
	}
named:
	if ((size_t)snprintf(name, nlen, "%s-s%s-n%d-w%d.restore", job, stepname, rank, w) >= nlen)
		return -ENAMETOOLONG;
	return 0;
}
