/* lkg: the job-wide decisions of DESIGN §5 as pure functions — which step
 * is the last known good one across the job, and where each node gets its
 * shard from. No I/O, no threads: the coordinator calls it with what the
 * nodes reported; unit tests call it with synthetic catalogs. Inputs are
 * borrowed; the plan is a caller-owned value (lkg_plan_free). */
#ifndef MTCFS_TIERS_LKG_H
#define MTCFS_TIERS_LKG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One complete shard some node holds: holder has (owner, worker, step)
 * with hash. worker is 0 unless the job keeps one shard per worker
 * (framework: pytorch with workers-per-node > 1, lkg_input.workers). */
struct lkg_hold {
	uint32_t holder;
	uint32_t owner;
	uint32_t worker;
	uint64_t step;
	uint8_t hash[32];
	/* The shard's data apart from its names, when the node says it
	 * (framework: pytorch: a worker's file, whose name carries the rank):
	 * column mates agree on it where their hashes cannot. */
	bool has_content;
	uint8_t content[32];
};

struct lkg_input {
	uint32_t nodes;            /* ranks 0..nodes-1 */
	uint32_t dp;               /* assume-data-parallelism D, 0 = none */
	uint32_t workers;          /* shards per node: 0 or 1 = one (worker 0) */
	const struct lkg_hold *h;
	size_t nh;
	const bool *live;          /* live[rank]: reported and reachable; NULL = all */
	/* sources known to be bad (failed CRC or died mid-fetch): skipped */
	const struct lkg_hold *bad;
	size_t nbad;
};

struct lkg_src {
	bool found;
	uint32_t holder;           /* node to fetch from (== rank: already local) */
	uint32_t owner;            /* whose shard it is (!= rank only with D) */
	uint32_t worker;           /* == the slot's worker */
	uint8_t hash[32];
};

struct lkg_plan {
	bool found;                /* false: no step is complete in the cluster */
	uint64_t step;
	uint32_t nodes;
	uint32_t workers;          /* >= 1 */
	/* [nodes * workers], the source of rank r's worker w shard at
	 * src[r * workers + w] (src[r] when there is one shard per node) */
	struct lkg_src *src;
};

/* Highest step S such that every (owner, worker) of 0..nodes-1 x
 * 0..workers-1 has a complete shard on some live node (with D, a rank
 * without its own shard of worker w may take worker w's shard of another
 * owner of the same column r mod (nodes/D), when every usable worker-w
 * shard of that column at S has the same hash: GKE compares per-worker
 * hashes), plus a source per (rank, worker): itself if it holds that
 * shard, else the live holder with the fewest assignments so far. Each
 * worker's shard is planned on its own, as GKE restores each worker's file
 * on its own. Holds with worker >= workers are ignored.
 * 0 or -ENOMEM / -EINVAL. */
int  lkg_plan(const struct lkg_input *in, struct lkg_plan *out);
void lkg_plan_free(struct lkg_plan *p);

/* Which ranks have every worker's shard of `step` covered, as lkg_plan
 * judges a step (own copy on a live holder, or under D the column's when
 * the column agrees): covered[r] for r in 0..in->nodes-1 (the caller's
 * array). A step is complete when every rank is covered. mtcfs-admin's
 * step table reads it. 0 or -ENOMEM / -EINVAL. */
int  lkg_step_covered(const struct lkg_input *in, uint64_t step, bool *covered);

/* The first (rank, worker) a plan could not cover. */
struct lkg_gap {
	uint32_t rank, worker;
	bool columns;              /* D is assumed: it could borrow in its column */
	bool disagree;             /* ... but the column's shards differ */
};

/* A backup as the source of a restore, as GKE judges one: only the job's
 * ranks count. in->h are the backup's complete shards, holder == owner ==
 * the backup's node, all of one step (else -EINVAL); in->nodes, dp and
 * workers are the job's (live and bad unused). A shard of a node >=
 * in->nodes is ignored (a backup of a larger job); a rank without its own
 * shard (a backup of a smaller job) takes, under D, worker w's shard of
 * the first node of its column (r mod nodes/D) that the backup holds, when
 * every such shard of the column has the same hash (lkg_plan's rule).
 * out->found with out->src[r * workers + w].owner the backup node to fetch
 * for (r, w); else *gap names the first slot left without one.
 * 0 or -ENOMEM / -EINVAL. */
int  lkg_plan_backup(const struct lkg_input *in, struct lkg_plan *out, struct lkg_gap *gap);

/* Newest step for which every owner committed (the steady-state LKG); the
 * reports are (owner, step) pairs. Returns false if none. */
bool lkg_newest_complete(uint32_t nodes, uint32_t dp, const struct lkg_hold *h, size_t nh,
			 uint64_t *step);

/* The same for per-worker shards: every (owner, worker) of nodes x
 * workers committed the step. */
bool lkg_newest_complete_w(uint32_t nodes, uint32_t dp, uint32_t workers,
			   const struct lkg_hold *h, size_t nh, uint64_t *step);

#endif
