/* ramtier: the RAM tier on RAMDIR (a tmpfs directory). Owns the layout
 *   RAMDIR/ns/                          the application's namespace (FUSE root)
 *   RAMDIR/db/                          the LMDB catalog
 *   RAMDIR/shards/JOB/STEP/nR-wW/       committed shards, own (hard links of
 *                                       the namespace files) and replicas
 *   RAMDIR/shards/JOB/STEP/parity/      the step's erasure-code holding on
 *                                       this node (rs:K+M; tiers/ec.h)
 * and the capacity account (ram_size): every byte stored under RAMDIR is
 * counted once per inode. Called from FUSE threads (accounting), the engine
 * worker (sealing, dropping) and the control thread. Thread-safe. */
#ifndef MTCFS_TIERS_RAMTIER_H
#define MTCFS_TIERS_RAMTIER_H

#include <stdbool.h>
#include <stdint.h>

#include "tiers/catalog.h"
#include "tiers/manifest.h"

struct ram_tier;

/* RAMDIR/shards and its JOB and STEP directories, seen by the trainer as
 * .mtcfs/JOB/STEP: anyone may pass (a restore marker points through them
 * for whatever uid wrote the step), only the daemon may list or change
 * them. A shard directory below has its writer's owner and mode. */
#define STORE_DIR_MODE 0711

/* Called when a reservation does not fit: free what policy allows and
 * return the bytes freed (0 if nothing may go). Runs on the caller's
 * thread, under the tier's reclaim lock (one reclaim at a time): it may
 * take other locks and drop shards (ram_drop), never reserve. */
typedef uint64_t (*ram_reclaim_fn)(void *arg, uint64_t want);

/* Create/open RAMDIR's layout and catalog. cap 0 = free space of RAMDIR's
 * filesystem at start. 0 or -errno. */
int  ram_open(const char *ramdir, uint64_t cap, struct ram_tier **out);
void ram_close(struct ram_tier *t);      /* accepts NULL */
void ram_set_reclaim(struct ram_tier *t, ram_reclaim_fn fn, void *arg);
/* Who owns a published copy (a replica, a restore from a peer or the
 * bucket) whose manifest records no owners: a backup in GKE's layout, the
 * per-worker files of framework: pytorch backups, a shard from an mtcfs
 * before owners; and the umask (group and other bits) of its modes, which
 * such a source does not keep. The control thread sets the owner, group
 * and umask of the replicator.yaml that configured the job (the trainer
 * writes it; under a Kubernetes fsGroup its group is the set-gid mount
 * root's); until then, the mount root's owner and 022. */
void ram_set_owner(struct ram_tier *t, uint32_t uid, uint32_t gid, uint32_t umask);

int ram_ns_fd(const struct ram_tier *t);        /* borrowed; valid until close */
int ram_root_fd(const struct ram_tier *t);      /* RAMDIR itself; borrowed */
struct idx *ram_idx(const struct ram_tier *t);  /* borrowed */
const char *ram_path(const struct ram_tier *t);

/* Capacity. ram_reserve() takes bytes out of the budget before a write
 * (reclaiming if needed): 0 or -ENOSPC. ram_adjust() corrects the account by
 * the measured change after the write (may be negative). */
int ram_reserve(struct ram_tier *t, uint64_t bytes);
void ram_adjust(struct ram_tier *t, int64_t delta);
uint64_t ram_used(const struct ram_tier *t);
uint64_t ram_cap(const struct ram_tier *t);
/* Recount every inode under RAMDIR once (start-up, after reclaim). */
void ram_recount(struct ram_tier *t);

/* The directory name of a step's parity holding (catalog.h SHF_PARITY). */
#define RAM_PARITY_DIR "parity"

/* Relative path of a shard's directory under RAMDIR ("shards/JOB/STEP/nR-wW"). */
int ram_shard_relpath(const struct shard_key *k, char *buf, size_t len);
/* Open a shard's directory (O_DIRECTORY); -ENOENT if absent. Caller closes. */
int ram_shard_open(struct ram_tier *t, const struct shard_key *k);
/* List a shard's directory (common/walk.h): 0 or -errno; walk_dir_fd(d)
 * is the directory for *at() calls on the entries. walk_dir_close(d). */
struct walk_dir;
int ram_shard_walk(struct ram_tier *t, const struct shard_key *k, struct walk_dir *d);

/* Seal a committed step: hard-link the tree under src_dirfd into the shard
 * directory of k (via a staging name, renamed into place), build its
 * manifest, and record it in the catalog as SH_COMMITTED with rec_flags.
 * *mf (optional) receives the manifest. 0; -EBADMSG when the tree cannot be
 * a shard (mf_validate's rule: too deep, a path too long, a symlink that
 * points outside, ...): the step is then recorded SH_BAD without a
 * manifest and sealing it again is pointless; or another -errno (perhaps
 * passing). On failure err (may be NULL) says why. */
int ram_seal(struct ram_tier *t, const struct shard_key *k, int src_dirfd,
	     uint64_t ns_ino, uint32_t rec_flags, struct manifest **mf, char *err, size_t errlen);
/* Remove a shard's files and catalog record; counts freed bytes. The record
 * is marked SH_DROPPING first and forgotten only once the files are gone,
 * so that ram_open() finishes a drop a crash cut short. ram_open() also
 * removes shard directories that no record names. 0 or -errno. */
int ram_drop(struct ram_tier *t, const struct shard_key *k, uint64_t *freed);
/* Re-check a shard's files against its catalog manifest (CRC32C).
 * 0, -EBADMSG (described in err), -ENOENT. */
int ram_verify(struct ram_tier *t, const struct shard_key *k, char *err, size_t errlen);
/* A shard restored in place that an older mtcfs sealed (a manifest without
 * owners) has directories of root's: they, its symlinks and FIFOs get
 * ram_set_owner's owner (its files are hard links of the writer's and keep
 * theirs). Nothing changes for a shard sealed with owners. 0 or -errno. */
int ram_own(struct ram_tier *t, const struct shard_key *k);
/* Cheap consistency check of a record (start-up): every file of its
 * manifest is in the store with its size; full CRC checks (ram_verify)
 * happen before a restore uses the shard. 0, or -errno with why in err. */
int ram_check_sizes(struct ram_tier *t, const struct shard_rec *r, char *err, size_t errlen);

/* A step's erasure-code holding (catalog.h SHF_PARITY, key
 * life_parity_key): its directory (O_DIRECTORY; the caller closes it), and
 * with create its record (COMMITTED, if none) and directory made first.
 * Its files grow one by one as the group's members arrive: each is
 * reserved (ram_reserve, which may reclaim by the retention plan or
 * refuse) before it is written under a temporary name in the directory
 * and renamed into place, and the account corrected by what it took.
 * The holding goes as a record does: ram_drop (the retention plan) and
 * the start-up scan of ram_open (half-written and corrupt files removed,
 * a record whose directory is gone forgotten; an older mtcfs's
 * RAMDIR/frags/JOB/STEP moved into place). -ENOENT without create when
 * there is none, -EINVAL for a job name that cannot be one, or -errno. */
int ram_parity_open(struct ram_tier *t, const char *job, uint64_t step, bool create);

/* A file of a parity holding, staged and published through the tier: its
 * bytes are reserved before it is written, it is written under a staging
 * name in the holding's directory, then published under its name (the
 * account corrected to what it takes) or, when it was only needed for a
 * while (a fragment received to fold, sent, fetched for a decode) or
 * failed, aborted (removed, the reservation given back).
 *   ram_pfile_reserve: takes bytes out of ram_size (ram_reserve: the
 *     reclaim may drop what the retention plan allows, or -ENOSPC); no
 *     file yet. Call it holding no lock. Sets up *f for dirfd (borrowed:
 *     it must stay open until publish or abort).
 *   ram_pfile_create: the staging file, read-write at f->fd: `name`
 *     (created or truncated: a name the caller owns, as a parity slot's
 *     "*.frag.tmp") or, when NULL, a fresh "<prefix>-PID-SEQ.tmp". The
 *     start-up scan removes either if the daemon stops first. 0 or -errno.
 *   ram_pfile_publish: renames it to `final` (replacing one there,
 *     whose bytes leave the account), corrects the account, closes it.
 *     0, or -errno (then aborted).
 *   ram_pfile_abort: closes and removes it, gives the reservation back;
 *     a file that went with its holding (ram_drop counted it) gives back
 *     only the rest. Accepts a pfile without a file, or already done. */
struct ram_pfile {
	int dirfd;            /* the holding's directory (borrowed) */
	int fd;               /* the staged file, -1 when none */
	char name[64];        /* its staging name in dirfd */
	uint64_t reserved;    /* bytes taken out of ram_size for it */
};
int  ram_pfile_reserve(struct ram_tier *t, int dirfd, uint64_t bytes, struct ram_pfile *f);
int  ram_pfile_create(struct ram_pfile *f, const char *name, const char *prefix);
int  ram_pfile_publish(struct ram_tier *t, struct ram_pfile *f, const char *final);
void ram_pfile_abort(struct ram_tier *t, struct ram_pfile *f);

/* Shards arriving from elsewhere (replicas pushed by peers, restores
 * fetched from a peer or the bucket) are written into a private staging
 * directory and published into place with their manifest. */
struct ram_stage {
	struct shard_key key;
	char rel[512];       /* staging path under shards/ */
	int fd;              /* the staging directory */
};
int  ram_stage_begin(struct ram_tier *t, const struct shard_key *k, struct ram_stage *st);
/* Check sizes against mf, rename into place (replacing an older copy),
 * record in the catalog as SH_COMMITTED with flags. 0 or -errno. */
int  ram_stage_publish(struct ram_tier *t, struct ram_stage *st, const struct manifest *mf,
		       uint32_t flags);
void ram_stage_abort(struct ram_tier *t, struct ram_stage *st);
/* Hard-link the files of shard `from` into a stage (same content under
 * another key: data-parallel de-duplication, restores of a column mate). */
int  ram_stage_link(struct ram_tier *t, struct ram_stage *st, const struct shard_key *from);
/* A committed, not bad shard holding exactly this content. 0 or -ENOENT. */
int  ram_find_hash(struct ram_tier *t, const uint8_t hash[32], struct shard_key *out);

/* Test use only (NULL otherwise): called at named points so that a unit
 * test can interleave threads deterministically. "drop-marked": a drop has
 * marked k's record and not yet deleted a file; "key-wait": a seal, publish
 * or drop of k is about to wait for another one of k to finish. Set it
 * before any thread uses a tier. */
extern void (*ram_test_hook)(const char *point, const struct shard_key *k);

#endif
