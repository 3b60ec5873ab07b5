/* coord.c — see coord.h. Protocol (JSON over NT_REQ/NT_RESP/NT_EVENT):
 *   register {rank, addr}                       -> {ok, addrs:[...]}
 *   table {}                                    -> {addrs:[...]}
 *   catalog {job, nodes, dp, holds:[[owner, step, hash]...]}
 *                                               -> (when planned) plan entry
 *   fetch_failed {job, plan, holder, owner, step} -> a new plan entry
 *   ready {job, plan}                           -> (barrier) {op:"go"} or a new plan entry
 *   committed {job, nodes, dp, step, hash} (event) -> event lkg {job, step} to all
 * A plan entry: {op:"plan", plan, found, step, holder, owner, hash, addr}. */
#include "net/coord.h"
#include "net/frame.h"
#include "net/server.h"
#include "tiers/lkg.h"
#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define COORD_MAX_NODES 65536
#define COORD_MAX_HOLDS 64        /* per node and catalog */
#define COMMITS_KEPT    4         /* newest steps remembered per owner */

struct pending { uint64_t conn; uint32_t req_id; bool waiting; };

struct cnode {
	uint64_t conn;            /* 0 = not connected */
	bool reported;            /* catalog received in this round */
	bool ready;               /* at the barrier of the current plan */
	struct pending cat, rdy;
	uint64_t commits[COMMITS_KEPT];
	uint8_t commit_hash[COMMITS_KEPT][32];
};

struct cjob {
	struct cjob *next;
	char name[129];
	uint32_t nodes, dp;
	struct cnode *n;
	bool has_lkg;
	uint64_t lkg;
	/* restore round */
	enum { R_IDLE, R_COLLECT, R_PLANNED } state;
	uint64_t round_start, plan_time;
	struct lkg_hold *holds;
	size_t nholds, capholds;
	struct lkg_hold *bad;
	size_t nbad, capbad;
	struct lkg_plan plan;
	uint32_t plan_id;
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
		lkg_plan_free(&j->plan);
		free(j->holds);
		free(j->bad);
		free(j->n);
		free(j);
		j = NULL;
	}
	if (j)
		return j;
	j = calloc(1, sizeof(*j));
	if (!j)
		return NULL;
	j->n = calloc(nodes, sizeof(*j->n));
	if (!j->n) {
		free(j);
		return NULL;
	}
	snprintf(j->name, sizeof(j->name), "%s", name);
	j->nodes = nodes;
	j->dp = dp;
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
	if (j->plan.found && rank < j->plan.nodes) {
		const struct lkg_src *s = &j->plan.src[rank];
		net_hex_encode(s->hash, 32, hex);
		json_object_set_new(m, "step", json_integer((json_int_t)j->plan.step));
		json_object_set_new(m, "holder", json_integer(s->holder));
		json_object_set_new(m, "owner", json_integer(s->owner));
		json_object_set_new(m, "hash", json_string(hex));
		json_object_set_new(m, "addr", json_string(addr_of(c, s->holder)));
	}
	return m;
}

static void compute_plan(struct coord *c, struct cjob *j)
{
	bool *live = calloc(j->nodes, sizeof(bool));
	struct lkg_input in = { .nodes = j->nodes, .dp = j->dp, .h = j->holds, .nh = j->nholds,
				.live = live, .bad = j->bad, .nbad = j->nbad };
	uint64_t t0 = util_now_ns(), old_step = j->plan.step;
	bool was_planned = j->state == R_PLANNED, old_found = j->plan.found;
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
	if (j->plan.found) {
		/* every node restores this step: it is complete job-wide */
		j->has_lkg = true;
		j->lkg = j->plan.step;
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
	if (j->state == R_IDLE || (j->n[rank].reported && j->state == R_PLANNED)) {
		/* a new restore round: abandon the previous one */
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
		if (got == j->nodes) {
			compute_plan(c, j);
			send_plan_to_waiters(c, j);
		}
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

	if (!j || net_json_u64(m, "holder", COORD_MAX_NODES - 1, &holder) < 0 ||
	    net_json_u64(m, "owner", COORD_MAX_NODES - 1, &owner) < 0 ||
	    net_json_u64(m, "step", UINT64_MAX >> 1, &step) < 0 || j->state != R_PLANNED) {
		reply_err(c, conn, req_id, EINVAL, "bad fetch_failed");
		return;
	}
	b.holder = (uint32_t)holder;
	b.owner = (uint32_t)owner;
	b.step = step;
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

/* The steady-state LKG: the newest step every owner has committed. */
static void on_committed(struct coord *c, uint64_t conn, int rank, json_t *m)
{
	const char *name;
	uint32_t nodes, dp;
	uint64_t step;
	uint8_t hash[32];
	struct cjob *j;
	struct cnode *n;
	struct lkg_hold *h;
	size_t nh = 0;
	uint64_t newest;

	if (parse_job(m, &name, &nodes, &dp) < 0 || rank < 0 || (uint32_t)rank >= nodes ||
	    net_json_u64(m, "step", UINT64_MAX >> 1, &step) < 0 ||
	    net_json_hex(m, "hash", hash, 32) < 0)
		return;
	j = job_get(c, name, nodes, dp);
	if (!j)
		return;
	n = &j->n[rank];
	n->conn = conn;
	/* keep the newest COMMITS_KEPT steps, slot 0 newest */
	if (step + 1 > n->commits[0]) {
		memmove(&n->commits[1], &n->commits[0], (COMMITS_KEPT - 1) * sizeof(uint64_t));
		memmove(&n->commit_hash[1], &n->commit_hash[0], (COMMITS_KEPT - 1) * 32);
		n->commits[0] = step + 1;   /* stored +1: 0 is empty */
		memcpy(n->commit_hash[0], hash, 32);
	}
	h = calloc((size_t)j->nodes * COMMITS_KEPT, sizeof(*h));
	if (!h)
		return;
	for (uint32_t r = 0; r < j->nodes; r++)
		for (int k = 0; k < COMMITS_KEPT; k++)
			if (j->n[r].commits[k]) {
				h[nh].holder = r;
				h[nh].owner = r;
				h[nh].step = j->n[r].commits[k] - 1;
				memcpy(h[nh].hash, j->n[r].commit_hash[k], 32);
				nh++;
			}
	if (lkg_newest_complete(j->nodes, j->dp, h, nh, &newest) &&
	    (!j->has_lkg || newest > j->lkg)) {
		j->has_lkg = true;
		j->lkg = newest;
		log_info("coord", "job %s: step %llu is complete on all %u nodes", j->name,
			 (unsigned long long)newest, j->nodes);
		for (uint32_t r = 0; r < j->nodes; r++) {
			if (!j->n[r].conn)
				continue;
			json_t *e = json_object();
			json_object_set_new(e, "op", json_string("lkg"));
			json_object_set_new(e, "job", json_string(j->name));
			json_object_set_new(e, "step", json_integer((json_int_t)newest));
			send_msg(c, j->n[r].conn, NT_EVENT, 0, e);
		}
	}
	free(h);
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
	json_object_set_new(r, "restore", json_string(j->state == R_IDLE ? "idle" :
						     j->state == R_COLLECT ? "collecting" : "planned"));
	json_object_set_new(r, "plan", json_integer(j->plan_id));
	nodes = json_array();
	for (uint32_t x = 0; x < j->nodes; x++) {
		json_t *n = json_object(), *cm = json_array();
		for (int k = 0; k < COMMITS_KEPT; k++)
			if (j->n[x].commits[k])
				json_array_append_new(cm, json_integer((json_int_t)(j->n[x].commits[k] - 1)));
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
	else if (type == NT_REQ)
		reply_err(c, conn, req_id, ENOSYS, "unknown op");
	pthread_mutex_unlock(&c->mu);
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
				compute_plan(c, j);
				send_plan_to_waiters(c, j);
			} else if (j->state == R_PLANNED && now - j->plan_time > c->timeout_ns) {
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
}

void coord_stop(struct coord *c)
{
	if (!c)
		return;
	coord_quiesce(c);
	while (c->jobs) {
		struct cjob *j = c->jobs;
		c->jobs = j->next;
		lkg_plan_free(&j->plan);
		free(j->holds);
		free(j->bad);
		free(j->n);
		free(j);
	}
	for (uint32_t i = 0; i < c->naddrs; i++)
		free(c->addrs[i]);
	free(c->addrs);
	pthread_mutex_destroy(&c->mu);
	pthread_cond_destroy(&c->cv);
	free(c);
}
