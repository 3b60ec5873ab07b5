/* engine.c — see engine.h; its pieces are listed in engine_int.h. */
#include "cluster/engine_int.h"
#include "cluster/engine_ec.h"
#include "cluster/placement.h"
#include "cluster/redund.h"
#include "net/tls.h"
#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void eng_report(struct eng *e, const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	log_err("engine", "%s", line);
	if (e->cb.report)
		e->cb.report(e->cb.arg, line);
}

bool eng_quitting(struct eng *e)
{
	bool q;
	pthread_mutex_lock(&e->ctl_mu);
	q = e->quit;
	pthread_mutex_unlock(&e->ctl_mu);
	return q;
}

bool eng_retry_wait(struct eng *e, int attempt, uint64_t t0_ns, unsigned budget_ms)
{
	uint64_t wait_ns = (uint64_t)1000000000 << (attempt < 3 ? attempt : 3);
	uint64_t now = util_now_ns(), end = now + wait_ns;
	struct timespec ts;
	bool q;

	if (end > t0_ns + (uint64_t)budget_ms * 1000000)
		return false;
	ts.tv_sec = (time_t)(end / 1000000000);
	ts.tv_nsec = (long)(end % 1000000000);
	pthread_mutex_lock(&e->ctl_mu);
	while (!e->quit && pthread_cond_timedwait(&e->quit_cv, &e->ctl_mu, &ts) == 0)
		;
	q = e->quit;
	pthread_mutex_unlock(&e->ctl_mu);
	return !q;
}

bool eng_gc_step(struct eng *e, const char *job, uint64_t *step)
{
	bool r;
	pthread_mutex_lock(&e->mu);
	r = e->has_lkg && e->has_safe && !strcmp(e->lkg_job, job);
	if (r)
		*step = e->safe < e->lkg ? e->safe : e->lkg;
	pthread_mutex_unlock(&e->mu);
	return r;
}

bool eng_lkg(struct eng *e, const char *job, uint64_t *step)
{
	bool r;
	pthread_mutex_lock(&e->mu);
	r = e->has_lkg && !strcmp(e->lkg_job, job);
	if (r)
		*step = e->lkg;
	pthread_mutex_unlock(&e->mu);
	return r;
}

void eng_status(struct eng *e, uint32_t *nodes, bool *coordinator_up)
{
	struct job_now now;

	pthread_mutex_lock(&e->ctl_mu);
	*coordinator_up = e->ctl != NULL;
	pthread_mutex_unlock(&e->ctl_mu);
	jobid_get(e->jid, &now);
	*nodes = now.set ? now.nodes : e->naddrs;   /* naddrs: set at start only */
}

int eng_rank(const struct eng *e)
{
	return jobid_rank(e->jid);
}

/* c checked against the mount and made this node's job: the shared
 * record, placement, backup interval, redundancy; a rank that changed
 * reconnects as the new one. Refused (-EINVAL, why in err), nothing
 * changes. *renamed: the rank changed. */
static int take_job(struct eng *e, const struct rcfg *c, char *err, size_t errlen, bool *renamed)
{
	int peers[MAX_PEERS], n, old_rank;
	struct job_now now;

	rcfg_job_now(c, &now);
	*renamed = false;
	pthread_mutex_lock(&e->mu);
	/* under mu: the check and the write are one step (the record's
	 * other writer, eng_start, is done before any yaml) */
	old_rank = jobid_rank(e->jid);
	if (old_rank >= 0 && c->node_rank != old_rank && e->rank_fixed) {
		snprintf(err, errlen, "node-rank: %d, but this node is rank %d (mount options rank=/peers=/listen=)",
			 c->node_rank, old_rank);
		pthread_mutex_unlock(&e->mu);
		return -EINVAL;
	}
	if (e->naddrs && (uint32_t)c->nodes != e->naddrs) {
		snprintf(err, errlen, "nodes: %d, but the mount's peers= table has %u entries",
			 c->nodes, e->naddrs);
		pthread_mutex_unlock(&e->mu);
		return -EINVAL;
	}
	if (c->peer_ranks) {
		n = c->n_peer_ranks > MAX_PEERS ? MAX_PEERS : c->n_peer_ranks;
		memcpy(peers, c->peer_ranks, (size_t)n * sizeof(int));
	} else {
		n = place_peers(c->node_rank, c->nodes, c->peers_per_node, c->assume_dp, peers, MAX_PEERS);
		if (n < 0)
			n = 0;
	}
	jobid_set(e->jid, &now);
	memcpy(e->peers, peers, (size_t)n * sizeof(int));
	e->npeers = n;
	e->bi_min = (uint32_t)c->backup_interval_minutes;
	e->bi_steps = (uint32_t)c->backup_interval_steps;
	if (strcmp(e->lkg_job, c->job))
		e->has_lkg = e->has_safe = false;
	pthread_mutex_unlock(&e->mu);
	/* not under mu: ec->mu is taken before ram_reserve(), whose reclaim
	 * takes mu */
	eng_ec_set_job(e, c->has_redundancy, &c->redundancy);
	log_info("engine", "job=%s rank=%d nodes=%d peers=%d", c->job, c->node_rank, c->nodes, n);
	*renamed = old_rank >= 0 && old_rank != c->node_rank;
	if (*renamed) {
		/* the other nodes' ranks are likely to move too (a job's
		 * restart): replication looks them up again */
		eng_table_stale(e);
		eng_ctl_new_identity(e, old_rank, c->node_rank);
	}
	return 0;
}

int eng_take_job(struct eng *e, const struct rcfg *c, char *err, size_t errlen)
{
	bool renamed;

	return take_job(e, c, err, errlen, &renamed);
}

int eng_set_job(struct eng *e, const struct rcfg *c, char *err, size_t errlen)
{
	bool renamed, want_table;
	int rc;

	rc = take_job(e, c, err, errlen, &renamed);
	if (rc < 0)
		return rc;
	/* the rank changed here, or in an eng_take_job before (which made
	 * the table stale): the table comes with the registration */
	pthread_mutex_lock(&e->mu);
	want_table = renamed || e->table_stale;
	pthread_mutex_unlock(&e->mu);
	if (eng_register(e, want_table) < 0)
		log_warn("engine", "cannot register with the coordinator at %s yet", e->coord_addr);
	return 0;
}

/* ---------- life cycle ---------- */

static int split_peers(struct eng *e, const char *peers)
{
	char *dup = strdup(peers), *p = dup, *comma;
	if (!dup)
		return -ENOMEM;
	while (p && *p) {
		char **na;
		comma = strchr(p, ',');
		if (comma)
			*comma = '\0';
		na = realloc(e->addrs, (e->naddrs + 1) * sizeof(*na));
		if (!na) {
			free(dup);
			return -ENOMEM;
		}
		e->addrs = na;
		e->addrs[e->naddrs++] = strdup(p);
		p = comma ? comma + 1 : NULL;
	}
	free(dup);
	return e->naddrs ? 0 : -EINVAL;
}

#define SELF_SECRET "peer.secret"

/* A node without listen= (a bucket and no peers) is a job of its own and
 * its own coordinator, on an ephemeral loopback port that any local user
 * could reach: without secret_file= it gets a secret of its own, 32 random
 * bytes (hex, one line) in RAMDIR/peer.secret, mode 0600, new at every
 * start: only this process, and root's mtcfs-admin through the "peer"
 * record, can talk to it. Its path into path (PATH_MAX). 0 or -errno. */
static int self_secret(struct eng *e, struct ram_tier *ram, char *path)
{
	static const char hexd[] = "0123456789abcdef";
	uint8_t raw[32];
	char line[2 * sizeof(raw) + 1], tmp[] = SELF_SECRET ".tmp";
	int fd, rc = 0;

	if (getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw))
		return -EIO;
	for (size_t i = 0; i < sizeof(raw); i++) {
		line[2 * i] = hexd[raw[i] >> 4];
		line[2 * i + 1] = hexd[raw[i] & 15];
	}
	line[sizeof(line) - 1] = '\n';
	unlinkat(ram_root_fd(ram), tmp, 0);
	fd = openat(ram_root_fd(ram), tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
		    0600);
	if (fd < 0)
		return -errno;
	if (write(fd, line, sizeof(line)) != (ssize_t)sizeof(line) || fsync(fd) < 0)
		rc = errno ? -errno : -EIO;
	close(fd);
	if (rc == 0 && renameat(ram_root_fd(ram), tmp, ram_root_fd(ram), SELF_SECRET) < 0)
		rc = -errno;
	if (rc == 0)
		rc = auth_set_secret(&e->auth, line, sizeof(line) - 1);
	if (rc < 0) {
		unlinkat(ram_root_fd(ram), tmp, 0);
		return rc;
	}
	snprintf(path, PATH_MAX, "%s/%s", ram_path(ram), SELF_SECRET);
	return 0;
}

/* The secret (secret_file=, or this node's own: self_secret into
 * self_path) and the TLS context of e->auth. 0 or -errno (logged). */
static int credentials(struct eng *e, struct ram_tier *ram, const struct eng_opts *o,
		       char *self_path)
{
	char err[512];
	int rc = 0;

	if (o->secret_file) {
		rc = auth_load_secret(o->secret_file, &e->auth);
		if (rc < 0)
			return rc;
	} else if (!o->listen) {
		rc = self_secret(e, ram, self_path);
		if (rc < 0) {
			log_err("engine", "cannot write %s/%s: %s", ram_path(ram), SELF_SECRET,
				strerror(-rc));
			return rc;
		}
	}
	if (o->tls_cert || o->tls_key || o->tls_ca) {
		rc = net_tls_load(o->tls_cert, o->tls_key, o->tls_ca, &e->auth.tls, err, sizeof(err));
		if (rc < 0)
			log_err("engine", "%s", err);
	}
	return rc;
}

int eng_start(struct ram_tier *ram, const struct eng_opts *o, const struct eng_cb *cb,
	      struct eng **out)
{
	struct eng *e = calloc(1, sizeof(*e));
	char self_secret_path[PATH_MAX];
	const char *secret_file = o->secret_file;
	int rank, rc;

	if (!e)
		return -ENOMEM;
	e->ram = ram;
	if (cb)
		e->cb = *cb;
	e->jid = o->jobid;
	if (!e->jid) {
		rc = jobid_new(&e->jid);
		if (rc < 0) {
			free(e);
			return rc;
		}
		e->jid_own = true;
	}
	e->restore_timeout_s = o->restore_timeout_s > 0 ? o->restore_timeout_s
							    : ENG_RESTORE_TIMEOUT_S;
	e->stop_budget_s = o->stop_timeout_s > 0 ? o->stop_timeout_s : ENG_STOP_BUDGET_S;
	pthread_mutex_init(&e->mu, NULL);
	pthread_mutex_init(&e->ctl_mu, NULL);
	pthread_cond_init(&e->ctl_cv, NULL);
	util_cond_init_monotonic(&e->quit_cv);
	if (!o->listen && (o->peers || o->coordinator)) {
		log_err("engine", "the peer tier needs listen=HOST:PORT");
		rc = -EINVAL;
		goto fail;
	}
	/* a bucket without peers: this node is a job of its own, its
	 * coordinator on an ephemeral loopback port */
	snprintf(e->listen, sizeof(e->listen), "%s", o->listen ? o->listen : "127.0.0.1:0");
	if (o->peers && (rc = split_peers(e, o->peers)) < 0) {
		log_err("engine", "peers=%s is not a list of HOST:PORT", o->peers);
		goto fail;
	}
	rank = o->rank;
	e->rank_fixed = rank >= 0 || e->naddrs > 0;
	/* a hint (mtcfs-csi: the pod's index) names the node until its first
	 * yaml and for jax-init-info.txt; the yaml's node-rank wins, as GKE's */
	if (rank < 0 && !e->naddrs && o->rank_hint >= 0)
		rank = o->rank_hint;
	if (rank < 0 && e->naddrs) {
		for (uint32_t i = 0; i < e->naddrs; i++)
			if (!strcmp(e->addrs[i], e->listen))
				rank = (int)i;
		if (rank < 0) {
			log_err("engine", "listen=%s is not in peers=%s and no rank= is given", e->listen, o->peers);
			rc = -EINVAL;
			goto fail;
		}
	}
	/* the record's first writer, before any yaml (eng_set_job's checks
	 * compare a yaml's node-rank with this one) */
	jobid_set_rank(e->jid, rank);
	if (o->coordinator)
		snprintf(e->coord_addr, sizeof(e->coord_addr), "%s", o->coordinator);
	else if (e->naddrs)
		snprintf(e->coord_addr, sizeof(e->coord_addr), "%s", e->addrs[0]);
	rc = credentials(e, ram, o, self_secret_path);
	if (rc < 0)
		goto fail;
	if (!o->secret_file && !o->listen)
		secret_file = self_secret_path;
	{
		char err[200];
		rc = eng_ec_start(e, o->redundancy, err, sizeof(err));
		if (rc < 0) {
			log_err("engine", "%s", err);
			goto fail;
		}
	}
	/* what the schemes store here was scanned by ram_open (parity
	 * holdings are RAM-tier records), before the data server starts */
	rc = tier_cut_new(&e->cut);
	if (rc == 0)
		rc = workq_start("mtcfs-repl", &e->replq);
	if (rc == 0)
		rc = workq_start("mtcfs-backup", &e->bkq);
	if (rc == 0)
		rc = eng_repl_start(e);
	if (rc < 0)
		goto fail;
	if (o->bucket) {
		struct bkt_opts bo = { .gcs_endpoint = o->gcs_endpoint, .gcs_key_file = o->gcs_key_file };
		rc = bkt_open(o->bucket, &bo, &e->bkt);
		if (rc < 0) {
			log_err("engine", "bucket=%s: %s", o->bucket, bkt_last_error());
			goto fail;
		}
	} else {
		log_info("engine", "no bucket configured: there is no backup tier");
	}
	rc = nsrv_start(e->listen, rank, &e->auth, &eng_srv_ops, e, &e->srv);
	if (rc < 0) {
		log_err("engine", "cannot listen on %s: %s", e->listen, strerror(-rc));
		goto fail;
	}
	if (strstr(e->listen, ":0") && e->listen[strlen(e->listen) - 1] == '0' &&
	    e->listen[strlen(e->listen) - 2] == ':') {
		char *colon = strrchr(e->listen, ':');
		snprintf(colon + 1, sizeof(e->listen) - (size_t)(colon + 1 - e->listen), "%d",
			 nsrv_port(e->srv));
	}
	if (!e->coord_addr[0])
		snprintf(e->coord_addr, sizeof(e->coord_addr), "%s", e->listen);
	{
		struct coord *c = NULL;
		rc = coord_start(e->srv, e->restore_timeout_s, &c);
		if (rc < 0)
			goto fail;
		__atomic_store_n(&e->coord, c, __ATOMIC_RELEASE);
	}
	if (e->bkt) {
		struct coord_bucket bcb = { .decide = eng_bk_decide, .new_name = eng_bk_name, .discard = eng_bk_discard,
					   .clear_restore_version = eng_bk_clear_rv, .arg = e };
		coord_set_bucket(e->coord, &bcb);
	}
	{
		/* how mtcfs-admin reaches the cluster from this RAMDIR */
		json_t *pm = json_pack("{s:s,s:s,s:s?,s:i,s:s?,s:s?,s:s?}", "listen", e->listen,
				       "coordinator", e->coord_addr, "secret_file", secret_file,
				       "rank", rank, "tls_cert", o->tls_cert, "tls_key", o->tls_key,
				       "tls_ca", o->tls_ca);
		char *txt = json_dumps(pm, JSON_COMPACT);
		if (txt)
			idx_put_meta(ram_idx(ram), "peer", txt, strlen(txt));
		free(txt);
		json_decref(pm);
	}
	log_info("engine", "peer tier up listen=%s rank=%d coordinator=%s peers=%u", e->listen,
		 rank, e->coord_addr, e->naddrs);
	*out = e;
	return 0;
fail:
	eng_stop(e);
	return rc;
}

/* How this node's newest step of a job is protected, for the stop report:
 * its own shards' catalog states (replication marks them replicated, a
 * backup backed up) and the coordinator's last word on the job (the safe
 * step: committed and protected job-wide, which is all rs:K+M says). */
static const char *protection(struct eng *e, const char *job, uint64_t step, uint32_t worst,
			      bool *ok)
{
	bool safe;

	pthread_mutex_lock(&e->mu);
	safe = e->has_safe && !strcmp(e->lkg_job, job) && e->safe >= step;
	pthread_mutex_unlock(&e->mu);
	*ok = true;
	if (worst >= SH_BACKED_UP)
		return "backed up to the bucket";
	if (worst >= SH_REPLICATED)
		return "replicated to its peers";
	if (safe)
		return "protected job-wide";
	*ok = false;
	return "NOT protected: this node holds its only copy";
}

/* The stop (a node drain, a preemption): after the last pushes, one line
 * per job this node wrote for: its newest step and what protects it. */
static void stop_report(struct eng *e)
{
	struct shard_rec *recs = NULL;
	size_t n = 0;

	if (!e->ram || idx_list_shards(ram_idx(e->ram), NULL, &recs, &n) < 0)
		return;
	/* ascending by (job, step, rank, worker): the last own step of a job
	 * is at the end of its run */
	for (size_t i = 0; i < n;) {
		const char *job = recs[i].key.job, *by;
		uint64_t newest = 0;
		uint32_t worst = SH_BACKED_UP;
		bool any = false, ok;
		size_t j;

		for (j = i; j < n && !strcmp(recs[j].key.job, job); j++) {
			const struct shard_rec *r = &recs[j];
			if (!(r->flags & SHF_OWN) || r->state < SH_COMMITTED || r->state == SH_BAD)
				continue;
			if (!any || r->key.step > newest) {
				newest = r->key.step;
				worst = r->state;
				any = true;
			} else if (r->key.step == newest && r->state < worst) {
				worst = r->state;
			}
		}
		if (any) {
			by = protection(e, job, newest, worst, &ok);
			if (ok)
				log_info("engine", "stopping: job=%s step=%llu (this node's newest) is %s",
					 job, (unsigned long long)newest, by);
			else
				log_warn("engine", "stopping: job=%s step=%llu (this node's newest) is %s",
					 job, (unsigned long long)newest, by);
		}
		i = j;
	}
	idx_recs_free(recs, n);
}

void eng_stop(struct eng *e)
{
	if (!e)
		return;
	pthread_mutex_lock(&e->ctl_mu);
	e->stopping = true;
	e->quit = true;
	pthread_cond_broadcast(&e->quit_cv);
	if (e->ctl)
		nconn_shutdown(e->ctl);
	pthread_mutex_unlock(&e->ctl_mu);
	if (e->ctl_reader_running)
		pthread_join(e->ctl_reader, NULL);
	e->ctl_reader_running = false;
	eng_repl_stop(e);
	workq_stop(e->replq);
	eng_repl_stopped(e);
	if (e->replq)
		stop_report(e);   /* after the last pushes: what they protected */
	workq_stop(e->bkq);
	coord_quiesce(e->coord);
	nsrv_stop(e->srv);
	coord_stop(e->coord);
	for (uint32_t i = 0; i < e->naddrs; i++)
		free(e->addrs[i]);
	free(e->addrs);
	for (uint32_t i = 0; i < e->ntable; i++)
		free(e->table[i]);
	free(e->table);
	net_tls_free(e->auth.tls);   /* every connection using it is closed */
	e->auth.tls = NULL;
	auth_clear(&e->auth);
	bkt_close(e->bkt);
	tier_cut_free(e->cut);
	eng_ec_stop(e);
	pthread_mutex_destroy(&e->mu);
	pthread_mutex_destroy(&e->ctl_mu);
	pthread_cond_destroy(&e->ctl_cv);
	pthread_cond_destroy(&e->quit_cv);
	if (e->jid_own)
		jobid_free(e->jid);
	free(e);
}
