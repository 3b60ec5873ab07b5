/* engine_repl.c — replication of committed shards (see engine_int.h). */
#include "cluster/engine_int.h"
#include "cluster/redund.h"
#include "tiers/lifecycle.h"
#include "tiers/tier.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---------- replication ---------- */

struct repl_job {
	struct eng *e;
	struct shard_key key;
	uint8_t hash[32];
	int attempt;
	uint64_t first_fail_ns;     /* when its first push failed */
	uint64_t due_ns;            /* on the retry list: when to run again */
	struct repl_job *next;      /* the retry list, under e->mu */
	bool restored;              /* the job restored it: pushed again, no "committed" event */
};

/* A failed push is tried again after 1, 2, 4, 8, then every 15 s, until
 * the step is replicated, superseded (a newer step of the job and worker
 * committed here: it replicates instead) or dropped, for at most
 * REPL_RETRY_FOR_S (then replicator.errors says so). A peer refusing
 * connections during a flood, or away for a restart, gets the step once it
 * is back. The waits are on a timer thread, not on the replication queue,
 * and end at eng_stop. */
#define REPL_RETRY_MAX_S 15
#define REPL_RETRY_FOR_S 1800

static void repl_run(void *arg);

static void *retry_main(void *arg)
{
	struct eng *e = arg;

	pthread_mutex_lock(&e->mu);
	while (!e->retry_stop) {
		uint64_t now = util_now_ns(), next = now + 60ull * 1000000000ull;
		struct repl_job **pp = &e->retry, *due = NULL;

		while (*pp) {
			struct repl_job *j = *pp;
			if (j->due_ns <= now) {
				*pp = j->next;
				j->next = due;
				due = j;
			} else {
				if (j->due_ns < next)
					next = j->due_ns;
				pp = &j->next;
			}
		}
		if (due) {
			pthread_mutex_unlock(&e->mu);
			while (due) {
				struct repl_job *j = due;
				due = j->next;
				j->next = NULL;
				if (workq_submit(e->replq, repl_run, j) < 0)
					free(j);
			}
			pthread_mutex_lock(&e->mu);
			/* Scan again before waiting: a job submitted just now may
			 * have failed and come back (retry_later) while the lock
			 * was not held, and its broadcast found no waiter. Waiting
			 * on the `next` of the scan above slept past it (up to
			 * 60 s: a test saw retries stop after the second try). */
			continue;
		}
		/* `next` and the wait come from one hold of e->mu: nothing can
		 * join the list between them without its broadcast reaching us */
		if (!e->retry) {
			pthread_cond_wait(&e->retry_cv, &e->mu);
		} else {
			struct timespec ts;
			uint64_t wait = next - now;
			clock_gettime(CLOCK_MONOTONIC, &ts);
			ts.tv_sec += (time_t)(wait / 1000000000ull);
			ts.tv_nsec += (long)(wait % 1000000000ull);
			if (ts.tv_nsec >= 1000000000L) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000L;
			}
			pthread_cond_timedwait(&e->retry_cv, &e->mu, &ts);
		}
	}
	pthread_mutex_unlock(&e->mu);
	return NULL;
}

int eng_repl_start(struct eng *e)
{
	int rc;

	util_cond_init_monotonic(&e->retry_cv);
	rc = pthread_create(&e->retry_thr, NULL, retry_main, e);
	if (rc != 0)
		return -rc;
	e->retry_running = true;
	return 0;
}

/* The stop budget: wait until the budget is spent or the queue drained
 * (watch_done); spent: cut the pushes still running, and those not yet
 * started fail before they connect. */
static void *watch_main(void *arg)
{
	struct eng *e = arg;
	struct timespec ts;
	bool cut;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += e->stop_budget_s;
	pthread_mutex_lock(&e->watch_mu);
	while (!e->watch_done &&
	       pthread_cond_timedwait(&e->watch_cv, &e->watch_mu, &ts) != ETIMEDOUT)
		;
	cut = !e->watch_done;
	pthread_mutex_unlock(&e->watch_mu);
	if (cut) {
		log_warn("engine", "stopping: the last pushes are still running after the stop budget (stop_timeout=%d s): cut",
			 e->stop_budget_s);
		tier_cut_all(e->cut);
	}
	return NULL;
}

static void watch_start(struct eng *e)
{
	pthread_mutex_init(&e->watch_mu, NULL);
	util_cond_init_monotonic(&e->watch_cv);
	e->watch_done = false;
	e->watch_running = pthread_create(&e->watch_thr, NULL, watch_main, e) == 0;
	if (!e->watch_running) {
		log_warn("engine", "stopping: no thread for the stop budget: the last pushes are not cut");
		pthread_cond_destroy(&e->watch_cv);
		pthread_mutex_destroy(&e->watch_mu);
	}
}

void eng_repl_stopped(struct eng *e)
{
	if (!e->watch_running)
		return;
	pthread_mutex_lock(&e->watch_mu);
	e->watch_done = true;
	pthread_cond_broadcast(&e->watch_cv);
	pthread_mutex_unlock(&e->watch_mu);
	pthread_join(e->watch_thr, NULL);
	e->watch_running = false;
	pthread_cond_destroy(&e->watch_cv);
	pthread_mutex_destroy(&e->watch_mu);
}

void eng_repl_stop(struct eng *e)
{
	struct repl_job *j;

	if (!e->retry_running)
		return;
	pthread_mutex_lock(&e->mu);
	e->retry_stop = true;
	pthread_cond_broadcast(&e->retry_cv);
	pthread_mutex_unlock(&e->mu);
	pthread_join(e->retry_thr, NULL);
	e->retry_running = false;
	/* A stop is often a node drain or a preemption (SIGTERM, ~30 s): each
	 * waiting push gets one last try now, the newest step first, on the
	 * replication queue that eng_stop drains next, so a peer that is back
	 * gets the step rather than never. A try that fails again is not
	 * retried (retry_stop) and the stop report names the step. */
	pthread_mutex_lock(&e->mu);
	j = e->retry;
	e->retry = NULL;
	pthread_mutex_unlock(&e->mu);
	while (j) {
		struct repl_job **pp = &j, **best = &j;
		for (; *pp; pp = &(*pp)->next)
			if ((*pp)->key.step > (*best)->key.step)
				best = pp;
		struct repl_job *b = *best;
		*best = b->next;
		b->next = NULL;
		log_info("engine", "stopping: job=%s step=%llu is not replicated to every peer yet: one last push",
			 b->key.job, (unsigned long long)b->key.step);
		if (workq_submit(e->replq, repl_run, b) < 0)
			free(b);
	}
	pthread_cond_destroy(&e->retry_cv);
	/* from here on the budget runs: the queue (these tries, and pushes of
	 * steps committed just before the stop) is drained next */
	if (e->cut)
		watch_start(e);
}

/* Put j on the retry list (takes it). false: not retried (stopping, or
 * past its time: the caller reports). */
static bool retry_later(struct eng *e, struct repl_job *j)
{
	uint64_t now = util_now_ns();
	int secs = j->attempt < 4 ? 1 << j->attempt : REPL_RETRY_MAX_S;

	if (!j->first_fail_ns)
		j->first_fail_ns = now;
	if (now - j->first_fail_ns > (uint64_t)REPL_RETRY_FOR_S * 1000000000ull)
		return false;
	j->attempt++;
	j->due_ns = now + (uint64_t)secs * 1000000000ull;
	pthread_mutex_lock(&e->mu);
	if (e->retry_stop || !e->retry_running) {
		pthread_mutex_unlock(&e->mu);
		return false;
	}
	j->next = e->retry;
	e->retry = j;
	pthread_cond_broadcast(&e->retry_cv);
	pthread_mutex_unlock(&e->mu);
	return true;
}

/* A step of k's job and worker committed: retries of older ones stop. */
static void retry_supersede(struct eng *e, const struct shard_key *k)
{
	struct repl_job **pp, *gone = NULL;

	pthread_mutex_lock(&e->mu);
	for (pp = &e->retry; *pp;) {
		struct repl_job *j = *pp;
		if (!strcmp(j->key.job, k->job) && j->key.worker == k->worker &&
		    j->key.rank == k->rank && j->key.step < k->step) {
			*pp = j->next;
			j->next = gone;
			gone = j;
		} else {
			pp = &j->next;
		}
	}
	pthread_mutex_unlock(&e->mu);
	while (gone) {
		struct repl_job *j = gone;
		gone = j->next;
		log_info("engine", "job=%s step=%llu: no more replication retries, step %llu "
			 "supersedes it", j->key.job, (unsigned long long)j->key.step,
			 (unsigned long long)k->step);
		free(j);
	}
}

/* One push of shard k to rank peer through the peer tier: 0 sent, 1 the
 * peer had the content, or -errno (-ESTALE: the node at the address our
 * table gives is not rank peer, or it is this node's own). The push names
 * peer, so a replica never lands on a node that is not that rank. */
static int push_once(struct eng *e, uint32_t peer, const struct shard_key *k,
		     const struct shard_rec *rec, const struct manifest *mf, char *addr, size_t alen)
{
	struct tier t = { 0 };
	int rank, rc;

	rc = eng_peer_addr(e, peer, addr, alen);
	if (rc < 0)
		return rc;
	rank = eng_rank(e);
	rc = tier_peer_open(addr, peer, rank, &e->auth, &t);
	if (rc < 0)
		return rc;
	tier_peer_cut_by(&t, e->cut);
	rc = tier_put(&t, e->ram, k, rec->mf, rec->mflen, mf);
	tier_close(&t);
	return rc;
}

/* Replicate shard k (its catalog record rec, manifest mf) to rank peer:
 * push_once, and once more at once with the table fetched again when the
 * node there is another rank. Any other failure marks the table stale too
 * (the peer may be back on a new address), for the retry. */
static int push_to(struct eng *e, uint32_t peer, const struct shard_key *k,
		   const struct shard_rec *rec, const struct manifest *mf)
{
	char addr[256] = "";
	int rc = push_once(e, peer, k, rec, mf, addr, sizeof(addr));

	if (rc >= 0)
		return rc;
	eng_table_stale(e);
	if (rc == -ESTALE) {
		log_info("engine", "the node at %s is not rank %u: fetching the peer table again",
			 addr[0] ? addr : "(none)", peer);
		rc = push_once(e, peer, k, rec, mf, addr, sizeof(addr));
		if (rc < 0)
			eng_table_stale(e);
	}
	return rc;
}

/* The step event of shard k for the coordinator (job, nodes, dp of now;
 * worker and workers count when workers > 1). */
static void step_ev(struct eng *e, const struct shard_key *k, const uint8_t hash[32],
		    struct proto_step_ev *se)
{
	struct job_now now;

	jobid_get(e->jid, &now);
	*se = (struct proto_step_ev){ .job = { k->job, now.nodes, now.dp }, .step = k->step,
				      .worker = k->worker, .workers = now.workers };
	memcpy(se->hash, hash, 32);
}

/* The replication scheme's work on one shard: push it to every peer; all
 * there: "replicated" to the coordinator; else onto the retry list. */
static void repl_run(void *arg)
{
	struct repl_job *j = arg;
	struct eng *e = j->e;
	struct shard_rec rec = { 0 };
	struct manifest *mf = NULL;
	int peers[MAX_PEERS], npeers, failed = 0;
	struct proto_step_ev se;
	json_t *ev;

	pthread_mutex_lock(&e->mu);
	npeers = e->npeers;
	memcpy(peers, e->peers, sizeof(peers));
	pthread_mutex_unlock(&e->mu);
	step_ev(e, &j->key, j->hash, &se);

	if (idx_get_shard(ram_idx(e->ram), &j->key, &rec) < 0 || !rec.mf ||
	    mf_decode(rec.mf, rec.mflen, &mf) < 0)
		goto out;   /* dropped meanwhile: nothing to replicate */
	for (int i = 0; i < npeers; i++) {
		uint64_t t0 = util_now_ns();
		int rc = push_to(e, (uint32_t)peers[i], &j->key, &rec, mf);
		double secs = (double)(util_now_ns() - t0) / 1e9;
		if (rc < 0) {
			failed++;
			metrics_add(MC_REPL_FAILURES, 1);
			log_warn("engine", "replicating job=%s step=%llu to rank %d failed: %s",
				 j->key.job, (unsigned long long)j->key.step, peers[i], strerror(-rc));
		} else {
			metrics_add(MC_REPL_SHARDS, 1);
			metrics_add(MC_REPL_BYTES, rc == 1 ? 0 : mf->total);
			metrics_observe(MH_REPL_SECONDS, secs);
			log_info("engine", "replicated job=%s step=%llu to rank %d bytes=%llu secs=%.3f worker=%u",
				 j->key.job, (unsigned long long)j->key.step, peers[i],
				 (unsigned long long)mf->total, secs, j->key.worker);
		}
	}
	if (!failed) {
		/* every copy it should have exists: the coordinator may let the
		 * job's older steps go */
		if (npeers > 0)
			life_replicated(ram_idx(e->ram), &j->key);
		if (j->restored)
			log_info("engine", "job %s step %llu: the restored shard is replicated again (peers: %d)",
				 j->key.job, (unsigned long long)j->key.step, npeers);
		ev = proto_replicated_encode(&se);
		if (eng_ctl_event(e, ev) < 0)
			log_warn("engine", "cannot report step %llu as replicated to the coordinator at %s",
				 (unsigned long long)j->key.step, e->coord_addr);
		json_decref(ev);
	} else {
		if (j->attempt == 0)
			log_warn("engine", "job=%s step=%llu: %d of %d peers do not have it yet; "
				 "retrying for up to %d s", j->key.job,
				 (unsigned long long)j->key.step, failed, npeers, REPL_RETRY_FOR_S);
		if (retry_later(e, j)) {
			j = NULL;
		} else {
			bool stopping;
			pthread_mutex_lock(&e->mu);
			stopping = e->retry_stop;
			pthread_mutex_unlock(&e->mu);
			if (!stopping)
				eng_report(e, "job %s step %llu: could not be replicated to %d of %d peers; it has fewer copies than configured",
					   j->key.job, (unsigned long long)j->key.step, failed, npeers);
		}
	}
out:
	mf_free(mf);
	idx_rec_clear(&rec);
	free(j);
}

/* The scheme's protect: we are on the replication worker already. */
static void repl_protect(struct eng *e, const struct shard_key *k, const uint8_t hash[32],
			 uint32_t nodes, uint32_t dp)
{
	struct repl_job *j = calloc(1, sizeof(*j));

	if (!j)
		return;
	*j = (struct repl_job){ .e = e, .key = *k };
	memcpy(j->hash, hash, 32);
	repl_run(j);
}

/* The scheme's reprotect: each worker's shard of the restored step pushed
 * again, as a restored job (no "committed" event: the coordinator knows). */
static void repl_reprotect(struct eng *e, const char *job, uint64_t step, uint32_t nodes,
			   uint32_t dp)
{
	struct job_now now;
	uint32_t workers;
	int rank;

	jobid_get(e->jid, &now);
	workers = now.workers;
	rank = now.rank;
	for (uint32_t w = 0; rank >= 0 && w < workers; w++) {
		struct shard_key k = { .step = step, .rank = (uint32_t)rank, .worker = w };
		struct shard_rec rec = { 0 };
		struct manifest *mf = NULL;
		struct repl_job *j = NULL;

		snprintf(k.job, sizeof(k.job), "%s", job);
		if (idx_get_shard(ram_idx(e->ram), &k, &rec) == 0 && rec.mf &&
		    mf_decode(rec.mf, rec.mflen, &mf) == 0 && (j = calloc(1, sizeof(*j))) != NULL) {
			*j = (struct repl_job){ .e = e, .key = k, .restored = true };
			memcpy(j->hash, mf->hash, 32);
			if (workq_submit(e->replq, repl_run, j) < 0)
				free(j);
		} else {
			/* never reported: the older steps stay until a newer one is replicated */
			log_warn("engine", "job %s step %llu worker %u: the restored shard is not held here; it is not replicated again",
				 job, (unsigned long long)step, w);
		}
		mf_free(mf);
		idx_rec_clear(&rec);
	}
}

/* Replicas are catalog records of their owners' shards: the commit GC
 * (retention) drops them with the steps, so the scheme has no gc of its
 * own; the planner finds them in the catalogs, so no source either. */
const struct redund_scheme redund_replication = {
	.name = "replication",
	.protect = repl_protect,
	.reprotect = repl_reprotect,
};

struct committed_job {
	struct eng *e;
	struct shard_key key;
	uint8_t hash[32];
};

/* On the replication worker: "committed" to the coordinator first (it
 * decides the job-wide LKG; with one shard per worker the step is the
 * job's once every (node, worker) committed it), then the scheme in force
 * protects the shard. */
static void committed_run(void *arg)
{
	struct committed_job *c = arg;
	struct eng *e = c->e;
	struct proto_step_ev se;
	json_t *ev;

	step_ev(e, &c->key, c->hash, &se);
	pthread_mutex_lock(&e->mu);
	se.bi_min = e->bi_min;
	se.bi_steps = e->bi_steps;
	pthread_mutex_unlock(&e->mu);
	ev = proto_committed_encode(&se);
	if (eng_ctl_event(e, ev) < 0)
		log_warn("engine", "cannot report step %llu to the coordinator at %s",
			 (unsigned long long)c->key.step, e->coord_addr);
	json_decref(ev);
	/* the shape the coordinator was told */
	redund_protect(e, &c->key, c->hash, se.job.nodes, se.job.dp);
	free(c);
}

void eng_committed(struct eng *e, const struct shard_key *k, const uint8_t hash[32])
{
	struct committed_job *c;
	if (!e)
		return;
	c = calloc(1, sizeof(*c));
	if (!c)
		return;
	c->e = e;
	c->key = *k;
	memcpy(c->hash, hash, 32);
	retry_supersede(e, k);
	if (workq_submit(e->replq, committed_run, c) < 0)
		free(c);
}

void eng_drain(struct eng *e)
{
	if (e)
		workq_drain(e->replq);
}

void eng_reprotect(struct eng *e, const char *job, uint64_t step, uint32_t nodes, uint32_t dp)
{
	redund_reprotect(e, job, step, nodes, dp);
}
