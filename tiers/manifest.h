/* manifest: the list of a shard's entries (relative path, type, size, mode,
 * owner, CRC32C per file) and the shard's content hash (SHA-256 over the
 * canonical encoding of the entries). Built by the engine's workers off the FUSE
 * threads; encoded into the catalog and the bucket; decoded from untrusted
 * bytes (peers, bucket) with every length and path bounded. A manifest is
 * owned by whoever built/decoded it and freed with mf_free(). */
#ifndef MTCFS_TIERS_MANIFEST_H
#define MTCFS_TIERS_MANIFEST_H

#include <stdbool.h>
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
	uint32_t uid, gid;   /* the writer's; 0 when the manifest has no owners */
	uint64_t size;       /* files only */
	uint32_t crc32c;     /* files only */
};

/* The mode a restore gives entry e (a manifest's): its permission bits,
 * and the sticky bit on a directory (it only narrows who may delete in it);
 * never set-user-ID or set-group-ID. A restored shard's modes come from a
 * peer, a bucket or erasure-code fragments (each restore path applies this
 * one rule): none of them may make a set-id file or directory on this node,
 * as the daemon's files are root's until their owners are applied. */
static inline uint32_t mf_restore_mode(const struct mf_entry *e)
{
	return e->mode & (e->type == MF_DIR ? 01777u : 0777u);
}

struct manifest {
	struct mf_entry *e;  /* sorted by path (bytewise) */
	size_t n;
	uint64_t total;      /* sum of file sizes */
	uint32_t nfiles;
	uint8_t hash[32];    /* SHA-256 of the encoded entries */
	/* Owners (version 2 of the encoding): every entry's uid/gid and the
	 * shard directory's own mode and owner, so that a copy restored on
	 * another node is readable by the uid/gid that wrote it. false: a
	 * manifest of version 1 (an older mtcfs) or one built from a tree
	 * whose owners mean nothing (a backup in GKE's layout, which keeps
	 * none): who owns its copies is then the caller's rule
	 * (mf_apply_owners). The hash covers the owners when they are there. */
	bool owners;
	uint32_t root_mode, root_uid, root_gid;
};

/* Walk the directory dirfd (iteratively, at most MF_MAX_DEPTH levels) and
 * build its manifest (CRC of every file). 0, -EBADMSG when the tree cannot
 * be a shard (too deep, a path too long, too many entries, a symlink that
 * points outside: described in err, retrying will not help), or another
 * -errno (I/O). *out owned by the caller. err may be NULL. */
int mf_build_err(int dirfd, struct manifest **out, char *err, size_t errlen);
int mf_build(int dirfd, struct manifest **out);
/* The same without owners (manifest->owners false, version 1): for a tree
 * this node downloaded, whose owners are the daemon's and not the
 * writer's. */
int mf_build_ownerless(int dirfd, struct manifest **out);
/* Who owns what a manifest without owners describes, and the umask that
 * its modes (which such a source does not keep: GKE's layout restores
 * files 0644) get: only group and other bits. */
struct mf_owner {
	uint32_t uid, gid;
	uint32_t umask;
};
/* Give the tree under dirfd (a stage about to be published) the owners and
 * modes m records: each entry's uid/gid (m->owners), or else dflt's uid/gid
 * and the recorded modes less dflt's umask; modes without setuid/setgid (a
 * chown clears those anyway) and, but for directories, sticky; the directory dirfd itself too (its mode
 * from m, or its own less the umask). dflt may be NULL when m->owners. Only
 * a daemon running as root can and does (otherwise 0 and nothing changed:
 * every copy is then the daemon's uid's). Symlinks get owners only; with
 * MF_OWN_NOT_FILES regular files are not touched. 0 or -errno (what failed
 * in err). */
#define MF_OWN_NOT_FILES 1u   /* leave regular files alone (hard links of the writer's) */
int mf_apply_owners(int dirfd, const struct manifest *m, const struct mf_owner *dflt,
		    unsigned flags, char *err, size_t errlen);
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
/* Canonical binary encoding; *buf malloc'd, owned by the caller. Version
 * 2 (with owners) when m->owners, else version 1, byte for byte what an
 * older mtcfs writes (the hash of a version-1 manifest stays the same). */
int mf_encode(const struct manifest *m, uint8_t **buf, size_t *len);
/* Decode untrusted bytes, version 1 or 2: -EBADMSG on anything malformed
 * (bad magic, lengths, unsafe paths, duplicate or unsorted entries, hash
 * mismatch). */
int mf_decode(const uint8_t *buf, size_t len, struct manifest **out);
/* The same, with the reason of a refusal in err (may be NULL). */
int mf_decode_err(const uint8_t *buf, size_t len, struct manifest **out, char *err,
		  size_t errlen);
void mf_free(struct manifest *m);
/* Lower-case hex of the hash into out[65]. */
void mf_hash_hex(const uint8_t hash[32], char out[65]);
int mf_hash_parse(const char *hex, uint8_t hash[32]);

#endif
