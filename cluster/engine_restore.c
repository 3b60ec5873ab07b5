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

/* Shards per node and step of job c: one per worker in framework:
 * pytorch, else one. */
static uint32_t job_workers(const struct rcfg *c)
{
	return c->framework == RCFG_FW_PYTORCH && c->workers_per_node > 1 ?
	       (uint32_t)c->workers_per_node : 1;
}

static json_t *catalog_msg(struct eng *e, const struct rcfg *c)
{
	struct shard_rec *recs = NULL;
	size_t n = 0;
	uint32_t W = job_workers(c);
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

/* Make this node's shard of plan p of worker w (0 unless one shard per
 * worker; p's holder, owner, hash and addr are that worker's) present
 * under its own key, from the tier the plan names. *whole: a bucket
 * restore brought every worker's file in worker 0's shard (a backup of
 * the older layout). */
static int obtain(struct eng *e, const struct rcfg *c, const struct plan_entry *p, uint32_t w,
		  bool *whole, char *why, size_t whylen)
{
	struct tier_get g = { .ram = e->ram };
	struct adopt ad = { c, p->step, p->owner, (uint32_t)c->node_rank };
	struct tier t = { 0 }, *src = &t;
	char addr[256];
	int rc;

	*whole = false;
	snprintf(g.as.job, sizeof(g.as.job), "%s", c->job);
	g.as.step = p->step;
	g.as.rank = (uint32_t)c->node_rank;
	g.as.worker = w;
	g.want = g.as;
	g.want.rank = p->owner;

	if (p->bucket) {
		if (!e->bkt) {
			snprintf(why, whylen, "the plan restores backup %s but this node has no bucket= option",
				 p->backup);
			return -ENOENT;
		}
		tier_bucket_init(e->bkt, &t);
		g.backup = p->backup;
		g.save_files = c->framework == RCFG_FW_PYTORCH;
		g.workers_per_node = (uint32_t)c->workers_per_node;
	} else if (p->holder == (uint32_t)c->node_rank && p->owner == g.as.rank &&
		   (rc = redund_source(e, &g.want, (uint32_t)c->nodes, (uint32_t)c->assume_dp,
				       &t)) != 0) {
		/* planned here with no copy here: the scheme rebuilds it (rs:
		 * from the code) */
		if (rc < 0)
			return rc;
	} else if (p->holder == (uint32_t)c->node_rank) {
		tier_ram_init(e->ram, &t);
	} else {
		if (p->addr[0])
			snprintf(addr, sizeof(addr), "%s", p->addr);
		else if ((rc = eng_addr_of(e, p->holder, addr, sizeof(addr))) < 0) {
			snprintf(why, whylen, "no address for rank %u", p->holder);
			return rc;
		}
		rc = tier_peer_open(addr, p->holder, c->node_rank, &e->auth, &t);
		if (rc < 0)
			return rc;
		g.hash = p->hash;
	}
	if (p->owner != g.as.rank && c->framework == RCFG_FW_PYTORCH) {
		/* a column mate's files, as this node's (a bucket restore of
		 * one worker file already names it for this rank: no-op) */
		g.rename = adopt_rename;
		g.rename_arg = &ad;
	}
	rc = tier_obtain(&src, 1, &g, why, whylen);
	*whole = g.whole;
	tier_close(&t);
	return rc;
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

/* One restore round of the control thread: what its steps share. */
struct round {
	struct eng *e;
	const struct rcfg *c;
	restore_report_fn rep;
	void *arg;
	int call_ms;
	uint64_t deadline;           /* util_now_ns(): give up after */
	int rounds;                  /* catalog attempts retried */
	char last_notes[1024];       /* the plan's notes last reported */
};

#define PLAN_RESTART 1           /* the coordinator restarts the round */

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

/* Each worker's shard of plan p from its own source (one shard per
 * worker), as GKE restores each worker's file. On failure, why says why,
 * *fw is the worker that failed and p's holder/owner its source (for
 * fetch_failed). 0 or -errno. */
static int obtain_workers(struct round *r, struct plan_entry *p, uint32_t *fw, char *why,
			  size_t whylen)
{
	uint32_t W = job_workers(r->c);
	struct plan_entry *pw = NULL;
	int rc = 0;

	*fw = 0;
	for (uint32_t w = 0; w < W && rc == 0; w++) {
		bool whole = false;
		if (w > 0 && !p->bucket && w >= p->nsrc) {
			rc = -EPROTO;
			snprintf(why, whylen, "the plan names no source for worker %u", w);
			break;
		}
		if (w > 0 && (!p->bucket || w < p->nsrc)) {
			/* its own source (bucket: the backup's node
			 * to fetch, when the plan names one) */
			if (!pw && !(pw = malloc(sizeof(*pw)))) {
				rc = -ENOMEM;
				break;
			}
			*pw = *p;
			pw->holder = p->src[w].holder;
			pw->owner = p->src[w].owner;
			memcpy(pw->hash, p->src[w].hash, 32);
			snprintf(pw->addr, sizeof(pw->addr), "%s", p->src[w].addr);
		}
		*fw = w;
		rc = obtain(r->e, r->c, w > 0 && (!p->bucket || w < p->nsrc) ? pw : p, w,
			    &whole, why, whylen);
		if (whole)
			break;   /* every worker's file came in worker 0's shard */
	}
	if (rc < 0 && *fw > 0 && pw) {
		p->holder = pw->holder;   /* the failed source, for fetch_failed */
		p->owner = pw->owner;
	}
	free(pw);
	return rc;
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

/* Follows the coordinator's plans, from *resp (consumed): the data of
 * each, then the barrier, until one passes it. 0 (plan filled in),
 * PLAN_RESTART (send the catalog again), or -errno. */
static int follow_plans(struct round *r, json_t **resp,
			void (*prerestore)(void *arg, const struct restore_plan *p),
			struct restore_plan *plan)
{
	const struct rcfg *c = r->c;
	struct plan_entry p;
	int rc;

	for (;;) {
		enum proto_op op;
		char why[512] = "";
		json_t *rd;
		uint32_t fw;

		if (proto_msg_op(*resp, &op) == 0 && op == PROTO_RESTART)
			return PLAN_RESTART;
		rc = parse_plan(*resp, &p);
		json_decref(*resp);
		*resp = NULL;
		if (rc < 0)
			return rc;
		if (p.bucket && !p.has_owner) {
			/* this rank's own shard of the backup */
			p.holder = p.owner = (uint32_t)c->node_rank;
			p.nsrc = 0;
		}
		to_restore_plan(c, &p, plan);
		if (p.notes[0] && r->rep && strcmp(p.notes, r->last_notes)) {
			r->rep(r->arg, p.notes);
			snprintf(r->last_notes, sizeof(r->last_notes), "%s", p.notes);
		}
		if (prerestore)
			prerestore(r->arg, plan);
		if (p.found && obtain_workers(r, &p, &fw, why, sizeof(why)) < 0) {
			rc = source_failed(r, &p, fw, why, resp);
			if (rc < 0)
				return rc;
			/* out of time with this plan's data not here: a failure,
			 * never a success (it returned the fetch_failed call's 0,
			 * and the caller published the markers of a step it did
			 * not have) */
			if (util_now_ns() > r->deadline)
				return -ETIMEDOUT;
			continue;
		}
		/* the job-wide barrier */
		rd = proto_ready_encode(&(struct proto_ready){ .job = c->job, .plan = p.plan });
		rc = eng_ctl_call(r->e, rd, resp, r->call_ms);
		json_decref(rd);
		if (rc < 0)
			return rc;
		if (proto_msg_op(*resp, &op) == 0 && op == PROTO_GO) {
			json_decref(*resp);
			*resp = NULL;
			if (p.found)
				restored(r, &p);
			return 0;
		}
		if (util_now_ns() > r->deadline)
			return -ETIMEDOUT;
		/* a new plan (another node's source failed): go around again */
	}
}

int eng_restore(struct eng *e, const struct rcfg *c, restore_report_fn rep, void *arg,
		void (*prerestore)(void *arg, const struct restore_plan *p),
		struct restore_plan *plan)
{
	struct round r = {
		.e = e, .c = c, .rep = rep, .arg = arg,
		.call_ms = (e->restore_timeout_s + 30) * 1000,
		.deadline = util_now_ns() + (uint64_t)(3 * e->restore_timeout_s + 60) * 1000000000ULL,
	};
	json_t *resp = NULL;
	bool stopping;
	int rc;

	pthread_mutex_lock(&e->ctl_mu);
	if (e->no_restores) {
		pthread_mutex_unlock(&e->ctl_mu);
		log_info("engine", "restore of job %s not started: the daemon is stopping", c->job);
		return -ECANCELED;
	}
	e->restoring = true;
	e->restore_cancel = false;
	e->restore_thr = pthread_self();
	pthread_mutex_unlock(&e->ctl_mu);
	do {
		json_decref(resp);
		resp = NULL;
		rc = send_catalog(&r, &resp);
		if (rc >= 0)
			rc = follow_plans(&r, &resp, prerestore, plan);
	} while (rc == PLAN_RESTART);

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
	json_decref(resp);
	return rc;
}
