/* engine_restore.c — the restore of DESIGN §5 (see engine_int.h). */
#include "cluster/engine_int.h"
#include "cluster/redund.h"
#include "tiers/backup.h"
#include "tiers/tier.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

/* ---------- restore ---------- */

/* The source of one worker's shard (framework: pytorch, workers > 1). */
struct plan_src {
	uint32_t holder, owner;
	uint8_t hash[32];
	char addr[256];
};

struct plan_entry {
	uint32_t plan;
	bool found;
	bool bucket;
	char backup[64];
	char notes[1024];
	uint64_t step;
	uint32_t holder, owner;       /* worker 0's shard (the only one, mostly);
				       * bucket: owner is the backup's node to
				       * fetch (has_owner false: this rank) */
	bool has_owner;
	uint8_t hash[32];
	char addr[256];
	uint32_t nsrc;                /* > 0: one source per worker in src[] */
	struct plan_src src[RCFG_WORKERS_MAX];
};

static int parse_plan(json_t *m, struct plan_entry *p)
{
	struct proto_plan_src sh[RCFG_WORKERS_MAX];
	struct proto_plan x;
	char why[160];

	memset(p, 0, sizeof(*p));
	if (proto_plan_decode(m, &x, sh, RCFG_WORKERS_MAX, why, sizeof(why)) < 0 ||
	    (x.bucket && !bk_backup_name_ok(x.backup))) {
		log_dbg("engine", "a plan entry is refused: %s", x.bucket ? "bad backup name" : why);
		return -EPROTO;
	}
	p->plan = x.plan;
	p->found = x.found;
	snprintf(p->notes, sizeof(p->notes), "%s", x.notes ? x.notes : "");
	p->step = x.step;
	p->bucket = x.bucket;
	snprintf(p->backup, sizeof(p->backup), "%s", x.bucket ? x.backup : "");
	p->holder = x.src.holder;
	p->owner = x.src.owner;
	p->has_owner = x.has_owner;
	memcpy(p->hash, x.src.hash, 32);
	snprintf(p->addr, sizeof(p->addr), "%s", x.src.addr ? x.src.addr : "");
	p->nsrc = x.nshards;
	for (uint32_t i = 0; i < x.nshards; i++) {
		p->src[i].holder = sh[i].holder;
		p->src[i].owner = sh[i].owner;
		memcpy(p->src[i].hash, sh[i].hash, 32);
		snprintf(p->src[i].addr, sizeof(p->src[i].addr), "%s", sh[i].addr);
	}
	return 0;
}

/* A worker shard's content key (framework: pytorch): its one .save file
 * apart from the name, which carries the rank: SHA-256 over a tag, the
 * size and the CRC32C. Column mates under D agree on it when their
 * workers saved the same bytes (GKE compares the files' BLAKE3). 0, or
 * -ENODATA when the shard is not one worker file. */
int eng_content_key(const struct shard_rec *r, uint8_t out[32])
{
	static const char tag[] = "mtcfs-worker-file-v1";
	struct manifest *mf = NULL;
	uint8_t buf[sizeof(tag) + 12];
	unsigned int hl = 0;
	int rc = -ENODATA;

	if (!r->mf || mf_decode(r->mf, r->mflen, &mf) < 0)
		return -ENODATA;
	if (mf->n == 1 && mf->e[0].type == MF_FILE &&
	    eng_save_worker(mf->e[0].path, r->key.job, r->key.rank, r->key.step) ==
	    (int64_t)r->key.worker) {
		memcpy(buf, tag, sizeof(tag));
		for (int i = 0; i < 8; i++)
			buf[sizeof(tag) + i] = (uint8_t)(mf->e[0].size >> (8 * i));
		for (int i = 0; i < 4; i++)
			buf[sizeof(tag) + 8 + i] = (uint8_t)(mf->e[0].crc32c >> (8 * i));
		if (EVP_Digest(buf, sizeof(buf), out, &hl, EVP_sha256(), NULL) && hl == 32)
			rc = 0;
	}
	mf_free(mf);
	return rc;
}

static json_t *catalog_msg(struct eng *e, const struct rcfg *c)
{
	struct shard_rec *recs = NULL;
	size_t n = 0;
	uint32_t W = rcfg_workers(c);
	struct proto_catalog m = { .job = { c->job, (uint32_t)c->nodes, (uint32_t)c->assume_dp },
				   .workers = W > 1 ? W : 0 };
	json_t *out;
	bool listed = idx_list_shards(ram_idx(e->ram), c->job, &recs, &n) == 0;

	if (listed && n > 0)
		m.holds = calloc(n < (size_t)MAX_HOLDS * W ? n : (size_t)MAX_HOLDS * W,
				 sizeof(*m.holds));
	for (size_t i = n; m.holds && i-- > 0 && m.nholds < (size_t)MAX_HOLDS * W;) {
		struct proto_hold *h = &m.holds[m.nholds];
		if (recs[i].state < SH_COMMITTED || recs[i].state == SH_BAD || !recs[i].mf ||
		    recs[i].key.worker >= W || recs[i].key.rank >= (uint32_t)c->nodes)
			continue;
		h->owner = recs[i].key.rank;
		h->step = recs[i].key.step;
		memcpy(h->hash, recs[i].hash, 32);
		if (W > 1) {
			h->has_worker = true;
			h->worker = recs[i].key.worker;
			h->has_content = eng_content_key(&recs[i], h->content) == 0;
		}
		m.nholds++;
	}
	if (listed)
		idx_recs_free(recs, n);
	out = proto_catalog_encode(&m);
	free(m.holds);
	json_t *ec = out ? redund_status(e, c->job) : NULL;
	if (ec)
		json_object_set_new(out, "ec", ec);
	return out;
}

/* framework: pytorch under D: a column mate's shard restored as this
 * node's holds files named for the mate's rank. GKE's coordinator gives
 * the node its mate's per-worker hashes and its restore writes them under
 * the node's own names (coordinator.py: infer_missing_meta, restore.py),
 * so each worker's marker finds its file: rename the staged files to this
 * rank's names (the step's spelling kept) and rebuild the manifest. */
static int adopt_mate_files(const struct rcfg *c, int dirfd, uint64_t step, uint32_t owner,
			    uint32_t rank, struct manifest **mf)
{
	size_t jl = strlen(c->job);
	struct manifest *nm = NULL;
	char from[32], to[32];
	int rc;

	snprintf(from, sizeof(from), "-n%u-w", owner);
	snprintf(to, sizeof(to), "-n%u-w", rank);
	/* the owners the mate's manifest gives its files go onto the tree
	 * first, under their names there (the mate was written by this job's
	 * uid too), so that the rebuilt manifest records them; without any,
	 * the publish's rule decides */
	if ((*mf)->owners && (rc = mf_apply_owners(dirfd, *mf, NULL, 0, NULL, 0)) < 0)
		return rc;
	for (size_t i = 0; i < (*mf)->n; i++) {
		const char *p = (*mf)->e[i].path, *q;
		char nn[NAME_MAX + 1];

		if ((*mf)->e[i].type != MF_FILE || eng_save_worker(p, c->job, owner, step) < 0)
			continue;
		q = p + jl + 2 + strspn(p + jl + 2, "0123456789");   /* at "-n<owner>-w" */
		if ((size_t)snprintf(nn, sizeof(nn), "%.*s%s%s", (int)(q - p), p, to,
				     q + strlen(from)) >= sizeof(nn))
			return -ENAMETOOLONG;
		if (renameat(dirfd, p, dirfd, nn) < 0)
			return -errno;
	}
	rc = (*mf)->owners ? mf_build(dirfd, &nm) : mf_build_ownerless(dirfd, &nm);
	if (rc < 0)
		return rc;
	mf_free(*mf);
	*mf = nm;
	return 0;
}

struct adopt {
	const struct rcfg *c;
	uint64_t step;
	uint32_t owner, rank;
};

static int adopt_rename(void *arg, int dirfd, struct manifest **mf)
{
	const struct adopt *a = arg;
	return adopt_mate_files(a->c, dirfd, a->step, a->owner, a->rank, mf);
}

/* The source of worker w's shard of plan entry p (0 unless one shard per
 * worker; p's holder, owner, hash and addr are that worker's) in *t, and
 * what the tier needs in g (g->as is this node's key of the worker). 0 or
 * -errno with why. */
static int source_of(struct eng *e, const struct rcfg *c, const struct plan_entry *p,
		     struct adopt *ad, struct tier *t, struct tier_get *g, char *why, size_t whylen)
{
	char addr[256];
	int rc;

	g->want.rank = p->owner;
	if (p->bucket) {
		if (!e->bkt) {
			snprintf(why, whylen, "the plan restores backup %s but this node has no bucket= option",
				 p->backup);
			return -ENOENT;
		}
		tier_bucket_init(e->bkt, t);
		g->backup = p->backup;
		g->save_files = c->framework == RCFG_FW_PYTORCH;
		g->workers_per_node = (uint32_t)c->workers_per_node;
	} else if (p->holder == (uint32_t)c->node_rank && p->owner == g->as.rank &&
		   (rc = redund_source(e, &g->want, (uint32_t)c->nodes, (uint32_t)c->assume_dp,
				       t)) != 0) {
		/* planned here with no copy here: the scheme rebuilds it (rs:
		 * from the code) */
		if (rc < 0)
			return rc;
	} else if (p->holder == (uint32_t)c->node_rank) {
		tier_ram_init(e->ram, t);
	} else {
		if (p->addr[0])
			snprintf(addr, sizeof(addr), "%s", p->addr);
		else if ((rc = eng_addr_of(e, p->holder, addr, sizeof(addr))) < 0) {
			snprintf(why, whylen, "no address for rank %u", p->holder);
			return rc;
		}
		rc = tier_peer_open(addr, p->holder, c->node_rank, &e->auth, t);
		if (rc < 0)
			return rc;
		g->hash = p->hash;
	}
	if (p->owner != g->as.rank && c->framework == RCFG_FW_PYTORCH) {
		/* a column mate's files, as this node's (a bucket restore of
		 * one worker file already names it for this rank: no-op) */
		*ad = (struct adopt){ c, p->step, p->owner, (uint32_t)c->node_rank };
		g->rename = adopt_rename;
		g->rename_arg = ad;
	}
	return 0;
}

static void to_restore_plan(const struct rcfg *c, const struct plan_entry *p, struct restore_plan *rp)
{
	memset(rp, 0, sizeof(*rp));
	rp->found = p->found;
	if (!p->found)
		return;
	rp->step = p->step;
	snprintf(rp->key.job, sizeof(rp->key.job), "%s", c->job);
	rp->key.step = p->step;
	rp->key.rank = (uint32_t)c->node_rank;
	if (p->bucket) {
		rp->source = RS_BUCKET;
		snprintf(rp->backup, sizeof(rp->backup), "%s", p->backup);
		return;
	}
	rp->source = p->holder == (uint32_t)c->node_rank ? RS_LOCAL : RS_PEER;
}

/* One restore round of the control thread: what its steps share, and the
 * coordinator's plans as restore_run()'s planner (tiers/restore.h). */
struct round {
	struct eng *e;
	const struct rcfg *c;
	restore_report_fn rep;
	void *arg;
	int call_ms;
	uint64_t deadline;           /* util_now_ns(): give up after */
	int rounds;                  /* catalog attempts retried */
	char last_notes[1024];       /* the plan's notes last reported */
	struct plan_entry cur;       /* the plan being followed */
	struct plan_entry pw;        /* cur with one worker's source */
	struct adopt ad;             /* a column mate's files renamed */
};

/* This node's catalog to the coordinator; its answer (a plan) in *resp.
 * The coordinator not answering is retried every second until the
 * deadline (20 times at most). 0, or -errno (-ECANCELED: a new yaml or the
 * daemon's stop). */
static int send_catalog(struct round *r, json_t **resp)
{
	struct eng *e = r->e;

	for (;;) {
		json_t *req = catalog_msg(e, r->c);
		int rc = eng_ctl_call(e, req, resp, r->call_ms);
		char line[512];
		struct timespec ts;

		json_decref(req);
		if (rc == -ECANCELED || rc >= 0)
			return rc;
		snprintf(line, sizeof(line), "restore: the coordinator at %s did not answer: %s",
			 e->coord_addr, strerror(-rc));
		if (r->rep)
			r->rep(r->arg, line);
		/* a WARN per attempt: the restore that fails in the end is the
		 * one ERROR (ctl: "replicator.yaml rejected: restore failed") */
		log_warn("engine", "%s%s", line, util_now_ns() < r->deadline && r->rounds < 20
			 ? "; retrying in 1 s" : "; giving up");
		if (!(util_now_ns() < r->deadline && r->rounds++ < 20))
			return rc;
		pthread_mutex_lock(&e->ctl_mu);
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 1;
		if (!e->restore_cancel && !e->no_restores)   /* a new yaml ends the pause too */
			pthread_cond_timedwait(&e->ctl_cv, &e->ctl_mu, &ts);
		pthread_mutex_unlock(&e->ctl_mu);
	}
}

/* Worker fw's source of plan p failed (why): said, and the coordinator
 * asked for another source; its new plan in *resp. 0 or -errno. */
static int source_failed(struct round *r, const struct plan_entry *p, uint32_t fw,
			 const char *why, json_t **resp)
{
	json_t *ff;
	char line[800];
	int rc;

	if (p->bucket)
		snprintf(line, sizeof(line),
			 "restore of step %llu from backup %s failed (%s); asking for another backup",
			 (unsigned long long)p->step, p->backup, why);
	else
		snprintf(line, sizeof(line),
			 "restore of step %llu: source rank %u failed (%s); asking for another source",
			 (unsigned long long)p->step, p->holder, why);
	log_warn("engine", "%s", line);
	if (r->rep)
		r->rep(r->arg, line);
	ff = proto_fetch_failed_encode(&(struct proto_fetch_failed){
		.job = r->c->job, .plan = p->plan, .holder = p->holder,
		.owner = p->owner, .step = p->step, .worker = fw,
		.bucket = p->bucket });
	rc = eng_ctl_call(r->e, ff, resp, r->call_ms);
	json_decref(ff);
	return rc;
}

/* The job-wide barrier passed for plan p: its step is this node's LKG. */
static void restored(struct round *r, const struct plan_entry *p)
{
	struct eng *e = r->e;
	const struct rcfg *c = r->c;

	/* Older steps go only once the restored one is protected
	 * again job-wide (the coordinator's next safe step): it
	 * was restored from one copy, and its replicas or parity
	 * may never have been made (a node killed right after
	 * its commit) or may be on a node lost since. A step
	 * restored from the bucket is held there. */
	pthread_mutex_lock(&e->mu);
	e->has_lkg = true;
	e->lkg = p->step;
	e->has_safe = p->bucket;
	e->safe = p->step;
	snprintf(e->lkg_job, sizeof(e->lkg_job), "%s", c->job);
	pthread_mutex_unlock(&e->mu);
	/* what the schemes keep of later steps (replicas, parity
	 * holdings) belongs to the timeline left: the caller's
	 * retention plan drops it (life_plan_newer) */
	if (!p->bucket)
		eng_reprotect(e, c->job, p->step, (uint32_t)c->nodes, (uint32_t)c->assume_dp);
}

/* The coordinator's answer in resp (consumed) as the plan to follow, in
 * r->cur and *rp; an answer that restarts the round sends the catalog
 * again. 0 or -errno. */
static int take_plan(struct round *r, json_t *resp, struct restore_plan *rp)
{
	const struct rcfg *c = r->c;
	struct plan_entry *p = &r->cur;
	enum proto_op op;
	int rc;

	while (proto_msg_op(resp, &op) == 0 && op == PROTO_RESTART) {
		json_decref(resp);
		resp = NULL;
		rc = send_catalog(r, &resp);
		if (rc < 0)
			return rc;
	}
	rc = parse_plan(resp, p);
	json_decref(resp);
	if (rc < 0)
		return rc;
	if (p->bucket && !p->has_owner) {
		/* this rank's own shard of the backup */
		p->holder = p->owner = (uint32_t)c->node_rank;
		p->nsrc = 0;
	}
	to_restore_plan(c, p, rp);
	if (p->notes[0] && r->rep && strcmp(p->notes, r->last_notes)) {
		r->rep(r->arg, p->notes);
		snprintf(r->last_notes, sizeof(r->last_notes), "%s", p->notes);
	}
	return 0;
}

static int round_plan(void *arg, struct restore_plan *rp)
{
	struct round *r = arg;
	json_t *resp = NULL;
	int rc = send_catalog(r, &resp);

	return rc < 0 ? rc : take_plan(r, resp, rp);
}

/* Plan entry of worker w: cur, or cur with w's own source (one shard per
 * worker: src[w]; bucket: the backup's node to fetch, when named). */
static const struct plan_entry *worker_entry(struct round *r, uint32_t w)
{
	const struct plan_entry *p = &r->cur;

	if (w == 0 || (p->bucket && w >= p->nsrc))
		return p;
	r->pw = *p;
	r->pw.holder = p->src[w].holder;
	r->pw.owner = p->src[w].owner;
	memcpy(r->pw.hash, p->src[w].hash, 32);
	snprintf(r->pw.addr, sizeof(r->pw.addr), "%s", p->src[w].addr);
	return &r->pw;
}

static int round_source(void *arg, const struct restore_plan *rp, uint32_t w, struct tier *t,
			struct tier_get *g, char *why, size_t whylen)
{
	struct round *r = arg;

	(void)rp;
	if (w > 0 && !r->cur.bucket && w >= r->cur.nsrc) {
		snprintf(why, whylen, "the plan names no source for worker %u", w);
		return -EPROTO;
	}
	return source_of(r->e, r->c, worker_entry(r, w), &r->ad, t, g, why, whylen);
}

static int round_failed(void *arg, struct restore_plan *rp, uint32_t w, const char *why)
{
	struct round *r = arg;
	json_t *resp = NULL;
	int rc = source_failed(r, worker_entry(r, w), w, why, &resp);

	if (rc < 0)
		return rc;
	rc = take_plan(r, resp, rp);
	/* out of time with this plan's data not here: a failure, never a
	 * success (the caller would publish the markers of a step it does
	 * not have) */
	if (rc == 0 && util_now_ns() > r->deadline)
		rc = -ETIMEDOUT;
	return rc;
}

/* The job-wide barrier: passed, or another node's source failed and the
 * coordinator sends a new plan. */
static int round_ready(void *arg, struct restore_plan *rp)
{
	struct round *r = arg;
	json_t *rd, *resp = NULL;
	enum proto_op op;
	int rc;

	rd = proto_ready_encode(&(struct proto_ready){ .job = r->c->job, .plan = r->cur.plan });
	rc = eng_ctl_call(r->e, rd, &resp, r->call_ms);
	json_decref(rd);
	if (rc < 0)
		return rc;
	if (proto_msg_op(resp, &op) == 0 && op == PROTO_GO) {
		json_decref(resp);
		if (r->cur.found)
			restored(r, &r->cur);
		return 0;
	}
	if (util_now_ns() > r->deadline) {
		json_decref(resp);
		return -ETIMEDOUT;
	}
	rc = take_plan(r, resp, rp);
	return rc < 0 ? rc : RESTORE_REPLAN;
}

int eng_restore(struct eng *e, const struct rcfg *c, restore_report_fn rep, void *arg,
		void (*prerestore)(void *arg, const struct restore_plan *p),
		struct restore_plan *plan)
{
	struct round *r = calloc(1, sizeof(*r));
	struct restore_planner pl = {
		.arg = r, .ram = e->ram, .workers = rcfg_workers(c),
		.plan = round_plan, .source = round_source, .failed = round_failed,
		.ready = round_ready, .prerestore = prerestore, .pre_arg = arg,
	};
	bool stopping;
	int rc;

	if (!r)
		return -ENOMEM;
	*r = (struct round){
		.e = e, .c = c, .rep = rep, .arg = arg,
		.call_ms = (e->restore_timeout_s + 30) * 1000,
		.deadline = util_now_ns() + (uint64_t)(3 * e->restore_timeout_s + 60) * 1000000000ULL,
	};
	pthread_mutex_lock(&e->ctl_mu);
	if (e->no_restores) {
		pthread_mutex_unlock(&e->ctl_mu);
		free(r);
		log_info("engine", "restore of job %s not started: the daemon is stopping", c->job);
		return -ECANCELED;
	}
	e->restoring = true;
	e->restore_cancel = false;
	e->restore_thr = pthread_self();
	pthread_mutex_unlock(&e->ctl_mu);
	rc = restore_run(&pl, plan);

	pthread_mutex_lock(&e->ctl_mu);
	stopping = e->no_restores;
	if (e->restore_cancel || stopping)
		rc = -ECANCELED;   /* whatever the round got to: a new one replaces it */
	e->restoring = false;
	e->restore_cancel = false;
	pthread_mutex_unlock(&e->ctl_mu);
	if (rc == -ECANCELED)
		log_info("engine", "restore of job %s interrupted %s", c->job,
			 stopping ? "by the daemon's stop (unmount or signal)"
				  : "by a new replicator.yaml");
	free(r);
	return rc;
}
