/* ec_i: what the pieces of tiers/ec (ec.c, ec_frag.c, ec_enc.c, ec_dec.c)
 * share and nothing outside tiers/ec*.c may use: the parsed fragment, the
 * shard byte stream and the fragment-format helpers. Same contract as ec.h:
 * blocking file I/O on the caller's thread, descriptors stay the caller's. */
#ifndef MTCFS_TIERS_EC_I_H
#define MTCFS_TIERS_EC_I_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "tiers/ec.h"

/* The err/errlen of a public call, or the caller's own small dummy when it
 * passed none: the code below writes messages without checking. */
static inline void ec_err_buf(char **err, size_t *errlen, char *dummy, size_t dummylen)
{
	if (!*err || !*errlen) {
		*err = dummy;
		*errlen = dummylen;
	}
}

static inline uint64_t member_len(const struct ec_geom *g, unsigned index)
{
	return index < g->k ? g->d[index].len : ec_cw_len(g);
}

/* Lengths and offsets bounded so that no sum of them (fragment size,
 * stream end) can wrap around 2^64: a header from a peer is untrusted. */
static inline bool geom_ok(const struct ec_geom *g)
{
	if (!g || g->k < 1 || g->m < 1 || g->k + g->m > EC_MAX_N || g->seg < EC_SEG_MIN ||
	    g->seg > EC_SEG_MAX)
		return false;
	for (unsigned j = 0; j < g->k; j++)
		if (g->d[j].len > EC_MAX_MEMBER || g->d[j].off > EC_MAX_MEMBER)
			return false;
	return true;
}

static inline bool geom_eq(const struct ec_geom *a, const struct ec_geom *b)
{
	if (a->k != b->k || a->m != b->m || a->seg != b->seg ||
	    memcmp(a->label, b->label, EC_LABEL_LEN))
		return false;
	return !memcmp(a->d, b->d, a->k * sizeof a->d[0]);
}

struct trailer {
	uint32_t mask;                 /* bit j: crc[j] is known */
	uint32_t crc[EC_MAX_N];        /* data members' original bytes */
	uint32_t payload_crc;
};

/* A fragment's parsed header and trailer (ec_frag_read_info). */
struct frag {
	int fd;
	unsigned index;
	struct ec_geom g;
	struct trailer t;
	uint64_t len;        /* payload bytes */
};

/* A shard's byte stream: its MF_FILE entries concatenated (ec_stream_*). */
struct stream {
	int dirfd;
	const struct manifest *mf;
	size_t *ent;         /* indices of the MF_FILE entries */
	uint64_t *start;     /* their offsets in the stream */
	size_t nf;
	uint64_t total;
	size_t cur;          /* ent[] index of fd */
	int fd;
	bool wr;
	bool rewrite;        /* writing again: zeros overwrite what a failed attempt wrote */
};

static inline bool shard_matches(const struct ec_shard *s, const struct ec_member_desc *d,
				 uint64_t total)
{
	return !memcmp(s->mf->hash, d->shard, 32) && d->off <= total && d->len <= total - d->off;
}

void ec_hdr_encode(const struct ec_geom *g, unsigned index, uint8_t *h);
void ec_trl_encode(unsigned k, const struct trailer *t, uint8_t *b);
int ec_write_full(int fd, const void *buf, size_t len);
int ec_pwrite_full(int fd, const void *buf, size_t len, uint64_t off);
int ec_pread_full(int fd, void *buf, size_t len, uint64_t off);
void *ec_seg_alloc(size_t n);
int ec_hdr_fixed(const uint8_t fixed[44], unsigned *k, unsigned *m, char *err, size_t errlen);
int ec_hdr_parse(const uint8_t *h, unsigned k, unsigned m, struct frag *f, char *err,
		 size_t errlen);
int ec_trl_parse(const uint8_t *tb, struct frag *f, char *err, size_t errlen);
int ec_frag_read_info(int fd, struct frag *f, char *err, size_t errlen);
int ec_frag_read(const struct frag *f, uint64_t off, uint8_t *buf, size_t len);
int ec_frag_check_payload(const struct frag *f, uint8_t *buf, size_t seg);
int ec_stream_open(struct stream *s, const struct ec_shard *sh, bool wr);
void ec_stream_close(struct stream *s);
int ec_stream_io(struct stream *s, uint64_t off, uint8_t *buf, size_t len, char *err,
		 size_t errlen);
int ec_stream_punch(struct stream *s, uint64_t off, uint64_t len);
int ec_coding_matrix(unsigned k, unsigned m, uint8_t **a);

#endif
