/* tier: the one interface through which a shard's files are moved between
 * the places that can hold them (DESIGN §2): this node's RAM tier
 * (tier_ram.c), a peer node's RAM tier over a data connection
 * (tier_peer.c) and the backup bucket (tier_bucket.c). A tier is a value
 * { ops, self }; callers go through the tier_* wrappers below, never
 * t->ops directly, so that a wrapper (a cache, the unit tests' fault
 * injector) can sit between. The restore brings shards in through
 * tier_obtain(), replication sends them out through tier_put().
 * Threads: whichever calls; a tier keeps no per-call state. The caller
 * owns every struct it passes; *mf results are the caller's. */
#ifndef MTCFS_TIERS_TIER_H
#define MTCFS_TIERS_TIER_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tiers/bucket.h"
#include "tiers/catalog.h"
#include "tiers/manifest.h"
#include "tiers/ramtier.h"

struct net_auth;

/* get's answer when the shard is already in place under g->as on g->ram
 * (a local shard of this node's own key): nothing was staged. */
#define TIER_IN_PLACE 1
/* put's answer when the tier already held the content: nothing was sent
 * (the peer tier; the bucket's uploads check and keep what is there). */
#define TIER_HAD 1

/* One shard wanted from a tier, and where it goes. */
struct tier_get {
	struct ram_tier *ram;       /* the RAM tier it is staged into and published on */
	struct shard_key want;      /* the shard as its source holds it (its owner's key) */
	struct shard_key as;        /* the key it is published under (this node's) */
	const uint8_t *hash;        /* peer: the manifest hash the plan promises */
	/* bucket: the backup, and its layout: framework: pytorch backups hold
	 * one file per worker (save_files), workers_per_node of them */
	const char *backup;
	bool save_files;
	uint32_t workers_per_node;
	/* Called with the staged files before they are published, when set
	 * (a column mate's files renamed as this node's): 0 or -errno. */
	int (*rename)(void *arg, int dirfd, struct manifest **mf);
	void *rename_arg;
	bool whole;                 /* out, bucket: every worker's file came in
				     * worker 0's shard (a backup of the older layout) */
};

struct tier_ops {
	const char *name;           /* "local", "peer", "bucket" */
	/* Stage g->want's files as g->as in *st (st->fd is -1 until the tier
	 * begins the stage; whatever it staged the caller aborts on failure)
	 * and return its manifest in *mf. 0, TIER_IN_PLACE, or -errno with why
	 * filled (when the tier has words for it). */
	int (*get)(void *self, struct tier_get *g, struct ram_stage *st, struct manifest **mf,
		   char *why, size_t whylen);
	/* After a get that returned 0, with the result of the rename and the
	 * publish that followed (rc): the tier's log line and metrics on
	 * success, its words for a failure. May be NULL. */
	void (*got)(void *self, const struct tier_get *g, const struct manifest *mf, int rc,
		    char *why, size_t whylen);
	/* Store shard k, held on ram with manifest mf (encoded: raw[0..rawlen),
	 * as the catalog keeps it), in the tier. 0, TIER_HAD, or -errno.
	 * NULL: the tier takes no shards. */
	int (*put)(void *self, struct ram_tier *ram, const struct shard_key *k, const uint8_t *raw,
		   size_t rawlen, const struct manifest *mf);
	void (*close)(void *self);  /* may be NULL */
};

struct tier {
	const struct tier_ops *ops;
	void *self;
};

static inline const char *tier_name(const struct tier *t)
{
	return t->ops->name;
}

static inline int tier_get(struct tier *t, struct tier_get *g, struct ram_stage *st,
			   struct manifest **mf, char *why, size_t whylen)
{
	return t->ops->get(t->self, g, st, mf, why, whylen);
}

static inline void tier_got(struct tier *t, const struct tier_get *g, const struct manifest *mf,
			    int rc, char *why, size_t whylen)
{
	if (t->ops->got)
		t->ops->got(t->self, g, mf, rc, why, whylen);
}

static inline int tier_put(struct tier *t, struct ram_tier *ram, const struct shard_key *k,
			   const uint8_t *raw, size_t rawlen, const struct manifest *mf)
{
	return t->ops->put ? t->ops->put(t->self, ram, k, raw, rawlen, mf) : -EOPNOTSUPP;
}

/* Release t (accepts a zeroed struct tier). */
void tier_close(struct tier *t);

/* Make shard g->want present on g->ram as g->as, owned and restored
 * (SHF_OWN | SHF_RESTORED), from the first of the n sources that gives
 * it: each one's get -> g->rename -> publish -> got, its stage aborted on
 * failure; TIER_IN_PLACE only sets the flags on the record. 0, or the
 * last source's -errno with its words in why. */
int tier_obtain(struct tier *const *src, size_t n, struct tier_get *g, char *why, size_t whylen);

/* This node's RAM tier: get verifies the local copy of g->want (a copy that
 * fails is marked SH_BAD) and, when g->as is another key, links its files
 * into the stage. No allocation; the ram tier must outlive t. */
void tier_ram_init(struct ram_tier *ram, struct tier *t);

/* The RAM tier of the node `holder` at addr (host:port), reached on a
 * data connection as rank my_rank with auth (borrowed, must outlive t):
 * get fetches the shard and checks each file's CRC32C and the manifest's
 * hash against g->hash; put pushes a shard of this node's to the peer as a
 * replica (the peer links it when it holds the same content: TIER_HAD).
 * 0 or -ENOMEM; tier_close frees. */
int tier_peer_open(const char *addr, uint32_t holder, int my_rank, const struct net_auth *auth,
		   struct tier *t);

/* A set of peer-tier connections that one call cuts (a stopping daemon's
 * last pushes, past its stop budget). A peer tier put in a set
 * (tier_peer_cut_by) registers its connection while it is open;
 * tier_cut_all() shuts every registered one down -- a wait on it (connect,
 * a send, an answer) ends at once with an error -- and from then on the
 * set's tiers fail with -ECANCELED before they connect. Thread-safe. */
struct tier_cut;
int  tier_cut_new(struct tier_cut **out);   /* 0 or -ENOMEM */
void tier_cut_all(struct tier_cut *c);
void tier_cut_free(struct tier_cut *c);     /* no tier of it open; accepts NULL */
/* t (a tier_peer_open one) registers its connections in c (borrowed). */
void tier_peer_cut_by(struct tier *t, struct tier_cut *c);

/* Backup g->backup in bucket b (borrowed, must outlive t): get downloads
 * the node's shard (g->as: job, step, rank, worker). No allocation. */
void tier_bucket_init(struct bkt *b, struct tier *t);

/* Backup `backup` of job in bucket b (borrowed, must outlive t) as a place
 * to put shards: put uploads one (bk_upload_shard: its data files unless
 * upload_data is false, then its manifest, then its .meta; words for a
 * failure in bkt_last_error()). 0 or -ENOMEM; tier_close frees. */
int tier_bucket_backup_open(struct bkt *b, const char *job, const char *backup, bool upload_data,
			    struct tier *t);

#endif
