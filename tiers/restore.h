/* restore: deciding what a node restores. A restore plan names one step and,
 * for each (rank, worker) shard this node must present, where it comes from.
 * This version plans from the local catalog (a single-node job); the
 * cluster-wide plan (DESIGN §5) feeds the same struct. Runs on the control
 * thread; the plan is a value owned by the caller. */
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

/* The newest own shard of (job, rank) whose files verify against their
 * manifest (CRC32C). Shards that fail are marked SH_BAD in the catalog and
 * reported. 0 (plan->found tells) or -errno. */
int restore_plan_local(struct ram_tier *t, const char *job, uint32_t rank,
		       restore_report_fn report, void *arg, struct restore_plan *plan);

/* The same when the node keeps `workers` shards per step (framework:
 * pytorch, one per worker's .save file): the newest step of which every
 * worker 0..workers-1 has an own shard that verifies (or a restored
 * worker-0 shard alone, which holds every worker's file as a restore of
 * a backup in the older layout writes it). plan->key is worker 0's.
 * workers 0 or 1: restore_plan_local(). */
int restore_plan_local_w(struct ram_tier *t, const char *job, uint32_t rank, uint32_t workers,
			 restore_report_fn report, void *arg, struct restore_plan *plan);

const char *restore_source_name(enum restore_source s);

#endif
