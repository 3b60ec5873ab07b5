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

/* One complete shard some node holds: holder has (owner, step) with hash. */
struct lkg_hold {
	uint32_t holder;
	uint32_t owner;
	uint64_t step;
	uint8_t hash[32];
};

struct lkg_input {
	uint32_t nodes;            /* ranks 0..nodes-1 */
	uint32_t dp;               /* assume-data-parallelism D, 0 = none */
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
	uint8_t hash[32];
};

struct lkg_plan {
	bool found;                /* false: no step is complete in the cluster */
	uint64_t step;
	uint32_t nodes;
	struct lkg_src *src;       /* [nodes], the source of each rank's shard */
};

/* Highest step S such that every owner 0..nodes-1 has a complete shard on
 * some live node (with D, a rank without its own shard may take one of the
 * same column r mod (nodes/D), when every usable shard of that column at S
 * has the same hash), plus a source
 * per rank: itself if it holds its own shard, else the live holder with the
 * fewest assignments so far. 0 or -ENOMEM / -EINVAL. */
int  lkg_plan(const struct lkg_input *in, struct lkg_plan *out);
void lkg_plan_free(struct lkg_plan *p);

/* Newest step for which every owner committed (the steady-state LKG); the
 * reports are (owner, step) pairs. Returns false if none. */
bool lkg_newest_complete(uint32_t nodes, uint32_t dp, const struct lkg_hold *h, size_t nh,
			 uint64_t *step);

#endif
