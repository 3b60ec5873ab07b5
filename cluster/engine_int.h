/* engine_int.h: what the pieces of the engine share (engine.h is the
 * public side). The engine is one object, struct eng, split by seam:
 *   engine.c          life cycle (eng_start/eng_stop), the job, state queries
 *   engine_data.c     the data server: push/fetch/list on "data" connections
 *                     (the wire of a shard's files is tiers/xfer.h's)
 *   engine_ctl.c      the control connection to the coordinator: calls,
 *                     events, its reader thread, registration, addresses
 *   engine_repl.c     a committed shard: "committed" to the coordinator,
 *                     then the scheme in force protects it (redund.h); the
 *                     replication scheme (the peer tier's put, tiers/tier.h)
 *   redund.c          which redundancy scheme is in force; engine_ec*.c is
 *                     the rs:K+M scheme (engine_ec.h)
 *   engine_backup.c   backup uploads, and the coordinator's bucket callbacks
 *   engine_restore.c  the restore of DESIGN §5 (shards brought in through
 *                     tiers/tier.h's tier_obtain)
 * Only the engine's files include this header. */
#ifndef MTCFS_CLUSTER_ENGINE_INT_H
#define MTCFS_CLUSTER_ENGINE_INT_H

#include "cluster/coord.h"
#include "cluster/engine.h"
#include "net/auth.h"
#include "net/client.h"
#include "net/frame.h"
#include "net/proto.h"
#include "net/server.h"
#include "tiers/bucket.h"
#include "tiers/jobid.h"
#include "tiers/manifest.h"
#include "tiers/xfer.h"
#include "common/workq.h"

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CTL_TIMEOUT_MS   10000
#define DATA_TIMEOUT_MS  XFER_TIMEOUT_MS
#define MAX_PEERS        64
#define MAX_HOLDS        64

struct pending_call {
	uint32_t id;
	bool done;
	int rc;
	json_t *resp;
};

struct eng {
	struct ram_tier *ram;
	struct eng_cb cb;
	struct net_auth auth;
	char listen[256];
	char coord_addr[256];
	char **addrs;                 /* static peers table */
	uint32_t naddrs;
	int restore_timeout_s;
	struct nsrv *srv;
	struct coord *coord;
	struct workq *replq;
	struct workq *bkq;            /* backup uploads, in order */
	struct bkt *bkt;              /* NULL: no bucket */
	struct eng_ec *ec;            /* redundancy (engine_ec.c) */

	/* The job this node serves and its rank (tiers/jobid.h), shared with
	 * the FUSE front; the engine writes it (eng_start's options, then
	 * eng_set_job) under mu, so a yaml's checks and its write are one
	 * step. Its lock is taken after mu, never before. */
	struct jobid *jid;
	bool jid_own;                 /* eng_opts gave none: made here, freed by eng_stop */

	pthread_mutex_t mu;           /* protects the fields below */
	bool rank_fixed;              /* rank= or the peers= table says it: a yaml
				       * with another node-rank is refused */
	int peers[MAX_PEERS];
	int npeers;
	uint32_t bi_min, bi_steps;    /* the job's backup interval */
	char pin_job[RCFG_JOB_MAX + 1];
	uint64_t pin_step;            /* a backup is uploading it */
	int pins;
	bool has_lkg;
	uint64_t lkg;
	bool has_safe;                /* lkg_job's step committed and replicated job-wide */
	uint64_t safe;
	char lkg_job[RCFG_JOB_MAX + 1];
	char **table;                 /* rank -> address from the coordinator */
	uint32_t ntable;
	/* failed pushes waiting to be tried again (engine_repl.c) */
	struct repl_job *retry;
	pthread_cond_t retry_cv;      /* with mu: the list changed, or stop */
	bool retry_stop;
	bool retry_running;           /* retry_thr is running */
	pthread_t retry_thr;
	/* the stop budget (engine_repl.c): pushes still running after
	 * stop_budget_s of a stop are cut (their connections are in cut) */
	struct tier_cut *cut;
	int stop_budget_s;
	pthread_mutex_t watch_mu;
	pthread_cond_t watch_cv;      /* CLOCK_MONOTONIC; with watch_mu: watch_done */
	bool watch_done, watch_running;
	pthread_t watch_thr;
	uint64_t table_gen;           /* its generation (0: an older coordinator's) */
	bool table_stale;             /* fetch it again before the next push: the
				       * coordinator's is newer, this node's rank
				       * changed, or a push was refused */

	/* control connection to the coordinator */
	pthread_mutex_t ctl_mu;       /* protects ctl state; taken before mu */
	pthread_cond_t ctl_cv;
	/* a restore in progress (protected by ctl_mu): its thread's calls to
	 * the coordinator end with -ECANCELED once a new replicator.yaml
	 * interrupts it */
	bool restoring, restore_cancel;
	bool no_restores;             /* the daemon is stopping: none runs on */
	pthread_t restore_thr;
	struct nconn *ctl;
	bool ctl_renaming;            /* ctl closed on purpose: a new node-rank */
	bool ctl_reader_running;
	pthread_t ctl_reader;
	uint32_t next_id;
	struct pending_call *calls[16];
	bool stopping;
	/* The daemon's stop has begun (eng_restore_stop or eng_stop; protected
	 * by ctl_mu): retry waits (eng_retry_wait) end at once on quit_cv
	 * (CLOCK_MONOTONIC), so a queue drained at the stop runs each queued
	 * job's current attempt only. */
	bool quit;
	pthread_cond_t quit_cv;
};

struct bk_upload {
	struct eng *e;
	char job[RCFG_JOB_MAX + 1];
	char name[64];
	uint64_t step;
	bool data;
};

/* engine.c: a recoverable problem, logged and passed to cb.report. */
void eng_report(struct eng *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* engine.c: the wait before retry `attempt` (0, 1, ...: 1 s, 2 s, 4 s,
 * then 8 s each) of work begun at t0_ns (util_now_ns). false, at once,
 * when the daemon is stopping, or when the retry would start later than
 * t0_ns + budget_ms: the caller gives up. Any thread but a FUSE one. */
bool eng_retry_wait(struct eng *e, int attempt, uint64_t t0_ns, unsigned budget_ms);
/* engine.c: the daemon's stop has begun (no new retries). */
bool eng_quitting(struct eng *e);

/* engine_data.c */
extern const struct nsrv_ops eng_srv_ops;
/* req's "to" against this node's rank: 0, or the request is answered
 * (ESTALE: another rank's; EINVAL: malformed) and -errno returned. what
 * names the request in the log ("a push"). */
int eng_check_target(struct eng *e, struct nconn *c, uint32_t id, json_t *req, int peer,
		     const char *what);

/* engine_ctl.c */
int eng_ctl_call(struct eng *e, json_t *req, json_t **resp, int timeout_ms);
int eng_ctl_event(struct eng *e, json_t *ev);
int eng_register(struct eng *e, bool want_table);
int eng_addr_of(struct eng *e, uint32_t rank, char *out, size_t len);
/* The address to push to rank at: eng_addr_of(), fetching the table again
 * when it names this node's own address (a table older than a rank
 * change); -ESTALE when it still does. */
int eng_peer_addr(struct eng *e, uint32_t rank, char *out, size_t len);
/* The table is to be fetched again before the next lookup. */
void eng_table_stale(struct eng *e);
void eng_ctl_new_identity(struct eng *e, int old_rank, int new_rank);

/* engine_repl.c: the job restored `step` from the cluster (DESIGN §5):
 * this node's shards of it are protected again to the configured level on
 * the nodes there are now — replicas pushed again to the peers, or under
 * rs the parity rebuilt (eng_ec_restored) — and each node then says
 * "replicated". Until every node has, the coordinator has no safe step for
 * the job, so no node drops a step older than the restored one: a node lost
 * right after the restart still leaves the older protected step. */
void eng_reprotect(struct eng *e, const char *job, uint64_t step, uint32_t nodes, uint32_t dp);

/* engine_repl.c: the thread that retries failed pushes; stop drops what
 * is waiting (logged) before the replication queue stops. */
int eng_repl_start(struct eng *e);
void eng_repl_stop(struct eng *e);
/* After the replication queue is drained at a stop: the stop budget's
 * watch ends (it cut what ran past the budget). */
void eng_repl_stopped(struct eng *e);

/* engine_backup.c */
int64_t eng_save_worker(const char *path, const char *job, uint32_t rank, uint64_t step);
void eng_backup_run(void *arg);       /* a struct bk_upload, freed */
int eng_bk_decide(void *arg, const char *job, uint32_t nodes, uint32_t dp, const char (*ex)[64], size_t nex,
		  bool need_newest, struct coord_bk_decision *d);
int eng_bk_name(void *arg, const char *job, char *out, size_t outlen, unsigned *retry_s);
int eng_bk_discard(void *arg, const char *job, const char *name, char *out, size_t outlen);
void eng_bk_clear_rv(void *arg, const char *job);

#endif
