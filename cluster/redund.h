/* redund.h: the one redundancy interface (DESIGN §9). A scheme keeps a
 * committed shard of this node safe on the other nodes of its job and
 * gives it back after a loss; the engine reaches every scheme only through
 * this table and the wrappers below:
 *   protect    a shard of this node committed (the coordinator was told)
 *   reprotect  the job restored a step from the cluster: this node's
 *              shards of it are protected again on the nodes there are now
 *   source     a restore needs a shard of this node that this node does
 *              not hold, and the plan says "here": a tier rebuilding it
 *   status     what the scheme holds of a job, for the coordinator's plan
 *              and mtcfs-admin (members of the catalog's "ec" object)
 * What a scheme stores on a node is a catalog record of the RAM tier (a
 * replica; rs's parity holding of a step, SHF_PARITY), so the retention
 * plan drops it (with its step, after a restore of an older one, for room
 * under ram_size), the RAM tier's start-up scan checks it and mtcfs-admin
 * verify reads it, whatever the scheme in force: no scheme collects or
 * scans anything of its own.
 * Schemes today: replication (engine_repl.c: whole replicas pushed to the
 * peers) and rs (engine_ec.c + engine_ec_rst.c: rs:K+M parity across a
 * group). One is in force for a shard (redund_for). Threads: protect on
 * the replication worker; reprotect and source on the restore thread;
 * status on the restore thread and the data server. Optional ops are
 * NULL. */
#ifndef MTCFS_CLUSTER_REDUND_H
#define MTCFS_CLUSTER_REDUND_H

#include "tiers/catalog.h"
#include "tiers/tier.h"

#include <jansson.h>
#include <stdint.h>

struct eng;

struct redund_scheme {
	const char *name;
	void (*protect)(struct eng *e, const struct shard_key *k, const uint8_t hash[32],
			uint32_t nodes, uint32_t dp);
	void (*reprotect)(struct eng *e, const char *job, uint64_t step, uint32_t nodes,
			  uint32_t dp);
	/* 1 with *t set up (tier_close frees it), 0 when this scheme has no
	 * way to k here, or -errno */
	int  (*source)(struct eng *e, const struct shard_key *k, uint32_t nodes, uint32_t dp,
		       struct tier *t);
	/* adds its members to the job's status object o */
	void (*status)(struct eng *e, const char *job, json_t *o);
};

extern const struct redund_scheme redund_replication;   /* engine_repl.c */
extern const struct redund_scheme redund_rs;            /* engine_ec.c */

/* The scheme in force for this node's shards now: rs when the mount option
 * or the job's replicator.yaml says rs:K+M and a node writes one shard per
 * step; per-worker shards (framework: pytorch with workers-per-node > 1)
 * are replicated. Never NULL. */
const struct redund_scheme *redund_for(struct eng *e);

/* The job's redundancy status: {"redundancy": the setting in force, and
 * each scheme's members}. A new reference, or NULL (no memory). */
json_t *redund_status(struct eng *e, const char *job);

static inline void redund_protect(struct eng *e, const struct shard_key *k,
				  const uint8_t hash[32], uint32_t nodes, uint32_t dp)
{
	redund_for(e)->protect(e, k, hash, nodes, dp);
}

static inline void redund_reprotect(struct eng *e, const char *job, uint64_t step,
				    uint32_t nodes, uint32_t dp)
{
	redund_for(e)->reprotect(e, job, step, nodes, dp);
}

static inline int redund_source(struct eng *e, const struct shard_key *k, uint32_t nodes,
				uint32_t dp, struct tier *t)
{
	const struct redund_scheme *s = redund_for(e);
	return s->source ? s->source(e, k, nodes, dp, t) : 0;
}

#endif
