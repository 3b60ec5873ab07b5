#include "tiers/lifecycle.h"
#include "tiers/manifest.h"
#include "common/util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- record writes ---- */

static int put_rec(struct idx *x, const struct shard_key *k, uint32_t state, uint32_t flags,
		   uint64_t ns_ino, const struct manifest *mf)
{
	struct shard_rec rec = { 0 };
	int rc;

	rec.key = *k;
	rec.state = state;
	rec.flags = flags;
	rec.commit_time = (uint64_t)time(NULL);
	rec.ns_ino = ns_ino;
	if (mf) {
		memcpy(rec.hash, mf->hash, 32);
		rec.bytes = mf->total;
		rec.nfiles = mf->nfiles;
		rc = mf_encode(mf, &rec.mf, &rec.mflen);
		if (rc < 0)
			return rc;
	}
	rc = idx_put_shard(x, &rec);
	free(rec.mf);
	return rc;
}

int life_seal_begin(struct idx *x, const struct shard_key *k, uint32_t flags, uint64_t ns_ino)
{
	return put_rec(x, k, SH_SEALING, flags, ns_ino, NULL);
}

int life_committed(struct idx *x, const struct shard_key *k, const struct manifest *mf,
		   uint32_t flags, uint64_t ns_ino)
{
	return put_rec(x, k, SH_COMMITTED, flags, ns_ino, mf);
}

int life_unsealable(struct idx *x, const struct shard_key *k, uint32_t flags, uint64_t ns_ino)
{
	return put_rec(x, k, SH_BAD, flags, ns_ino, NULL);
}

int life_bad(struct idx *x, const struct shard_key *k)
{
	return idx_set_state(x, k, SH_BAD, 0, 0);
}

int life_replicated(struct idx *x, const struct shard_key *k)
{
	return idx_set_state(x, k, SH_REPLICATED, 0, 0);
}

int life_backed_up(struct idx *x, const struct shard_key *k)
{
	return idx_set_state(x, k, SH_BACKED_UP, 0, 0);
}

int life_hide(struct idx *x, const struct shard_key *k)
{
	return idx_set_state(x, k, 0, SHF_HIDDEN, 0);
}

int life_restored(struct idx *x, const struct shard_key *k)
{
	return idx_set_state(x, k, 0, SHF_RESTORED, 0);
}

int life_adopt(struct idx *x, const struct shard_key *k)
{
	return idx_set_state(x, k, 0, SHF_OWN | SHF_RESTORED, 0);
}

void life_parity_key(const char *job, uint64_t step, struct shard_key *k)
{
	memset(k, 0, sizeof(*k));
	snprintf(k->job, sizeof(k->job), "%s", job);
	k->step = step;
	k->rank = k->worker = IDX_PARITY;
}

int life_parity_begin(struct idx *x, const struct shard_key *k)
{
	struct shard_rec rec = { 0 };
	int rc;

	if (!life_is_parity(k))
		return -EINVAL;
	rc = idx_get_shard(x, k, &rec);
	idx_rec_clear(&rec);
	if (rc != -ENOENT)
		return rc;   /* held already (or a catalog error) */
	return put_rec(x, k, SH_COMMITTED, SHF_PARITY, 0, NULL);
}

int life_forget(struct idx *x, const struct shard_key *k)
{
	return idx_del_shard(x, k);
}

int life_drop_mark(struct idx *x, const struct shard_key *k)
{
	return idx_set_state(x, k, SH_DROPPING, 0, 0);
}

int life_drop_done(struct idx *x, const struct shard_key *k)
{
	return idx_forget_dropping(x, k);
}

static void name_meta_key(const struct shard_key *k, char *buf, size_t len)
{
	if (k->worker)
		snprintf(buf, len, "stepname/%s/%u/%" PRIu64 "/w%u", k->job, k->rank, k->step,
			 k->worker);
	else
		snprintf(buf, len, "stepname/%s/%u/%" PRIu64, k->job, k->rank, k->step);
}

int life_name_set(struct idx *x, const struct shard_key *k, const char *name)
{
	char key[256], plain[32];

	name_meta_key(k, key, sizeof(key));
	snprintf(plain, sizeof(plain), "%" PRIu64, k->step);
	if (!strcmp(name, plain))
		return idx_del_meta(x, key);
	return idx_put_meta(x, key, name, strlen(name));
}

int life_name_forget(struct idx *x, const struct shard_key *k)
{
	char key[256];
	name_meta_key(k, key, sizeof(key));
	return idx_del_meta(x, key);
}

void life_name_get(struct idx *x, const struct shard_key *k, char *buf, size_t len)
{
	char key[256];
	void *v = NULL;
	size_t vl = 0;
	uint64_t step;

	name_meta_key(k, key, sizeof(key));
	if (idx_get_meta(x, key, &v, &vl) == 0 && vl < len) {
		memcpy(buf, v, vl);
		buf[vl] = '\0';
		if (util_is_step_name(buf, &step) && step == k->step) {
			free(v);
			return;
		}
	}
	free(v);
	snprintf(buf, len, "%" PRIu64, k->step);
}

/* ---- retention plan ---- */

static bool sealed_ok(const struct shard_rec *r)
{
	return r->state >= SH_COMMITTED && r->state != SH_BAD;
}

static bool is_own(const struct shard_rec *r, uint32_t rank)
{
	return (r->flags & SHF_OWN) && r->key.rank == rank && !life_is_parity(&r->key);
}

/* framework: pytorch, one shard per worker: has every worker 0..W-1 of
 * this node committed step (or is it a restored worker-0 shard holding
 * every worker's file, as a bucket restore writes it, or a directory)? */
static bool step_complete(const struct life_in *in, const struct shard_rec *recs, size_t n,
			  uint64_t step)
{
	uint64_t seen = 0;   /* workers <= RCFG_WORKERS_MAX (64) */
	bool restored0 = false;

	for (size_t i = 0; i < n; i++) {
		const struct shard_rec *r = &recs[i];
		if (strcmp(r->key.job, in->job) || r->key.step != step || r->key.rank != in->rank ||
		    !(r->flags & SHF_OWN) || !sealed_ok(r) || r->key.worker >= in->workers)
			continue;
		seen |= 1ull << r->key.worker;
		/* a directory step is worker 0's alone (GKE's pytorch mode has
		 * none: an mtcfs extra, complete on the node) */
		if (r->key.worker == 0 && ((r->flags & SHF_RESTORED) || r->ns_ino != 0))
			restored0 = true;
	}
	if (in->workers >= 64 ? seen == UINT64_MAX : seen == (1ull << in->workers) - 1)
		return true;
	return restored0 && seen == 1;
}

static bool pinned(const struct life_in *in, const struct shard_rec *r)
{
	return in->pinned && in->pinned(in->pin_arg, r->key.job, r->key.step);
}

/* The current job (DESIGN §4-5):
 *  - single node: own steps older than the newest committed (and, in
 *    pytorch mode, complete) one, except the restored step until a newer
 *    commit exists;
 *  - with peers: own steps and replicas older than in->step, never it. */
static void plan_current(const struct life_in *in, const struct shard_rec *recs, size_t n,
			 struct life_drop *out, size_t *nout)
{
	uint64_t newest = 0;
	bool have_newest = false, keep_restored = false;

	if (in->cluster) {
		if (!in->have_step)
			return;   /* nothing known: keep all */
		newest = in->step;
		have_newest = true;   /* the restored step is <= the LKG */
	} else {
		for (size_t i = 0; i < n; i++) {
			const struct shard_rec *r = &recs[i];
			if (!strcmp(r->key.job, in->job) && is_own(r, in->rank) && sealed_ok(r) &&
			    (!have_newest || r->key.step > newest) &&
			    (in->workers <= 1 || step_complete(in, recs, n, r->key.step))) {
				newest = r->key.step;
				have_newest = true;
			}
		}
		/* a newer commit supersedes the restored step */
		keep_restored = in->have_restored && in->restored_step >= newest;
	}
	for (size_t i = 0; have_newest && i < n; i++) {
		const struct shard_rec *r = &recs[i];
		bool own = is_own(r, in->rank);
		if (strcmp(r->key.job, in->job) || r->key.step >= newest || r->state == SH_SEALING)
			continue;
		if (keep_restored && r->key.step == in->restored_step)
			continue;
		if (!own && !in->cluster)
			continue;   /* a single node keeps what it did not write */
		if (pinned(in, r))
			continue;
		out[(*nout)++] = (struct life_drop){ .rec = r, .own = own,
						     .parity = life_is_parity(&r->key),
						     .why = LIFE_OLDER };
	}
}

static int cmp_older_first(const void *a, const void *b)
{
	const struct shard_rec *x = ((const struct life_drop *)a)->rec;
	const struct shard_rec *y = ((const struct life_drop *)b)->rec;
	if (x->commit_time != y->commit_time)
		return x->commit_time < y->commit_time ? -1 : 1;
	if (x->key.step != y->key.step)
		return x->key.step < y->key.step ? -1 : 1;
	/* same time and step: keep the catalog's order (deterministic) */
	return x < y ? -1 : x > y;
}

/* Shards of other jobs (an earlier job on this mount: the namespace no
 * longer shows them and no restore of the current job can use them) go
 * before a write of the current job is refused, oldest first. */
static void plan_other_jobs(const struct life_in *in, const struct shard_rec *recs, size_t n,
			    struct life_drop *out, size_t *nout)
{
	size_t first = *nout;

	for (size_t i = 0; i < n; i++) {
		const struct shard_rec *r = &recs[i];
		if (!strcmp(r->key.job, in->job) || r->state == SH_SEALING || pinned(in, r))
			continue;
		out[(*nout)++] = (struct life_drop){ .rec = r, .own = is_own(r, in->rank),
						     .parity = life_is_parity(&r->key),
						     .why = LIFE_OTHER_JOB };
	}
	if (*nout - first > 1)
		qsort(out + first, *nout - first, sizeof(*out), cmp_older_first);
}

int life_plan_gc(const struct life_in *in, const struct shard_rec *recs, size_t n,
		 struct life_drop *out, size_t *nout)
{
	if (!in || !in->job || (n && (!recs || !out)) || !nout)
		return -EINVAL;
	*nout = 0;
	plan_current(in, recs, n, out, nout);
	if (in->want)
		plan_other_jobs(in, recs, n, out, nout);
	return 0;
}

int life_plan_newer(const char *job, uint32_t rank, uint64_t step, const struct shard_rec *recs,
		    size_t n, struct life_drop *out, size_t *nout)
{
	if (!job || (n && (!recs || !out)) || !nout)
		return -EINVAL;
	*nout = 0;
	for (size_t i = 0; i < n; i++) {
		const struct shard_rec *r = &recs[i];
		if (strcmp(r->key.job, job) || r->key.step <= step || r->state == SH_SEALING ||
		    r->state == SH_BAD)
			continue;   /* bad shards are never restored: kept for inspection */
		out[(*nout)++] = (struct life_drop){ .rec = r, .own = is_own(r, rank),
						     .parity = life_is_parity(&r->key),
						     .why = LIFE_NEWER };
	}
	return 0;
}
