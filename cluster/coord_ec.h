/* coord_ec: the coordinator's side of `redundancy=rs:K+M` (issue 17).
 * Each node's catalog carries "ec": {redundancy, parity: [[step,
 * [[owner, hash], ...]], ...]}: the steps it stores all its parity
 * fragments of, with the hashes of its group's shards. When a plan is
 * made, a shard that no live node holds at a step but that
 * ecplan_restorable() says K members of each of its codewords rebuild is
 * added as a hold of its own node (holder = owner): lkg_plan then counts
 * the step complete, and that node's restore rebuilds it from the code
 * (engine_ec_rst.c). A failed rebuild comes back as fetch_failed, a bad
 * hold, and the plan falls back as for any source. With c->mu held. */
#ifndef MTCFS_CLUSTER_COORD_EC_H
#define MTCFS_CLUSTER_COORD_EC_H

#include "cluster/coord_i.h"

struct coord_ec;

/* rank's catalog message (borrowed): replace its "ec" report. */
void coord_ec_catalog(struct cjob *j, int rank, json_t *msg);
/* The holds to plan with: in->h/in->nh plus the shards the code rebuilds,
 * as a new array the caller frees (in->h/nh are pointed at it), or NULL
 * (in unchanged) when nothing is added. */
struct lkg_hold *coord_ec_augment(struct cjob *j, struct lkg_input *in);
/* A node's redundancy differs from the job's: the note goes into j->notes
 * (replicator.errors on every node), once. */
void coord_ec_note(struct cjob *j);
void coord_ec_free(struct coord_ec *x);   /* accepts NULL */

#endif
