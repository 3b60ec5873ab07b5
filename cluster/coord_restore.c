/* coord_restore.c — restore rounds of the coordinator (see coord.h, the
 * messages in net/proto.h): collect every node's catalog (waiting up to
 * restore_timeout for all), plan with lkg_plan() (asking the bucket when
 * there is one), answer each node with its entry of the plan, re-plan on
 * fetch failures, and release the job-wide barrier. Runs with c->mu held,
 * except the bucket's part of a plan on the coordinator's worker thread. */
#include "cluster/coord_i.h"
#include "cluster/coord_ec.h"
#include "net/frame.h"
#include "net/server.h"
#include "common/log.h"
#include "common/util.h"
#include "common/workq.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_t *plan_entry(struct coord *c, struct cjob *j, uint32_t rank)
{
	struct proto_plan_src sh[COORD_MAX_WORKERS];
	struct proto_plan p = { .plan = j->plan_id, .found = j->plan.found, .notes = j->notes,
				.step = j->plan.step, .bucket = j->bucket_plan,
				.backup = j->bucket_name };

	if (j->plan.found && j->bucket_plan && j->bucket_owners && rank < j->nodes) {
		/* a backup of another job size: the backup's node to fetch,
		 * sent only where it is not the rank's own */
		uint32_t W = j->bucket_owners_w ? j->bucket_owners_w : 1;
		memset(sh, 0, sizeof(sh));
		for (uint32_t w = 0; w < W && w < COORD_MAX_WORKERS; w++) {
			sh[w].owner = sh[w].holder = j->bucket_owners[(size_t)rank * W + w];
			sh[w].addr = "";
			p.has_owner |= sh[w].owner != rank;
		}
		p.src = sh[0];
		if (W > 1) {
			p.shards = sh;
			p.nshards = W < COORD_MAX_WORKERS ? W : COORD_MAX_WORKERS;
		}
	}

	if (j->plan.found && !j->bucket_plan && rank < j->plan.nodes) {
		uint32_t W = j->plan.workers ? j->plan.workers : 1;
		for (uint32_t w = 0; w < W && w < COORD_MAX_WORKERS; w++) {
			const struct lkg_src *x = &j->plan.src[(size_t)rank * W + w];
			sh[w] = (struct proto_plan_src){ .holder = x->holder, .owner = x->owner,
							 .addr = coord_addr_of(c, x->holder) };
			memcpy(sh[w].hash, x->hash, 32);
		}
		p.src = sh[0];
		p.shards = sh;
		p.nshards = W < COORD_MAX_WORKERS ? W : COORD_MAX_WORKERS;
	}
	return proto_plan_encode(&p);
}

static void compute_plan(struct coord *c, struct cjob *j);
static void send_plan_to_waiters(struct coord *c, struct cjob *j);

/* The bucket's say in a plan (restore.version, or the newest complete
 * backup when nothing is complete in the cluster): on the worker thread. */
struct bk_plan_job {
	struct coord *c;
	char job[JOB_NAME_MAX + 1];
	uint64_t round;
	uint32_t nodes, dp;
	char (*exclude)[64];
	size_t nexclude;
};

static void bucket_plan_run(void *arg)
{
	struct bk_plan_job *p = arg;
	struct coord *c = p->c;
	struct coord_bk_decision d;
	struct cjob *j;
	int rc;

	bool need_newest = true;

	memset(&d, 0, sizeof(d));
	/* peek at the cluster: the bucket's newest backup matters only when
	 * no step is complete in RAM */
	pthread_mutex_lock(&c->mu);
	for (j = c->jobs; j; j = j->next)
		if (!strcmp(j->name, p->job))
			break;
	if (j) {
		bool *live = calloc(j->nodes, sizeof(bool));
		struct lkg_input in = { .nodes = j->nodes, .dp = j->dp, .workers = j->workers,
					.h = j->holds, .nh = j->nholds,
					.live = live, .bad = j->bad, .nbad = j->nbad };
		struct lkg_plan tmp;
		if (live) {
			for (uint32_t r = 0; r < j->nodes; r++)
				live[r] = j->n[r].reported && j->n[r].conn != 0;
			struct lkg_hold *aug = coord_ec_augment(j, &in);
			if (lkg_plan(&in, &tmp) == 0) {
				need_newest = !tmp.found;
				lkg_plan_free(&tmp);
			}
			free(aug);
			free(live);
		}
	}
	pthread_mutex_unlock(&c->mu);
	rc = c->bk.decide(c->bk.arg, p->job, p->nodes, p->dp, (const char (*)[64])p->exclude,
			  p->nexclude, need_newest, &d);
	pthread_mutex_lock(&c->mu);
	for (j = c->jobs; j; j = j->next)
		if (!strcmp(j->name, p->job))
			break;
	if (j && j->round == p->round && j->state == R_PLANNING) {
		bool was_found = j->plan.found, was_bucket = j->bucket_plan;
		uint64_t was_step = j->plan.step;
		uint32_t was_id = j->plan_id;
		char was_name[64];
		snprintf(was_name, sizeof(was_name), "%s", j->bucket_name);
		compute_plan(c, j);        /* the cluster's part */
		j->bucket_plan = false;
		j->forced_restore = false;
		j->rv_seen = rc == 0 && d.forced;
		snprintf(j->notes, sizeof(j->notes), "%s", rc < 0 || (!d.forced && j->plan.found) ? "" : d.notes);
		if (rc < 0) {
			snprintf(j->notes, sizeof(j->notes), "the bucket could not be read (%s); planning from the cluster only",
				 strerror(-rc));
		} else if (d.forced) {
			j->plan.found = d.forced_ok;
			j->plan.step = d.step;
			j->bucket_plan = d.forced_ok;
			j->forced_restore = d.forced_ok;
			snprintf(j->bucket_name, sizeof(j->bucket_name), "%s", d.name);
		} else if (!j->plan.found && d.have_newest) {
			j->plan.found = true;
			j->plan.step = d.step;
			j->bucket_plan = true;
			snprintf(j->bucket_name, sizeof(j->bucket_name), "%s", d.name);
		}
		free(j->bucket_owners);
		j->bucket_owners = NULL;
		if (j->bucket_plan && d.owners) {
			j->bucket_owners = d.owners;   /* [nodes * workers], ours now */
			j->bucket_owners_w = d.workers;
			d.owners = NULL;
		}
		if (j->plan_id == was_id && (j->plan.found != was_found || j->plan.step != was_step ||
					     j->bucket_plan != was_bucket ||
					     strcmp(was_name, j->bucket_name))) {
			/* another backup: every node fetches again */
			j->plan_id++;
			j->plan_time = util_now_ns();
			for (uint32_t r = 0; r < j->nodes; r++)
				j->n[r].ready = false;
			j->nready = 0;
		}
		if (j->bucket_plan)
			log_info("coord", "plan job=%s plan=%u: restore backup %s (step %llu)%s", j->name,
				 j->plan_id, j->bucket_name, (unsigned long long)j->plan.step,
				 j->forced_restore ? " named by restore.version" : "");
		coord_ec_note(j);
		if (j->notes[0])
			log_warn("coord", "job %s: %s", j->name, j->notes);
		send_plan_to_waiters(c, j);
	}
	pthread_mutex_unlock(&c->mu);
	free(d.owners);
	free(p->exclude);
	free(p);
}

/* All catalogs are in (or the wait timed out): plan, asking the bucket
 * first when there is one. Called with c->mu held. */
void coord_start_plan(struct coord *c, struct cjob *j)
{
	struct bk_plan_job *p;

	if (!c->bk.decide || !c->worker)
		goto direct;
	p = calloc(1, sizeof(*p));
	if (!p)
		goto direct;
	p->c = c;
	snprintf(p->job, sizeof(p->job), "%s", j->name);
	p->round = j->round;
	p->nodes = j->nodes;
	p->dp = j->dp;
	if (j->nexcluded) {
		p->exclude = malloc(j->nexcluded * sizeof(*p->exclude));
		if (p->exclude) {
			memcpy(p->exclude, j->excluded, j->nexcluded * sizeof(*p->exclude));
			p->nexclude = j->nexcluded;
		}
	}
	if (workq_submit(c->worker, bucket_plan_run, p) == 0) {
		j->state = R_PLANNING;
		return;
	}
	free(p->exclude);
	free(p);
direct:
	compute_plan(c, j);
	send_plan_to_waiters(c, j);
}

static void compute_plan(struct coord *c, struct cjob *j)
{
	bool *live = calloc(j->nodes, sizeof(bool));
	struct lkg_input in = { .nodes = j->nodes, .dp = j->dp, .workers = j->workers,
				.h = j->holds, .nh = j->nholds,
				.live = live, .bad = j->bad, .nbad = j->nbad };
	uint64_t t0 = util_now_ns(), old_step = j->plan.step;
	bool was_planned = j->plan_round == j->round && j->plan_id, old_found = j->plan.found;
	uint32_t missing = 0;

	if (!live)
		return;
	for (uint32_t r = 0; r < j->nodes; r++) {
		live[r] = j->n[r].reported && j->n[r].conn != 0;
		if (!j->n[r].reported)
			missing++;
	}
	lkg_plan_free(&j->plan);
	struct lkg_hold *aug = coord_ec_augment(j, &in);
	if (lkg_plan(&in, &j->plan) < 0)
		memset(&j->plan, 0, sizeof(j->plan));
	free(aug);
	if (was_planned && j->plan.found == old_found && j->plan.step == old_step) {
		/* another source for the same step: nodes that already have
		 * their shard stay at the barrier */
	} else {
		j->plan_id++;
		j->plan_time = util_now_ns();
		for (uint32_t r = 0; r < j->nodes; r++)
			j->n[r].ready = false;
		j->nready = 0;
	}
	j->state = R_PLANNED;
	j->exp_scan = 0;             /* the next release check scans */
	j->plan_round = j->round;
	log_info("coord", "plan job=%s plan=%u found=%d step=%llu nodes=%u missing=%u holds=%zu bad=%zu plan_ms=%.2f",
		 j->name, j->plan_id, j->plan.found, (unsigned long long)j->plan.step, j->nodes,
		 missing, j->nholds, j->nbad, (double)(util_now_ns() - t0) / 1e6);
	free(live);
}

/* Answer every node waiting for a plan (catalog) or at the barrier of an
 * older plan (ready) with its entry of the current plan. */
static void send_plan_to_waiters(struct coord *c, struct cjob *j)
{
	for (uint32_t r = 0; r < j->nodes; r++) {
		struct cnode *n = &j->n[r];
		if (n->cat.waiting) {
			coord_send(c, n->cat.conn, NT_RESP, n->cat.req_id, plan_entry(c, j, r));
			n->cat.waiting = false;
		}
		if (n->rdy.waiting) {
			coord_send(c, n->rdy.conn, NT_RESP, n->rdy.req_id, plan_entry(c, j, r));
			n->rdy.waiting = false;
		}
	}
}

void coord_restart_history(struct cjob *j)
{
	/* what was committed before the restore belongs to a timeline the job
	 * left: from now on every node's history starts at the restored step */
	for (uint32_t r = 0; r < j->nodes; r++) {
		struct cnode *n = &j->n[r];
		memset(&n->lg, 0, sizeof(n->lg));
		if (n->nlgx)
			memset(n->lgx, 0, (size_t)n->nlgx * sizeof(*n->lgx));
		for (uint32_t w = 0; j->plan.found && w < j->workers; w++) {
			struct wlog *l = coord_wlog_of(n, w, true);
			uint32_t W = j->plan.workers ? j->plan.workers : 1;
			if (!l)
				break;
			l->commits[0] = j->plan.step + 1;
			if (!j->bucket_plan && r < j->plan.nodes && w < W)
				memcpy(l->commit_hash[0], j->plan.src[(size_t)r * W + w].hash, 32);
			if (j->bucket_plan) {
				/* the bucket holds it */
				l->repl[0] = j->plan.step + 1;
				memcpy(l->repl_hash[0], l->commit_hash[0], 32);
			}
		}
	}
	j->has_lkg = false;
	j->has_safe = false;
	if (j->plan.found) {
		/* every node restores this step: it is complete job-wide, and
		 * what is older than it belongs to the past. But it is safe
		 * (older steps may go) only once each node has said "replicated"
		 * of it again (eng_reprotect: its replicas or parity on the
		 * nodes there are now), unless the bucket holds it. */
		j->has_lkg = true;
		j->lkg = j->plan.step;
		j->has_safe = j->bucket_plan;
		j->safe = j->plan.step;
	}
}

static void release_barrier(struct coord *c, struct cjob *j)
{
	for (uint32_t r = 0; r < j->nodes; r++) {
		struct cnode *n = &j->n[r];
		if (n->rdy.waiting) {
			coord_send(c, n->rdy.conn, NT_RESP, n->rdy.req_id, proto_go_encode(j->plan_id));
			n->rdy.waiting = false;
		}
	}
	coord_restart_history(j);
	if (j->plan.found) {
		j->restored_step = j->plan.step;
		/* after a restore from it, restore.version goes with the next commit */
		if (j->forced_restore) {
			j->rv_delete_pending = true;
			j->rv_after_any = false;
		}
		if (j->bucket_plan && !j->has_last_bk) {
			/* that backup already holds this step */
			j->has_last_bk = true;
			j->last_bk_step = j->plan.step;
			j->last_bk_start = util_now_ns();
		}
	}
	if (j->rv_seen && !j->plan.found) {
		/* restore.version named a missing or incomplete backup: the job
		 * started empty, and the file is used once all the same (GKE's
		 * documented rule): it goes with the first checkpoint saved */
		j->rv_delete_pending = true;
		j->rv_after_any = true;
	}
	log_info("coord", "barrier released job=%s plan=%u step=%llu", j->name, j->plan_id,
		 (unsigned long long)(j->plan.found ? j->plan.step : 0));
	j->state = R_IDLE;
}

void coord_maybe_release(struct coord *c, struct cjob *j, bool timed_out)
{
	uint32_t ready = 0, expected = 0;

	/* fewer ready than the connected, reported nodes can be (the last
	 * scan's count less the closes since): no release, and no scan of
	 * 16k nodes for each ready message */
	if (!timed_out && j->exp_scan > j->closes_since &&
	    j->nready < j->exp_scan - j->closes_since)
		return;
	for (uint32_t r = 0; r < j->nodes; r++) {
		if (j->n[r].reported && j->n[r].conn) {
			expected++;
			if (j->n[r].ready)
				ready++;
		}
	}
	j->exp_scan = expected;
	j->closes_since = 0;
	if (ready == expected || (timed_out && ready > 0))
		release_barrier(c, j);
}

void coord_on_catalog(void *arg, const struct proto_in *in)
{
	struct coord *c = arg;
	struct proto_catalog m;
	const char *name;
	uint32_t nodes;
	uint64_t conn = in->conn;
	uint32_t req_id = in->req_id;
	int rank = in->rank, rc;
	struct cjob *j;
	char why[160] = "";

	rc = proto_catalog_decode(in->msg, &m, why, sizeof(why));
	if (rc == -ENOMEM) {
		coord_reply_err(c, conn, req_id, ENOMEM, "out of memory");
		return;
	}
	if (rc == 0 && (rank < 0 || (uint32_t)rank >= m.job.nodes)) {
		snprintf(why, sizeof(why), "rank %d is not below nodes %u", rank, m.job.nodes);
		rc = -EINVAL;
	}
	if (rc < 0) {
		coord_reply_bad(c, in, why);
		return;
	}
	name = m.job.name;
	nodes = m.job.nodes;
	j = coord_job_get(c, name, nodes, m.job.dp);
	if (!j) {
		proto_catalog_free(&m);
		coord_reply_err(c, conn, req_id, ENOMEM, "out of memory");
		return;
	}
	j->dp = m.job.dp;
	if (m.workers > 0)
		j->workers = m.workers;
	if (j->state == R_IDLE || j->n[rank].reported) {
		/* A new restore round: abandon the previous one.  A rank that
		 * reports twice in one round is a new incarnation of the job
		 * there (a new replicator.yaml): as GKE's replicator restarts at
		 * once, the round starts over now, its timeout with it, rather
		 * than waiting restore_timeout for the old round to end. */
		if (j->state != R_IDLE)
			log_warn("coord", "job %s: rank %d restarted its restore; starting a new round",
				 name, rank);
		for (uint32_t r = 0; r < j->nodes; r++) {
			struct cnode *n = &j->n[r];
			if (n->rdy.waiting) {
				coord_send(c, n->rdy.conn, NT_RESP, n->rdy.req_id, proto_restart_encode());
				n->rdy.waiting = false;
			}
			if (n->cat.waiting && r != (uint32_t)rank) {
				/* keep waiting: their catalogs stay valid for the new round */
			}
			if (!n->cat.waiting)
				n->reported = false;
			n->ready = false;
		}
		j->nready = 0;
		j->exp_scan = 0;
		j->nreported = 0;
		for (uint32_t r = 0; r < j->nodes; r++)
			j->nreported += j->n[r].reported;
		j->nbad = 0;
		j->nexcluded = 0;
		j->notes[0] = '\0';
		j->bucket_plan = false;
		j->forced_restore = false;
		j->rv_seen = false;
		j->round++;
		j->state = R_COLLECT;
		j->round_start = util_now_ns();
		/* keep the holdings of nodes still waiting, drop the others */
		size_t k = 0;
		for (size_t x = 0; x < j->nholds; x++)
			if (j->n[j->holds[x].holder].reported)
				j->holds[k++] = j->holds[x];
		j->nholds = k;
		for (uint32_t r = 0; r < j->nodes; r++)
			if (!j->n[r].reported)
				j->n[r].nheld = 0;
	}
	/* replace this node's holdings (a scan of every hold only when it has
	 * some: each node's first catalog of a round would make it O(n^2)) */
	if (j->n[rank].nheld) {
		size_t k = 0;
		for (size_t x = 0; x < j->nholds; x++)
			if (j->holds[x].holder != (uint32_t)rank)
				j->holds[k++] = j->holds[x];
		j->nholds = k;
		j->n[rank].nheld = 0;
	}
	for (size_t i = 0; i < m.nholds; i++) {
		const struct proto_hold *h = &m.holds[i];
		struct lkg_hold lh = { .holder = (uint32_t)rank, .owner = h->owner,
				       .worker = h->worker, .step = h->step,
				       .has_content = h->has_content };
		memcpy(lh.hash, h->hash, 32);
		memcpy(lh.content, h->content, 32);
		if (j->nholds == j->capholds) {
			size_t nc = j->capholds ? j->capholds * 2 : 64;
			struct lkg_hold *nh = realloc(j->holds, nc * sizeof(*nh));
			if (!nh) {
				proto_catalog_free(&m);
				coord_reply_err(c, conn, req_id, ENOMEM, "out of memory");
				return;
			}
			j->holds = nh;
			j->capholds = nc;
		}
		j->holds[j->nholds++] = lh;
		j->n[rank].nheld++;
	}
	proto_catalog_free(&m);
	coord_ec_catalog(j, rank, in->msg);
	j->n[rank].conn = conn;
	if (!j->n[rank].reported)
		j->nreported++;
	j->n[rank].reported = true;
	if (j->state == R_PLANNING) {
		j->n[rank].cat = (struct pending){ conn, req_id, true };
		return;
	}
	if (j->state == R_PLANNED) {
		/* a late node: the plan stands */
		coord_send(c, conn, NT_RESP, req_id, plan_entry(c, j, (uint32_t)rank));
		return;
	}
	j->n[rank].cat = (struct pending){ conn, req_id, true };
	/* a count, not a scan of every node per catalog (O(n^2) at 16k) */
	if (j->nreported == j->nodes && j->state == R_COLLECT)
		coord_start_plan(c, j);
}

void coord_on_fetch_failed(void *arg, const struct proto_in *in)
{
	struct coord *c = arg;
	struct proto_fetch_failed m;
	uint64_t conn = in->conn;
	uint32_t req_id = in->req_id;
	int rank = in->rank;
	struct cjob *j;
	struct lkg_hold b = { 0 };
	uint64_t old_step;
	bool old_found;
	char why[160];

	if (proto_fetch_failed_decode(in->msg, &m, why, sizeof(why)) < 0) {
		coord_reply_bad(c, in, why);
		return;
	}
	j = coord_job_of(c, m.job, rank);
	if (j && j->state == R_PLANNED && j->bucket_plan && m.bucket) {
		/* a shard of the backup is bad or missing: plan without that backup */
		char (*ne)[64] = realloc(j->excluded, (j->nexcluded + 1) * sizeof(*ne));
		if (!ne) {
			coord_reply_err(c, conn, req_id, ENOMEM, "out of memory");
			return;
		}
		j->excluded = ne;
		snprintf(j->excluded[j->nexcluded++], 64, "%s", j->bucket_name);
		log_warn("coord", "job %s: rank %d could not fetch its shard of backup %s; planning without that backup",
			 j->name, rank, j->bucket_name);
		j->n[rank].cat = (struct pending){ conn, req_id, true };
		j->state = R_COLLECT;
		coord_start_plan(c, j);
		return;
	}
	if (!j || j->state != R_PLANNED) {
		coord_reply_bad(c, in, j ? "no restore plan in force" : "unknown job or rank");
		return;
	}
	b.holder = m.holder;
	b.owner = m.owner;
	b.step = m.step;
	b.worker = m.worker;
	if (j->nbad == j->capbad) {
		size_t nc = j->capbad ? j->capbad * 2 : 16;
		struct lkg_hold *nb = realloc(j->bad, nc * sizeof(*nb));
		if (!nb) {
			coord_reply_err(c, conn, req_id, ENOMEM, "out of memory");
			return;
		}
		j->bad = nb;
		j->capbad = nc;
	}
	j->bad[j->nbad++] = b;
	log_warn("coord", "job %s: rank %d could not use the shard of node %llu at step %llu held by %llu; re-planning",
		 j->name, rank, (unsigned long long)m.owner, (unsigned long long)m.step,
		 (unsigned long long)m.holder);
	if (c->bk.decide && c->worker) {
		/* with a bucket, a cluster that lost its last copy may still
		 * restore from a backup: plan again with the bucket's say */
		j->n[rank].cat = (struct pending){ conn, req_id, true };
		j->state = R_COLLECT;
		coord_start_plan(c, j);
		return;
	}
	old_step = j->plan.step;
	old_found = j->plan.found;
	compute_plan(c, j);
	coord_send(c, conn, NT_RESP, req_id, plan_entry(c, j, (uint32_t)rank));
	if (j->plan.found != old_found || j->plan.step != old_step)
		send_plan_to_waiters(c, j);   /* nodes at the barrier must fetch again */
}

void coord_on_ready(void *arg, const struct proto_in *in)
{
	struct coord *c = arg;
	struct proto_ready m;
	struct cjob *j;
	int rank = in->rank;
	uint64_t pid;
	char why[160];

	if (proto_ready_decode(in->msg, &m, why, sizeof(why)) < 0) {
		coord_reply_bad(c, in, why);
		return;
	}
	if (!(j = coord_job_of(c, m.job, rank))) {
		coord_reply_bad(c, in, "unknown job or rank");
		return;
	}
	pid = m.plan;
	if (j->state == R_IDLE && pid == j->plan_id) {
		/* the barrier was released while this node was late */
		coord_send(c, in->conn, NT_RESP, in->req_id, proto_go_encode(j->plan_id));
		return;
	}
	if (j->state != R_PLANNED || pid != j->plan_id) {
		coord_send(c, in->conn, NT_RESP, in->req_id, plan_entry(c, j, (uint32_t)rank));
		return;
	}
	if (!j->n[rank].ready)
		j->nready++;
	j->n[rank].ready = true;
	j->n[rank].rdy = (struct pending){ in->conn, in->req_id, true };
	coord_maybe_release(c, j, false);
}
