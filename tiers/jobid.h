/* jobid: the one record of the job this node serves — its name, this
 * node's rank, the job's shape (nodes, assume-data-parallelism) and how
 * many shards a node commits per step. The FUSE front (fs/) commits under
 * it and the engine (cluster/) reports, replicates and backs up under it:
 * the composition root makes one and hands the same pointer to both.
 * Writers: the engine (its options' rank at start, each replicator.yaml
 * it accepts), or fs/ctl.c when there is no engine. Readers take a
 * snapshot (jobid_get), any thread. The record's mutex is a leaf lock: it
 * may be taken under any other lock, and nothing is called while it is
 * held. The creator frees it, after every user is gone. */
#ifndef MTCFS_TIERS_JOBID_H
#define MTCFS_TIERS_JOBID_H

#include <stdbool.h>
#include <stdint.h>

#include "common/jobname.h"

struct jobid;

/* A snapshot of the record (a value: the caller's to keep). */
struct job_now {
	bool set;                       /* a replicator.yaml set it (or the last
					 * one, taken again after a restart) */
	char job[JOB_NAME_MAX + 1];     /* "" until set */
	int rank;                       /* this node's; -1: not known yet */
	uint32_t nodes, dp;             /* the job's; 0 until set (dp 0: not assumed) */
	/* shards per node and step: workers-per-node when framework is
	 * pytorch (each worker's .save file is its own shard), else 1;
	 * always >= 1 */
	uint32_t workers;
	bool save_files;                /* framework: pytorch: <job>-s<S>-n<r>-w<w>.save files commit */
};

/* A record with no job (set false, rank -1, workers 1) into *out, freed
 * with jobid_free(). 0 or -ENOMEM. */
int  jobid_new(struct jobid **out);
void jobid_free(struct jobid *j);   /* accepts NULL */

/* The record now, into *out. */
void jobid_get(const struct jobid *j, struct job_now *out);
/* The rank alone (-1: not known yet): what jobid_get gives as rank. */
int  jobid_rank(const struct jobid *j);
/* The whole record becomes *now (workers 0 is taken as 1). The caller has
 * checked it: the record takes what it is given. */
void jobid_set(struct jobid *j, const struct job_now *now);
/* The rank alone (the engine's options, before any yaml). */
void jobid_set_rank(struct jobid *j, int rank);

#endif /* MTCFS_TIERS_JOBID_H */
