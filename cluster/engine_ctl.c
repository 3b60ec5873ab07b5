/* engine_ctl.c — the control connection to the coordinator (see engine_int.h). */
#include "cluster/engine_int.h"
#include "cluster/redund.h"
#include "tiers/backup.h"
#include "common/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---------- the control connection ---------- */

static void ctl_fail_all(struct eng *e, int rc)
{
	for (size_t i = 0; i < sizeof(e->calls) / sizeof(e->calls[0]); i++) {
		if (e->calls[i] && !e->calls[i]->done) {
			e->calls[i]->done = true;
			e->calls[i]->rc = rc;
		}
	}
	pthread_cond_broadcast(&e->ctl_cv);
}

/* The coordinator's events on the control connection (ctx: the engine);
 * a malformed one is dropped. */
static void on_ev_backup(void *arg, const struct proto_in *in)
{
	struct eng *e = arg;
	struct proto_backup m;
	struct bk_upload *u;

	if (!e->bkt || proto_backup_decode(in->msg, &m, NULL, 0) < 0 || !bk_backup_name_ok(m.name))
		return;
	u = calloc(1, sizeof(*u));
	if (!u)
		return;
	u->e = e;
	snprintf(u->job, sizeof(u->job), "%s", m.job);
	snprintf(u->name, sizeof(u->name), "%s", m.name);
	u->step = m.step;
	u->data = m.data;
	pthread_mutex_lock(&e->mu);
	e->pins++;
	e->pin_step = m.step;
	snprintf(e->pin_job, sizeof(e->pin_job), "%s", m.job);
	pthread_mutex_unlock(&e->mu);
	if (workq_submit(e->bkq, eng_backup_run, u) < 0) {
		pthread_mutex_lock(&e->mu);
		e->pins--;
		pthread_mutex_unlock(&e->mu);
		free(u);
	}
}

static void on_ev_report(void *arg, const struct proto_in *in)
{
	struct proto_report m;

	if (proto_report_decode(in->msg, &m, NULL, 0) == 0)
		eng_report(arg, "%s", m.text);
}

static void on_ev_lkg(void *arg, const struct proto_in *in)
{
	struct eng *e = arg;
	struct proto_lkg m;
	bool news;

	if (proto_lkg_decode(in->msg, &m, NULL, 0) < 0)
		return;
	pthread_mutex_lock(&e->mu);
	news = !e->has_lkg || e->lkg != m.step || strcmp(e->lkg_job, m.job);
	if (strcmp(e->lkg_job, m.job))
		e->has_safe = false;
	e->has_lkg = true;
	e->lkg = m.step;
	if (m.has_safe) {
		e->has_safe = true;
		e->safe = m.safe;
	}
	snprintf(e->lkg_job, sizeof(e->lkg_job), "%s", m.job);
	pthread_mutex_unlock(&e->mu);
	if (news)
		log_info("engine", "job %s: step %llu complete on every node", m.job,
			 (unsigned long long)m.step);
	if (m.has_safe)
		log_dbg("engine", "job %s: step %llu committed and replicated on every node",
			m.job, (unsigned long long)m.safe);
	/* older steps' parity holdings go by the retention plan (on_lkg) */
	if (e->cb.on_lkg)
		e->cb.on_lkg(e->cb.arg, m.job, m.step);
}

/* The coordinator's table is at a new generation: fetch it before the
 * next push (not now: the reader thread must not wait on its own
 * connection's reply). */
static void on_ev_peers(void *arg, const struct proto_in *in)
{
	struct eng *e = arg;
	uint64_t gen;

	if (proto_peers_decode(in->msg, &gen, NULL, 0) < 0)
		return;
	pthread_mutex_lock(&e->mu);
	if (gen != e->table_gen) {
		e->table_stale = true;
		log_dbg("engine", "the coordinator's peer table is at generation %llu (ours %llu)",
			(unsigned long long)gen, (unsigned long long)e->table_gen);
	}
	pthread_mutex_unlock(&e->mu);
}

static const struct proto_route ctl_routes[] = {
	{ PROTO_BACKUP, PROTO_T(NT_EVENT), on_ev_backup },
	{ PROTO_REPORT, PROTO_T(NT_EVENT), on_ev_report },
	{ PROTO_LKG,    PROTO_T(NT_EVENT), on_ev_lkg },
	{ PROTO_PEERS,  PROTO_T(NT_EVENT), on_ev_peers },
};

static void handle_event(struct eng *e, json_t *m)
{
	struct proto_in in = { .type = NT_EVENT, .rank = 0, .msg = m };

	proto_dispatch(ctl_routes, sizeof(ctl_routes) / sizeof(ctl_routes[0]), e, &in);
}

static void *ctl_reader(void *arg)
{
	struct eng *e = arg;
	struct nconn *c;

	pthread_setname_np(pthread_self(), "mtcfs-ctlrd");
	pthread_mutex_lock(&e->ctl_mu);
	c = e->ctl;
	pthread_mutex_unlock(&e->ctl_mu);
	for (;;) {
		struct net_hdr h;
		json_t *m = NULL;
		int rc = nconn_recv(c, 1000, &h, &m);

		if (rc == -ETIMEDOUT || rc == -EAGAIN) {
			bool stop;
			pthread_mutex_lock(&e->ctl_mu);
			stop = e->stopping;
			pthread_mutex_unlock(&e->ctl_mu);
			if (stop)
				break;
			continue;
		}
		if (rc < 0) {
			bool renamed;
			pthread_mutex_lock(&e->ctl_mu);
			renamed = e->ctl_renaming;
			pthread_mutex_unlock(&e->ctl_mu);
			if (renamed)
				log_info("engine", "control connection closed: this node has a new rank");
			else
				log_warn("engine", "control connection to the coordinator lost: %s",
					 strerror(-rc));
			break;
		}
		if (h.type == NT_EVENT) {
			handle_event(e, m);
			json_decref(m);
			continue;
		}
		pthread_mutex_lock(&e->ctl_mu);
		for (size_t i = 0; i < sizeof(e->calls) / sizeof(e->calls[0]); i++) {
			struct pending_call *p = e->calls[i];
			if (p && !p->done && p->id == h.req_id) {
				p->done = true;
				p->rc = h.type == NT_ERROR ? net_error_errno(m) : 0;
				p->resp = m;
				m = NULL;
				pthread_cond_broadcast(&e->ctl_cv);
				break;
			}
		}
		pthread_mutex_unlock(&e->ctl_mu);
		json_decref(m);
	}
	pthread_mutex_lock(&e->ctl_mu);
	if (e->ctl == c)
		e->ctl = NULL;
	ctl_fail_all(e, -ECONNRESET);
	pthread_mutex_unlock(&e->ctl_mu);
	nconn_close(c);
	return NULL;
}

static json_t *register_msg(struct eng *e)
{
	struct proto_register r = { .addr = e->listen };
	struct job_now now;
	json_t *m;

	pthread_mutex_lock(&e->mu);
	jobid_get(e->jid, &now);   /* with the backup interval: the same yaml's */
	if (now.set) {
		r.job = now.job;
		r.nodes = now.nodes;
		r.dp = now.dp;
		r.has_bi = true;
		r.bi_min = e->bi_min;
		r.bi_steps = e->bi_steps;
	}
	pthread_mutex_unlock(&e->mu);
	m = proto_register_encode(&r);   /* copies now.job */
	return m;
}

/* A send on the control connection failed (ctl_mu held): a coordinator
 * that has not read for the whole io timeout, or a broken stream. Shut the
 * socket: the reader tears the connection down and the next call makes a
 * new one (and registers again) instead of failing on a dead stream. */
static void ctl_send_failed(struct eng *e, int rc)
{
	if (!e->ctl)
		return;
	log_warn("engine", "sending to the coordinator at %s failed: %s; reconnecting",
		 e->coord_addr, strerror(-rc));
	nconn_shutdown(e->ctl);
}

/* Connect the control connection if needed. ctl_mu held. */
static int ctl_ensure_locked(struct eng *e)
{
	struct nconn *c = NULL;
	int rank, rc;

	if (e->ctl)
		return 0;
	if (e->stopping)
		return -ESHUTDOWN;
	if (e->ctl_reader_running) {
		pthread_mutex_unlock(&e->ctl_mu);
		pthread_join(e->ctl_reader, NULL);
		pthread_mutex_lock(&e->ctl_mu);
		e->ctl_reader_running = false;
		if (e->ctl)
			return 0;
	}
	rank = eng_rank(e);
	if (!e->coord_addr[0])
		return -ENOTCONN;
	rc = nconn_connect(e->coord_addr, rank, "control", &e->auth, 5000, &c, NULL);
	if (rc < 0)
		return rc;
	e->ctl = c;
	rc = pthread_create(&e->ctl_reader, NULL, ctl_reader, e);
	if (rc) {
		e->ctl = NULL;
		nconn_close(c);
		return -rc;
	}
	e->ctl_reader_running = true;
	return 0;
}

/* One request on the control connection; *resp owned by the caller. */
/* ctl_mu held: the calling thread runs a restore that was interrupted. */
static bool restore_cancelled_locked(struct eng *e)
{
	return e->restoring && (e->restore_cancel || e->no_restores) &&
	       pthread_equal(e->restore_thr, pthread_self());
}

void eng_restore_stop(struct eng *e)
{
	pthread_mutex_lock(&e->ctl_mu);
	e->no_restores = true;
	pthread_cond_broadcast(&e->ctl_cv);
	e->quit = true;   /* retries of queued jobs end too (eng_retry_wait) */
	pthread_cond_broadcast(&e->quit_cv);
	pthread_mutex_unlock(&e->ctl_mu);
}

void eng_restore_interrupt(struct eng *e)
{
	pthread_mutex_lock(&e->ctl_mu);
	if (e->restoring) {
		e->restore_cancel = true;
		pthread_cond_broadcast(&e->ctl_cv);
	}
	pthread_mutex_unlock(&e->ctl_mu);
}

int eng_ctl_call(struct eng *e, json_t *req, json_t **resp, int timeout_ms)
{
	struct pending_call p = { 0 };
	struct timespec ts;
	size_t slot = SIZE_MAX;
	int rc;

	*resp = NULL;
	pthread_mutex_lock(&e->ctl_mu);
	if (restore_cancelled_locked(e)) {
		rc = -ECANCELED;
		goto out;
	}
	rc = ctl_ensure_locked(e);
	if (rc < 0)
		goto out;
	for (size_t i = 0; i < sizeof(e->calls) / sizeof(e->calls[0]); i++)
		if (!e->calls[i]) {
			slot = i;
			break;
		}
	if (slot == SIZE_MAX) {
		rc = -EBUSY;
		goto out;
	}
	p.id = ++e->next_id ? e->next_id : ++e->next_id;
	e->calls[slot] = &p;
	rc = nconn_send(e->ctl, NT_REQ, p.id, req);
	if (rc < 0) {
		e->calls[slot] = NULL;
		ctl_send_failed(e, rc);
		goto out;
	}
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += timeout_ms / 1000;
	ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	while (!p.done) {
		if (restore_cancelled_locked(e)) {
			/* the answer, if it comes, finds no waiter and is dropped */
			p.rc = -ECANCELED;
			break;
		}
		if (pthread_cond_timedwait(&e->ctl_cv, &e->ctl_mu, &ts) == ETIMEDOUT) {
			p.rc = -ETIMEDOUT;
			break;
		}
	}
	e->calls[slot] = NULL;
	rc = p.rc;
	*resp = p.resp;
out:
	pthread_mutex_unlock(&e->ctl_mu);
	return rc;
}

int eng_ctl_event(struct eng *e, json_t *ev)
{
	int rc;
	pthread_mutex_lock(&e->ctl_mu);
	rc = ctl_ensure_locked(e);
	if (rc == 0) {
		rc = nconn_send(e->ctl, NT_EVENT, 0, ev);
		if (rc < 0)
			ctl_send_failed(e, rc);
	}
	pthread_mutex_unlock(&e->ctl_mu);
	return rc;
}

/* A new table from the coordinator replaces ours (e->mu held): every rank
 * whose address changed is logged, as replication now goes there. */
static void table_replace(struct eng *e, json_t *addrs, uint64_t gen)
{
	uint32_t n = (uint32_t)json_array_size(addrs), changed = 0;
	char **nt = calloc((size_t)n + 1, sizeof(char *));
	size_t i;
	json_t *a;

	if (!nt)
		return;   /* the old one stays, still stale */
	json_array_foreach(addrs, i, a)
		nt[i] = json_is_string(a) ? strdup(json_string_value(a)) : NULL;
	for (uint32_t r = 0; r < n || r < e->ntable; r++) {
		const char *was = r < e->ntable ? e->table[r] : NULL;
		const char *now = r < n ? nt[r] : NULL;
		if (!was || (now && !strcmp(was, now)))
			continue;   /* the first sight of a rank is no change */
		if (++changed <= 8)
			log_info("engine", "peer table changed: rank %u now at %s (was %s); replication follows",
				 r, now ? now : "(none: its node has not registered)", was);
	}
	if (changed > 8)
		log_info("engine", "peer table changed: %u more ranks moved; replication follows",
			 changed - 8);
	for (uint32_t x = 0; x < e->ntable; x++)
		free(e->table[x]);
	free(e->table);
	e->table = nt;
	e->ntable = n;
	e->table_gen = gen;
	e->table_stale = false;
}

int eng_register(struct eng *e, bool want_table)
{
	json_t *req = register_msg(e), *resp = NULL;
	int rc;
	json_t *addrs;

	if (want_table)
		json_object_set_new(req, "want_table", json_true());
	rc = eng_ctl_call(e, req, &resp, CTL_TIMEOUT_MS);
	addrs = json_object_get(resp, "addrs");
	json_decref(req);
	if (rc == 0) {
		uint64_t gen = proto_addrs_gen(resp);
		pthread_mutex_lock(&e->mu);
		if (json_is_array(addrs))
			table_replace(e, addrs, gen);
		else if (gen != e->table_gen)
			e->table_stale = true;   /* changed since ours: fetch before the next push */
		pthread_mutex_unlock(&e->mu);
	}
	json_decref(resp);
	return rc;
}

void eng_table_stale(struct eng *e)
{
	pthread_mutex_lock(&e->mu);
	e->table_stale = true;
	pthread_mutex_unlock(&e->mu);
}

/* Address of a rank: the static table, else the coordinator's, fetched
 * again when it is stale or does not know the rank. */
int eng_addr_of(struct eng *e, uint32_t rank, char *out, size_t len)
{
	int rc = -ENOENT;
	if (rank < e->naddrs) {
		snprintf(out, len, "%s", e->addrs[rank]);
		return 0;
	}
	for (int attempt = 0; attempt < 2 && rc < 0; attempt++) {
		bool stale;
		pthread_mutex_lock(&e->mu);
		stale = e->table_stale && attempt == 0;
		if (!stale && rank < e->ntable && e->table[rank]) {
			snprintf(out, len, "%s", e->table[rank]);
			rc = 0;
		}
		pthread_mutex_unlock(&e->mu);
		if (rc < 0 && attempt == 0 && eng_register(e, true) < 0 && stale) {
			/* the coordinator is out of reach: the table we have is
			 * the best guess, and the receiver checks its rank */
			pthread_mutex_lock(&e->mu);
			if (rank < e->ntable && e->table[rank]) {
				snprintf(out, len, "%s", e->table[rank]);
				rc = 0;
			}
			pthread_mutex_unlock(&e->mu);
		}
	}
	return rc;
}

int eng_peer_addr(struct eng *e, uint32_t rank, char *out, size_t len)
{
	int rc = eng_addr_of(e, rank, out, len);

	if (rc < 0 || strcmp(out, e->listen))
		return rc;
	/* our own address under another rank: a table from before a rank
	 * change, ours or a peer's */
	eng_table_stale(e);
	rc = eng_addr_of(e, rank, out, len);
	if (rc == 0 && !strcmp(out, e->listen)) {
		log_warn("engine", "the coordinator's table names this node's address %s for rank %u; not pushing to it",
			 out, rank);
		rc = -ESTALE;
	}
	return rc;
}

/* A registered node (coordinator=, no rank= and no peers= table) takes the
 * node-rank of each new replicator.yaml, as GKE's replicator does. The
 * coordinator knows a node by the rank it connected with: the control
 * connection is closed (and waited for, up to 5 s) so that the next call
 * connects and registers as the new rank. Shards of the old rank stay in
 * the catalog as what they are: that owner's, held here. */
void eng_ctl_new_identity(struct eng *e, int old_rank, int new_rank)
{
	struct timespec ts;

	log_info("engine", "node-rank changes from %d to %d: reconnecting to the coordinator as rank %d",
		 old_rank, new_rank, new_rank);
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 5;
	pthread_mutex_lock(&e->ctl_mu);
	if (e->ctl) {
		e->ctl_renaming = true;
		nconn_shutdown(e->ctl);
	}
	while (e->ctl && pthread_cond_timedwait(&e->ctl_cv, &e->ctl_mu, &ts) != ETIMEDOUT)
		;
	e->ctl_renaming = false;
	pthread_mutex_unlock(&e->ctl_mu);
}
