/* coord.c — see coord.h; the messages are net/proto.h's. This half keeps
 * the jobs and the rank -> address table (register, table, status), the
 * steady-state LKG (committed, replicated -> lkg to every node), backups
 * (backup to every node, backup_done), the message table and the
 * lifecycle; coord_restore.c runs restore rounds.
 * lkg.step: the newest step every node has committed (backups start from it);
 * lkg.safe: the newest step every node has committed and replicated (nodes
 * drop older steps only below it, so a node lost before its newest step's
 * replicas exist still leaves the previous step complete). */
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
#include <unistd.h>

void coord_send(struct coord *c, uint64_t conn, uint8_t type, uint32_t req_id, json_t *m)
{
	nsrv_send(c->srv, conn, type, req_id, m);   /* takes m */
}

void coord_reply_err(struct coord *c, uint64_t conn, uint32_t req_id, int err, const char *what)
{
	coord_send(c, conn, NT_ERROR, req_id, net_error_msg(err, what));
}

const char *coord_addr_of(struct coord *c, uint32_t rank)
{
	return rank < c->naddrs && c->addrs[rank] ? c->addrs[rank] : "";
}

struct wlog *coord_wlog_of(struct cnode *n, uint32_t w, bool create)
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
	free(j->bucket_owners);
	free(j->bk_done);
	coord_ec_free(j->ec);
	free(j);
}

struct cjob *coord_job_get(struct coord *c, const char *name, uint32_t nodes, uint32_t dp)
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

/* A bad request: the reason in the reply and the log. */
void coord_reply_bad(struct coord *c, const struct proto_in *in, const char *why)
{
	char text[256];

	snprintf(text, sizeof(text), "bad %s: %s", proto_op_name(in->op), why);
	log_dbg("coord", "rank %d: %s", in->rank, text);
	coord_reply_err(c, in->conn, in->req_id, EINVAL, text);
}

struct cjob *coord_job_of(struct coord *c, const char *name, int rank)
{
	struct cjob *j;
	for (j = c->jobs; j; j = j->next)
		if (!strcmp(j->name, name))
			break;
	if (!j || rank < 0 || (uint32_t)rank >= j->nodes)
		return NULL;
	return j;
}

/* ---- backups (DESIGN §4): the coordinator names them, nodes upload ---- */

struct bk_job {
	struct coord *c;
	char job[JOB_NAME_MAX + 1];
	uint64_t step;
	char failed[64];              /* copy of the job's bk_failed */
	uint64_t failed_step;
};

static void bk_abandon(struct cjob *j, const char *why, bool is_error);

static bool hash_at_w(struct cnode *n, uint32_t w, uint64_t step, uint8_t out[32])
{
	struct wlog *l = coord_wlog_of(n, w, false);
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
			struct proto_report e = { .job = j->name, .text = why };
			coord_send(c, j->n[r].conn, NT_EVENT, 0, proto_report_encode(&e));
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
		struct proto_backup e = { .job = j->name, .name = name, .step = j->bk_step,
					  .data = data };
		coord_send(c, j->n[r].conn, NT_EVENT, 0, proto_backup_encode(&e));
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

static void on_backup_done(void *arg, const struct proto_in *in)
{
	struct coord *c = arg;
	struct proto_backup_done m;
	int rank = in->rank;
	struct cjob *j;
	uint32_t done = 0;

	if (proto_backup_done_decode(in->msg, &m, NULL, 0) < 0 ||
	    !(j = coord_job_of(c, m.job, rank)) || !j->bk_running || strcmp(m.name, j->bk_name))
		return;
	if (!m.ok) {
		char why[512];
		snprintf(why, sizeof(why), "node %d: %s", rank, m.error ? m.error : "failed");
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
			const struct wlog *l = coord_wlog_of(&j->n[r], w, false);
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
		struct proto_lkg e = { .job = j->name, .step = j->lkg, .has_safe = j->has_safe,
				       .safe = j->safe };
		coord_send(c, j->n[r].conn, NT_EVENT, 0, proto_lkg_encode(&e));
	}
}

/* A node's event about one of its steps: its job (made if new) and node,
 * whose connection is noted. false: not a rank of that job, or no memory. */
static bool event_node(struct coord *c, const struct proto_in *in, const struct proto_step_ev *m,
		       struct cjob **jp, struct cnode **np)
{
	if (in->rank < 0 || (uint32_t)in->rank >= m->job.nodes)
		return false;
	*jp = coord_job_get(c, m->job.name, m->job.nodes, m->job.dp);
	if (!*jp)
		return false;
	(*jp)->workers = m->workers;
	*np = &(*jp)->n[in->rank];
	(*np)->conn = in->conn;
	return true;
}

/* The steady-state LKG: the newest step every owner has committed. */
static void on_committed(void *arg, const struct proto_in *in)
{
	struct coord *c = arg;
	struct proto_step_ev m;
	uint64_t step;
	struct cjob *j;
	struct cnode *n;
	struct wlog *l;
	uint64_t newest;
	char why[160];

	if (proto_committed_decode(in->msg, &m, why, sizeof(why)) < 0) {
		log_dbg("coord", "rank %d: bad committed: %s", in->rank, why);
		return;
	}
	if (!event_node(c, in, &m, &j, &n) || !(l = coord_wlog_of(n, m.worker, true)))
		return;
	step = m.step;
	if (m.has_bi_min)
		j->bi_min = m.bi_min;
	if (m.has_bi_steps)
		j->bi_steps = m.bi_steps;
	/* keep the newest COMMITS_KEPT steps, slot 0 newest */
	if (step + 1 > l->commits[0]) {
		memmove(&l->commits[1], &l->commits[0], (COMMITS_KEPT - 1) * sizeof(uint64_t));
		memmove(&l->commit_hash[1], &l->commit_hash[0], (COMMITS_KEPT - 1) * 32);
		l->commits[0] = step + 1;   /* stored +1: 0 is empty */
		memcpy(l->commit_hash[0], m.hash, 32);
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

bool coord_replicated(struct cjob *j, struct cnode *n, uint32_t worker, uint64_t step)
{
	uint64_t safe;
	uint8_t hash[32];
	struct wlog *l;

	if (!hash_at_w(n, worker, step, hash) || !(l = coord_wlog_of(n, worker, false)))
		return false;   /* not a commit we know (a timeline left by a restore) */
	if (step + 1 > l->repl[0]) {
		memmove(&l->repl[1], &l->repl[0], (COMMITS_KEPT - 1) * sizeof(uint64_t));
		memmove(&l->repl_hash[1], &l->repl_hash[0], (COMMITS_KEPT - 1) * 32);
		l->repl[0] = step + 1;
		memcpy(l->repl_hash[0], hash, 32);
	}
	if (!newest_of(j, true, &safe) || (j->has_safe && safe <= j->safe))
		return false;
	j->has_safe = true;
	j->safe = safe;
	return true;
}

/* A node's pushes of its own step all succeeded (under rs: all its parity
 * of the step is stored). */
static void on_replicated(void *arg, const struct proto_in *in)
{
	struct coord *c = arg;
	struct proto_step_ev m;
	struct cjob *j;
	struct cnode *n;
	char why[160];

	if (proto_replicated_decode(in->msg, &m, why, sizeof(why)) < 0) {
		log_dbg("coord", "rank %d: bad replicated: %s", in->rank, why);
		return;
	}
	if (!event_node(c, in, &m, &j, &n))
		return;
	if (coord_replicated(j, n, m.worker, m.step)) {
		log_info("coord", "job %s: step %llu is committed and replicated on all %u nodes",
			 j->name, (unsigned long long)j->safe, j->nodes);
		send_lkg(c, j);
	}
}

static void on_register(void *arg, const struct proto_in *in)
{
	struct coord *c = arg;
	struct proto_register m;
	int rank = in->rank;
	char why[160];

	if (proto_register_decode(in->msg, &m, why, sizeof(why)) < 0) {
		coord_reply_bad(c, in, why);
		return;
	}
	if (rank < 0 || rank >= (int)COORD_MAX_NODES) {
		coord_reply_bad(c, in, "rank out of range");
		return;
	}
	if ((uint32_t)rank >= c->naddrs) {
		char **na = realloc(c->addrs, ((size_t)rank + 1) * sizeof(*na));
		uint64_t *nc;
		if (na)
			c->addrs = na;
		nc = na ? realloc(c->ctl, ((size_t)rank + 1) * sizeof(*nc)) : NULL;
		if (!nc) {
			coord_reply_err(c, in->conn, in->req_id, ENOMEM, "out of memory");
			return;
		}
		c->ctl = nc;
		for (uint32_t i = c->naddrs; i <= (uint32_t)rank; i++) {
			na[i] = NULL;
			nc[i] = 0;
		}
		c->naddrs = (uint32_t)rank + 1;
	}
	if (!c->addrs[rank] || strcmp(c->addrs[rank], m.addr)) {
		char *a = strdup(m.addr);
		if (!a) {
			coord_reply_err(c, in->conn, in->req_id, ENOMEM, "out of memory");
			return;
		}
		if (c->addrs[rank])
			log_info("coord", "rank %d moved from %s to %s", rank, c->addrs[rank], m.addr);
		free(c->addrs[rank]);
		c->addrs[rank] = a;
		c->gen++;
	}
	/* One address is one rank's: a node that took another rank (a new
	 * replicator.yaml, a JobSet reschedule) no longer serves the one it
	 * had, and a push meant for that rank must not reach it. The rank is
	 * unknown until its new node registers. */
	for (uint32_t r = 0; r < c->naddrs; r++) {
		if (r == (uint32_t)rank || !c->addrs[r] || strcmp(c->addrs[r], m.addr))
			continue;
		log_info("coord", "rank %d registered %s, rank %u's address until now: rank %u has no address until its node registers",
			 rank, m.addr, r, r);
		free(c->addrs[r]);
		c->addrs[r] = NULL;
		c->gen++;
	}
	c->ctl[rank] = in->conn;
	/* remember the connection for events of a job it names */
	if (m.job && m.nodes > (uint32_t)rank) {
		struct cjob *j = coord_job_get(c, m.job, m.nodes, m.dp);
		if (j)
			j->n[rank].conn = in->conn;
		if (j && m.has_bi) {
			/* a restarted coordinator: the interval before any commit */
			j->bi_min = m.bi_min;
			j->bi_steps = m.bi_steps;
		}
	}
	/* the table only on request: at 4096 nodes answering every register
	 * with it costs O(n^2) */
	coord_send(c, in->conn, NT_RESP, in->req_id,
		 proto_addrs_reply(true, m.want_table, c->addrs, c->naddrs, c->gen));
}

/* The table changed since the nodes were last told: every registered node
 * hears its new generation (peers) and fetches the table before its next
 * push. Called from the tick, so a burst of registrations (a job's start)
 * costs one event per node per tick, not one per registration. c->mu held. */
static void announce_table(struct coord *c)
{
	if (c->gen == c->gen_sent)
		return;
	c->gen_sent = c->gen;
	for (uint32_t r = 0; r < c->naddrs; r++)
		if (c->ctl[r])
			coord_send(c, c->ctl[r], NT_EVENT, 0, proto_peers_encode(c->gen));
}

static void on_table(void *arg, const struct proto_in *in)
{
	struct coord *c = arg;
	coord_send(c, in->conn, NT_RESP, in->req_id,
		   proto_addrs_reply(false, true, c->addrs, c->naddrs, c->gen));
}

/* {job} -> what the coordinator knows of a job, for mtcfs-admin. */
static void on_status(void *arg, const struct proto_in *in)
{
	struct coord *c = arg;
	struct proto_status m;
	struct proto_status_reply r = { .addrs = c->addrs, .naddrs = c->naddrs };
	struct proto_status_node *nodes = NULL;
	struct cjob *j = NULL;

	proto_status_decode(in->msg, &m, NULL, 0);
	for (j = m.job ? c->jobs : NULL; j; j = j->next)
		if (!strcmp(j->name, m.job))
			break;
	if (j && !(nodes = calloc(j->nodes, sizeof(*nodes)))) {
		coord_reply_err(c, in->conn, in->req_id, ENOMEM, "out of memory");
		return;
	}
	if (j) {
		r = (struct proto_status_reply){
			.addrs = c->addrs, .naddrs = c->naddrs, .known = true, .job = j->name,
			.nodes_total = j->nodes, .dp = j->dp,
			.has_lkg = j->has_lkg, .lkg = j->lkg, .has_safe = j->has_safe, .safe = j->safe,
			.restore = j->state == R_IDLE ? "idle" :
				   j->state == R_COLLECT ? "collecting" : "planned",
			.plan = j->plan_id,
			.has_last_backup = j->has_last_bk, .last_backup_step = j->last_bk_step,
			.backup_running = j->bk_running ? j->bk_name : NULL, .nodes = nodes };
		for (uint32_t x = 0; x < j->nodes; x++) {
			nodes[x].connected = j->n[x].conn != 0;
			for (int k = 0; k < COMMITS_KEPT && k < PROTO_STATUS_COMMITS; k++)
				if (j->n[x].lg.commits[k])
					nodes[x].commits[nodes[x].ncommits++] = j->n[x].lg.commits[k] - 1;
		}
	}
	coord_send(c, in->conn, NT_RESP, in->req_id, proto_status_reply_encode(&r));
	free(nodes);
}

static const struct proto_route coord_routes[] = {
	{ PROTO_REGISTER,     PROTO_T(NT_REQ), on_register },
	{ PROTO_TABLE,        PROTO_T(NT_REQ), on_table },
	{ PROTO_CATALOG,      PROTO_T(NT_REQ), coord_on_catalog },
	{ PROTO_FETCH_FAILED, PROTO_T(NT_REQ), coord_on_fetch_failed },
	{ PROTO_READY,        PROTO_T(NT_REQ), coord_on_ready },
	{ PROTO_STATUS,       PROTO_T(NT_REQ), on_status },
	/* events, taken in any frame (a request gets no reply), as ever */
	{ PROTO_COMMITTED,    PROTO_T_ANY, on_committed },
	{ PROTO_REPLICATED,   PROTO_T_ANY, on_replicated },
	{ PROTO_BACKUP_DONE,  PROTO_T_ANY, on_backup_done },
};

void coord_on_msg(struct coord *c, uint64_t conn, int rank, uint8_t type, uint32_t req_id,
		  json_t *msg)
{
	struct proto_in in = { .type = type, .req_id = req_id, .rank = rank, .conn = conn,
			       .msg = msg };
	int rc;

	pthread_mutex_lock(&c->mu);
	rc = proto_dispatch(coord_routes, sizeof(coord_routes) / sizeof(coord_routes[0]), c, &in);
	pthread_mutex_unlock(&c->mu);
	if (rc < 0 && type == NT_REQ)
		coord_reply_err(c, conn, req_id, rc == -EINVAL ? EINVAL : ENOSYS,
				rc == -EINVAL ? "missing op" : "unknown op");
	/* the event tests and tools wait on (-d): the coordinator's state now
	 * includes this message; mtcfs-admin's polls are left out */
	if (rc != -EINVAL && log_get_level() >= LOG_DEBUG && in.op != PROTO_STATUS &&
	    in.op != PROTO_TABLE) {
		const char *op = "", *job = "";
		uint64_t step = 0;
		(void)net_json_str(msg, "op", PROTO_OP_MAX, &op);
		(void)net_json_str(msg, "job", PROTO_JOB_MAX, &job);
		(void)net_json_u64(msg, "step", UINT64_MAX, &step);
		log_dbg("coord", "handled %s job=%s step=%llu rank=%d", op, job,
			(unsigned long long)step, rank);
	}
}

void coord_on_close(struct coord *c, uint64_t conn, int rank)
{
	pthread_mutex_lock(&c->mu);
	/* A connection speaks for the one rank it said hello as (-1: a tool's):
	 * only that rank's slots can hold it, so a close is O(jobs), not a
	 * scan of every node (16k closes at a job's end). Its address stays:
	 * the node may be back on a new connection. */
	if (rank >= 0 && (uint32_t)rank < c->naddrs && c->ctl[rank] == conn)
		c->ctl[rank] = 0;
	for (struct cjob *j = c->jobs; rank >= 0 && j; j = j->next) {
		for (uint32_t r = (uint32_t)rank; r < j->nodes && r == (uint32_t)rank; r++) {
			struct cnode *n = &j->n[r];
			if (n->conn != conn)
				continue;
			n->conn = 0;
			j->closes_since++;
			n->cat.waiting = false;
			n->rdy.waiting = false;
			if (j->bk_running && !j->bk_done[r])
				bk_abandon(j, "a node disconnected", false);
			if (j->state == R_PLANNED)
				coord_maybe_release(c, j, false);
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
		announce_table(c);
		for (struct cjob *j = c->jobs; j; j = j->next) {
			if (j->state == R_COLLECT && now - j->round_start > c->timeout_ns) {
				uint32_t missing = 0;
				for (uint32_t r = 0; r < j->nodes; r++)
					missing += !j->n[r].reported;
				log_warn("coord", "job %s: %u of %u nodes did not report within restore_timeout (%llu s); planning without them",
					 j->name, missing, j->nodes,
					 (unsigned long long)(c->timeout_ns / 1000000000ULL));
				coord_start_plan(c, j);
			}
			maybe_backup(c, j);
			/* a plan made just now (above) has plan_time > now */
			if (j->state == R_PLANNED && now > j->plan_time &&
			    now - j->plan_time > c->timeout_ns) {
				log_warn("coord", "job %s: barrier timed out; releasing the nodes that are ready", j->name);
				coord_maybe_release(c, j, true);
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
	c->timeout_ns = (uint64_t)(restore_timeout_s > 0 ? restore_timeout_s : 120) * 1000000000ULL;
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
	free(c->ctl);
	pthread_mutex_destroy(&c->mu);
	pthread_cond_destroy(&c->cv);
	free(c);
}
