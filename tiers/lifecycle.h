/* lifecycle: a shard's life in the catalog, in one place.
 *
 * 1. The only writer of shard records. Every change of a record in
 *    RAMDIR/db goes through one of the life_* calls below, each named after
 *    the transition it makes (the catalog's idx_put_shard / idx_del_shard /
 *    idx_set_state / idx_forget_dropping are for this file only):
 *
 *        (none) --life_seal_begin--> SEALING --life_committed--> COMMITTED
 *        (none) --life_committed--> COMMITTED   (a replica or a restore,
 *                                                published from staging)
 *        SEALING --life_unsealable--> BAD;  any --life_bad--> BAD
 *        COMMITTED --life_replicated--> REPLICATED --life_backed_up--> BACKED_UP
 *        any --life_drop_mark--> DROPPING --(files gone) life_drop_done--> (none)
 *        any --life_forget--> (none)   (an aborted or stale seal, the old
 *                                       copy a publish replaces)
 *    and the flags: SHF_HIDDEN (life_hide), SHF_RESTORED (life_restored),
 *    SHF_OWN (life_adopt: a peer's copy restored as this node's own).
 *    The calls do not check the state they start from (nor did the code
 *    before them: checking would change behaviour). Also here: a step's
 *    spelling (life_name_*).
 *    Every call is one short catalog transaction: 0 or -errno.
 *
 * 2. The retention plan (pure: no I/O, no locks): given a node's shard
 *    records and what the caller knows (the job-wide step to keep from, the
 *    restored step, pins, RAM pressure), which shards go and in what order.
 *    The caller drops them (fs/commit.c) and stops once it freed enough. */
#ifndef MTCFS_TIERS_LIFECYCLE_H
#define MTCFS_TIERS_LIFECYCLE_H

#include "tiers/catalog.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct manifest;

/* ---- record writes ---- */

/* A commit of k was seen: SEALING, no manifest yet (flags: SHF_*). */
int life_seal_begin(struct idx *x, const struct shard_key *k, uint32_t flags, uint64_t ns_ino);
/* k's files are in the store and described by mf: COMMITTED, replacing
 * any earlier record of k. */
int life_committed(struct idx *x, const struct shard_key *k, const struct manifest *mf,
		   uint32_t flags, uint64_t ns_ino);
/* k's committed tree cannot be a shard: BAD, without a manifest. */
int life_unsealable(struct idx *x, const struct shard_key *k, uint32_t flags, uint64_t ns_ino);
/* Its files no longer match the manifest (or a peer's copy failed). */
int life_bad(struct idx *x, const struct shard_key *k);
int life_replicated(struct idx *x, const struct shard_key *k);
int life_backed_up(struct idx *x, const struct shard_key *k);
int life_hide(struct idx *x, const struct shard_key *k);
int life_restored(struct idx *x, const struct shard_key *k);
/* A copy restored from a peer becomes this node's own (and restored). */
int life_adopt(struct idx *x, const struct shard_key *k);
/* Forget a record whose files are not (or no longer) in the store. */
int life_forget(struct idx *x, const struct shard_key *k);
/* A drop: mark first (DROPPING), delete the files, then life_drop_done;
 * a crash in between leaves the mark, finished at the next start. */
int life_drop_mark(struct idx *x, const struct shard_key *k);
int life_drop_done(struct idx *x, const struct shard_key *k);

/* A step's erasure-code holding (catalog.h SHF_PARITY): the key of
 * (job, step)'s, and whether a key is one. life_parity_begin records it,
 * COMMITTED and empty, when its directory is about to be made (the RAM
 * tier's ram_parity_open; its files are reserved and written one by one as
 * the group's members arrive), if there is no record of it already. It
 * goes like a replica of its step: by the retention plan (life_plan_gc,
 * life_plan_newer: .parity set) and ram_drop. */
void life_parity_key(const char *job, uint64_t step, struct shard_key *k);
static inline bool life_is_parity(const struct shard_key *k)
{
	return k->worker == IDX_PARITY && k->rank == IDX_PARITY;
}
int life_parity_begin(struct idx *x, const struct shard_key *k);

/* A step's spelling ("05", "00000100") is kept in the catalog beside its
 * shard, only when it is not the plain decimal: the namespace name goes
 * with the next clean, and the .restore marker still needs it.
 * life_name_set stores name (or forgets it when it is the decimal);
 * life_name_get gives the spelling, else the decimal (always a string). */
int  life_name_set(struct idx *x, const struct shard_key *k, const char *name);
int  life_name_forget(struct idx *x, const struct shard_key *k);
void life_name_get(struct idx *x, const struct shard_key *k, char *buf, size_t len);

/* ---- retention plan ---- */

/* Is (job, step) pinned (a backup is uploading it)? */
typedef bool (*life_pinned_fn)(void *arg, const char *job, uint64_t step);

struct life_in {
	const char *job;        /* the current job */
	uint32_t rank;          /* this node */
	uint32_t workers;       /* shards per step and node (pytorch .save files), >= 1 */
	/* With peers (cluster): keep every step >= step, and nothing is known
	 * (keep all of the current job) unless have_step. Routine GC passes
	 * the step replicated job-wide, RAM pressure the LKG. */
	bool cluster;
	bool have_step;
	uint64_t step;
	/* Single node: the step the last restore brought back, kept until a
	 * newer commit of the current job exists. */
	bool have_restored;
	uint64_t restored_step;
	uint64_t want;          /* 0: routine GC; else bytes a write needs */
	life_pinned_fn pinned;  /* NULL: nothing pinned */
	void *pin_arg;
};

enum life_why {
	LIFE_OLDER = 1,         /* of the current job, older than the kept step */
	LIFE_OTHER_JOB,         /* of an earlier job, dropped for room */
	LIFE_NEWER,             /* newer than a restored step: abandoned timeline */
};

struct life_drop {
	const struct shard_rec *rec;   /* points into the caller's recs */
	bool own;                      /* this node's own shard (else a replica) */
	bool parity;                   /* a parity holding (goes as a replica does) */
	enum life_why why;
};

/* What goes, first to last, from recs (all records of the node, any order;
 * parity holdings go with their step as its replicas do, never count as
 * this node's commit of it):
 * out must hold n entries; *nout is set. Under pressure (want) the
 * current job's candidates come before other jobs' (oldest commit first);
 * routine GC never touches other jobs. 0 or -EINVAL. */
int life_plan_gc(const struct life_in *in, const struct shard_rec *recs, size_t n,
		 struct life_drop *out, size_t *nout);

/* After a restore of `step` of job: every shard of job newer than it
 * (sealed, not bad: bad shards stay for inspection). Same out/nout. */
int life_plan_newer(const char *job, uint32_t rank, uint64_t step, const struct shard_rec *recs,
		    size_t n, struct life_drop *out, size_t *nout);

#endif
