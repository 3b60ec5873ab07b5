/* coord_i: the coordinator's state, shared by its two halves inside
 * cluster/: coord.c (jobs, node table, the steady-state LKG, backups, the
 * message table, lifecycle) and coord_restore.c (restore rounds: catalogs,
 * plans, fetch failures, the barrier). Everything here runs with c->mu
 * held unless it says otherwise; messages are borrowed. */
#ifndef MTCFS_CLUSTER_COORD_I_H
#define MTCFS_CLUSTER_COORD_I_H

#include "cluster/coord.h"
#include "cluster/lkg.h"
#include "net/proto.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#define COORD_MAX_NODES PROTO_MAX_NODES
#define COMMITS_KEPT    4         /* newest steps remembered per owner */
#define COORD_MAX_WORKERS PROTO_MAX_WORKERS

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
	uint32_t nheld;           /* of the job's holds, this node's (a catalog
				   * replaces them: skip the scan when none) */
	struct pending cat, rdy;
	struct wlog lg;           /* worker 0 */
	struct wlog *lgx;         /* workers 1..nlgx, grown as they report */
	uint32_t nlgx;
};

struct cjob {
	struct cjob *next;
	char name[JOB_NAME_MAX + 1];
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
	/* the barrier without a scan of every node per message: nready counts
	 * n[].ready; a release needs every reported, connected node ready, of
	 * which the last scan found exp_scan, since when closes_since closed */
	uint32_t nready, exp_scan, closes_since;
	uint32_t nreported;           /* n[].reported (a round plans when all have) */
	struct lkg_hold *bad;
	size_t nbad, capbad;
	struct lkg_plan plan;
	uint32_t plan_id;
	uint64_t round;               /* bumped by every new restore round */
	uint64_t plan_round;          /* the round the current plan belongs to */
	/* the bucket's part of the plan */
	bool bucket_plan;             /* plan.found/step come from a backup */
	char bucket_name[64];
	uint32_t *bucket_owners;      /* [nodes * bucket_owners_w]: the backup's
				       * node each (rank, worker) fetches; NULL:
				       * its own */
	uint32_t bucket_owners_w;
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
	struct coord_ec *ec;          /* redundancy rs:K+M reports (coord_ec.c) */
};

struct coord {
	struct nsrv *srv;
	pthread_mutex_t mu;       /* protects everything below */
	struct cjob *jobs;
	char **addrs;             /* rank -> address, from register; one address
				   * is one rank's (a rank that registers an
				   * address clears it from any other) */
	uint64_t *ctl;            /* rank -> its registered control connection, 0 none */
	uint32_t naddrs;          /* of addrs and ctl */
	uint64_t gen;             /* the table's generation: bumps on every change */
	uint64_t gen_sent;        /* the last one the nodes were told of (peers) */
	uint64_t timeout_ns;
	pthread_t tick;
	bool stop;
	pthread_cond_t cv;
	struct coord_bucket bk;       /* .decide NULL: no bucket */
	struct workq *worker;         /* bucket calls, off the loop thread */
};

/* coord.c */
/* Node n of j said "replicated" of its worker's shard of step (its
 * replicas pushed, or under rs all its parity stored): the job's safe step
 * (older steps may go, DESIGN §5) is the newest step every node has
 * committed and said so of. true when that moved it; a step that is not
 * one of n's known commits changes nothing. */
bool coord_replicated(struct cjob *j, struct cnode *n, uint32_t worker, uint64_t step);
/* Send m (taken) on conn; errors are the server's to log. */
void coord_send(struct coord *c, uint64_t conn, uint8_t type, uint32_t req_id, json_t *m);
void coord_reply_err(struct coord *c, uint64_t conn, uint32_t req_id, int err, const char *what);
/* EINVAL "bad <op>: why" to in's request. */
void coord_reply_bad(struct coord *c, const struct proto_in *in, const char *why);
/* rank's registered address, "" when unknown; valid until the next register. */
const char *coord_addr_of(struct coord *c, uint32_t rank);
/* Worker w's log of node n; NULL when it has none and create is false
 * (or memory ran out). */
struct wlog *coord_wlog_of(struct cnode *n, uint32_t w, bool create);
/* The job named name, made (or remade, when its node count changed) with
 * nodes and dp; NULL when out of memory. */
struct cjob *coord_job_get(struct coord *c, const char *name, uint32_t nodes, uint32_t dp);
/* The known job named name when rank is one of its nodes, else NULL. */
struct cjob *coord_job_of(struct coord *c, const char *name, int rank);

/* coord_restore.c */
/* At the barrier of j's plan: every node's history starts again at the
 * restored step, committed everywhere (the LKG). It is the safe step at
 * once only when it came from the bucket; restored from the cluster it
 * is safe once every node has said "replicated" of it again
 * (coord_replicated), as it was read from one copy whose replicas or
 * parity may not exist on the nodes there are now. */
void coord_restart_history(struct cjob *j);
/* All catalogs are in (or the wait timed out): plan, asking the bucket
 * first when there is one. */
void coord_start_plan(struct coord *c, struct cjob *j);
/* Release the barrier when every live node is ready (timed_out: when any is). */
void coord_maybe_release(struct coord *c, struct cjob *j, bool timed_out);
/* Handlers of catalog, fetch_failed and ready (ctx: the coordinator). */
void coord_on_catalog(void *ctx, const struct proto_in *in);
void coord_on_fetch_failed(void *ctx, const struct proto_in *in);
void coord_on_ready(void *ctx, const struct proto_in *in);

#endif
