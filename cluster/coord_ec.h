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

#include "cluster/lkg.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cjob;
struct coord_ec;

/* ---- the rule itself, on any set of reports (also mtcfs-admin steps) ---- */

/* rank's message (borrowed; its "ec" member, absent = nothing) replaces
 * its report in *x (allocated on first use) for a job of `nodes`. 1 when
 * rank runs another redundancy than the first reporter (then note names
 * both, and the report is not used), else 0. */
int coord_ec_report(struct coord_ec **x, uint32_t nodes, int rank, json_t *msg, char *note,
		    size_t notelen);
/* in->h/in->nh plus a hold (holder = owner) for every live owner that no
 * live node holds at a step the reports name and that the code rebuilds,
 * as a new array the caller frees (in->h/nh are pointed at it); NULL (in
 * unchanged) when nothing is added. job names the log lines; quiet: none. */
struct lkg_hold *coord_ec_rebuilt(struct coord_ec *x, const char *job, struct lkg_input *in,
				  bool quiet);
/* rank reported all its parity of step. */
bool coord_ec_parity(const struct coord_ec *x, uint32_t rank, uint64_t step);
/* "rs:K+M" of the reports, or NULL when none (or replication). */
const char *coord_ec_red(const struct coord_ec *x, char *buf, size_t len);
void coord_ec_free(struct coord_ec *x);   /* accepts NULL */

/* ---- the coordinator's job (j->ec), with c->mu held ---- */

/* rank's catalog message (borrowed): replace its "ec" report. */
void coord_ec_catalog(struct cjob *j, int rank, json_t *msg);
/* coord_ec_rebuilt() for j's plan. */
struct lkg_hold *coord_ec_augment(struct cjob *j, struct lkg_input *in);
/* A node's redundancy differs from the job's: the note goes into j->notes
 * (replicator.errors on every node), once. */
void coord_ec_note(struct cjob *j);

#endif
