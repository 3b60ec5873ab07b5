/* mtcfs-cdcbench: what content-defined chunks would cost the seal (issue 27,
 * docs/chunks.md), and mtcfs's chunk lists of real files.
 *
 *   mtcfs-cdcbench [--size MiB] [--reps N] [--dir DIR] [--avg BYTES]
 *   mtcfs-cdcbench --list [--avg BYTES] FILE...
 *
 * Bench (default): one thread unless said, GB/s (10^9 bytes per second) of
 *   ram    a --size MiB buffer of random bytes in memory, walked in 1 MiB
 *          blocks: CRC32C alone (what the seal computes today, common/
 *          crc32c.h); the gear chunker alone (common/cdc.h); each candidate
 *          strong hash alone; CRC32C + chunking; CRC32C + chunking + a
 *          strong hash per chunk;
 *   file   a --size MiB file on DIR (tmpfs: /dev/shm by default) read with
 *          1 MiB preads: the same three seal variants, and two two-thread
 *          pipelines through a ring of 8 blocks: the reader does pread +
 *          CRC32C and a second thread cuts and hashes; or the reader also
 *          cuts and the second thread only hashes the chunks.
 * Chunks of --avg bytes (min avg / 4, max 4 x avg; default 16 KiB). Median
 * of --reps runs (default 7) with min..max; the variants alternate inside
 * each repetition, so a burst of other load hits them alike. Not a test.
 *
 * --list: one line per chunk of each FILE, "FILE OFFSET LENGTH SHA256",
 * for tests/bench/cdc_overlap.py. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/evp.h>
#ifdef MTCFS_HAVE_XXHASH
#include <xxhash.h>
#endif

#include "common/cdc.h"
#include "common/crc32c.h"
#include "common/io.h"
#include "common/util.h"

#define BLOCK (1u << 20)
#define MAXREPS 64

static void die(const char *what, int rc)
{
	fprintf(stderr, "cdcbench: %s: %s\n", what, strerror(rc < 0 ? -rc : rc));
	exit(2);
}

static int cmp_dbl(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double now_s(void)
{
	return (double)util_now_ns() / 1e9;
}

/* ---- the strong hashes, each over one chunk in pieces ------------------- */

enum hash_kind { H_NONE, H_SHA256, H_BLAKE2B, H_BLAKE2S, H_SHA512_256, H_XXH3 };

static const char *const hash_name[] = {
	[H_NONE] = "none", [H_SHA256] = "SHA-256 (OpenSSL)",
	[H_BLAKE2B] = "BLAKE2b-512 (OpenSSL)", [H_BLAKE2S] = "BLAKE2s-256 (OpenSSL)",
	[H_SHA512_256] = "SHA-512/256 (OpenSSL)", [H_XXH3] = "XXH3-128 (libxxhash, not cryptographic)",
};

struct hasher {
	enum hash_kind kind;
	EVP_MD *md;
	EVP_MD_CTX *ctx;
#ifdef MTCFS_HAVE_XXHASH
	XXH3_state_t *xs;
#endif
	uint64_t chunks;
	uint8_t last[64];      /* the last digest, kept so no call is dead code */
};

static void hasher_init(struct hasher *h, enum hash_kind kind)
{
	static const char *const evp_name[] = {
		[H_SHA256] = "SHA256", [H_BLAKE2B] = "BLAKE2B-512",
		[H_BLAKE2S] = "BLAKE2S-256", [H_SHA512_256] = "SHA512-256",
	};

	memset(h, 0, sizeof *h);
	h->kind = kind;
	if (kind == H_NONE)
		return;
	if (kind == H_XXH3) {
#ifdef MTCFS_HAVE_XXHASH
		h->xs = XXH3_createState();
		if (!h->xs)
			die("XXH3_createState", -ENOMEM);
		XXH3_128bits_reset(h->xs);
#endif
		return;
	}
	h->md = EVP_MD_fetch(NULL, evp_name[kind], NULL);
	h->ctx = EVP_MD_CTX_new();
	if (!h->md || !h->ctx || !EVP_DigestInit_ex(h->ctx, h->md, NULL))
		die(evp_name[kind], -EIO);
}

static void hasher_free(struct hasher *h)
{
	EVP_MD_CTX_free(h->ctx);
	EVP_MD_free(h->md);
#ifdef MTCFS_HAVE_XXHASH
	if (h->xs)
		XXH3_freeState(h->xs);
#endif
}

static void hasher_update(struct hasher *h, const void *p, size_t n)
{
	if (h->kind == H_NONE)
		return;
	if (h->kind == H_XXH3) {
#ifdef MTCFS_HAVE_XXHASH
		XXH3_128bits_update(h->xs, p, n);
#endif
	} else if (!EVP_DigestUpdate(h->ctx, p, n))
		die("EVP_DigestUpdate", -EIO);
}

/* ends the chunk: its digest into h->last, and starts the next one */
static void hasher_final(struct hasher *h)
{
	unsigned len = 0;

	h->chunks++;
	if (h->kind == H_NONE)
		return;
	if (h->kind == H_XXH3) {
#ifdef MTCFS_HAVE_XXHASH
		XXH128_hash_t d = XXH3_128bits_digest(h->xs);

		memcpy(h->last, &d, sizeof d);
		XXH3_128bits_reset(h->xs);
#endif
		return;
	}
	if (!EVP_DigestFinal_ex(h->ctx, h->last, &len) ||
	    !EVP_DigestInit_ex(h->ctx, h->md, NULL))
		die("EVP_DigestFinal_ex", -EIO);
}

/* ---- one seal pass over blocks ------------------------------------------ */

/* Cuts p[0 .. n) and hashes each chunk (as far as it lies in p). */
static void chunk_block(struct cdc *c, struct hasher *h, const uint8_t *p, size_t n)
{
	uint64_t clen;

	while (n > 0) {
		size_t k = cdc_scan(c, p, n, &clen);

		hasher_update(h, p, k);
		if (clen)
			hasher_final(h);
		p += k;
		n -= k;
	}
}

/* What the seal would do per block read: CRC32C always; cut points if c;
 * a strong hash per chunk if h->kind. Returns the CRC. */
static uint32_t seal_block(uint32_t crc, struct cdc *c, struct hasher *h,
			   const uint8_t *p, size_t n)
{
	crc = mf_crc32c(crc, p, n);
	if (c)
		chunk_block(c, h, p, n);
	return crc;
}

static void seal_end(struct cdc *c, struct hasher *h)
{
	if (c && cdc_finish(c))
		hasher_final(h);
}

static volatile uint32_t sink;

static double ram_pass(const uint8_t *buf, size_t size, struct cdc *c,
		       enum hash_kind hk, bool crc_on)
{
	struct hasher h;
	uint32_t crc = 0;
	double t0;

	hasher_init(&h, hk);
	t0 = now_s();
	for (size_t off = 0; off < size; off += BLOCK) {
		size_t n = size - off < BLOCK ? size - off : BLOCK;

		if (crc_on)
			crc = mf_crc32c(crc, buf + off, n);
		if (c)
			chunk_block(c, &h, buf + off, n);
		else if (!crc_on)
			hasher_update(&h, buf + off, n);   /* the hash's raw speed */
	}
	if (c)
		seal_end(c, &h);
	else
		hasher_final(&h);
	t0 = now_s() - t0;
	sink = crc ^ h.last[0];
	hasher_free(&h);
	return (double)size / t0 / 1e9;
}

static double file_pass(int fd, uint64_t size, uint8_t *blk, struct cdc *c,
			enum hash_kind hk)
{
	struct hasher h;
	uint32_t crc = 0;
	double t0;

	hasher_init(&h, hk);
	t0 = now_s();
	for (uint64_t off = 0; off < size;) {
		ssize_t n = pread(fd, blk, BLOCK, (off_t)off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			die("pread", n < 0 ? -errno : -EIO);
		crc = seal_block(crc, c, &h, blk, (size_t)n);
		off += (uint64_t)n;
	}
	seal_end(c, &h);
	t0 = now_s() - t0;
	sink = crc ^ h.last[0];
	hasher_free(&h);
	return (double)size / t0 / 1e9;
}

/* ---- the two-thread pipeline -------------------------------------------- */

#define RING 8

/* One block in flight: its bytes and, when the reader cuts, the offsets in
 * it just past each chunk that ends there. */
struct slot {
	uint8_t *blk;
	size_t len;
	size_t ncuts;
	uint32_t *cuts;        /* BLOCK / min + 1 entries */
};

struct pipe {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct slot *slot;     /* RING of them; a slot in [tail, head) is the
				* hasher's, any other the reader's */
	uint64_t head, tail;   /* protected by mu */
	bool done;             /* protected by mu */
	bool reader_cuts;      /* the reader cuts, the second thread only hashes */
	struct cdc *c;
	enum hash_kind hk;
};

static void *pipe_hasher(void *arg)
{
	struct pipe *pp = arg;
	struct hasher h;

	hasher_init(&h, pp->hk);
	for (;;) {
		struct slot *sl;

		pthread_mutex_lock(&pp->mu);
		while (pp->tail == pp->head && !pp->done)
			pthread_cond_wait(&pp->cv, &pp->mu);
		if (pp->tail == pp->head) {
			pthread_mutex_unlock(&pp->mu);
			break;
		}
		sl = &pp->slot[pp->tail % RING];
		pthread_mutex_unlock(&pp->mu);
		if (pp->reader_cuts) {
			size_t from = 0;

			for (size_t k = 0; k < sl->ncuts; k++) {
				hasher_update(&h, sl->blk + from, sl->cuts[k] - from);
				hasher_final(&h);
				from = sl->cuts[k];
			}
			hasher_update(&h, sl->blk + from, sl->len - from);
		} else {
			chunk_block(pp->c, &h, sl->blk, sl->len);
		}
		pthread_mutex_lock(&pp->mu);
		pp->tail++;
		pthread_cond_broadcast(&pp->cv);
		pthread_mutex_unlock(&pp->mu);
	}
	if (pp->reader_cuts)
		hasher_final(&h);     /* the file's last chunk (the reader saw its end) */
	else
		seal_end(pp->c, &h);
	sink ^= h.last[0];
	hasher_free(&h);
	return NULL;
}

/* The reader: pread + CRC32C (+ the cut points when reader_cuts). */
static double file_pass_2t(int fd, uint64_t size, struct slot *slots, struct cdc *c,
			   enum hash_kind hk, bool reader_cuts)
{
	struct pipe pp = { .slot = slots, .c = c, .hk = hk, .reader_cuts = reader_cuts };
	pthread_t t;
	uint32_t crc = 0;
	double t0;
	int rc;

	pthread_mutex_init(&pp.mu, NULL);
	pthread_cond_init(&pp.cv, NULL);
	t0 = now_s();
	rc = pthread_create(&t, NULL, pipe_hasher, &pp);
	if (rc)
		die("pthread_create", -rc);
	for (uint64_t off = 0; off < size;) {
		struct slot *sl;
		ssize_t n;

		pthread_mutex_lock(&pp.mu);
		while (pp.head - pp.tail == RING)
			pthread_cond_wait(&pp.cv, &pp.mu);
		sl = &pp.slot[pp.head % RING];
		pthread_mutex_unlock(&pp.mu);
		n = pread(fd, sl->blk, BLOCK, (off_t)off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			die("pread", n < 0 ? -errno : -EIO);
		crc = mf_crc32c(crc, sl->blk, (size_t)n);
		sl->len = (size_t)n;
		sl->ncuts = 0;
		for (size_t at = 0; reader_cuts && at < sl->len;) {
			uint64_t clen;

			at += cdc_scan(c, sl->blk + at, sl->len - at, &clen);
			if (clen)
				sl->cuts[sl->ncuts++] = (uint32_t)at;
		}
		off += (uint64_t)n;
		pthread_mutex_lock(&pp.mu);
		pp.head++;
		pthread_cond_broadcast(&pp.cv);
		pthread_mutex_unlock(&pp.mu);
	}
	if (reader_cuts)
		cdc_finish(c);   /* the hasher ends the last chunk itself */
	pthread_mutex_lock(&pp.mu);
	pp.done = true;
	pthread_cond_broadcast(&pp.cv);
	pthread_mutex_unlock(&pp.mu);
	pthread_join(t, NULL);
	t0 = now_s() - t0;
	sink ^= crc;
	pthread_mutex_destroy(&pp.mu);
	pthread_cond_destroy(&pp.cv);
	return (double)size / t0 / 1e9;
}

/* ---- output ------------------------------------------------------------- */

static double median(double *v, int n)
{
	double w[MAXREPS];

	memcpy(w, v, (size_t)n * sizeof *v);
	qsort(w, (size_t)n, sizeof *w, cmp_dbl);
	return w[n / 2];
}

/* ---- --list ------------------------------------------------------------- */

static void print_chunk(const char *path, uint64_t start, uint64_t len,
			struct hasher *h)
{
	hasher_final(h);
	printf("%s %llu %llu ", path, (unsigned long long)start, (unsigned long long)len);
	for (int i = 0; i < 32; i++)
		printf("%02x", h->last[i]);
	putchar('\n');
}

static int list_file(const char *path, struct cdc *c, uint8_t *blk)
{
	struct hasher h;
	uint64_t off = 0, start = 0, clen;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -errno;
	hasher_init(&h, H_SHA256);
	while ((n = io_read_upto(fd, blk, BLOCK)) > 0) {
		for (const uint8_t *p = blk, *e = p + n; p < e;) {
			size_t k = cdc_scan(c, p, (size_t)(e - p), &clen);

			hasher_update(&h, p, k);
			p += k;
			off += k;
			if (clen) {
				print_chunk(path, start, clen, &h);
				start = off;
			}
		}
	}
	clen = cdc_finish(c);
	if (n == 0 && clen)
		print_chunk(path, start, clen, &h);
	hasher_free(&h);
	close(fd);
	return n < 0 ? (int)n : 0;
}

int main(int argc, char **argv)
{
	const char *dir = "/dev/shm";
	uint64_t size_mib = 256, avg = CDC_AVG_DEFAULT, reps = 7;
	bool list = false;
	int i, rc;

	for (i = 1; i < argc; i++) {
		const char *a = argv[i];

		if (!strcmp(a, "--list")) {
			list = true;
		} else if (i + 1 < argc && !strcmp(a, "--size")) {
			if (util_parse_u64(argv[++i], 1u << 20, &size_mib) < 0 || !size_mib)
				die("--size", -EINVAL);
		} else if (i + 1 < argc && !strcmp(a, "--reps")) {
			if (util_parse_u64(argv[++i], MAXREPS, &reps) < 0 || !reps)
				die("--reps", -EINVAL);
		} else if (i + 1 < argc && !strcmp(a, "--avg")) {
			if (util_parse_u64(argv[++i], CDC_AVG_MAX, &avg) < 0)
				die("--avg", -EINVAL);
		} else if (i + 1 < argc && !strcmp(a, "--dir")) {
			dir = argv[++i];
		} else if (a[0] == '-') {
			fprintf(stderr, "usage: mtcfs-cdcbench [--size MiB] [--reps N] "
				"[--dir DIR] [--avg BYTES] | --list [--avg BYTES] FILE...\n");
			return 2;
		} else {
			break;
		}
	}
	struct cdc_params p = { .min = (uint32_t)avg / 4, .avg = (uint32_t)avg,
				.max = (uint32_t)avg * 4 };
	struct cdc *c = NULL;
	uint8_t *blk = malloc(BLOCK);

	rc = cdc_create(&p, &c);
	if (rc < 0 || !blk)
		die("cdc_create", rc < 0 ? rc : -ENOMEM);
	if (list) {
		for (; i < argc; i++) {
			rc = list_file(argv[i], c, blk);
			if (rc < 0)
				die(argv[i], rc);
		}
		cdc_close(c);
		free(blk);
		return 0;
	}

	size_t size = (size_t)size_mib << 20;
	uint8_t *buf = malloc(size);
	uint64_t s = 1;

	if (!buf)
		die("malloc", -ENOMEM);
	for (size_t k = 0; k < size; k += 8) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		memcpy(buf + k, &s, 8);
	}
	printf("chunks: avg %u, min %u, max %u; %llu MiB, %llu reps, blocks of 1 MiB\n\n",
	       p.avg, p.min, p.max, (unsigned long long)size_mib, (unsigned long long)reps);

	/* RAM: raw kernels */
	static const enum hash_kind hashes[] = {
		H_SHA256, H_BLAKE2B, H_BLAKE2S, H_SHA512_256,
#ifdef MTCFS_HAVE_XXHASH
		H_XXH3,
#endif
	};
	enum { NH = sizeof hashes / sizeof hashes[0] };
	double r_crc[MAXREPS], r_cdc[MAXREPS], r_h[NH][MAXREPS];
	double r_seal[MAXREPS], r_sealh[NH][MAXREPS];

	for (int r = 0; r < (int)reps + 1; r++) {
		/* repetition 0 warms the buffer and the caches: discarded */
		int k = r ? r - 1 : 0;

		r_crc[k] = ram_pass(buf, size, NULL, H_NONE, true);
		r_cdc[k] = ram_pass(buf, size, c, H_NONE, false);
		for (int h = 0; h < NH; h++)
			r_h[h][k] = ram_pass(buf, size, NULL, hashes[h], false);
		r_seal[k] = ram_pass(buf, size, c, H_NONE, true);
		for (int h = 0; h < NH; h++)
			r_sealh[h][k] = ram_pass(buf, size, c, hashes[h], true);
	}
	double base = median(r_crc, (int)reps);

	printf("| RAM, one thread | GB/s median | min .. max | s/GB | x CRC32C's time |\n|---|---|---|---|---|\n");
#define ROW(what, v) do { double m_ = median(v, (int)reps); \
		qsort(v, reps, sizeof(double), cmp_dbl); \
		printf("| %s | %.2f | %.2f .. %.2f | %.3f | %.2f |\n", what, m_, \
		       v[0], v[reps - 1], 1.0 / m_, base / m_); } while (0)
	ROW("CRC32C alone (the seal today)", r_crc);
	ROW("gear chunking alone", r_cdc);
	for (int h = 0; h < NH; h++) {
		char what[128];

		snprintf(what, sizeof what, "%s alone", hash_name[hashes[h]]);
		ROW(what, r_h[h]);
	}
	ROW("CRC32C + chunking", r_seal);
	for (int h = 0; h < NH; h++) {
		char what[128];

		snprintf(what, sizeof what, "CRC32C + chunking + %s per chunk",
			 hash_name[hashes[h]]);
		ROW(what, r_sealh[h]);
	}

	/* a file on DIR, 1 MiB preads */
	char path[4096];
	int fd;
	struct slot ring[RING];

	if (snprintf(path, sizeof path, "%s/mtcfs-cdcbench.%d", dir, (int)getpid()) >=
	    (int)sizeof path)
		die("--dir", -ENAMETOOLONG);
	fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		die(path, -errno);
	unlink(path);   /* gone on every way out; the fd keeps it */
	rc = io_pwrite_full(fd, buf, size, 0);
	if (rc < 0)
		die("pwrite", rc);
	for (int k = 0; k < RING; k++) {
		ring[k].blk = malloc(BLOCK);
		ring[k].cuts = malloc((BLOCK / p.min + 1) * sizeof *ring[k].cuts);
		if (!ring[k].blk || !ring[k].cuts)
			die("malloc", -ENOMEM);
	}
	double f[6][MAXREPS];

	for (int r = 0; r < (int)reps + 1; r++) {
		int k = r ? r - 1 : 0;

		f[0][k] = file_pass(fd, size, blk, NULL, H_NONE);
		f[1][k] = file_pass(fd, size, blk, c, H_NONE);
		f[2][k] = file_pass(fd, size, blk, c, H_SHA256);
		f[3][k] = file_pass_2t(fd, size, ring, c, H_SHA256, false);
		f[4][k] = file_pass_2t(fd, size, ring, c, H_SHA256, true);
#ifdef MTCFS_HAVE_XXHASH
		f[5][k] = file_pass(fd, size, blk, c, H_XXH3);
#endif
	}
	base = median(f[0], (int)reps);
	printf("\n| file on %s, 1 MiB preads | GB/s median | min .. max | s/GB | x CRC32C's time |\n|---|---|---|---|---|\n", dir);
	ROW("pread + CRC32C (the seal today)", f[0]);
	ROW("pread + CRC32C + chunking", f[1]);
	ROW("pread + CRC32C + chunking + SHA-256 per chunk", f[2]);
	ROW("same, chunking + SHA-256 on a second thread", f[3]);
	ROW("same, SHA-256 on a second thread (the reader cuts)", f[4]);
#ifdef MTCFS_HAVE_XXHASH
	ROW("pread + CRC32C + chunking + XXH3-128 per chunk", f[5]);
#endif
	close(fd);
	for (int k = 0; k < RING; k++) {
		free(ring[k].blk);
		free(ring[k].cuts);
	}
	free(buf);
	free(blk);
	cdc_close(c);
	return 0;
}
