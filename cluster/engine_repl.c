/* engine_repl.c — replication of committed shards (see engine_int.h). */
#include "cluster/engine_int.h"
#include "cluster/engine_ec.h"
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

static int push_to(struct eng *e, uint32_t peer, const struct shard_key *k,
		   const struct shard_rec *rec, const struct manifest *mf)
{
	char addr[256];
	struct nconn *c = NULL;
	json_t *req, *resp = NULL;
	char *b64;
	int rank, dfd = -1, rc;

	rc = eng_addr_of(e, peer, addr, sizeof(addr));
	if (rc < 0)
		return rc;
	pthread_mutex_lock(&e->mu);
	rank = e->rank;
	pthread_mutex_unlock(&e->mu);
	rc = nconn_connect(addr, rank, "data", &e->auth, 5000, &c, NULL);
	if (rc < 0)
		return rc;
	b64 = xfer_b64_encode(rec->mf, rec->mflen);
	req = json_object();
	json_object_set_new(req, "op", json_string("push"));
	json_object_set_new(req, "key", xfer_key_json(k));
	json_object_set_new(req, "manifest", json_string(b64 ? b64 : ""));
	free(b64);
	rc = nconn_call(c, req, &resp, DATA_TIMEOUT_MS);
	json_decref(req);
	if (rc < 0)
		goto out;
	if (json_is_true(json_object_get(resp, "have"))) {
		rc = 1;   /* the peer had the content: nothing sent */
		goto out;
	}
	if (!json_is_true(json_object_get(resp, "send"))) {
		rc = -EPROTO;
		goto out;
	}
	json_decref(resp);
	resp = NULL;
	dfd = ram_shard_open(e->ram, k);
	if (dfd < 0) {
		rc = dfd;
		goto out;
	}
	rc = xfer_send_files(c, dfd, mf);
	if (rc == 0) {
		struct net_hdr h;
		rc = nconn_recv(c, DATA_TIMEOUT_MS, &h, &resp);
		if (rc == 0 && h.type == NT_ERROR)
			rc = net_error_errno(resp);
		else if (rc == 0 && !json_is_true(json_object_get(resp, "ok")))
			rc = -EPROTO;
	}
out:
	if (dfd >= 0)
		close(dfd);
	json_decref(resp);
	nconn_close(c);
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
	char hex[65];
	json_t *ev;

	pthread_mutex_lock(&e->mu);
	npeers = e->npeers;
	memcpy(peers, e->peers, sizeof(peers));
	nodes = e->nodes;
	dp = e->dp;
	workers = e->workers ? e->workers : 1;
	pthread_mutex_unlock(&e->mu);

	/* tell the coordinator first: it decides the job-wide LKG */
	net_hex_encode(j->hash, 32, hex);
	if (j->attempt == 0) {
		ev = json_object();
		json_object_set_new(ev, "op", json_string("committed"));
		json_object_set_new(ev, "job", json_string(j->key.job));
		json_object_set_new(ev, "nodes", json_integer(nodes));
		json_object_set_new(ev, "dp", json_integer(dp));
		json_object_set_new(ev, "step", json_integer((json_int_t)j->key.step));
		json_object_set_new(ev, "hash", json_string(hex));
		if (workers > 1) {
			/* one shard per worker: the step is the job's once
			 * every (node, worker) committed it */
			json_object_set_new(ev, "worker", json_integer(j->key.worker));
			json_object_set_new(ev, "workers", json_integer(workers));
		}
		pthread_mutex_lock(&e->mu);
		json_object_set_new(ev, "bi_min", json_integer(e->bi_min));
		json_object_set_new(ev, "bi_steps", json_integer(e->bi_steps));
		pthread_mutex_unlock(&e->mu);
		if (eng_ctl_event(e, ev) < 0)
			log_warn("engine", "cannot report step %llu to the coordinator at %s",
				 (unsigned long long)j->key.step, e->coord_addr);
		json_decref(ev);
	}
	if (eng_ec_get(e, NULL)) {
		/* rs:K+M: the code protects the step instead of replicas */
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
			idx_set_state(ram_idx(e->ram), &j->key, SH_REPLICATED, 0, 0);
		ev = json_object();
		json_object_set_new(ev, "op", json_string("replicated"));
		json_object_set_new(ev, "job", json_string(j->key.job));
		json_object_set_new(ev, "nodes", json_integer(nodes));
		json_object_set_new(ev, "dp", json_integer(dp));
		json_object_set_new(ev, "step", json_integer((json_int_t)j->key.step));
		if (workers > 1) {
			json_object_set_new(ev, "worker", json_integer(j->key.worker));
			json_object_set_new(ev, "workers", json_integer(workers));
		}
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
