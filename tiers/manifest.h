/* manifest: the list of a shard's entries (relative path, type, size, mode,
 * CRC32C per file) and the shard's content hash (SHA-256 over the canonical
 * encoding of the entries). Built by the engine's workers off the FUSE
 * threads; encoded into the catalog and the bucket; decoded from untrusted
 * bytes (peers, bucket) with every length and path bounded. A manifest is
 * owned by whoever built/decoded it and freed with mf_free(). */
#ifndef MTCFS_TIERS_MANIFEST_H
#define MTCFS_TIERS_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "common/crc32c.h"   /* mf_crc32c: every user of manifests needs it */

/* MF_FIFO: a named pipe, mode only (no data). An mtcfs older than
 * MF_FIFO rejects a manifest holding one as malformed (-EBADMSG). */
enum mf_type { MF_FILE = 1, MF_DIR = 2, MF_SYMLINK = 3, MF_FIFO = 4 };

#define MF_MAX_ENTRIES 1000000u
#define MF_MAX_FILE_SIZE (1ULL << 44)   /* 16 TiB per file */
/* Path components of an entry ("a/b/c" is 3). Checkpoints are a few levels
 * deep; the bound keeps every walk of a shard small (descriptors, memory)
 * and leaves room under the file:// bucket's 64-level listing walk for the
 * JOB/BACKUP/<hash>.data/ levels above the shard. */
#define MF_MAX_DEPTH 48u

struct mf_entry {
	char *path;          /* relative, validated by util_safe_relpath */
	char *target;        /* symlink target, else NULL */
	uint8_t type;        /* enum mf_type */
	uint32_t mode;       /* permission bits only */
	uint64_t size;       /* files only */
	uint32_t crc32c;     /* files only */
};

/* The mode a restore gives an entry of mode `mode` (a manifest's):
 * permission bits only. A restored shard's modes come from a peer, a
 * bucket or erasure-code fragments (each restore path applies this one
 * rule): none of them may make a set-user-ID, set-group-ID or sticky
 * file or directory on this node, as the daemon's files are root's. */
static inline uint32_t mf_restore_mode(uint32_t mode)
{
	return mode & 0777;
}

struct manifest {
	struct mf_entry *e;  /* sorted by path (bytewise) */
	size_t n;
	uint64_t total;      /* sum of file sizes */
	uint32_t nfiles;
	uint8_t hash[32];    /* SHA-256 of the encoded entries */
};

/* Walk the directory dirfd (iteratively, at most MF_MAX_DEPTH levels) and
 * build its manifest (CRC of every file). 0, -EBADMSG when the tree cannot
 * be a shard (too deep, a path too long, too many entries, a symlink that
 * points outside: described in err, retrying will not help), or another
 * -errno (I/O). *out owned by the caller. err may be NULL. */
int mf_build_err(int dirfd, struct manifest **out, char *err, size_t errlen);
int mf_build(int dirfd, struct manifest **out);
/* The one rule for what a shard may hold, applied when this node seals a
 * tree (mf_build) and to every manifest decoded from a peer, the bucket or
 * the catalog (mf_decode): safe relative paths, sorted and unique, at most
 * MF_MAX_DEPTH levels, every entry's parent a directory entry, and symlink
 * targets relative and inside the shard (only leading "..", no further up
 * than the link's directory). 0 or -EBADMSG with the reason in err (may be
 * NULL). */
int mf_validate(const struct manifest *m, char *err, size_t errlen);
/* Map a walk's failure on a tree (-ELOOP, -ENAMETOOLONG, -EFBIG) to
 * -EBADMSG, "cannot be a shard", described in err; others pass through. */
int mf_refusal(int rc, char *err, size_t errlen);
/* Re-read every file under dirfd and compare with m. 0, -EBADMSG on any
 * mismatch (first one described in err), or -errno. */
int mf_verify(int dirfd, const struct manifest *m, char *err, size_t errlen);
/* Canonical binary encoding; *buf malloc'd, owned by the caller. */
int mf_encode(const struct manifest *m, uint8_t **buf, size_t *len);
/* Decode untrusted bytes: -EBADMSG on anything malformed (bad magic,
 * lengths, unsafe paths, duplicate or unsorted entries, hash mismatch). */
int mf_decode(const uint8_t *buf, size_t len, struct manifest **out);
/* The same, with the reason of a refusal in err (may be NULL). */
int mf_decode_err(const uint8_t *buf, size_t len, struct manifest **out, char *err,
		  size_t errlen);
void mf_free(struct manifest *m);
/* Lower-case hex of the hash into out[65]. */
void mf_hash_hex(const uint8_t hash[32], char out[65]);
int mf_hash_parse(const char *hex, uint8_t hash[32]);

#endif
