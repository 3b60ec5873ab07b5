/* engine_repl.c — replication of committed shards (see engine_int.h). */
#include "cluster/engine_int.h"
#include "cluster/engine_ec.h"
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
};

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
	pthread_mutex_lock(&e->mu);
	rank = e->rank;
	pthread_mutex_unlock(&e->mu);
	rc = tier_peer_open(addr, peer, rank, &e->auth, &t);
	if (rc < 0)
		return rc;
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

static void repl_run(void *arg)
{
	struct repl_job *j = arg;
	struct eng *e = j->e;
	struct shard_rec rec = { 0 };
	struct manifest *mf = NULL;
	int peers[MAX_PEERS], npeers, failed = 0;
	uint32_t nodes, dp, workers;
	struct proto_step_ev se;
	json_t *ev;

	pthread_mutex_lock(&e->mu);
	npeers = e->npeers;
	memcpy(peers, e->peers, sizeof(peers));
	nodes = e->nodes;
	dp = e->dp;
	workers = e->workers ? e->workers : 1;
	pthread_mutex_unlock(&e->mu);

	/* tell the coordinator first: it decides the job-wide LKG. With one
	 * shard per worker the step is the job's once every (node, worker)
	 * committed it (worker, workers are sent when workers > 1). */
	se = (struct proto_step_ev){ .job = { j->key.job, nodes, dp }, .step = j->key.step,
				     .worker = j->key.worker, .workers = workers };
	memcpy(se.hash, j->hash, 32);
	if (j->attempt == 0) {
		pthread_mutex_lock(&e->mu);
		se.bi_min = e->bi_min;
		se.bi_steps = e->bi_steps;
		pthread_mutex_unlock(&e->mu);
		ev = proto_committed_encode(&se);
		if (eng_ctl_event(e, ev) < 0)
			log_warn("engine", "cannot report step %llu to the coordinator at %s",
				 (unsigned long long)j->key.step, e->coord_addr);
		json_decref(ev);
	}
	if (workers == 1 && eng_ec_get(e, NULL)) {
		/* rs:K+M: the code protects the step instead of replicas (one
		 * shard per step: per-worker shards are still replicated) */
		eng_ec_committed(e, &j->key, nodes, dp);
		goto out;
	}
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
		ev = proto_replicated_encode(&se);
		if (eng_ctl_event(e, ev) < 0)
			log_warn("engine", "cannot report step %llu as replicated to the coordinator at %s",
				 (unsigned long long)j->key.step, e->coord_addr);
		json_decref(ev);
	} else if (failed && j->attempt < 3) {
		struct repl_job *again = malloc(sizeof(*again));
		if (again) {
			*again = *j;
			again->attempt++;
			struct timespec ts = { .tv_sec = 1 << j->attempt, .tv_nsec = 0 };
			nanosleep(&ts, NULL);
			if (workq_submit(e->replq, repl_run, again) < 0)
				free(again);
		}
	} else if (failed) {
		eng_report(e, "job %s step %llu: could not be replicated to %d of %d peers; it has fewer copies than configured",
		       j->key.job, (unsigned long long)j->key.step, failed, npeers);
	}
out:
	mf_free(mf);
	idx_rec_clear(&rec);
	free(j);
}

void eng_committed(struct eng *e, const struct shard_key *k, const uint8_t hash[32])
{
	struct repl_job *j;
	if (!e)
		return;
	j = calloc(1, sizeof(*j));
	if (!j)
		return;
	j->e = e;
	j->key = *k;
	memcpy(j->hash, hash, 32);
	if (workq_submit(e->replq, repl_run, j) < 0)
		free(j);
}

void eng_drain(struct eng *e)
{
	if (e)
		workq_drain(e->replq);
}
