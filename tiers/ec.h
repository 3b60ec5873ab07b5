/* ec: Reed-Solomon erasure coding of shards (issue 17), the byte side: the
 * fragment format, streaming encode and decode with ISA-L, and the parsing
 * of the `redundancy` setting. Which node holds which fragment is
 * tiers/ecplan.h. Every function here blocks on file I/O and computes: call
 * it on a worker thread, never on a FUSE thread. No global state; handles
 * are the caller's descriptors, which stay the caller's (never closed here).
 *
 * The code (see ecplan.h for why it runs ACROSS shards, not within one):
 * a codeword has K data members and M parity members. Data member j is a
 * slice [off, off + len) of one shard's byte stream -- the shard's MF_FILE
 * entries in manifest order, concatenated (holes read as zeros), so the
 * owner keeps its shard whole and the data members cost no extra RAM.
 * Parity member j is ISA-L's Cauchy row K + j over the K data members,
 * each zero-padded to the codeword length (the longest member). Any K of
 * the K + M members give back every member.
 *
 * A fragment is one member as a file (or a stream of it):
 *     header  | payload (len bytes) | trailer
 * header (little-endian, EC_HDR_LEN(K) bytes): "MTCFSEC\0", version 1,
 *     K, M, index (0..K-1 data, K..K+M-1 parity), segment size, codeword
 *     length, a 16-byte label chosen by the caller (same for the whole
 *     codeword: job/step/group/codeword), then per data member its length,
 *     offset in its shard's stream and the shard's content hash; its CRC32C.
 * trailer (EC_TRL_LEN(K) bytes): a bit mask of the known member CRCs, the
 *     CRC32C of each data member's original bytes (a data fragment knows
 *     its own, a parity fragment all K), the CRC32C of this payload, and
 *     the trailer's own CRC32C. The trailer comes last so that a fragment
 *     can be written in one pass to a socket.
 * CRC32C is the project's (mf_crc32c, ISA-L crc32_iscsi). */
#ifndef MTCFS_TIERS_EC_H
#define MTCFS_TIERS_EC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tiers/manifest.h"

/* K + M per codeword. ISA-L's Cauchy matrix is MDS up to 256 rows; 32 keeps
 * the header small and a group within one failure-domain plan. */
#define EC_MAX_N 32u
#define EC_MAGIC "MTCFSEC"            /* 8 bytes with its NUL */
#define EC_VERSION 1u
#define EC_LABEL_LEN 16u
#define EC_HDR_LEN(k) (44u + 48u * (unsigned)(k) + 4u)
#define EC_TRL_LEN(k) (12u + 4u * (unsigned)(k))
#define EC_SEG_DEFAULT (1u << 20)     /* 1 MiB: (K + M) x this is the working set */
#define EC_SEG_MIN 4096u
/* A reader sizes its buffers from the header's segment size, and headers
 * come from peers: at most 1 MiB keeps any encode or decode within
 * EC_MAX_N x 1 MiB (ISA-L is at full speed well below that). */
#define EC_SEG_MAX EC_SEG_DEFAULT
/* A member's length and offset (64 PiB): far above any shard, low enough
 * that no sum of them wraps. A geometry beyond it is -EINVAL/-EBADMSG. */
#define EC_MAX_MEMBER (1ULL << 56)

/* ---- the `redundancy` setting ---- */
enum ec_kind { EC_REPLICATION = 0, EC_RS = 1 };
struct ec_redundancy {
	enum ec_kind kind;
	unsigned k, m;       /* EC_RS only */
};
/* "replication" (also NULL or "": the default) or "rs:K+M" with decimal
 * K >= 1, M >= 1, K + M <= EC_MAX_N, no sign, spaces or leading zeros.
 * 0, or -EINVAL with one line for replicator.errors in err (may be NULL). */
int ec_parse_redundancy(const char *s, struct ec_redundancy *out, char *err, size_t errlen);
/* "replication" or "rs:K+M" into buf; returns buf. */
const char *ec_redundancy_str(const struct ec_redundancy *r, char *buf, size_t len);

/* ---- codeword geometry ---- */
struct ec_member_desc {
	uint64_t len;        /* bytes of the member (its slice of the shard) */
	uint64_t off;        /* where the slice starts in the shard's stream */
	uint8_t shard[32];   /* the shard's content hash (manifest.hash) */
};
struct ec_geom {
	unsigned k, m;
	uint32_t seg;                          /* EC_SEG_MIN..EC_SEG_MAX */
	uint8_t label[EC_LABEL_LEN];
	struct ec_member_desc d[EC_MAX_N];     /* the K data members */
};
/* Longest data member: the payload length of every parity fragment. */
uint64_t ec_cw_len(const struct ec_geom *g);
/* Piece t (0..k-1) of a shard stream of `total` bytes cut in k: pieces of
 * ceil(total / k) rounded up to 4 KiB, the last ones shorter or empty. */
void ec_split(uint64_t total, unsigned k, unsigned t, uint64_t *off, uint64_t *len);
/* Bytes of one fragment file of member `index`: header + payload + trailer. */
uint64_t ec_frag_size(const struct ec_geom *g, unsigned index);
/* Heap the encoder or decoder needs besides ISA-L tables: (K + M) x seg. */
uint64_t ec_work_bytes(unsigned k, unsigned m, uint32_t seg);

/* A shard on disk: its directory and manifest (both borrowed). */
struct ec_shard {
	int dirfd;
	const struct manifest *mf;
};

/* Data fragment `index` (< K) of g, read from the shard (which must be the
 * one g->d[index] names: its hash and a stream long enough), written to fd
 * in one sequential pass (a file, pipe or socket). 0, -EINVAL (geometry),
 * -EBADMSG (the shard is shorter than the manifest says: err says which
 * file), or -errno of the I/O. */
int ec_frag_data(const struct ec_geom *g, unsigned index, const struct ec_shard *src, int fd,
		 char *err, size_t errlen);

/* Parity: reads the k data fragments in[0..k-1] (regular files, any order;
 * their headers name their index), checks every header, payload and
 * trailer CRC, and writes parity fragment k + j to out[j], j < m (regular
 * files, truncated and written from offset 0). k and m are the caller's:
 * headers saying otherwise are refused. Bounded memory: ec_work_bytes().
 * 0, -EINVAL (k, m), -EBADMSG (a data fragment is malformed, corrupt, for
 * another rs:K+M or codeword, or an index twice: err says which), or
 * -errno. On an error out[] hold no fragment a reader accepts (the
 * trailers are written last, after every member's CRC matched). */
int ec_encode(const int *in, unsigned k, const int *out, unsigned m, char *err, size_t errlen);

/* Incremental parity, for data fragments that arrive over the network one
 * member at a time, in any order, and are never stored: each is read once,
 * sequentially, and folded into the M parity files (GF(2^8) is linear:
 * ISA-L's ec_encode_data_update). The parity holder's extra memory is
 * (cnt + 1) x seg whatever the shard size, and no RAM holds the K data
 * members (ec_encode needs them as files: S more on the node while a
 * codeword is encoded).
 *   ec_enc_open:   g is the codeword (ecplan_geom); out[0..cnt-1] regular
 *                  files for parity slots K + first .. K + first + cnt - 1
 *                  (truncated, header written, payload zeros): a holder of
 *                  one slot asks for that one (cnt 1, 1/M of the work of
 *                  all M). *e owned by the caller. 0, -EINVAL (geometry,
 *                  slots), -ENOMEM or -errno.
 *   ec_enc_add:    reads exactly one data fragment, ec_frag_size() bytes,
 *                  from fd (a file at its current offset, a pipe or a
 *                  socket), checks that it belongs to g and its CRCs, and
 *                  folds it in. -EBADMSG (err says why): a header of another
 *                  codeword or an index already added leaves the encoder as
 *                  it was (nothing read past the header); a payload or
 *                  trailer that fails after folding spoils it: it stays
 *                  failed, every later call returns that error (start the
 *                  codeword again). -errno of the read likewise.
 *   ec_enc_finish: all K added: writes the trailers. -ENODATA (err names a
 *                  missing member) or the failure.
 *   ec_enc_free:   accepts NULL; does not close out[]. */
struct ec_enc;
int ec_enc_open(const struct ec_geom *g, unsigned first, unsigned cnt, const int *out,
		struct ec_enc **e);
int ec_enc_add(struct ec_enc *e, int fd, char *err, size_t errlen);
int ec_enc_finish(struct ec_enc *e, char *err, size_t errlen);
void ec_enc_free(struct ec_enc *e);

/* Where a rebuilt member goes. */
struct ec_sink {
	const struct ec_shard *shard;  /* a data member: into these files (prepared) */
	int fd;                        /* else: a fragment file of that index */
};
/* Rebuild member `want` of a codeword from n candidate fragments in[]
 * (regular files; any indices, duplicates, junk). A candidate whose header,
 * trailer or payload CRC fails, or that belongs to another codeword than
 * the majority, is treated as lost and the next one used. The rebuilt bytes
 * are checked against the member CRC the fragments carry.
 *   want < K with sink->shard: the member's slice is written into the
 *     shard's files (prepared with ec_shard_prepare); all-zero 4 KiB blocks
 *     are not written, so holes stay holes. The survivors' payload CRCs are
 *     checked while decoding (one read of each); a corrupt one costs a
 *     second decode that zeros what the first wrote wrongly and punches
 *     the zero pages wholly inside the member (a page shared with the next
 *     member that the wrong bytes hit stays allocated, as zeros).
 *     Members of one shard may be decoded in parallel: only pages wholly
 *     inside this member are punched.
 *   otherwise sink->fd receives the whole fragment `want` (a lost parity,
 *     or a data fragment to send to a peer), written in one pass (a socket
 *     works); each survivor's payload is checked before the first byte.
 * Memory: (K + 1) x seg.
 * 0; -ENODATA when fewer than K good fragments are left (err lists which
 * indices were found and why others were refused); -EBADMSG if the rebuilt
 * bytes fail their CRC (should not happen: a fragment lied); -EINVAL; or
 * -errno. */
int ec_decode(const int *in, unsigned n, unsigned want, const struct ec_sink *sink, char *err,
	      size_t errlen);

/* Read and check one fragment's header and trailer (not its payload): fills
 * *g and *index. 0 or -EBADMSG (reason in err). */
int ec_frag_info(int fd, struct ec_geom *g, unsigned *index, char *err, size_t errlen);
/* The same and the payload's CRC32C too (mtcfs-admin verify, the start-up
 * scan of stored fragments that a crash may have left half written).
 * 0, -EBADMSG (reason in err), -ENOMEM or -errno. */
int ec_frag_verify(int fd, struct ec_geom *g, unsigned *index, char *err, size_t errlen);

/* Before decoding into a shard: creates under dirfd every directory,
 * symlink and FIFO of mf and every file at its final size with no data
 * (sparse, mode 0600 until ec_shard_finish). Existing files are truncated.
 * 0, -EBADMSG (an unsafe path) or -errno. */
int ec_shard_prepare(const struct ec_shard *s);
/* After every data member of the shard is decoded: sets the modes and
 * checks every file against the manifest (mf_verify). 0, -EBADMSG (err
 * names the first file that differs) or -errno. */
int ec_shard_finish(const struct ec_shard *s, char *err, size_t errlen);

/* ---- what a RAMDIR stores of the code ----
 * A step's erasure-code holding on a node is a catalog record of the RAM
 * tier (catalog.h SHF_PARITY; cluster/engine_ec.c writes its files, through
 * ram_parity_open), its directory RAMDIR/shards/JOB/STEP/parity/ holding
 * parity fragments g<G>-c<CW>-s<SLOT>.frag, the group's manifests m<R>.mf,
 * the markers "sent" and "protected", and temporary files (*.tmp,
 * .*.mtcfs-tmp) while something is written. ec_stored_walk_dir calls fn for
 * every entry of one such directory (stepfd, borrowed; job and step are
 * handed to fn), in directory order, checked as `check` says (verdict,
 * why): EC_CHECK_NONE; EC_CHECK_HEAD, a fragment's header and trailer
 * (ec_frag_info) and a manifest decoded; EC_CHECK_ALL, the fragment's
 * payload CRC32C too (ec_frag_verify). fn may unlink in stepfd and returns
 * 0 to go on, else the walk stops and returns that. 0 or -errno. Reads
 * only. */
#define EC_STORED_META_MAX (64u << 20)   /* a manifest file read back */
enum ec_stored_kind { ECS_FRAG, ECS_META, ECS_MARK, ECS_TMP, ECS_OTHER };
enum ec_check { EC_CHECK_NONE, EC_CHECK_HEAD, EC_CHECK_ALL };
struct ec_stored {
	const char *job;        /* borrowed for the call */
	uint64_t step;
	const char *name;       /* the entry's name in the step directory */
	enum ec_stored_kind kind;
	int owner;              /* ECS_META: the owner rank of m<R>.mf, else -1 */
	uint64_t bytes;         /* what it takes in RAM (st_blocks) */
	int verdict;            /* checked: 0, -EBADMSG or -errno */
	char why[256];          /* verdict < 0: the reason */
};
typedef int (*ec_stored_fn)(void *arg, int stepfd, const struct ec_stored *s);
int ec_stored_walk_dir(int stepfd, const char *job, uint64_t step, enum ec_check check,
		       ec_stored_fn fn, void *arg);

#endif /* MTCFS_TIERS_EC_H */
