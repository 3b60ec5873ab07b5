/* cdc: content-defined chunking, the cut points that let two copies of the
 * same bytes at different offsets or under different names (data-parallel
 * checkpoint twins, docs/chunks.md) be cut into the same chunks.
 * One struct cdc per stream (one file at a time), used by one thread at a
 * time; different handles share nothing. The caller owns its buffers and
 * the handle (cdc_create .. cdc_close); nothing here keeps a pointer into a
 * caller's buffer after a call returns.
 *
 * The algorithm is FastCDC-style: a Gear rolling hash
 *     h = (h << 1) + gear[byte]        (64-bit, wrapping)
 * whose top bits depend on the last 64 bytes only: whether a position
 * passes a mask depends on the 64 bytes before it, not on where the chunk
 * began (which mask applies does, below). Normalized chunking: between min
 * and avg a cut needs the top log2(avg) + 2 bits of h to be zero (stricter),
 * from avg on the top log2(avg) - 2 bits (looser), and max cuts regardless.
 * No cut before min; the hash starts 64 bytes before min, so the test at
 * min already sees a full window. Chunk sizes cluster around avg (the mean
 * is 1.09-1.15 x avg with min = avg / 4 on checkpoints and random bytes,
 * docs/chunks.md).
 *
 * The gear table is mtcfs's own: entry i is SplitMix64 (Steele, Lea and
 * Flood, "Fast splittable pseudorandom number generators", 2014: add
 * 0x9e3779b97f4a7c15, then the xor-shift-multiply finaliser) of the state
 * after i + 1 steps from the seed CDC_GEAR_SEED. Changing the seed, the
 * mixer or the masks changes every cut point, and with it every chunk's
 * identity across versions: tests/unit/test_cdc.c pins them.
 *
 * Streaming: feed the bytes of one file in buffers of any size; the cut
 * points are the same as for one call over the whole file. Chunks never
 * span files: cdc_finish() ends the last chunk of a file and readies the
 * handle for the next one.
 *
 * Which strong hash names a chunk is the caller's (this layer links no
 * crypto library): mtcfs uses SHA-256 (OpenSSL, SHA-NI), measured against
 * BLAKE2 and XXH3 in docs/chunks.md. */
#ifndef MTCFS_COMMON_CDC_H
#define MTCFS_COMMON_CDC_H

#include <stddef.h>
#include <stdint.h>

#define CDC_GEAR_SEED 0x6d746366732d6364ull   /* "mtcfs-cd" */

/* Accepted ranges (cdc_create refuses anything else with -EINVAL):
 *   avg  a power of two, CDC_AVG_MIN .. CDC_AVG_MAX
 *   min  CDC_WINDOW .. avg / 2
 *   max  2 * avg .. CDC_MAX_MAX
 * mtcfs's choice (docs/chunks.md): 16 KiB average, 4 KiB min, 64 KiB max. */
#define CDC_WINDOW   64u                 /* bytes the gear hash looks back */
#define CDC_AVG_MIN  (1u << 10)
#define CDC_AVG_MAX  (1u << 22)
#define CDC_MAX_MAX  (1u << 26)
#define CDC_AVG_DEFAULT (16u << 10)
#define CDC_MIN_DEFAULT (CDC_AVG_DEFAULT / 4)
#define CDC_MAX_DEFAULT (CDC_AVG_DEFAULT * 4)

struct cdc_params {
	uint32_t min, avg, max;          /* bytes */
};

struct cdc;

/* 0 if p is in the ranges above, else -EINVAL. */
int cdc_params_check(const struct cdc_params *p);

/* A new handle for parameters p (copied), positioned at the start of a
 * file. NULL p = the defaults. 0, or -EINVAL (p out of range) or -ENOMEM;
 * on error *out is NULL. Free with cdc_close. */
int cdc_create(const struct cdc_params *p, struct cdc **out);

/* Frees c; NULL is a no-op. */
void cdc_close(struct cdc *c);

/* Scans buf[0 .. len) as the next bytes of the current file, up to the
 * first cut point in it. Returns how many bytes of buf were consumed
 * (<= len). If a chunk ended at the last consumed byte, *chunk_len is that
 * chunk's length (which may include bytes of earlier calls) and the next
 * chunk starts at the following byte; otherwise *chunk_len = 0 and all
 * len bytes were consumed. Callers loop until the buffer is used up:
 *
 *     while (len > 0) {
 *             size_t k = cdc_scan(c, p, len, &clen);
 *             hash_update(p, k);
 *             if (clen) emit_chunk(clen, hash_final());
 *             p += k; len -= k;
 *     }
 *
 * Never fails; len 0 consumes nothing and cuts nothing. */
size_t cdc_scan(struct cdc *c, const void *buf, size_t len, uint64_t *chunk_len);

/* Ends the current file: returns the length of its last chunk (the bytes
 * scanned since the last cut; 0 if there were none: an empty file has no
 * chunk) and resets c for the next file. */
uint64_t cdc_finish(struct cdc *c);

/* Entry i (0..255) of the gear table, for tests and tools. */
uint64_t cdc_gear(unsigned i);

#endif /* MTCFS_COMMON_CDC_H */
