/* restore: what a node restores and how it gets it. A restore plan names one
 * step and where this node's shards of it come from; restore_run() is the
 * one round every restore goes through, whoever plans it. Runs on the
 * control thread; the plan is a value owned by the caller. */
#ifndef MTCFS_TIERS_RESTORE_H
#define MTCFS_TIERS_RESTORE_H

#include <stdbool.h>
#include <stdint.h>

#include "tiers/ramtier.h"

enum restore_source { RS_NONE = 0, RS_LOCAL, RS_PEER, RS_BUCKET };

struct restore_plan {
	bool found;                 /* false: nothing to restore */
	uint64_t step;
	struct shard_key key;       /* this node's shard */
	enum restore_source source;
	char backup[64];            /* backup name when source is RS_BUCKET */
};

/* Called for each recoverable problem met while planning (a shard that
 * fails verification, ...): one line, no newline. */
typedef void (*restore_report_fn)(void *arg, const char *line);

/* ---------- a restore round (DESIGN §5) ----------
 *
 * One loop for a node on its own and for a node of a cluster: a plan, each
 * of this node's shards of it made present through tier_obtain(), then the
 * barrier; a source that fails asks for another plan. What differs is where
 * plans and the barrier come from, which the planner's ops say: the
 * coordinator's (cluster/engine_restore.c) or this node's own catalog
 * (restore_local() below). Runs on the calling thread. */

/* source's answer: this worker has no shard of its own to obtain (worker
 * 0's shard holds every worker's file) */
#define RESTORE_SKIP 1
/* ready's answer: not passed, another plan is in *p */
#define RESTORE_REPLAN 1

struct tier;
struct tier_get;

struct restore_planner {
	void *arg;                  /* the ops' */
	struct ram_tier *ram;       /* where shards are published */
	uint32_t workers;           /* this node's shards per step (1 unless one per worker) */
	/* The round's first plan into *p. 0 or -errno. */
	int (*plan)(void *arg, struct restore_plan *p);
	/* Worker w's source for plan p (found): *t opened and g's source
	 * fields filled (want, hash, backup, rename ...; g->ram and g->as,
	 * this node's key of the worker, are set). 0, RESTORE_SKIP, or -errno
	 * with why filled. */
	int (*source)(void *arg, const struct restore_plan *p, uint32_t w, struct tier *t,
		      struct tier_get *g, char *why, size_t whylen);
	/* Worker w's shard of p could not be obtained (why): the next plan
	 * into *p. 0 or -errno (the round ends). */
	int (*failed)(void *arg, struct restore_plan *p, uint32_t w, const char *why);
	/* p's shards are here (or p found nothing): the barrier. 0 (passed),
	 * RESTORE_REPLAN or -errno. */
	int (*ready)(void *arg, struct restore_plan *p);
	/* Each plan as soon as it is known, before its data is fetched
	 * (replicator.prerestore). May be NULL. */
	void (*prerestore)(void *arg, const struct restore_plan *p);
	void *pre_arg;
};

/* Plan, obtain, barrier until a plan passes it: 0 with the plan in *p, or
 * -errno from an op. */
int restore_run(const struct restore_planner *pl, struct restore_plan *p);

/* A node on its own (no coordinator): its restore round over its own
 * catalog. The plan is the newest step of `job` of which this node holds
 * its shard (rank, worker 0) committed -- with `workers` > 1 (framework:
 * pytorch, one shard per worker's .save file) an own shard of every worker,
 * or a restored worker-0 shard alone, which holds every worker's file as a
 * restore of a backup in the older layout writes it; obtaining a shard
 * verifies its files (CRC32C), and a step that fails is marked SH_BAD,
 * reported and passed over for the next older one. The barrier is this
 * node's alone. 0 (plan->found tells) or -errno (the catalog cannot be
 * read). */
int restore_local(struct ram_tier *t, const char *job, uint32_t rank, uint32_t workers,
		  restore_report_fn report, void *arg,
		  void (*prerestore)(void *arg, const struct restore_plan *p),
		  struct restore_plan *plan);

const char *restore_source_name(enum restore_source s);

#endif
