/* engine_backup.c — backup uploads and the bucket, as the coordinator asks
 * for it (see engine_int.h). */
#include "cluster/engine_int.h"
#include "cluster/lkg.h"
#include "tiers/lifecycle.h"
#include "tiers/backup.h"
#include "tiers/tier.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---------- backups ---------- */

/* Worker w of "<job>-s<digits>-n<rank>-w<w>.save" at the top of a shard
 * (GKE's file_naming), else -1. */
int64_t eng_save_worker(const char *path, const char *job, uint32_t rank, uint64_t step)
{
	size_t jl = strlen(job), d, pl = strlen(path);
	char want[32];
	const char *p = path;
	uint64_t v, w;
	char num[24];

	if (pl < 5 || strchr(path, '/') || strcmp(path + pl - 5, ".save") ||
	    strncmp(p, job, jl) || strncmp(p + jl, "-s", 2))
		return -1;
	p += jl + 2;
	d = strspn(p, "0123456789");
	if (d == 0 || d >= sizeof(num))
		return -1;
	memcpy(num, p, d);
	num[d] = '\0';
	if (util_parse_u64(num, UINT64_MAX, &v) < 0 || v != step)
		return -1;
	p += d;
	snprintf(want, sizeof(want), "-n%u-w", rank);
	if (strncmp(p, want, strlen(want)))
		return -1;
	p += strlen(want);
	d = strspn(p, "0123456789");
	if (d == 0 || d >= sizeof(num) || strcmp(p + d, ".save"))
		return -1;
	memcpy(num, p, d);
	num[d] = '\0';
	if (util_parse_u64(num, RCFG_WORKERS_MAX - 1, &w) < 0)
		return -1;
	return (int64_t)w;
}

/* Worker w's .save entry of shard mf, or NULL. */
static const struct mf_entry *save_entry(const struct manifest *mf, const struct shard_key *k,
					 uint32_t w, bool *any)
{
	const struct mf_entry *r = NULL;
	for (size_t i = 0; i < mf->n; i++) {
		int64_t x = mf->e[i].type == MF_FILE ?
			    eng_save_worker(mf->e[i].path, k->job, k->rank, k->step) : -1;
		if (x < 0)
			continue;
		*any = true;
		if ((uint64_t)x == w)
			r = &mf->e[i];
	}
	return r;
}

/* framework: pytorch: each worker's file is its own shard in the bucket,
 * as GKE's replicator backs them up (one .meta per worker, <hash>.data one
 * object). In the cluster too each worker's file is its own shard (k is
 * worker 0's, open as fd with manifest mf); a worker-0 shard holding every
 * worker's file (restored from a backup of the older layout, or written by
 * an earlier mtcfs) serves them all. -ENODATA when the shard has no .save
 * file at all (a step directory committed in pytorch mode): the caller
 * backs it up whole. */
static int upload_workers(struct eng *e, const struct bk_upload *u, const struct shard_key *k,
			  int fd, const struct manifest *mf, uint32_t workers, char *err,
			  size_t errlen)
{
	bool any = false;
	int rc;

	if (!save_entry(mf, k, 0, &any) || !any)
		return any ? -ENOENT : -ENODATA;
	for (uint32_t w = 0; w < workers; w++) {
		struct shard_key wk = *k;
		struct shard_rec rec = { 0 };
		struct manifest *wmf = NULL;
		const struct mf_entry *ent = save_entry(mf, k, w, &any);
		int wfd = -1;

		wk.worker = w;
		if (!ent && idx_get_shard(ram_idx(e->ram), &wk, &rec) == 0 && rec.mf &&
		    rec.state >= SH_COMMITTED && rec.state != SH_BAD &&
		    mf_decode(rec.mf, rec.mflen, &wmf) == 0 &&
		    (ent = save_entry(wmf, k, w, &any)) != NULL &&
		    (wfd = ram_shard_open(e->ram, &wk)) < 0)
			ent = NULL;
		idx_rec_clear(&rec);
		if (!ent) {
			snprintf(err, errlen, "the shard of step %llu has no .save file of worker %u",
				 (unsigned long long)k->step, w);
			mf_free(wmf);
			return -ENOENT;
		}
		rc = bk_upload_file(e->bkt, u->job, u->name, &wk, wfd >= 0 ? wfd : fd, ent, u->data);
		if (wfd >= 0)
			close(wfd);
		mf_free(wmf);
		if (rc < 0) {
			snprintf(err, errlen, "%s", bkt_last_error());
			return rc;
		}
	}
	return 0;
}

void eng_backup_run(void *arg)
{
	struct bk_upload *u = arg;
	struct eng *e = u->e;
	struct shard_rec rec = { 0 };
	struct manifest *mf = NULL;
	struct shard_key k = { 0 };
	char err[512] = "";
	uint64_t t0 = util_now_ns();
	json_t *ev;
	struct job_now now;
	uint32_t workers;
	bool save_files;
	int fd = -1, rc;

	snprintf(k.job, sizeof(k.job), "%s", u->job);
	k.step = u->step;
	jobid_get(e->jid, &now);
	k.rank = (uint32_t)now.rank;
	save_files = now.save_files && !strcmp(now.job, u->job);
	workers = now.workers;
	rc = idx_get_shard(ram_idx(e->ram), &k, &rec);
	if (rc < 0 || !rec.mf || mf_decode(rec.mf, rec.mflen, &mf) < 0) {
		snprintf(err, sizeof(err), "step %llu is not held on node %u",
			 (unsigned long long)k.step, k.rank);
		rc = rc < 0 ? rc : -ENOENT;
		goto out;
	}
	fd = ram_shard_open(e->ram, &k);
	if (fd < 0) {
		rc = fd;
		snprintf(err, sizeof(err), "shard directory missing");
		goto out;
	}
	rc = save_files ? upload_workers(e, u, &k, fd, mf, workers, err, sizeof(err)) : -ENODATA;
	if (rc == -ENODATA) {
		struct tier t = { 0 };
		rc = tier_bucket_backup_open(e->bkt, u->job, u->name, u->data, &t);
		if (rc == 0)
			rc = tier_put(&t, e->ram, &k, rec.mf, rec.mflen, mf);
		tier_close(&t);
		if (rc < 0)
			snprintf(err, sizeof(err), "%s", bkt_last_error());
	}
	if (rc < 0)
		goto out;
	life_backed_up(ram_idx(e->ram), &k);
	metrics_add(MC_BACKUPS, 1);
	metrics_add(MC_BACKUP_BYTES, u->data ? mf->total : 0);
	metrics_observe(MH_BACKUP_SECONDS, (double)(util_now_ns() - t0) / 1e9);
	log_info("engine", "backed up job=%s step=%llu node=%u to %s/%s/%s bytes=%llu data=%d secs=%.2f",
		 u->job, (unsigned long long)u->step, k.rank, bkt_url(e->bkt), u->job, u->name,
		 (unsigned long long)mf->total, u->data, (double)(util_now_ns() - t0) / 1e9);
out:
	if (rc < 0) {
		metrics_add(MC_BACKUP_FAILURES, 1);
		eng_report(e, "backup %s of job %s step %llu failed: %s", u->name, u->job,
		       (unsigned long long)u->step, err[0] ? err : strerror(-rc));
	}
	if (fd >= 0)
		close(fd);
	mf_free(mf);
	idx_rec_clear(&rec);
	pthread_mutex_lock(&e->mu);
	e->pins--;
	pthread_mutex_unlock(&e->mu);
	ev = proto_backup_done_encode(&(struct proto_backup_done){
		.job = u->job, .name = u->name, .step = u->step, .ok = rc == 0,
		.error = rc < 0 ? (err[0] ? err : strerror(-rc)) : NULL });
	if (eng_ctl_event(e, ev) < 0)
		log_warn("engine", "cannot report backup %s to the coordinator", u->name);
	json_decref(ev);
	free(u);
}

bool eng_pinned(struct eng *e, const char *job, uint64_t step)
{
	bool r;
	if (!e)
		return false;
	pthread_mutex_lock(&e->mu);
	r = e->pins > 0 && e->pin_step == step && !strcmp(e->pin_job, job);
	pthread_mutex_unlock(&e->mu);
	return r;
}

/* ---------- the bucket, as the coordinator asks for it ---------- */

static bool excluded(const char (*ex)[64], size_t n, const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (!strcmp(ex[i], name))
			return true;
	return false;
}

/* Can a job of nodes x W (assume-data-parallelism dp) restore backup v,
 * listed with bk_check_backup(nodes 0: its own shape)? As GKE judges it,
 * only the job's ranks count (lkg_plan_backup): 0 and *owners (malloc'ed,
 * [nodes * W]: the backup's node each (rank, worker) fetches), or
 * -ENOENT with the reason in why. */
static int plan_for_job(const struct bk_backup *v, uint32_t nodes, uint32_t dp, uint32_t W,
			uint32_t **owners, char *why, size_t whylen)
{
	struct lkg_hold *h = NULL;
	struct lkg_input in = { .nodes = nodes, .dp = dp, .workers = W };
	struct lkg_plan p = { 0 };
	struct lkg_gap g;
	uint32_t seen = 0;
	size_t nh = 0;
	int rc;

	*owners = NULL;
	if (!v->nshards || !v->nodes_seen) {
		snprintf(why, whylen, "%s", v->why[0] ? v->why : "no .meta");
		return -ENOENT;
	}
	h = calloc(v->nshards * (W ? W : 1), sizeof(*h));
	if (!h)
		return -ENOMEM;
	for (size_t i = 0; i < v->nshards; i++) {
		const struct bk_shard *s = &v->shards[i];
		if (s->node + 1 > seen)
			seen = s->node + 1;   /* the backup's job size, as its .meta say */
		if (!s->complete)
			continue;
		if (s->step != v->step) {
			snprintf(why, whylen, "mixed steps %llu and %llu",
				 (unsigned long long)s->step, (unsigned long long)v->step);
			free(h);
			return -ENOENT;
		}
		h[nh] = (struct lkg_hold){ .holder = s->node, .owner = s->node,
					   .worker = s->worker, .step = s->step };
		memcpy(h[nh].hash, s->hash, 32);
		nh++;
		/* mtcfs before per-worker backups: one w0 shard (with its
		 * manifest) held every worker's file of the node */
		if (W > 1 && s->worker == 0 && !s->gke && !s->file &&
		    (i + 1 == v->nshards || v->shards[i + 1].node != s->node))
			for (uint32_t w = 1; w < W; w++) {
				h[nh] = h[nh - 1];
				h[nh++].worker = w;
			}
	}
	in.h = h;
	in.nh = nh;
	rc = lkg_plan_backup(&in, &p, &g);
	if (rc == 0 && !p.found) {
		const struct bk_shard *own = NULL;
		char wk[24] = "";
		rc = -ENOENT;
		for (size_t i = 0; i < v->nshards && !own; i++)
			if (v->shards[i].node == g.rank && v->shards[i].worker == g.worker)
				own = &v->shards[i];
		if (W > 1)
			snprintf(wk, sizeof(wk), " worker %u", g.worker);
		if (own && !g.disagree)
			snprintf(why, whylen, "node %u worker %u: %s", g.rank, g.worker,
				 own->why[0] ? own->why : "incomplete");
		else if (g.disagree)
			snprintf(why, whylen, "node %u%s has no shard in it and the shards of its column "
				 "(nodes %u mod %u) differ, so none of them is its own", g.rank, wk,
				 g.rank % (nodes / dp), nodes / dp);
		else if (g.columns)
			snprintf(why, whylen, "node %u%s has no shard in it, nor has any node of its "
				 "column (nodes %u mod %u)", g.rank, wk, g.rank % (nodes / dp), nodes / dp);
		else
			snprintf(why, whylen, "it was written by a job of %u nodes and this job has %u: "
				 "node %u has no shard in it (with assume-data-parallelism a new node "
				 "restores its column's)", seen, nodes, g.rank);
	} else if (rc == 0) {
		*owners = malloc((size_t)nodes * p.workers * sizeof(**owners));
		if (!*owners)
			rc = -ENOMEM;
		for (size_t i = 0; *owners && i < (size_t)nodes * p.workers; i++)
			(*owners)[i] = p.src[i].owner;
	} else if (rc == -EINVAL) {
		snprintf(why, whylen, "its shards are not of one step");
		rc = -ENOENT;
	}
	lkg_plan_free(&p);
	free(h);
	return rc;
}

struct usable_arg {
	const char (*ex)[64];
	size_t n;
	uint32_t nodes, dp, workers;
};

static bool usable(void *arg, const struct bk_backup *v)
{
	const struct usable_arg *x = arg;
	uint32_t *owners = NULL;
	char why[8];
	bool ok;

	if (excluded(x->ex, x->n, v->name))
		return false;
	ok = plan_for_job(v, x->nodes, x->dp, x->workers, &owners, why, sizeof(why)) == 0;
	free(owners);
	return ok;
}

int eng_bk_decide(void *arg, const char *job, uint32_t nodes, uint32_t dp, const char (*ex)[64],
		  size_t nex, bool need_newest, struct coord_bk_decision *d)
{
	struct eng *e = arg;
	struct bk_backup *v = NULL, one;
	char rv[BK_NAME_MAX], why[512], reason[400];
	size_t n = 0, nl = 0;
	struct job_now now;
	uint32_t workers;
	int rc;

	memset(d, 0, sizeof(*d));
	jobid_get(e->jid, &now);
	workers = now.workers;
	if (dp && nodes % dp)
		dp = 0;
	d->workers = workers;
	rc = bk_get_restore_version(e->bkt, job, rv);
	if (rc == 0 || rc == -EBADMSG) {
		d->forced = true;
		if (rc == -EBADMSG) {
			snprintf(d->notes, sizeof(d->notes),
				 "%s/%s/restore.version does not name a backup; nothing is restored",
				 bkt_url(e->bkt), job);
			return 0;
		}
		snprintf(d->name, sizeof(d->name), "%s", rv);
		memset(&one, 0, sizeof(one));
		/* its own shape (nodes 0): the job's ranks are judged here, as
		 * GKE judges them */
		rc = bk_check_backup(e->bkt, job, rv, 0, workers, &one);
		if (rc < 0)
			snprintf(why, sizeof(why), "does not exist");
		else if (excluded(ex, nex, rv))
			snprintf(why, sizeof(why), "failed to restore");
		else if ((rc = plan_for_job(&one, nodes, dp, workers, &d->owners, reason,
					    sizeof(reason))) == 0) {
			d->forced_ok = true;
			d->step = one.step;
		} else if (rc == -ENOMEM) {
			bk_backup_clear(&one);
			return rc;
		} else {
			snprintf(why, sizeof(why), "cannot be restored by this job: %s", reason);
		}
		if (!d->forced_ok)
			snprintf(d->notes, sizeof(d->notes),
				 "restore.version names backup %s, which %s; nothing is restored (no fallback)",
				 rv, why);
		bk_backup_clear(&one);
		return 0;
	}
	if (rc != -ENOENT)
		return rc;
	if (!need_newest)
		return 0;
	/* newest first, and no further than the first usable one */
	struct usable_arg ua = { ex, nex, nodes, dp, workers };
	rc = bk_list_backups_until(e->bkt, job, 0, workers, usable, &ua, &v, &n);
	if (rc < 0)
		return rc;
	for (size_t i = 0; i < n; i++) {
		if (excluded(ex, nex, v[i].name))
			continue;
		rc = plan_for_job(&v[i], nodes, dp, workers, &d->owners, why, sizeof(why));
		if (rc == -ENOMEM)
			break;
		if (rc == 0) {
			d->have_newest = true;
			d->step = v[i].step;
			snprintf(d->name, sizeof(d->name), "%s", v[i].name);
			break;
		}
		if (nl < sizeof(d->notes) - 1)
			nl += (size_t)snprintf(d->notes + nl, sizeof(d->notes) - nl, "%sbackup %s skipped: %s",
					       nl ? "; " : "", v[i].name, why);
		if (nl >= sizeof(d->notes))
			nl = sizeof(d->notes) - 1;
	}
	bk_backups_free(v, n);
	return rc == -ENOMEM ? rc : 0;
}

/* The clock backups are named by.  MTCFS_TEST_MINUTE_SECS=N (tests only,
 * 1..60) makes a minute of it last N real seconds from the first call, so
 * tests of the one-backup-per-minute rule need not wait real minutes. */
static time_t backup_clock(unsigned *real_s_per_min)
{
	/* only the coordinator's one worker thread calls this */
	static time_t t0;
	static unsigned scale;
	time_t now = time(NULL);

	*real_s_per_min = 60;
	if (!t0) {
		const char *v = getenv("MTCFS_TEST_MINUTE_SECS");
		uint64_t n;
		if (v && util_parse_u64(v, 60, &n) == 0 && n >= 1)
			scale = (unsigned)n;
		t0 = now;
	}
	if (!scale)
		return now;
	*real_s_per_min = scale;
	return t0 + (now - t0) * 60 / (time_t)scale;
}

int eng_bk_name(void *arg, const char *job, char *out, size_t outlen, unsigned *retry_s)
{
	struct eng *e = arg;
	char name[BK_NAME_MAX];
	unsigned per_min;
	time_t t = backup_clock(&per_min);
	int rc = bk_new_name(e->bkt, job, t, name);

	*retry_s = 0;
	if (rc == -EAGAIN) {
		/* real seconds until the clock's next minute, rounded up */
		*retry_s = (unsigned)(((60 - t % 60) * per_min + 59) / 60);
		snprintf(out, outlen, "%s", bkt_last_error());
	} else if (rc < 0) {
		eng_report(e, "backup of job %s not started: %s", job, bkt_last_error());
		snprintf(out, outlen, "%s", bkt_last_error());
	} else {
		snprintf(out, outlen, "%s", name);
	}
	return rc;
}

int eng_bk_discard(void *arg, const char *job, const char *name, char *out, size_t outlen)
{
	struct eng *e = arg;
	int rc = bk_discard_attempt(e->bkt, job, name);

	if (rc < 0) {
		eng_report(e, "backup %s of job %s failed and cannot be removed: %s", name, job,
		       bkt_last_error());
		snprintf(out, outlen, "%s", bkt_last_error());
	}
	return rc;
}

void eng_bk_clear_rv(void *arg, const char *job)
{
	struct eng *e = arg;
	int rc = bk_clear_restore_version(e->bkt, job);
	if (rc < 0)
		log_err("engine", "cannot delete %s/%s/restore.version: %s", bkt_url(e->bkt), job,
			bkt_last_error());
	else
		log_info("engine", "deleted %s/%s/restore.version after the first commit following its restore",
			 bkt_url(e->bkt), job);
}
