/* catalog: the LMDB index in RAMDIR/db — shards held locally (own and
 * replicas) with their state and manifest, and small named metadata values
 * (the current job config, restore state). All writes go through this module
 * (one short write transaction per call), and shard records are written by
 * tiers/lifecycle.c alone (its life_* calls name each transition; the unit
 * test test_lifecycle fails on any other caller of the four shard writes
 * below). Readers may be other processes
 * (mtcfs-admin opens it read-only). Every function is thread-safe. Values
 * handed out are copies owned by the caller. */
#ifndef MTCFS_TIERS_CATALOG_H
#define MTCFS_TIERS_CATALOG_H

#include "common/jobname.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define IDX_JOB_MAX JOB_NAME_MAX   /* common/jobname.h: the one limit */

struct idx;

enum shard_state {
	SH_SEALING    = 1,   /* commit seen, manifest not yet built */
	SH_COMMITTED  = 2,   /* manifest built, data in the RAM tier */
	SH_REPLICATED = 3,   /* at least the configured peers hold it */
	SH_BACKED_UP  = 4,
	SH_BAD        = 5,   /* files no longer match the manifest, or the
			      * committed tree cannot be a shard (mf_validate) */
	SH_DROPPING   = 6,   /* being deleted: files first, then the record */
};

#define SHF_OWN      0x1u   /* written by this node (else a replica) */
#define SHF_HIDDEN   0x2u   /* the app removed it from its view */
#define SHF_RESTORED 0x4u   /* restored into this node by the last restore */
/* A step's erasure-code holding on this node (redundancy=rs:K+M): the
 * parity fragments it stores and the group manifests it keeps, one record
 * per (job, step) and node, under the reserved key form rank = worker =
 * IDX_PARITY (no shard has either: ranks and workers are far below), the
 * value flagged SHF_PARITY (what idx_list_shards goes by). The key and
 * value encodings are a shard's: catalog version 1 unchanged, a RAMDIR of
 * an earlier mtcfs opens as it was. */
#define SHF_PARITY   0x8u
#define IDX_PARITY   UINT32_MAX

struct shard_key {
	char job[IDX_JOB_MAX + 1];
	uint64_t step;
	uint32_t rank, worker;
};

struct shard_rec {
	struct shard_key key;
	uint32_t state;          /* enum shard_state */
	uint32_t flags;          /* SHF_* */
	uint8_t hash[32];
	uint64_t bytes;
	uint32_t nfiles;
	uint64_t commit_time;    /* unix seconds */
	uint64_t ns_ino;         /* inode of the step dir in the namespace, 0 if none */
	uint8_t *mf;             /* encoded manifest (NULL while sealing); owned */
	size_t mflen;
};

int  idx_open(const char *dir, bool readonly, struct idx **out);
void idx_close(struct idx *x);     /* accepts NULL */

const char *shard_state_name(uint32_t state);

/* A record in SH_DROPPING is invisible to every reader below except
 * idx_list_dropping() and idx_forget_dropping(): to them the shard is gone
 * already (idx_get_shard -ENOENT, idx_list_shards skips it, idx_set_state
 * -ENOENT). It stays only so that a crash while its files are deleted is
 * finished at the next start instead of leaking them. */

/* Shard writes: for tiers/lifecycle.c only. */
/* Insert or replace. rec->mf may be NULL. 0 or -errno. */
int idx_put_shard(struct idx *x, const struct shard_rec *rec);
/* 0, -ENOENT, or -errno; rec->mf malloc'd (free with idx_rec_clear). */
int idx_get_shard(struct idx *x, const struct shard_key *k, struct shard_rec *rec);
int idx_del_shard(struct idx *x, const struct shard_key *k);
/* Update state/flags of an existing shard. */
int idx_set_state(struct idx *x, const struct shard_key *k, uint32_t state,
		  uint32_t set_flags, uint32_t clear_flags);
void idx_rec_clear(struct shard_rec *rec);
/* Delete the record of k only if it is still SH_DROPPING (a new copy put
 * meanwhile stays). 0, -ENOENT, -EBUSY (another state), or -errno. */
int idx_forget_dropping(struct idx *x, const struct shard_key *k);
/* Keys of the SH_DROPPING records; *keys malloc'd, owned by the caller. */
int idx_list_dropping(struct idx *x, struct shard_key **keys, size_t *n);

/* All shards (of one job when job != NULL), ascending by (job, step, rank,
 * worker). *recs is a malloc'd array owned by the caller: idx_recs_free().
 * Parity holdings (SHF_PARITY) are not shards and are left out. */
int idx_list_shards(struct idx *x, const char *job, struct shard_rec **recs, size_t *n);
/* The same with the parity holdings: every record the retention plan, the
 * RAM tier's start-up scan and mtcfs-admin verify look at. */
int idx_list_records(struct idx *x, const char *job, struct shard_rec **recs, size_t *n);
void idx_recs_free(struct shard_rec *recs, size_t n);

/* Small named values (config, restore state). */
int idx_put_meta(struct idx *x, const char *name, const void *val, size_t len);
int idx_get_meta(struct idx *x, const char *name, void **val, size_t *len);
int idx_del_meta(struct idx *x, const char *name);

#endif
