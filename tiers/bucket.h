/* bucket: the backup tier's object store behind one interface, chosen by URL:
 * gs://BUCKET[/PREFIX] (Cloud Storage JSON API over libcurl, bucket_gcs.c) or
 * file:///abs/path (any POSIX directory: NFS, Lustre, gcsfuse; bucket_file.c).
 * Objects are named relative to the URL's prefix and are write-once.
 * A handle is thread-safe: backup workers, the coordinator and restore threads
 * may use one handle at once. Calls block on the network: never call from FUSE
 * threads. Functions return 0 or -errno; the words for the calling thread's
 * last failure are in bkt_last_error(). The caller keeps ownership of its fds
 * and buffers; the handle keeps none of them after a call returns. */
#ifndef MTCFS_TIERS_BUCKET_H
#define MTCFS_TIERS_BUCKET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct bkt;

struct bkt_opts {
	/* gs: endpoint override, e.g. "http://127.0.0.1:PORT"; else the
	 * STORAGE_EMULATOR_HOST environment variable; else
	 * https://storage.googleapis.com */
	const char *gcs_endpoint;
	/* gs: service-account JSON key (JWT RS256 -> token at its token_uri);
	 * else GOOGLE_APPLICATION_CREDENTIALS if it names a service-account
	 * key; else the metadata server. Ignored when STORAGE_EMULATOR_HOST is
	 * set (no credentials, like Google's client libraries). */
	const char *gcs_key_file;
	/* gs: metadata server host[:port]; else env GCE_METADATA_HOST; else
	 * metadata.google.internal */
	const char *metadata_host;
	int parallelism;           /* concurrent transfers of bkt_put_files/get_files; 0 -> 8 */
	/* Tuning, 0 = production default (tests shrink them): */
	size_t simple_max;         /* gs: largest single-request upload (8 MiB) */
	size_t chunk;              /* gs: resumable chunk, multiple of 256 KiB (16 MiB) */
	size_t part;               /* gs: ranged-download part (32 MiB) */
	unsigned list_page;        /* gs: maxResults per listing page (1000) */
};

/* Environment read at bkt_open (gs):
 *   MTCFS_GCS_RETRY="base_ms,cap_ms,attempts"   backoff (default 100,5000,10)
 *   MTCFS_GCS_TIMEOUTS="connect_ms,stall_s"     connect timeout, and the time
 *                                               a transfer may make no progress
 *                                               before it counts as broken
 *                                               (default 10000,60) */

/* Open "gs://BUCKET[/PREFIX]" or "file:///abs/path" (the directory is created
 * if missing). o may be NULL. -EINVAL (reason logged and in bkt_last_error)
 * on a malformed URL, unreadable key file, unknown scheme; *out owned by the
 * caller, freed with bkt_close(). */
int  bkt_open(const char *url, const struct bkt_opts *o, struct bkt **out);
void bkt_close(struct bkt *b);                 /* accepts NULL */
/* The URL as given (without a trailing '/'); valid until bkt_close. */
const char *bkt_url(const struct bkt *b);

/* Object names: relative, '/'-separated, no empty/"."/".." components, no
 * control characters, at most 1024 bytes with the prefix; -EINVAL otherwise.
 *
 * Writes are write-once: -EEXIST if the object exists (gs:
 * ifGenerationMatch=0 -> 412; file: link without replace). A retried gs
 * upload that meets 412 after an attempt that may have succeeded is resolved
 * by comparing the object's size and CRC32C with ours: equal -> 0.
 * bkt_put_file sends size bytes of fd from offset 0 (pread: the fd's offset
 * is untouched); crc32c is the CRC32C of those bytes, checked by the server
 * (gs) or after the copy (file): -EBADMSG when the data does not match it. */
int  bkt_put_file(struct bkt *b, const char *name, int fd, uint64_t size, uint32_t crc32c);
int  bkt_put_buf(struct bkt *b, const char *name, const void *buf, size_t len);

/* Download into fd from offset 0 (pwrite when fd is a regular file, which is
 * truncated to the object's size; plain write otherwise). gs: large objects
 * come as parallel ranged GETs. The CRC32C of what arrived is checked against
 * the server's (gs, x-goog-hash) and, if has_crc, against expect_crc:
 * -EBADMSG on a mismatch (never retried: the caller picks another source).
 * *size (may be NULL) gets the object's size. -ENOENT if absent. */
int  bkt_get_file(struct bkt *b, const char *name, int fd, uint64_t *size,
		  bool has_crc, uint32_t expect_crc);
/* Whole small object into a malloc'd buffer (NUL-terminated, not counted in
 * *len), owned by the caller. -EFBIG beyond max bytes, -ENOENT, -EBADMSG. */
int  bkt_get_buf(struct bkt *b, const char *name, size_t max, void **buf, size_t *len);
/* Size and CRC32C of an object; either pointer may be NULL. gs: from its
 * metadata; file: the CRC is computed by reading the file, only when crc32c
 * is not NULL. -ENOENT if absent. */
int  bkt_stat(struct bkt *b, const char *name, uint64_t *size, uint32_t *crc32c);

struct bkt_entry {
	const char *name;          /* relative to the bucket prefix; valid during the callback */
	bool is_prefix;            /* a "directory" (ends with the delimiter) */
	uint64_t size;
	bool has_crc;              /* gs lists CRC32C; file does not */
	uint32_t crc32c;
};
/* Every object whose name starts with prefix ("" = all), in bytewise name
 * order. With delim ("/" only, or NULL) names containing delim after the
 * prefix are rolled up into one is_prefix entry each. Pages are followed.
 * A non-zero return of cb stops the listing and is returned. */
int  bkt_list(struct bkt *b, const char *prefix, const char *delim,
	      int (*cb)(void *arg, const char *name, bool is_prefix, uint64_t size), void *arg);
int  bkt_list_ex(struct bkt *b, const char *prefix, const char *delim,
		 int (*cb)(void *arg, const struct bkt_entry *e), void *arg);

/* Only for restore.version and `prune`. -ENOENT if absent. */
int  bkt_delete(struct bkt *b, const char *name);

/* Several transfers, up to opts.parallelism at once, all attempted; returns
 * the first failure in array order (its words in bkt_last_error) or 0.
 * Each transfer uses fd if >= 0, else opens path under dirfd for itself
 * (put: O_RDONLY; get: created/truncated with mode, parent directories made),
 * so thousands of files never hold thousands of descriptors. */
struct bkt_xfer {
	const char *name;          /* object name */
	int fd;                    /* the local file, or -1: use dirfd + path */
	int dirfd;
	const char *path;
	uint32_t mode;             /* get via path: mode of the new file (0 -> 0644) */
	uint64_t size;             /* put: bytes to send; get: out, the object's size */
	uint32_t crc32c;           /* put: CRC32C of the data; get: expected when has_crc */
	bool has_crc;              /* get only */
	int rc;                    /* out: this transfer's 0 or -errno */
};
int  bkt_put_files(struct bkt *b, struct bkt_xfer *x, size_t n);
int  bkt_get_files(struct bkt *b, struct bkt_xfer *x, size_t n);

/* The calling thread's last failure in words, e.g. "gs://b/p: 403 Forbidden:
 * the caller lacks storage.objects.create (grant roles/storage.objectUser on
 * gs://b)". "" after a successful call. Valid until this thread's next bkt_
 * call. */
const char *bkt_last_error(void);

/* CRC32C of A+B from crc(A), crc(B) and len(B) (zlib's crc32_combine). */
uint32_t bkt_crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

/* ---- backend side: bucket.c dispatches to one table per URL scheme ----
 * (bucket_file.c, bucket_gcs.c). Names reaching a backend are validated;
 * the common code checks expected CRCs and runs the parallel helpers. */

struct bkt_src {                   /* the bytes of an upload */
	int fd;                    /* >= 0: pread from offset 0 ... */
	const void *buf;           /* ... else this buffer */
	uint64_t size;
	uint32_t crc32c;
};

struct bkt_ops {
	const char *scheme;        /* "gs", "file": the URL's "SCHEME://" */
	/* location = the URL after "SCHEME://"; *priv owned by the backend */
	int  (*open)(struct bkt *b, const char *location, void **priv);
	void (*close)(void *priv);
	int  (*put)(struct bkt *b, const char *name, const struct bkt_src *src);
	/* ranges: how many parallel ranged GETs this download may use;
	 * *crc32c: CRC32C of the bytes delivered, already checked against
	 * what the backend knows about the object */
	int  (*get_file)(struct bkt *b, const char *name, int fd, unsigned ranges,
			 uint64_t *size, uint32_t *crc32c);
	int  (*get_buf)(struct bkt *b, const char *name, size_t max, void **buf, size_t *len);
	int  (*stat)(struct bkt *b, const char *name, uint64_t *size, uint32_t *crc32c);
	int  (*list)(struct bkt *b, const char *prefix, const char *delim,
		     int (*cb)(void *arg, const struct bkt_entry *e), void *arg);
	int  (*del)(struct bkt *b, const char *name);
};

extern const struct bkt_ops bkt_file_ops;
extern const struct bkt_ops bkt_gcs_ops;
/* Test use only (NULL otherwise): one more backend bkt_open() accepts by
 * its scheme (the unit tests' in-memory bucket). Set it before any open. */
extern const struct bkt_ops *bkt_test_backend;

void *bkt_priv(const struct bkt *b);
/* For a backend's open: every object name gets a prefix of len bytes of
 * its own (gs://BUCKET/PREFIX/), which counts against BKT_NAME_MAX: a
 * longer name is refused with -ENAMETOOLONG before any request. */
void bkt_name_prefix(struct bkt *b, size_t len);
const struct bkt_opts *bkt_opts_of(const struct bkt *b);   /* defaults filled in */
/* Set the calling thread's last error (printf format). */
void bkt_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
bool bkt_has_error(void);
/* Downloads keep holes: write len bytes at off into a regular file that read
 * as zeros there before (a new or truncated file), skipping every piece that
 * is all zeros; pieces are cut at BKT_HOLE_BLOCK boundaries of the file
 * offset so that data and holes fall on page-sized blocks. The caller sets
 * the final length with ftruncate (trailing zeros are never written). */
#define BKT_HOLE_BLOCK 4096u
int  bkt_pwrite_sparse(int fd, const void *p, size_t len, uint64_t off);

#endif
