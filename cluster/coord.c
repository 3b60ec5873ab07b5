/* coord.c — see coord.h. Protocol (JSON over NT_REQ/NT_RESP/NT_EVENT):
 *   register {rank, addr}                       -> {ok, addrs:[...]}
 *   table {}                                    -> {addrs:[...]}
 *   catalog {job, nodes, dp, [workers], holds:[[owner, step, hash, [worker, [content]]]...]}
 *                                               -> (when planned) plan entry
 *   fetch_failed {job, plan, holder, owner, step} -> a new plan entry
 *   ready {job, plan}                           -> (barrier) {op:"go"} or a new plan entry
 *   committed {job, nodes, dp, step, hash} (event) -> event lkg {job, step, safe} to all
 *   replicated {job, nodes, dp, step} (event: every push of the node's own
 *               step succeeded)                  -> event lkg {job, step, safe} to all
 * lkg.step: the newest step every node has committed (backups start from it);
 * lkg.safe: the newest step every node has committed and replicated (nodes
 * drop older steps only below it, so a node lost before its newest step's
 * replicas exist still leaves the previous step complete).
 * A plan entry: {op:"plan", plan, found, step, holder, owner, hash, addr}. */
#include "cluster/coord.h"
#include "net/frame.h"
#include "net/server.h"
#include "cluster/lkg.h"
#include "common/log.h"
#include "common/util.h"
#include "common/workq.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define COORD_MAX_NODES 65536
#define COORD_MAX_HOLDS 4096      /* per node and catalog: 64 (steps, owners) x workers */
#define COMMITS_KEPT    4         /* newest steps remembered per owner */
#define COORD_MAX_WORKERS 64      /* RCFG_WORKERS_MAX: shards per node */

struct pending { uint64_t conn; uint32_t req_id; bool waiting; };

/* The newest commits of one (node, worker) shard: a node keeps one shard
 * per step, or (framework: pytorch) one per worker, each committed and
 * replicated on its own; a step is the job's when every (node, worker)
 * has it. */
struct wlog {
	uint64_t commits[COMMITS_KEPT];  /* +1, 0 empty; slot 0 newest */
	uint8_t commit_hash[COMMITS_KEPT][32];
	uint64_t repl[COMMITS_KEPT];     /* of those, replicated to every peer; +1, 0 empty */
	uint8_t repl_hash[COMMITS_KEPT][32];
};

struct cnode {
	uint64_t conn;            /* 0 = not connected */
	bool reported;            /* catalog received in this round */
	bool ready;               /* at the barrier of the current plan */
	struct pending cat, rdy;
	struct wlog lg;           /* worker 0 */
	struct wlog *lgx;         /* workers 1..nlgx, grown as they report */
	uint32_t nlgx;
};

struct cjob {
	struct cjob *next;
	char name[129];
	uint32_t nodes, dp;
	uint32_t workers;             /* shards per node (>= 1), as the nodes say */
	struct cnode *n;
	bool has_lkg;
	uint64_t lkg;
	bool has_safe;                /* lkg.safe: committed and replicated job-wide */
	uint64_t safe;
	/* restore round */
	enum { R_IDLE, R_COLLECT, R_PLANNING, R_PLANNED } state;
	uint64_t round_start, plan_time;
	struct lkg_hold *holds;
	size_t nholds, capholds;
	struct lkg_hold *bad;
	size_t nbad, capbad;
	struct lkg_plan plan;
	uint32_t plan_id;
	uint64_t round;               /* bumped by every new restore round */
	uint64_t plan_round;          /* the round the current plan belongs to */
	/* the bucket's part of the plan */
	bool bucket_plan;             /* plan.found/step come from a backup */
	char bucket_name[64];
	char notes[1024];
	char (*excluded)[64];         /* backups that failed during this round */
	size_t nexcluded;
	bool forced_restore;          /* this round restored restore.version */
	bool rv_seen;                 /* this round found restore.version, valid or not */
	bool rv_delete_pending;       /* delete it after the next commit */
	bool rv_after_any;            /* ... any step (nothing was restored) */
	uint64_t restored_step;
	/* backups */
	uint32_t bi_min, bi_steps;
	bool bk_running, has_last_bk;
	uint64_t bk_step, last_bk_step, last_bk_start, bk_start, job_seen;
	uint64_t bk_retry_at, postponed_step;
	uint32_t bk_backoff_s;
	char bk_name[64];
	/* the last attempt that failed, until it is resumed (same step: same
	 * name) or discarded (another step), so no retry leaves a new partial
	 * directory behind */
	char bk_failed[64];
	uint64_t bk_failed_step;
	bool *bk_done;
};

struct coord {
	struct nsrv *srv;
	pthread_mutex_t mu;       /* protects everything below */
	struct cjob *jobs;
	char **addrs;             /* rank -> address, from register */
	uint32_t naddrs;
	uint64_t timeout_ns;
	pthread_t tick;
	bool stop;
	pthread_cond_t cv;
	struct coord_bucket bk;       /* .decide NULL: no bucket */
	struct workq *worker;         /* bucket calls, off the loop thread */
};

static void send_msg(struct coord *c, uint64_t conn, uint8_t type, uint32_t req_id, json_t *m)
{
	nsrv_send(c->srv, conn, type, req_id, m);   /* takes m */
}

static void reply_err(struct coord *c, uint64_t conn, uint32_t req_id, int err, const char *what)
{
	send_msg(c, conn, NT_ERROR, req_id, net_error_msg(err, what));
}

static json_t *addrs_json(struct coord *c)
{
	json_t *a = json_array();
	for (uint32_t i = 0; i < c->naddrs; i++)
		json_array_append_new(a, c->addrs[i] ? json_string(c->addrs[i]) : json_null());
	return a;
}

static const char *addr_of(struct coord *c, uint32_t rank)
{
	return rank < c->naddrs && c->addrs[rank] ? c->addrs[rank] : "";
}

/* Worker w's log of node n; NULL when it has none and create is false
 * (or memory ran out). */
static struct wlog *wlog_of(struct cnode *n, uint32_t w, bool create)
{
	if (w == 0)
		return &n->lg;
	if (w > n->nlgx) {
		struct wlog *nv;
		if (!create || w >= COORD_MAX_WORKERS)
			return NULL;
		nv = realloc(n->lgx, (size_t)w * sizeof(*nv));
		if (!nv)
			return NULL;
		memset(nv + n->nlgx, 0, (size_t)(w - n->nlgx) * sizeof(*nv));
		n->lgx = nv;
		n->nlgx = w;
	}
	return &n->lgx[w - 1];
}

static void job_free(struct cjob *j)
{
	for (uint32_t r = 0; j->n && r < j->nodes; r++)
		free(j->n[r].lgx);
	lkg_plan_free(&j->plan);
	free(j->holds);
	free(j->bad);
	free(j->n);
	free(j->excluded);
	free(j->bk_done);
	free(j);
}

static struct cjob *job_get(struct coord *c, const char *name, uint32_t nodes, uint32_t dp)
{
	struct cjob *j;
	for (j = c->jobs; j; j = j->next)
		if (!strcmp(j->name, name))
			break;
	if (j && j->nodes != nodes) {
		log_warn("coord", "job %s now has %u nodes (was %u): starting over", name, nodes, j->nodes);
		/* unlink and free the old one */
		struct cjob **pp = &c->jobs;
		while (*pp != j)
			pp = &(*pp)->next;
		*pp = j->next;
		job_free(j);
		j = NULL;
	}
	if (j)
		return j;
	j = calloc(1, sizeof(*j));
	if (!j)
		return NULL;
	j->n = calloc(nodes, sizeof(*j->n));
	j->bk_done = calloc(nodes, sizeof(bool));
	if (!j->n || !j->bk_done) {
		free(j->n);
		free(j->bk_done);
		free(j);
		return NULL;
	}
	j->job_seen = util_now_ns();
	snprintf(j->name, sizeof(j->name), "%s", name);
	j->nodes = nodes;
	j->dp = dp;
	j->workers = 1;
	j->next = c->jobs;
	c->jobs = j;
	return j;
}

static json_t *plan_entry(struct coord *c, struct cjob *j, uint32_t rank)
{
	json_t *m = json_object();
	char hex[65];

	json_object_set_new(m, "op", json_string("plan"));
	json_object_set_new(m, "plan", json_integer(j->plan_id));
	json_object_set_new(m, "found", json_boolean(j->plan.found));
	if (j->notes[0])
		json_object_set_new(m, "notes", json_string(j->notes));
	if (j->plan.found && j->bucket_plan) {
		json_object_set_new(m, "step", json_integer((json_int_t)j->plan.step));
		json_object_set_new(m, "source", json_string("bucket"));
		json_object_set_new(m, "backup", json_string(j->bucket_name));
	} else if (j->plan.found && rank < j->plan.nodes) {
		uint32_t W = j->plan.workers ? j->plan.workers : 1;
		const struct lkg_src *s = &j->plan.src[(size_t)rank * W];
		net_hex_encode(s->hash, 32, hex);
		json_object_set_new(m, "step", json_integer((json_int_t)j->plan.step));
		json_object_set_new(m, "holder", json_integer(s->holder));
		json_object_set_new(m, "owner", json_integer(s->owner));
		json_object_set_new(m, "hash", json_string(hex));
		json_object_set_new(m, "addr", json_string(addr_of(c, s->holder)));
		if (W > 1) {
			/* one source per worker shard; worker 0's is also the
			 * entry's own fields above */
			json_t *a = json_array();
			for (uint32_t w = 0; w < W; w++) {
				const struct lkg_src *x = &j->plan.src[(size_t)rank * W + w];
				net_hex_encode(x->hash, 32, hex);
				json_array_append_new(a, json_pack("{s:i,s:i,s:i,s:s,s:s}", "worker",
								   (int)w, "holder", (int)x->holder,
								   "owner", (int)x->owner, "hash", hex,
								   "addr", addr_of(c, x->holder)));
			}
			json_object_set_new(m, "shards", a);
		}
	}
	return m;
}

static void compute_plan(struct coord *c, struct cjob *j);
static void send_plan_to_waiters(struct coord *c, struct cjob *j);

/* The bucket's say in a plan (restore.version, or the newest complete
 * backup when nothing is complete in the cluster): on the worker thread. */
struct bk_plan_job {
	struct coord *c;
	char job[129];
	uint64_t round;
	uint32_t nodes;
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
			if (lkg_plan(&in, &tmp) == 0) {
				need_newest = !tmp.found;
				lkg_plan_free(&tmp);
			}
			free(live);
		}
	}
	pthread_mutex_unlock(&c->mu);
	rc = c->bk.decide(c->bk.arg, p->job, p->nodes, (const char (*)[64])p->exclude, p->nexclude,
			  need_newest, &d);
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
		if (j->plan_id == was_id && (j->plan.found != was_found || j->plan.step != was_step ||
					     j->bucket_plan != was_bucket ||
					     strcmp(was_name, j->bucket_name))) {
			/* another backup: every node fetches again */
			j->plan_id++;
			j->plan_time = util_now_ns();
			for (uint32_t r = 0; r < j->nodes; r++)
				j->n[r].ready = false;
		}
		if (j->bucket_plan)
			log_info("coord", "plan job=%s plan=%u: restore backup %s (step %llu)%s", j->name,
				 j->plan_id, j->bucket_name, (unsigned long long)j->plan.step,
				 j->forced_restore ? " named by restore.version" : "");
		if (j->notes[0])
			log_warn("coord", "job %s: %s", j->name, j->notes);
		send_plan_to_waiters(c, j);
	}
	pthread_mutex_unlock(&c->mu);
	free(p->exclude);
	free(p);
}

/* All catalogs are in (or the wait timed out): plan, asking the bucket
 * first when there is one. Called with c->mu held. */
static void start_plan(struct coord *c, struct cjob *j)
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
	if (lkg_plan(&in, &j->plan) < 0)
		memset(&j->plan, 0, sizeof(j->plan));
	if (was_planned && j->plan.found == old_found && j->plan.step == old_step) {
		/* another source for the same step: nodes that already have
		 * their shard stay at the barrier */
	} else {
		j->plan_id++;
		j->plan_time = util_now_ns();
		for (uint32_t r = 0; r < j->nodes; r++)
			j->n[r].ready = false;
	}
	j->state = R_PLANNED;
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
			send_msg(c, n->cat.conn, NT_RESP, n->cat.req_id, plan_entry(c, j, r));
			n->cat.waiting = false;
		}
		if (n->rdy.waiting) {
			send_msg(c, n->rdy.conn, NT_RESP, n->rdy.req_id, plan_entry(c, j, r));
			n->rdy.waiting = false;
		}
	}
}

static void release_barrier(struct coord *c, struct cjob *j)
{
	for (uint32_t r = 0; r < j->nodes; r++) {
		struct cnode *n = &j->n[r];
		if (n->rdy.waiting) {
			json_t *m = json_object();
			json_object_set_new(m, "op", json_string("go"));
			json_object_set_new(m, "plan", json_integer(j->plan_id));
			send_msg(c, n->rdy.conn, NT_RESP, n->rdy.req_id, m);
			n->rdy.waiting = false;
		}
	}
	/* what was committed before the restore belongs to a timeline the job
	 * left: from now on every node's history starts at the restored step */
	for (uint32_t r = 0; r < j->nodes; r++) {
		struct cnode *n = &j->n[r];
		memset(&n->lg, 0, sizeof(n->lg));
		if (n->nlgx)
			memset(n->lgx, 0, (size_t)n->nlgx * sizeof(*n->lgx));
		for (uint32_t w = 0; j->plan.found && w < j->workers; w++) {
			struct wlog *l = wlog_of(n, w, true);
			uint32_t W = j->plan.workers ? j->plan.workers : 1;
			if (!l)
				break;
			l->commits[0] = l->repl[0] = j->plan.step + 1;
			if (!j->bucket_plan && r < j->plan.nodes && w < W)
				memcpy(l->commit_hash[0], j->plan.src[(size_t)r * W + w].hash, 32);
			memcpy(l->repl_hash[0], l->commit_hash[0], 32);
		}
	}
	j->has_lkg = false;
	j->has_safe = false;
	if (j->plan.found) {
		/* every node restores this step: it is complete job-wide, and
		 * what is older than it belongs to the past */
		j->has_lkg = true;
		j->lkg = j->plan.step;
		j->has_safe = true;
		j->safe = j->plan.step;
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

static void maybe_release(struct coord *c, struct cjob *j, bool timed_out)
{
	uint32_t ready = 0, expected = 0;
	for (uint32_t r = 0; r < j->nodes; r++) {
		if (j->n[r].reported && j->n[r].conn) {
			expected++;
			if (j->n[r].ready)
				ready++;
		}
	}
	if (ready == expected || (timed_out && ready > 0))
		release_barrier(c, j);
}

static int parse_job(json_t *m, const char **name, uint32_t *nodes, uint32_t *dp)
{
	uint64_t n = 0, d = 0;
	if (net_json_str(m, "job", 128, name) < 0 || !**name ||
	    net_json_u64(m, "nodes", COORD_MAX_NODES, &n) < 0 || n == 0)
		return -EBADMSG;
	if (net_json_u64(m, "dp", COORD_MAX_NODES, &d) == -EBADMSG)
		return -EBADMSG;
	if (d && n % d)
		return -EBADMSG;
	*nodes = (uint32_t)n;
	*dp = (uint32_t)d;
	return 0;
}

static void on_catalog(struct coord *c, uint64_t conn, int rank, uint32_t req_id, json_t *m)
{
	const char *name;
	uint32_t nodes, dp;
	struct cjob *j;
	json_t *holds = json_object_get(m, "holds");
	size_t i;
	json_t *h;

	if (parse_job(m, &name, &nodes, &dp) < 0 || rank < 0 || (uint32_t)rank >= nodes ||
	    !json_is_array(holds) || json_array_size(holds) > COORD_MAX_HOLDS) {
		reply_err(c, conn, req_id, EINVAL, "bad catalog");
		return;
	}
	j = job_get(c, name, nodes, dp);
	if (!j) {
		reply_err(c, conn, req_id, ENOMEM, "out of memory");
		return;
	}
	j->dp = dp;
	{
		uint64_t w;
		if (net_json_u64(m, "workers", COORD_MAX_WORKERS, &w) == 0 && w > 0)
			j->workers = (uint32_t)w;
	}
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
				json_t *x = json_object();
				json_object_set_new(x, "op", json_string("restart"));
				send_msg(c, n->rdy.conn, NT_RESP, n->rdy.req_id, x);
				n->rdy.waiting = false;
			}
			if (n->cat.waiting && r != (uint32_t)rank) {
				/* keep waiting: their catalogs stay valid for the new round */
			}
			if (!n->cat.waiting)
				n->reported = false;
			n->ready = false;
		}
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
	}
	/* replace this node's holdings */
	{
		size_t k = 0;
		for (size_t x = 0; x < j->nholds; x++)
			if (j->holds[x].holder != (uint32_t)rank)
				j->holds[k++] = j->holds[x];
		j->nholds = k;
	}
	json_array_foreach(holds, i, h) {
		struct lkg_hold lh = { .holder = (uint32_t)rank };
		json_t *o = json_array_get(h, 0), *s = json_array_get(h, 1), *hx = json_array_get(h, 2);
		json_t *wk = json_array_get(h, 3);   /* absent: worker 0 */
		if (wk && (!json_is_integer(wk) || json_integer_value(wk) < 0 ||
			   json_integer_value(wk) >= COORD_MAX_WORKERS)) {
			reply_err(c, conn, req_id, EINVAL, "bad holding in catalog");
			return;
		}
		lh.worker = wk ? (uint32_t)json_integer_value(wk) : 0;
		{
			/* the content key of a worker's file (its name apart) */
			json_t *ck = json_array_get(h, 4);
			if (ck && (!json_is_string(ck) ||
				   net_hex_decode(json_string_value(ck), json_string_length(ck),
						  lh.content, 32) < 0)) {
				reply_err(c, conn, req_id, EINVAL, "bad holding in catalog");
				return;
			}
			lh.has_content = ck != NULL;
		}
		if (!json_is_integer(o) || !json_is_integer(s) || !json_is_string(hx) ||
		    json_integer_value(o) < 0 || json_integer_value(o) >= (json_int_t)nodes ||
		    json_integer_value(s) < 0 ||
		    net_hex_decode(json_string_value(hx), json_string_length(hx), lh.hash, 32) < 0) {
			reply_err(c, conn, req_id, EINVAL, "bad holding in catalog");
			return;
		}
		lh.owner = (uint32_t)json_integer_value(o);
		lh.step = (uint64_t)json_integer_value(s);
		if (j->nholds == j->capholds) {
			size_t nc = j->capholds ? j->capholds * 2 : 64;
			struct lkg_hold *nh = realloc(j->holds, nc * sizeof(*nh));
			if (!nh) {
				reply_err(c, conn, req_id, ENOMEM, "out of memory");
				return;
			}
			j->holds = nh;
			j->capholds = nc;
		}
		j->holds[j->nholds++] = lh;
	}
	j->n[rank].conn = conn;
	j->n[rank].reported = true;
	if (j->state == R_PLANNING) {
		j->n[rank].cat = (struct pending){ conn, req_id, true };
		return;
	}
	if (j->state == R_PLANNED) {
		/* a late node: the plan stands */
		send_msg(c, conn, NT_RESP, req_id, plan_entry(c, j, (uint32_t)rank));
		return;
	}
	j->n[rank].cat = (struct pending){ conn, req_id, true };
	{
		uint32_t got = 0;
		for (uint32_t r = 0; r < j->nodes; r++)
			got += j->n[r].reported;
		if (got == j->nodes && j->state == R_COLLECT)
			start_plan(c, j);
	}
}

static struct cjob *job_of(struct coord *c, json_t *m, int rank)
{
	const char *name;
	struct cjob *j;
	if (net_json_str(m, "job", 128, &name) < 0)
		return NULL;
	for (j = c->jobs; j; j = j->next)
		if (!strcmp(j->name, name))
			break;
	if (!j || rank < 0 || (uint32_t)rank >= j->nodes)
		return NULL;
	return j;
}

static void on_fetch_failed(struct coord *c, uint64_t conn, int rank, uint32_t req_id, json_t *m)
{
	struct cjob *j = job_of(c, m, rank);
	uint64_t holder, owner, step;
	struct lkg_hold b = { 0 };
	uint64_t old_step;
	bool old_found;

	if (j && j->state == R_PLANNED && j->bucket_plan && json_is_true(json_object_get(m, "bucket"))) {
		/* a shard of the backup is bad or missing: plan without that backup */
		char (*ne)[64] = realloc(j->excluded, (j->nexcluded + 1) * sizeof(*ne));
		if (!ne) {
			reply_err(c, conn, req_id, ENOMEM, "out of memory");
			return;
		}
		j->excluded = ne;
		snprintf(j->excluded[j->nexcluded++], 64, "%s", j->bucket_name);
		log_warn("coord", "job %s: rank %d could not fetch its shard of backup %s; planning without that backup",
			 j->name, rank, j->bucket_name);
		j->n[rank].cat = (struct pending){ conn, req_id, true };
		j->state = R_COLLECT;
		start_plan(c, j);
		return;
	}
	if (!j || net_json_u64(m, "holder", COORD_MAX_NODES - 1, &holder) < 0 ||
	    net_json_u64(m, "owner", COORD_MAX_NODES - 1, &owner) < 0 ||
	    net_json_u64(m, "step", UINT64_MAX >> 1, &step) < 0 || j->state != R_PLANNED) {
		reply_err(c, conn, req_id, EINVAL, "bad fetch_failed");
		return;
	}
	b.holder = (uint32_t)holder;
	b.owner = (uint32_t)owner;
	b.step = step;
	{
		uint64_t w;
		if (net_json_u64(m, "worker", COORD_MAX_WORKERS - 1, &w) == 0)
			b.worker = (uint32_t)w;
	}
	if (j->nbad == j->capbad) {
		size_t nc = j->capbad ? j->capbad * 2 : 16;
		struct lkg_hold *nb = realloc(j->bad, nc * sizeof(*nb));
		if (!nb) {
			reply_err(c, conn, req_id, ENOMEM, "out of memory");
			return;
		}
		j->bad = nb;
		j->capbad = nc;
	}
	j->bad[j->nbad++] = b;
	log_warn("coord", "job %s: rank %d could not use the shard of node %llu at step %llu held by %llu; re-planning",
		 j->name, rank, (unsigned long long)owner, (unsigned long long)step,
		 (unsigned long long)holder);
	if (c->bk.decide && c->worker) {
		/* with a bucket, a cluster that lost its last copy may still
		 * restore from a backup: plan again with the bucket's say */
		j->n[rank].cat = (struct pending){ conn, req_id, true };
		j->state = R_COLLECT;
		start_plan(c, j);
		return;
	}
	old_step = j->plan.step;
	old_found = j->plan.found;
	compute_plan(c, j);
	send_msg(c, conn, NT_RESP, req_id, plan_entry(c, j, (uint32_t)rank));
	if (j->plan.found != old_found || j->plan.step != old_step)
		send_plan_to_waiters(c, j);   /* nodes at the barrier must fetch again */
}

static void on_ready(struct coord *c, uint64_t conn, int rank, uint32_t req_id, json_t *m)
{
	struct cjob *j = job_of(c, m, rank);
	uint64_t pid;

	if (!j || net_json_u64(m, "plan", UINT32_MAX, &pid) < 0) {
		reply_err(c, conn, req_id, EINVAL, "bad ready");
		return;
	}
	if (j->state == R_IDLE && pid == j->plan_id) {
		/* the barrier was released while this node was late */
		json_t *x = json_object();
		json_object_set_new(x, "op", json_string("go"));
		json_object_set_new(x, "plan", json_integer(j->plan_id));
		send_msg(c, conn, NT_RESP, req_id, x);
		return;
	}
	if (j->state != R_PLANNED || pid != j->plan_id) {
		send_msg(c, conn, NT_RESP, req_id, plan_entry(c, j, (uint32_t)rank));
		return;
	}
	j->n[rank].ready = true;
	j->n[rank].rdy = (struct pending){ conn, req_id, true };
	maybe_release(c, j, false);
}

/* ---- backups (DESIGN §4): the coordinator names them, nodes upload ---- */

struct bk_job {
	struct coord *c;
	char job[129];
	uint64_t step;
	char failed[64];              /* copy of the job's bk_failed */
	uint64_t failed_step;
};

static void bk_abandon(struct cjob *j, const char *why, bool is_error);

static bool hash_at_w(struct cnode *n, uint32_t w, uint64_t step, uint8_t out[32])
{
	struct wlog *l = wlog_of(n, w, false);
	for (int k = 0; l && k < COMMITS_KEPT; k++)
		if (l->commits[k] == step + 1) {
			memcpy(out, l->commit_hash[k], 32);
			return true;
		}
	return false;
}

static bool hash_at(struct cnode *n, uint64_t step, uint8_t out[32])
{
	return hash_at_w(n, 0, step, out);
}

static void backup_start_run(void *arg)
{
	struct bk_job *b = arg;
	struct coord *c = b->c;
	char name[600] = "";
	struct cjob *j;
	unsigned retry_s = 0;
	bool discarded = false;
	int rc = 0;

	if (b->failed[0] && b->failed_step == b->step) {
		/* resume: uploads are idempotent, what is there is kept */
		snprintf(name, sizeof(name), "%s", b->failed);
	} else {
		if (b->failed[0]) {
			rc = c->bk.discard(c->bk.arg, b->job, b->failed, name, sizeof(name));
			discarded = rc == 0;
		}
		if (rc == 0)
			rc = c->bk.new_name(c->bk.arg, b->job, name, sizeof(name), &retry_s);
	}

	pthread_mutex_lock(&c->mu);
	for (j = c->jobs; j; j = j->next)
		if (!strcmp(j->name, b->job))
			break;
	if (j && discarded && !strcmp(j->bk_failed, b->failed))
		j->bk_failed[0] = '\0';
	if (!j || !j->bk_running || j->bk_step != b->step) {
		pthread_mutex_unlock(&c->mu);
		free(b);
		return;
	}
	if (rc == -EAGAIN) {
		/* a backup was started in this minute already: wait for the
		 * next one (no error, no backoff) */
		j->bk_running = false;
		j->bk_retry_at = util_now_ns() + (uint64_t)(retry_s ? retry_s : 1) * 1000000000ULL;
		log_info("coord", "job %s: backup of step %llu waits %u s for the next UTC minute",
			 j->name, (unsigned long long)b->step, retry_s ? retry_s : 1);
		pthread_mutex_unlock(&c->mu);
		free(b);
		return;
	}
	if (rc < 0) {
		char why[700];
		if (b->failed[0] && !discarded)
			snprintf(why, sizeof(why), "cannot remove the failed attempt %s: %.600s",
				 b->failed, name[0] ? name : strerror(-rc));
		else
			snprintf(why, sizeof(why), "cannot name a backup in the bucket: %.600s",
				 name[0] ? name : strerror(-rc));
		/* a WARN: rank 0's engine logged the failure as an ERROR */
		bk_abandon(j, why, false);
		/* the other nodes' replicator.errors say it too (rank 0, where
		 * the bucket call failed, reported it itself) */
		for (uint32_t r = 1; r < j->nodes; r++) {
			json_t *e = json_pack("{s:s,s:s,s:s}", "op", "report", "job", j->name, "text", why);
			send_msg(c, j->n[r].conn, NT_EVENT, 0, e);
		}
		pthread_mutex_unlock(&c->mu);
		free(b);
		return;
	}
	snprintf(j->bk_name, sizeof(j->bk_name), "%.63s", name);
	uint32_t P = (j->dp > 0 && j->nodes % j->dp == 0) ? j->nodes / j->dp : j->nodes;
	for (uint32_t r = 0; r < j->nodes; r++) {
		uint8_t h[32], hc[32];
		/* with D, a node whose column's first node holds the same data
		 * uploads only its manifest and .meta */
		bool data = r < P || !hash_at(&j->n[r], j->bk_step, h) ||
			    !hash_at(&j->n[r % P], j->bk_step, hc) || memcmp(h, hc, 32);
		json_t *e = json_object();
		json_object_set_new(e, "op", json_string("backup"));
		json_object_set_new(e, "job", json_string(j->name));
		json_object_set_new(e, "name", json_string(name));
		json_object_set_new(e, "step", json_integer((json_int_t)j->bk_step));
		json_object_set_new(e, "data", json_boolean(data));
		send_msg(c, j->n[r].conn, NT_EVENT, 0, e);
	}
	log_info("coord", "backup job=%s name=%s step=%llu started on %u nodes", j->name, name,
		 (unsigned long long)j->bk_step, j->nodes);
	pthread_mutex_unlock(&c->mu);
	free(b);
}

/* Start a backup of the LKG when the interval says so. c->mu held. */
static void maybe_backup(struct coord *c, struct cjob *j)
{
	uint64_t now = util_now_ns(), iv;
	struct bk_job *b;
	bool due;

	if (!c->bk.new_name || !c->worker || j->bk_running || !j->has_lkg)
		return;
	if (j->bk_retry_at && now < j->bk_retry_at)
		return;
	if (j->has_last_bk && j->lkg <= j->last_bk_step)
		return;
	if (j->bi_steps)
		due = !j->has_last_bk || j->lkg >= j->last_bk_step + j->bi_steps;
	else {
		iv = (uint64_t)(j->bi_min ? j->bi_min : 30) * 60ULL * 1000000000ULL;
		due = now - (j->has_last_bk ? j->last_bk_start : j->job_seen) >= iv;
	}
	if (!due)
		return;
	for (uint32_t r = 0; r < j->nodes; r++) {
		if (!j->n[r].conn) {
			if (j->postponed_step != j->lkg + 1)
				log_warn("coord", "job %s: backup of step %llu postponed: node %u is not connected",
					 j->name, (unsigned long long)j->lkg, r);
			j->postponed_step = j->lkg + 1;
			return;
		}
	}
	b = calloc(1, sizeof(*b));
	if (!b)
		return;
	b->c = c;
	snprintf(b->job, sizeof(b->job), "%s", j->name);
	b->step = j->lkg;
	snprintf(b->failed, sizeof(b->failed), "%s", j->bk_failed);
	b->failed_step = j->bk_failed_step;
	j->bk_running = true;
	j->bk_step = j->lkg;
	j->bk_start = now;
	j->bk_name[0] = '\0';
	memset(j->bk_done, 0, j->nodes * sizeof(bool));
	if (workq_submit(c->worker, backup_start_run, b) < 0) {
		j->bk_running = false;
		free(b);
	}
}

/* A failed backup is retried after a pause that doubles up to 10 min. */
static void bk_abandon(struct cjob *j, const char *why, bool is_error)
{
	uint64_t now = util_now_ns();
	j->bk_backoff_s = j->bk_backoff_s ? (j->bk_backoff_s * 2 > 600 ? 600 : j->bk_backoff_s * 2) : 10;
	j->bk_retry_at = now + (uint64_t)j->bk_backoff_s * 1000000000ULL;
	if (j->bk_name[0]) {
		snprintf(j->bk_failed, sizeof(j->bk_failed), "%s", j->bk_name);
		j->bk_failed_step = j->bk_step;
	}
	log_msg(is_error ? LOG_ERROR : LOG_WARN, "coord",
		"job %s: backup %s of step %llu abandoned: %s; next attempt in %u s", j->name,
		j->bk_name[0] ? j->bk_name : "(unnamed)", (unsigned long long)j->bk_step, why,
		j->bk_backoff_s);
	j->bk_running = false;
}

static void on_backup_done(struct coord *c, int rank, json_t *m)
{
	const char *name = NULL, *err = NULL;
	struct cjob *j = job_of(c, m, rank);
	uint32_t done = 0;

	if (!j || !j->bk_running || net_json_str(m, "name", 63, &name) < 0 ||
	    strcmp(name, j->bk_name))
		return;
	if (!json_is_true(json_object_get(m, "ok"))) {
		char why[512];
		net_json_str(m, "error", 4000, &err);
		snprintf(why, sizeof(why), "node %d: %s", rank, err ? err : "failed");
		/* a WARN: that node logged its failure as an ERROR already */
		bk_abandon(j, why, false);
		return;
	}
	j->bk_done[rank] = true;
	for (uint32_t r = 0; r < j->nodes; r++)
		done += j->bk_done[r];
	if (done == j->nodes) {
		j->bk_running = false;
		j->bk_backoff_s = 0;
		if (!strcmp(j->bk_failed, j->bk_name))
			j->bk_failed[0] = '\0';
		j->has_last_bk = true;
		j->last_bk_step = j->bk_step;
		j->last_bk_start = j->bk_start;
		log_info("coord", "backup job=%s name=%s step=%llu complete secs=%.1f", j->name,
			 j->bk_name, (unsigned long long)j->bk_step,
			 (double)(util_now_ns() - j->bk_start) / 1e9);
	}
}

static void clear_rv_run(void *arg)
{
	struct bk_job *b = arg;
	b->c->bk.clear_restore_version(b->c->bk.arg, b->job);
	free(b);
}

/* The newest step every node reported committed (replicated: only those
 * it also reported replicated). */
static bool newest_of(struct cjob *j, bool replicated, uint64_t *step)
{
	uint32_t W = j->workers ? j->workers : 1;
	struct lkg_hold *h = calloc((size_t)j->nodes * W * COMMITS_KEPT, sizeof(*h));
	size_t nh = 0;
	bool found;

	if (!h)
		return false;
	for (uint32_t r = 0; r < j->nodes; r++) {
		for (uint32_t w = 0; w < W; w++) {
			const struct wlog *l = wlog_of(&j->n[r], w, false);
			for (int k = 0; l && k < COMMITS_KEPT; k++) {
				uint64_t s1 = replicated ? l->repl[k] : l->commits[k];
				if (!s1)
					continue;
				h[nh].holder = r;
				h[nh].owner = r;
				h[nh].worker = w;
				h[nh].step = s1 - 1;
				memcpy(h[nh].hash, replicated ? l->repl_hash[k] : l->commit_hash[k], 32);
				nh++;
			}
		}
	}
	/* every node itself, as GKE's sync gathers each node's replicated step:
	 * borrowing a column mate's shard under D is for restores only (a step
	 * counted complete before a node had it sent that node backups of a
	 * step it did not hold, and let GC move past its newest step) */
	found = lkg_newest_complete_w(j->nodes, 0, W, h, nh, step);
	free(h);
	return found;
}

/* Tell every node: lkg {job, step, safe} (safe absent while unknown). */
static void send_lkg(struct coord *c, struct cjob *j)
{
	if (!j->has_lkg)
		return;
	for (uint32_t r = 0; r < j->nodes; r++) {
		if (!j->n[r].conn)
			continue;
		json_t *e = json_object();
		json_object_set_new(e, "op", json_string("lkg"));
		json_object_set_new(e, "job", json_string(j->name));
		json_object_set_new(e, "step", json_integer((json_int_t)j->lkg));
		if (j->has_safe)
			json_object_set_new(e, "safe", json_integer((json_int_t)j->safe));
		send_msg(c, j->n[r].conn, NT_EVENT, 0, e);
	}
}

/* A node's event about one of its steps ({job, nodes, dp, step}): its job
 * (made if new) and node, whose connection is noted. false: malformed. */
static bool event_node(struct coord *c, uint64_t conn, int rank, json_t *m, struct cjob **jp,
		       struct cnode **np, uint64_t *step, uint32_t *worker)
{
	const char *name;
	uint32_t nodes, dp;
	uint64_t w = 0, nw = 1;

	if (parse_job(m, &name, &nodes, &dp) < 0 || rank < 0 || (uint32_t)rank >= nodes ||
	    net_json_u64(m, "step", UINT64_MAX >> 1, step) < 0)
		return false;
	/* worker, workers: absent from a node keeping one shard per step */
	if (net_json_u64(m, "workers", COORD_MAX_WORKERS, &nw) == -EBADMSG || nw == 0 ||
	    net_json_u64(m, "worker", COORD_MAX_WORKERS - 1, &w) == -EBADMSG || w >= nw)
		return false;
	*jp = job_get(c, name, nodes, dp);
	if (!*jp)
		return false;
	(*jp)->workers = (uint32_t)nw;
	*worker = (uint32_t)w;
	*np = &(*jp)->n[rank];
	(*np)->conn = conn;
	return true;
}

/* The steady-state LKG: the newest step every owner has committed. */
static void on_committed(struct coord *c, uint64_t conn, int rank, json_t *m)
{
	uint64_t step;
	uint8_t hash[32];
	struct cjob *j;
	struct cnode *n;
	struct wlog *l;
	uint64_t newest;
	uint32_t w;

	if (net_json_hex(m, "hash", hash, 32) < 0 ||
	    !event_node(c, conn, rank, m, &j, &n, &step, &w) || !(l = wlog_of(n, w, true)))
		return;
	{
		uint64_t v;
		if (net_json_u64(m, "bi_min", 1u << 20, &v) == 0)
			j->bi_min = (uint32_t)v;
		if (net_json_u64(m, "bi_steps", 1u << 30, &v) == 0)
			j->bi_steps = (uint32_t)v;
	}
	/* keep the newest COMMITS_KEPT steps, slot 0 newest */
	if (step + 1 > l->commits[0]) {
		memmove(&l->commits[1], &l->commits[0], (COMMITS_KEPT - 1) * sizeof(uint64_t));
		memmove(&l->commit_hash[1], &l->commit_hash[0], (COMMITS_KEPT - 1) * 32);
		l->commits[0] = step + 1;   /* stored +1: 0 is empty */
		memcpy(l->commit_hash[0], hash, 32);
	}
	if (newest_of(j, false, &newest) && (!j->has_lkg || newest > j->lkg)) {
		j->has_lkg = true;
		j->lkg = newest;
		log_info("coord", "job %s: step %llu is complete on all %u nodes", j->name,
			 (unsigned long long)newest, j->nodes);
		send_lkg(c, j);
		if (j->rv_delete_pending && (j->rv_after_any || newest > j->restored_step) &&
		    c->bk.clear_restore_version &&
		    c->worker) {
			struct bk_job *b = calloc(1, sizeof(*b));
			if (b) {
				b->c = c;
				snprintf(b->job, sizeof(b->job), "%s", j->name);
				if (workq_submit(c->worker, clear_rv_run, b) < 0)
					free(b);
			}
			j->rv_delete_pending = false;
		}
		maybe_backup(c, j);
	}
}

/* A node's pushes of its own step all succeeded. */
static void on_replicated(struct coord *c, uint64_t conn, int rank, json_t *m)
{
	uint64_t step, safe;
	uint8_t hash[32];
	struct cjob *j;
	struct cnode *n;
	struct wlog *l;
	uint32_t w;

	if (!event_node(c, conn, rank, m, &j, &n, &step, &w))
		return;
	if (!hash_at_w(n, w, step, hash) || !(l = wlog_of(n, w, false)))
		return;   /* not a commit we know (a timeline left by a restore) */
	if (step + 1 > l->repl[0]) {
		memmove(&l->repl[1], &l->repl[0], (COMMITS_KEPT - 1) * sizeof(uint64_t));
		memmove(&l->repl_hash[1], &l->repl_hash[0], (COMMITS_KEPT - 1) * 32);
		l->repl[0] = step + 1;
		memcpy(l->repl_hash[0], hash, 32);
	}
	if (newest_of(j, true, &safe) && (!j->has_safe || safe > j->safe)) {
		j->has_safe = true;
		j->safe = safe;
		log_info("coord", "job %s: step %llu is committed and replicated on all %u nodes",
			 j->name, (unsigned long long)safe, j->nodes);
		send_lkg(c, j);
	}
}

static void on_register(struct coord *c, uint64_t conn, int rank, uint32_t req_id, json_t *m)
{
	const char *addr, *job;
	json_t *r;
	uint64_t nodes;

	if (rank < 0 || rank >= COORD_MAX_NODES || net_json_str(m, "addr", 256, &addr) < 0) {
		reply_err(c, conn, req_id, EINVAL, "bad register");
		return;
	}
	if ((uint32_t)rank >= c->naddrs) {
		char **na = realloc(c->addrs, ((size_t)rank + 1) * sizeof(*na));
		if (!na) {
			reply_err(c, conn, req_id, ENOMEM, "out of memory");
			return;
		}
		for (uint32_t i = c->naddrs; i <= (uint32_t)rank; i++)
			na[i] = NULL;
		c->addrs = na;
		c->naddrs = (uint32_t)rank + 1;
	}
	if (c->addrs[rank] && strcmp(c->addrs[rank], addr))
		log_info("coord", "rank %d moved from %s to %s", rank, c->addrs[rank], addr);
	free(c->addrs[rank]);
	c->addrs[rank] = strdup(addr);
	/* remember the connection for events of a job it names */
	if (net_json_str(m, "job", 128, &job) == 0 && net_json_u64(m, "nodes", COORD_MAX_NODES, &nodes) == 0 &&
	    nodes > (uint64_t)rank) {
		uint64_t dp = 0;
		net_json_u64(m, "dp", COORD_MAX_NODES, &dp);
		struct cjob *j = job_get(c, job, (uint32_t)nodes, (uint32_t)dp);
		if (j)
			j->n[rank].conn = conn;
	}
	r = json_object();
	json_object_set_new(r, "ok", json_true());
	/* the table only on request: at 4096 nodes answering every register
	 * with it costs O(n^2) */
	if (json_is_true(json_object_get(m, "want_table")))
		json_object_set_new(r, "addrs", addrs_json(c));
	send_msg(c, conn, NT_RESP, req_id, r);
}

/* {job} -> what the coordinator knows of a job, for mtcfs-admin. */
static void on_status(struct coord *c, uint64_t conn, uint32_t req_id, json_t *m)
{
	const char *name;
	struct cjob *j = NULL;
	json_t *r = json_object(), *nodes;

	if (net_json_str(m, "job", 128, &name) == 0)
		for (j = c->jobs; j; j = j->next)
			if (!strcmp(j->name, name))
				break;
	json_object_set_new(r, "addrs", addrs_json(c));
	if (!j) {
		json_object_set_new(r, "known", json_false());
		send_msg(c, conn, NT_RESP, req_id, r);
		return;
	}
	json_object_set_new(r, "known", json_true());
	json_object_set_new(r, "job", json_string(j->name));
	json_object_set_new(r, "nodes_total", json_integer(j->nodes));
	json_object_set_new(r, "dp", json_integer(j->dp));
	json_object_set_new(r, "lkg", j->has_lkg ? json_integer((json_int_t)j->lkg) : json_null());
	json_object_set_new(r, "replicated_lkg",
			    j->has_safe ? json_integer((json_int_t)j->safe) : json_null());
	json_object_set_new(r, "restore", json_string(j->state == R_IDLE ? "idle" :
						     j->state == R_COLLECT ? "collecting" : "planned"));
	json_object_set_new(r, "plan", json_integer(j->plan_id));
	json_object_set_new(r, "last_backup_step", j->has_last_bk ? json_integer((json_int_t)j->last_bk_step) : json_null());
	json_object_set_new(r, "backup_running", j->bk_running ? json_string(j->bk_name) : json_null());
	nodes = json_array();
	for (uint32_t x = 0; x < j->nodes; x++) {
		json_t *n = json_object(), *cm = json_array();
		for (int k = 0; k < COMMITS_KEPT; k++)
			if (j->n[x].lg.commits[k])
				json_array_append_new(cm, json_integer((json_int_t)(j->n[x].lg.commits[k] - 1)));
		json_object_set_new(n, "rank", json_integer(x));
		json_object_set_new(n, "connected", json_boolean(j->n[x].conn != 0));
		json_object_set_new(n, "commits", cm);
		json_array_append_new(nodes, n);
	}
	json_object_set_new(r, "nodes", nodes);
	send_msg(c, conn, NT_RESP, req_id, r);
}

void coord_on_msg(struct coord *c, uint64_t conn, int rank, uint8_t type, uint32_t req_id,
		  json_t *msg)
{
	const char *op = NULL;

	if (net_json_str(msg, "op", 32, &op) < 0) {
		if (type == NT_REQ)
			reply_err(c, conn, req_id, EINVAL, "missing op");
		return;
	}
	pthread_mutex_lock(&c->mu);
	if (!strcmp(op, "register") && type == NT_REQ)
		on_register(c, conn, rank, req_id, msg);
	else if (!strcmp(op, "table") && type == NT_REQ) {
		json_t *r = json_object();
		json_object_set_new(r, "addrs", addrs_json(c));
		send_msg(c, conn, NT_RESP, req_id, r);
	} else if (!strcmp(op, "catalog") && type == NT_REQ)
		on_catalog(c, conn, rank, req_id, msg);
	else if (!strcmp(op, "fetch_failed") && type == NT_REQ)
		on_fetch_failed(c, conn, rank, req_id, msg);
	else if (!strcmp(op, "ready") && type == NT_REQ)
		on_ready(c, conn, rank, req_id, msg);
	else if (!strcmp(op, "status") && type == NT_REQ)
		on_status(c, conn, req_id, msg);
	else if (!strcmp(op, "committed"))
		on_committed(c, conn, rank, msg);
	else if (!strcmp(op, "replicated"))
		on_replicated(c, conn, rank, msg);
	else if (!strcmp(op, "backup_done"))
		on_backup_done(c, rank, msg);
	else if (type == NT_REQ)
		reply_err(c, conn, req_id, ENOSYS, "unknown op");
	pthread_mutex_unlock(&c->mu);
	/* the event tests and tools wait on (-d): the coordinator's state now
	 * includes this message; mtcfs-admin's polls are left out */
	if (log_get_level() >= LOG_DEBUG && strcmp(op, "status") && strcmp(op, "table")) {
		const char *job = "";
		uint64_t step = 0;
		(void)net_json_str(msg, "job", 128, &job);
		(void)net_json_u64(msg, "step", UINT64_MAX, &step);
		log_dbg("coord", "handled %s job=%s step=%llu rank=%d", op, job,
			(unsigned long long)step, rank);
	}
}

void coord_on_close(struct coord *c, uint64_t conn, int rank)
{
	pthread_mutex_lock(&c->mu);
	for (struct cjob *j = c->jobs; j; j = j->next) {
		for (uint32_t r = 0; r < j->nodes; r++) {
			struct cnode *n = &j->n[r];
			if (n->conn != conn)
				continue;
			n->conn = 0;
			n->cat.waiting = false;
			n->rdy.waiting = false;
			if (j->bk_running && !j->bk_done[r])
				bk_abandon(j, "a node disconnected", false);
			if (j->state == R_PLANNED)
				maybe_release(c, j, false);
		}
	}
	pthread_mutex_unlock(&c->mu);
}

static void *tick_main(void *arg)
{
	struct coord *c = arg;

	pthread_setname_np(pthread_self(), "mtcfs-coord");
	pthread_mutex_lock(&c->mu);
	while (!c->stop) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 100 * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&c->cv, &c->mu, &ts);
		uint64_t now = util_now_ns();
		for (struct cjob *j = c->jobs; j; j = j->next) {
			if (j->state == R_COLLECT && now - j->round_start > c->timeout_ns) {
				uint32_t missing = 0;
				for (uint32_t r = 0; r < j->nodes; r++)
					missing += !j->n[r].reported;
				log_warn("coord", "job %s: %u of %u nodes did not report within restore_timeout; planning without them",
					 j->name, missing, j->nodes);
				start_plan(c, j);
			}
			maybe_backup(c, j);
			if (j->state == R_PLANNED && now - j->plan_time > c->timeout_ns) {
				log_warn("coord", "job %s: barrier timed out; releasing the nodes that are ready", j->name);
				maybe_release(c, j, true);
				j->plan_time = now;
			}
		}
	}
	pthread_mutex_unlock(&c->mu);
	return NULL;
}

int coord_start(struct nsrv *srv, int restore_timeout_s, struct coord **out)
{
	struct coord *c = calloc(1, sizeof(*c));
	int rc;

	if (!c)
		return -ENOMEM;
	c->srv = srv;
	c->timeout_ns = (uint64_t)(restore_timeout_s > 0 ? restore_timeout_s : 300) * 1000000000ULL;
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cv, NULL);
	rc = pthread_create(&c->tick, NULL, tick_main, c);
	if (rc) {
		free(c);
		return -rc;
	}
	*out = c;
	return 0;
}

void coord_set_bucket(struct coord *c, const struct coord_bucket *b)
{
	pthread_mutex_lock(&c->mu);
	c->bk = *b;
	if (!c->worker && workq_start("mtcfs-coordbk", &c->worker) < 0)
		c->worker = NULL;
	pthread_mutex_unlock(&c->mu);
}

void coord_quiesce(struct coord *c)
{
	bool join;
	if (!c)
		return;
	pthread_mutex_lock(&c->mu);
	join = !c->stop;
	c->stop = true;
	pthread_cond_signal(&c->cv);
	pthread_mutex_unlock(&c->mu);
	if (join)
		pthread_join(c->tick, NULL);
	/* bucket work may send: finish it while the server still exists */
	workq_stop(c->worker);
	c->worker = NULL;
}

void coord_stop(struct coord *c)
{
	if (!c)
		return;
	coord_quiesce(c);
	while (c->jobs) {
		struct cjob *j = c->jobs;
		c->jobs = j->next;
		job_free(j);
	}
	for (uint32_t i = 0; i < c->naddrs; i++)
		free(c->addrs[i]);
	free(c->addrs);
	pthread_mutex_destroy(&c->mu);
	pthread_cond_destroy(&c->cv);
	free(c);
}
