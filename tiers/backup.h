/* backup: checkpoints in the bucket, in GKE's layout (DESIGN §4):
 *   PREFIX/JOB/YYYY-MM-DD_HH-MM/              one backup, named by its UTC start
 *                                            (older mtcfs: "-N" suffixes, still read)
 *     <job>-s<step>-n<node>-w<w>.meta          the shard hash (64 hex), no newline
 *     <hash>.data/<the shard's files>          the data
 *     <hash>.manifest                          mf_encode bytes
 *   PREFIX/JOB/restore.version                 optional: name of a backup to force
 * A shard is published data first, then its manifest, then its .meta; a
 * backup is complete when every (node, worker) has a .meta whose manifest
 * and files are all present and match. Used by the backup workers, the
 * coordinator, the restore planner and mtcfs-admin; keeps no state (as
 * thread-safe as the bkt handle). Results are owned by the caller. Errors
 * are -errno with words in bkt_last_error(). */
#ifndef MTCFS_TIERS_BACKUP_H
#define MTCFS_TIERS_BACKUP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "tiers/bucket.h"
#include "tiers/catalog.h"
#include "tiers/manifest.h"

#define BK_NAME_MAX      64              /* backup names, with the NUL */
#define BK_MANIFEST_MAX  (256u << 20)    /* largest manifest read back */
#define BK_RESTORE_VERSION "restore.version"

/* A job name: job_name_ok() (common/jobname.h), the rule replicator.yaml
 * and the wire use. A backup name usable as one path component: 1..63
 * bytes of [A-Za-z0-9._-], not "." or "..". */
bool bk_job_name_ok(const char *job);
bool bk_backup_name_ok(const char *name);

/* Upload one shard (k's step/rank/worker; k->job must be "" or job) from
 * dirfd (the shard's directory in the RAM tier) described by mf: its data
 * files (unless upload_data is false: under data parallelism another node
 * of the column uploads the same hash), then <hash>.manifest, then the
 * .meta LAST. Idempotent: objects already there are checked (size and CRC32C;
 * the manifest and .meta by content), never rewritten, so re-running after a
 * crash completes what is missing. -EEXIST when an object of this shard is
 * there with other content; -EBADMSG when a local file no longer matches
 * mf (the server refused its CRC32C). */
int bk_upload_shard(struct bkt *b, const char *job, const char *backup,
		    const struct shard_key *k, int dirfd, const struct manifest *mf,
		    bool upload_data);

/* One worker's file of a framework: pytorch shard, in GKE's layout: the
 * object <hash>.data (hash: SHA-256 of the bytes, 64 hex digits; GKE's own
 * is BLAKE3 and neither side recomputes the other's) and then the .meta of
 * (k->step, k->rank, k->worker) naming it. upload_data false: the .meta
 * only. Write-once like bk_upload_shard: an existing object must hold the
 * same bytes (size and CRC32C). */
int bk_upload_file(struct bkt *b, const char *job, const char *backup,
		   const struct shard_key *k, int dirfd, const struct mf_entry *e,
		   bool upload_data);

/* Name for a new backup of job started at unix time t into out: exactly
 * "YYYY-MM-DD_HH-MM" (UTC), the only form GKE's replicator and Orbax's
 * converter list.  -EAGAIN when an object already exists under JOB/that/
 * (a backup was started in this minute: the next one waits for the next
 * minute).  It does not reserve the name: one node (the coordinator) names
 * backups.  Older mtcfs wrote "-N" suffixes; bk_list_backups still reads
 * them. */
int bk_new_name(struct bkt *b, const char *job, time_t t, char out[BK_NAME_MAX]);

/* Delete every object of JOB/backup/, .meta objects first: only for an
 * attempt of this coordinator that failed and will not be resumed (the
 * step it was for is no longer the one to back up).  0 also when there was
 * nothing. */
int bk_discard_attempt(struct bkt *b, const char *job, const char *backup);

struct bk_shard {
	uint32_t node, worker;
	uint64_t step;
	uint8_t hash[32];           /* zero when there is no (readable) .meta */
	bool gke;                   /* written by GKE's replicator: the .meta is
				     * "D" + hash, <D hash>.data/ has no manifest */
	bool file;                  /* one worker's file of framework: pytorch:
				     * <hash>.data is one object, no manifest
				     * (GKE's layout; mtcfs writes it too) */
	bool complete;
	char why[128];              /* when !complete: the first thing wrong */
};

struct bk_backup {
	char name[BK_NAME_MAX];
	uint64_t step;              /* the shards' step (the highest if mixed) */
	uint32_t nodes_seen;        /* distinct nodes with a .meta */
	bool complete;
	size_t nshards;
	struct bk_shard *shards;    /* by (node, worker, step); a (node, worker)
				     * with no .meta has an entry with why set */
	uint64_t bytes;             /* data objects' bytes stored in this backup */
	char why[512];              /* when !complete: the first reason */
};

/* All backups of job, newest name first (N orders "-N" names numerically;
 * names not of the timestamp form come last). Completeness for nodes x
 * workers (0: as many as the .meta names show): every (node, worker) has
 * exactly one .meta whose manifest exists, decodes, hashes to the .meta's
 * hash, and every data file exists with the manifest's size (and CRC32C when
 * the listing gives it: gs); a backup with mixed steps, or with a node or
 * worker outside the job, is incomplete. bk_verify_backup() reads all data.
 * *out is owned by the caller: bk_backups_free(). */
int  bk_list_backups(struct bkt *b, const char *job, uint32_t nodes, uint32_t workers,
		     struct bk_backup **out, size_t *n);
/* The same, checking newest first and stopping after the first backup for
 * which enough(arg, v) is true (a restore wants only the newest complete
 * one): *out then ends with it. */
int  bk_list_backups_until(struct bkt *b, const char *job, uint32_t nodes, uint32_t workers,
			   bool (*enough)(void *arg, const struct bk_backup *v), void *arg,
			   struct bk_backup **out, size_t *n);
/* The same for one backup (-ENOENT when it holds no object). */
int  bk_check_backup(struct bkt *b, const char *job, const char *backup, uint32_t nodes,
		     uint32_t workers, struct bk_backup *out);
void bk_backup_clear(struct bk_backup *v);
void bk_backups_free(struct bk_backup *v, size_t n);
/* bk_check_backup, then download every data file of every complete shard
 * (to /dev/null) checking its CRC32C against the manifest: 0, -EBADMSG
 * naming the first bad object, or another -errno. */
int  bk_verify_backup(struct bkt *b, const char *job, const char *backup, uint32_t nodes,
		      uint32_t workers, struct bk_backup *out);

/* Download the shard of (node, worker) of a backup into dirfd, an empty
 * directory: directories, files (CRC32C of each checked against the manifest,
 * modes applied), symlinks last. The manifest must describe a tree whose
 * every parent is a directory entry (no writing through a symlink).
 * -ENOENT (no .meta for it), -EBADMSG naming the bad object (manifest hash,
 * a file's CRC32C or size), or -errno. *mf owned by the caller (mf_free).
 * max_bytes (0: no bound): -EFBIG, before any download, when the files the
 * manifest lists claim more (tier_bucket.c: ram_size, or RAMDIR's file
 * system if larger: files may have holes); each file's object must
 * be listed at the manifest's size first (-EBADMSG, -ENOENT). */
int bk_fetch_shard(struct bkt *b, const char *job, const char *backup, uint32_t node,
		   uint32_t worker, int dirfd, struct manifest **mf, uint64_t max_bytes);

/* Download the framework: pytorch shard of (node, worker) of a backup, one
 * file stored as the object <hash>.data (GKE's layout), into dirfd as
 * fname (mode 0644); its size, and on gs:// its CRC32C, checked against the
 * listing. -EMEDIUMTYPE when the .meta names a directory shard (a manifest,
 * or GKE's D<hash>.data/): bk_fetch_shard reads those. -ENOENT (no .meta or
 * no data object), -EBADMSG, -EFBIG (the object is larger than max_bytes,
 * 0: no bound; before any download), or -errno. */
int bk_fetch_file(struct bkt *b, const char *job, const char *backup, uint32_t node,
		  uint32_t worker, int dirfd, const char *fname, uint64_t max_bytes);

/* restore.version: get -> -ENOENT if none, -EBADMSG if it does not name a
 * backup; set replaces (delete + write-once put); clear is 0 when absent. */
int bk_get_restore_version(struct bkt *b, const char *job, char out[BK_NAME_MAX]);
int bk_set_restore_version(struct bkt *b, const char *job, const char *name);
int bk_clear_restore_version(struct bkt *b, const char *job);

#endif
