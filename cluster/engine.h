/* engine: the only code that moves shards between nodes (DESIGN §2, §4-5).
 * It owns this node's peer server (data connections: replicas pushed to
 * us, shards fetched from us; control connections: the coordinator when we
 * are rank 0), the control connection to the coordinator, the replication
 * queue and the restore procedure. Threads: the server's loop and data
 * threads, a reader thread for the control connection, the replication
 * worker, and the caller's (the control thread for restores, the seal
 * worker for commits). Lock order: e->mu before ram/catalog internals. */
#ifndef MTCFS_CLUSTER_ENGINE_H
#define MTCFS_CLUSTER_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "cluster/rcfg.h"
#include "tiers/ramtier.h"
#include "tiers/restore.h"

struct eng;

/* restore_timeout's default, seconds. Orbax waits 300 s for the .restore
 * entries once replicator.yaml is gone (NeMo gives up after 300 s too), and
 * a restore spends up to restore_timeout waiting for catalogs and up to
 * restore_timeout again at the barrier (for the nodes still fetching; those
 * ready are released then): 2 x 120 s leaves a minute for the plan's bucket
 * listing and the fetches. With 300 (the old default) a plan without a
 * missing node came just as Orbax gave up. */
#define ENG_RESTORE_TIMEOUT_S 120

/* stop_timeout's default, seconds: Kubernetes gives a pod 30 s from
 * SIGTERM to SIGKILL (terminationGracePeriodSeconds, and a spot VM's
 * preemption notice), and the daemon still unmounts and reports after the
 * last pushes. */
#define ENG_STOP_BUDGET_S 20

struct eng_opts {
	const char *listen;        /* host:port of this node's peer endpoint */
	const char *peers;         /* "A0,A1,..." static table, or NULL */
	const char *coordinator;   /* rank 0's endpoint for registration, or NULL */
	const char *secret_file;   /* shared secret; NULL = unauthenticated (warned) */
	const char *tls_cert, *tls_key, *tls_ca;   /* mutual TLS (all or none) */
	int rank;                  /* -1: from the peers table (our listen entry) or replicator.yaml */
	int rank_hint;             /* -1, or the rank until a yaml says otherwise (not fixed) */
	int restore_timeout_s;     /* <= 0: ENG_RESTORE_TIMEOUT_S */
	const char *bucket;        /* gs://B[/P] or file:///dir; NULL: no backup tier */
	const char *gcs_endpoint, *gcs_key_file;
	const char *redundancy;    /* "replication" (NULL) or "rs:K+M" (engine_ec.h) */
	/* how long a stop lets the last pushes run before it cuts them, so
	 * the log's stop report is out before a drain's or preemption's
	 * SIGKILL; <= 0: ENG_STOP_BUDGET_S */
	int stop_timeout_s;
	/* the job identity shared with the FUSE front (borrowed: it must
	 * outlive the engine); NULL: the engine makes one of its own */
	struct jobid *jobid;
};

struct eng_cb {
	/* The coordinator says step is complete on every node of job. Called
	 * on the control connection's reader thread: must not block long. */
	void (*on_lkg)(void *arg, const char *job, uint64_t step);
	/* A recoverable problem for replicator.errors (one line). */
	void (*report)(void *arg, const char *line);
	void *arg;
};

int  eng_start(struct ram_tier *ram, const struct eng_opts *o, const struct eng_cb *cb,
	       struct eng **out);
void eng_stop(struct eng *e);        /* accepts NULL */
/* This node's rank as the engine knows it (the mount options, then the
 * yamls it took; the shared record's), or -1. Any thread. */
int  eng_rank(const struct eng *e);
/* Take the job's configuration (placement, node count). -EINVAL with a
 * message in err when it contradicts the mount (e.g. node-rank vs peers= or
 * rank=). A node whose rank only yamls give (coordinator=) takes each new
 * yaml's node-rank, as GKE's replicator does, and reconnects as it. */
int  eng_set_job(struct eng *e, const struct rcfg *c, char *err, size_t errlen);
/* eng_set_job() but for the coordinator: c checked the same way (nothing
 * changes when it is refused) and made the node's job, not registered.
 * For a restart, which takes the last yaml's job again before the control
 * thread can wait for the coordinator; that thread's eng_set_job() with
 * the same c registers it. */
int  eng_take_job(struct eng *e, const struct rcfg *c, char *err, size_t errlen);
/* The restore of DESIGN §5, blocking (control thread): sends the catalog,
 * gets the plan, calls prerestore() with it, fetches what is missing
 * (verifying CRC32C, falling back to other holders), passes the job-wide
 * barrier. On return *plan says what to publish. 0 or -errno (then nothing
 * may be published). */
int  eng_restore(struct eng *e, const struct rcfg *c, restore_report_fn report, void *arg,
		 void (*prerestore)(void *arg, const struct restore_plan *p),
		 struct restore_plan *plan);
/* A new replicator.yaml arrived while eng_restore() runs (any thread; no
 * effect otherwise): the restore's calls to the coordinator end at once and
 * eng_restore() returns -ECANCELED, nothing published; the next
 * eng_restore() starts a new round, which the coordinator begins at once
 * (its timeout starts again) because this rank reports a second time. */
void eng_restore_interrupt(struct eng *e);
/* The daemon is stopping (unmount, signal): a restore in progress ends as
 * eng_restore_interrupt() ends it, and any later eng_restore() returns
 * -ECANCELED at once. Without it the stop waits for the round's
 * coordinator call, up to restore_timeout + 30 s. */
void eng_restore_stop(struct eng *e);
/* A shard of ours was sealed: replicate it to the peers and tell the
 * coordinator (asynchronous; never blocks on the network). */
void eng_committed(struct eng *e, const struct shard_key *k, const uint8_t hash[32]);
/* Newest step complete across the job (from the coordinator), if known. */
bool eng_lkg(struct eng *e, const char *job, uint64_t *step);
/* Newest step every node has committed and replicated to its peers, if
 * known: what garbage collection may keep as the oldest step (older ones
 * are the only complete copy until the newer step's replicas exist). */
bool eng_gc_step(struct eng *e, const char *job, uint64_t *step);
/* For metrics: nodes of the job and whether the coordinator is connected. */
void eng_status(struct eng *e, uint32_t *nodes, bool *coordinator_up);
/* A backup is uploading this step: policy must keep it. */
bool eng_pinned(struct eng *e, const char *job, uint64_t step);
/* A worker shard's content key (framework: pytorch): its one .save file
 * apart from the name, which carries the rank; column mates under D agree
 * on it (lkg_hold.content). 0, or -ENODATA when r is not one worker file. */
int eng_content_key(const struct shard_rec *r, uint8_t out[32]);
/* Waits until the replication queue is empty (tests, shutdown). */
void eng_drain(struct eng *e);

#endif
