/* Erasure coding of shards: fragment format, encode, decode (see ec.h). */
#include "tiers/ec.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <isa-l/erasure_code.h>

#define PIECE_ALIGN 4096u
#define HOLE_BLOCK 4096u   /* zero blocks of this size are left unwritten */

/* ---- the `redundancy` setting ---- */

/* 1..2 decimal digits without a leading zero, ending at *end. */
static int parse_small(const char *s, const char **end, unsigned *out)
{
	unsigned v = 0;
	size_t n = 0;

	while (s[n] >= '0' && s[n] <= '9') {
		if (n == 2)
			return -EINVAL;
		v = v * 10 + (unsigned)(s[n] - '0');
		n++;
	}
	if (n == 0 || (n > 1 && s[0] == '0'))
		return -EINVAL;
	*end = s + n;
	*out = v;
	return 0;
}

int ec_parse_redundancy(const char *s, struct ec_redundancy *out, char *err, size_t errlen)
{
	const char *p;
	unsigned k, m;
	char dummy[1];

	if (!err || !errlen) {
		err = dummy;
		errlen = sizeof dummy;
	}
	err[0] = '\0';
	if (!out)
		return -EINVAL;
	if (!s || !*s || !strcmp(s, "replication")) {
		*out = (struct ec_redundancy){ .kind = EC_REPLICATION };
		return 0;
	}
	if (strncmp(s, "rs:", 3) || parse_small(s + 3, &p, &k) || *p != '+' ||
	    parse_small(p + 1, &p, &m) || *p) {
		snprintf(err, errlen,
			 "redundancy: '%.64s' is neither 'replication' nor 'rs:K+M' (e.g. rs:4+2)", s);
		return -EINVAL;
	}
	if (k < 1 || m < 1 || k + m > EC_MAX_N) {
		snprintf(err, errlen, "redundancy: rs:%u+%u needs K >= 1, M >= 1 and K + M <= %u", k, m,
			 EC_MAX_N);
		return -EINVAL;
	}
	*out = (struct ec_redundancy){ .kind = EC_RS, .k = k, .m = m };
	return 0;
}

const char *ec_redundancy_str(const struct ec_redundancy *r, char *buf, size_t len)
{
	if (r->kind == EC_RS)
		snprintf(buf, len, "rs:%u+%u", r->k, r->m);
	else
		snprintf(buf, len, "replication");
	return buf;
}

/* ---- geometry ---- */

uint64_t ec_cw_len(const struct ec_geom *g)
{
	uint64_t mx = 0;

	for (unsigned j = 0; j < g->k && j < EC_MAX_N; j++)
		if (g->d[j].len > mx)
			mx = g->d[j].len;
	return mx;
}

void ec_split(uint64_t total, unsigned k, unsigned t, uint64_t *off, uint64_t *len)
{
	uint64_t piece, o;

	if (k == 0) {
		*off = *len = 0;
		return;
	}
	piece = total / k + (total % k != 0);
	piece = (piece + PIECE_ALIGN - 1) / PIECE_ALIGN * PIECE_ALIGN;
	o = piece * t;
	if (o >= total) {
		*off = total;
		*len = 0;
		return;
	}
	*off = o;
	*len = total - o < piece ? total - o : piece;
}

static uint64_t member_len(const struct ec_geom *g, unsigned index)
{
	return index < g->k ? g->d[index].len : ec_cw_len(g);
}

uint64_t ec_frag_size(const struct ec_geom *g, unsigned index)
{
	return EC_HDR_LEN(g->k) + member_len(g, index) + EC_TRL_LEN(g->k);
}

uint64_t ec_work_bytes(unsigned k, unsigned m, uint32_t seg)
{
	return (uint64_t)(k + m) * seg;
}

/* Lengths and offsets bounded so that no sum of them (fragment size,
 * stream end) can wrap around 2^64: a header from a peer is untrusted. */
static bool geom_ok(const struct ec_geom *g)
{
	if (!g || g->k < 1 || g->m < 1 || g->k + g->m > EC_MAX_N || g->seg < EC_SEG_MIN ||
	    g->seg > EC_SEG_MAX)
		return false;
	for (unsigned j = 0; j < g->k; j++)
		if (g->d[j].len > EC_MAX_MEMBER || g->d[j].off > EC_MAX_MEMBER)
			return false;
	return true;
}

static bool geom_eq(const struct ec_geom *a, const struct ec_geom *b)
{
	if (a->k != b->k || a->m != b->m || a->seg != b->seg ||
	    memcmp(a->label, b->label, EC_LABEL_LEN))
		return false;
	return !memcmp(a->d, b->d, a->k * sizeof a->d[0]);
}

/* ---- little-endian codec ---- */

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
	uint32_t v = 0;

	for (int i = 3; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static uint64_t get64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* Header of fragment `index` into h[EC_HDR_LEN(g->k)]. */
static void hdr_encode(const struct ec_geom *g, unsigned index, uint8_t *h)
{
	uint8_t *p = h + 44;

	memset(h, 0, EC_HDR_LEN(g->k));
	memcpy(h, EC_MAGIC, 8);
	h[8] = EC_VERSION & 0xff;
	h[9] = EC_VERSION >> 8;
	h[10] = (uint8_t)g->k;
	h[11] = (uint8_t)g->m;
	h[12] = (uint8_t)index;
	put32(h + 16, g->seg);
	put64(h + 20, ec_cw_len(g));
	memcpy(h + 28, g->label, EC_LABEL_LEN);
	for (unsigned j = 0; j < g->k; j++, p += 48) {
		put64(p, g->d[j].len);
		put64(p + 8, g->d[j].off);
		memcpy(p + 16, g->d[j].shard, 32);
	}
	put32(p, mf_crc32c(0, h, (size_t)(p - h)));
}

struct trailer {
	uint32_t mask;                 /* bit j: crc[j] is known */
	uint32_t crc[EC_MAX_N];        /* data members' original bytes */
	uint32_t payload_crc;
};

static void trl_encode(unsigned k, const struct trailer *t, uint8_t *b)
{
	put32(b, t->mask);
	for (unsigned j = 0; j < k; j++)
		put32(b + 4 + 4 * j, t->crc[j]);
	put32(b + 4 + 4 * k, t->payload_crc);
	put32(b + 8 + 4 * k, mf_crc32c(0, b, 8 + 4 * k));
}

/* ---- full I/O ---- */

static int write_full(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t n = write(fd, p, len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static int pwrite_full(int fd, const void *buf, size_t len, uint64_t off)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t n = pwrite(fd, p, len, (off_t)off);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		off += (uint64_t)n;
		len -= (size_t)n;
	}
	return 0;
}

/* Reads exactly len bytes at off; a short file is -EBADMSG. */
static int pread_full(int fd, void *buf, size_t len, uint64_t off)
{
	uint8_t *p = buf;

	while (len) {
		ssize_t n = pread(fd, p, len, (off_t)off);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EBADMSG;
		p += n;
		off += (uint64_t)n;
		len -= (size_t)n;
	}
	return 0;
}

static void *seg_alloc(size_t n)
{
	void *p = NULL;

	return posix_memalign(&p, 64, n ? n : 1) ? NULL : p;
}

/* ---- fragment headers ---- */

struct frag {
	int fd;
	unsigned index;
	struct ec_geom g;
	struct trailer t;
	uint64_t len;        /* payload bytes */
};

/* The fixed start of a header: K and M, to know its length. */
static int hdr_fixed(const uint8_t fixed[44], unsigned *k, unsigned *m, char *err, size_t errlen)
{
	if (memcmp(fixed, EC_MAGIC, 8) || fixed[8] != EC_VERSION || fixed[9] != 0) {
		snprintf(err, errlen, "not an mtcfs fragment (magic or version)");
		return -EBADMSG;
	}
	*k = fixed[10];
	*m = fixed[11];
	if (*k < 1 || *m < 1 || *k + *m > EC_MAX_N || fixed[12] >= *k + *m) {
		snprintf(err, errlen, "fragment header: K %u, M %u, index %u out of range", *k, *m,
			 fixed[12]);
		return -EBADMSG;
	}
	return 0;
}

/* The whole header h[EC_HDR_LEN(k)] into f (geometry, index, len). */
static int hdr_parse(const uint8_t *h, unsigned k, unsigned m, struct frag *f, char *err,
		     size_t errlen)
{
	if (get32(h + EC_HDR_LEN(k) - 4) != mf_crc32c(0, h, EC_HDR_LEN(k) - 4)) {
		snprintf(err, errlen, "fragment header CRC32C mismatch");
		return -EBADMSG;
	}
	f->index = h[12];
	f->g.k = k;
	f->g.m = m;
	f->g.seg = get32(h + 16);
	memcpy(f->g.label, h + 28, EC_LABEL_LEN);
	for (unsigned j = 0; j < k; j++) {
		const uint8_t *p = h + 44 + 48 * j;
		f->g.d[j].len = get64(p);
		f->g.d[j].off = get64(p + 8);
		memcpy(f->g.d[j].shard, p + 16, 32);
	}
	if (!geom_ok(&f->g) || ec_cw_len(&f->g) != get64(h + 20)) {
		snprintf(err, errlen, "fragment header: segment size or lengths inconsistent");
		return -EBADMSG;
	}
	f->len = member_len(&f->g, f->index);
	return 0;
}

/* The trailer tb[EC_TRL_LEN(k)] of f (header parsed) into f->t. */
static int trl_parse(const uint8_t *tb, struct frag *f, char *err, size_t errlen)
{
	unsigned k = f->g.k;

	if (get32(tb + 8 + 4 * k) != mf_crc32c(0, tb, 8 + 4 * k)) {
		snprintf(err, errlen, "fragment %u: trailer CRC32C mismatch", f->index);
		return -EBADMSG;
	}
	f->t.mask = get32(tb);
	for (unsigned j = 0; j < k; j++)
		f->t.crc[j] = get32(tb + 4 + 4 * j);
	f->t.payload_crc = get32(tb + 4 + 4 * k);
	if (f->t.mask >> k || (f->index < k && !(f->t.mask >> f->index & 1)) ||
	    (f->index < k && f->t.crc[f->index] != f->t.payload_crc)) {
		snprintf(err, errlen, "fragment %u: trailer's member CRCs inconsistent", f->index);
		return -EBADMSG;
	}
	return 0;
}

static int frag_read_info(int fd, struct frag *f, char *err, size_t errlen)
{
	uint8_t fixed[44], *h = NULL, tb[EC_TRL_LEN(EC_MAX_N)];
	unsigned k, m;
	struct stat st;
	uint64_t want;
	int rc;

	memset(f, 0, sizeof *f);
	f->fd = fd;
	if (fstat(fd, &st) < 0)
		return -errno;
	rc = pread_full(fd, fixed, sizeof fixed, 0);
	if (rc == -EBADMSG) {
		snprintf(err, errlen, "not an mtcfs fragment (magic or version)");
		return rc;
	}
	if (!rc)
		rc = hdr_fixed(fixed, &k, &m, err, errlen);
	if (rc)
		return rc;
	h = malloc(EC_HDR_LEN(k));
	if (!h)
		return -ENOMEM;
	rc = pread_full(fd, h, EC_HDR_LEN(k), 0);
	if (rc)
		goto short_or_rc;
	rc = hdr_parse(h, k, m, f, err, errlen);
	if (rc)
		goto out;
	want = ec_frag_size(&f->g, f->index);
	if ((uint64_t)st.st_size != want) {
		snprintf(err, errlen, "fragment %u is %lld bytes, its header says %llu", f->index,
			 (long long)st.st_size, (unsigned long long)want);
		rc = -EBADMSG;
		goto out;
	}
	rc = pread_full(fd, tb, EC_TRL_LEN(k), want - EC_TRL_LEN(k));
	if (rc)
		goto short_or_rc;
	rc = trl_parse(tb, f, err, errlen);
	goto out;
short_or_rc:
	if (rc == -EBADMSG)
		snprintf(err, errlen, "fragment truncated");
out:
	free(h);
	return rc;
}

int ec_frag_info(int fd, struct ec_geom *g, unsigned *index, char *err, size_t errlen)
{
	struct frag f;
	char dummy[1];
	int rc;

	if (!err || !errlen) {
		err = dummy;
		errlen = sizeof dummy;
	}
	rc = frag_read_info(fd, &f, err, errlen);
	if (rc)
		return rc;
	if (g)
		*g = f.g;
	if (index)
		*index = f.index;
	return 0;
}

/* Reads payload bytes [off, off + len) of f into buf, zeros past its end. */
static int frag_read(const struct frag *f, uint64_t off, uint8_t *buf, size_t len)
{
	size_t have = off >= f->len ? 0 : (f->len - off < len ? (size_t)(f->len - off) : len);
	int rc = have ? pread_full(f->fd, buf, have, EC_HDR_LEN(f->g.k) + off) : 0;

	memset(buf + have, 0, len - have);
	return rc;
}

/* CRC32C of f's whole payload against its trailer. */
static int frag_check_payload(const struct frag *f, uint8_t *buf, size_t seg)
{
	uint32_t crc = 0;
	int rc;

	for (uint64_t off = 0; off < f->len; off += seg) {
		size_t n = f->len - off < seg ? (size_t)(f->len - off) : seg;
		rc = pread_full(f->fd, buf, n, EC_HDR_LEN(f->g.k) + off);
		if (rc)
			return rc;
		crc = mf_crc32c(crc, buf, n);
	}
	return crc == f->t.payload_crc ? 0 : -EBADMSG;
}

int ec_frag_verify(int fd, struct ec_geom *g, unsigned *index, char *err, size_t errlen)
{
	struct frag f;
	uint8_t *buf;
	char dummy[1];
	int rc;

	if (!err || !errlen) {
		err = dummy;
		errlen = sizeof dummy;
	}
	err[0] = '\0';
	rc = frag_read_info(fd, &f, err, errlen);
	if (rc)
		return rc;
	buf = seg_alloc(f.g.seg);
	if (!buf)
		return -ENOMEM;
	rc = frag_check_payload(&f, buf, f.g.seg);
	free(buf);
	if (rc == -EBADMSG)
		snprintf(err, errlen, "fragment %u: payload CRC32C mismatch", f.index);
	if (rc)
		return rc;
	if (g)
		*g = f.g;
	if (index)
		*index = f.index;
	return 0;
}

/* ---- a shard's byte stream ---- */

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

static int stream_open(struct stream *s, const struct ec_shard *sh, bool wr)
{
	uint64_t pos = 0;

	memset(s, 0, sizeof *s);
	s->fd = -1;
	s->dirfd = sh->dirfd;
	s->mf = sh->mf;
	s->wr = wr;
	s->ent = malloc((sh->mf->n ? sh->mf->n : 1) * sizeof *s->ent);
	s->start = malloc((sh->mf->n ? sh->mf->n : 1) * sizeof *s->start);
	if (!s->ent || !s->start) {
		free(s->ent);
		free(s->start);
		return -ENOMEM;
	}
	for (size_t i = 0; i < sh->mf->n; i++) {
		const struct mf_entry *e = &sh->mf->e[i];
		if (e->type != MF_FILE || e->size == 0)
			continue;
		s->ent[s->nf] = i;
		s->start[s->nf++] = pos;
		pos += e->size;
	}
	s->total = pos;
	return 0;
}

static void stream_close(struct stream *s)
{
	if (s->fd >= 0)
		close(s->fd);
	free(s->ent);
	free(s->start);
}

/* The file holding stream offset off (< total), opened. */
static int stream_seek(struct stream *s, uint64_t off, size_t *fi)
{
	size_t lo = 0, hi = s->nf;

	while (hi - lo > 1) {   /* last start <= off */
		size_t mid = lo + (hi - lo) / 2;
		if (s->start[mid] <= off)
			lo = mid;
		else
			hi = mid;
	}
	if (s->fd < 0 || s->cur != lo) {
		const struct mf_entry *e = &s->mf->e[s->ent[lo]];
		if (s->fd >= 0)
			close(s->fd);
		s->fd = openat(s->dirfd, e->path,
			       (s->wr ? O_RDWR : O_RDONLY) | O_NOFOLLOW | O_CLOEXEC);
		if (s->fd < 0)
			return -errno;
		s->cur = lo;
	}
	*fi = lo;
	return 0;
}

static bool all_zero(const uint8_t *p, size_t n)
{
	return n == 0 || (p[0] == 0 && !memcmp(p, p + 1, n - 1));
}

/* zeros[0..len) are zeros; makes file bytes [off, off + len) zeros without
 * writing where they already are (reading a hole allocates nothing). */
static int zero_if_written(int fd, const uint8_t *zeros, size_t len, uint64_t off)
{
	uint8_t cur[HOLE_BLOCK];
	int rc = pread_full(fd, cur, len, off);

	if (rc)
		return rc == -EBADMSG ? -EIO : rc;   /* inside the size: cannot be short */
	return all_zero(cur, len) ? 0 : pwrite_full(fd, zeros, len, off);
}

/* Stream bytes [off, off + len) to or from buf. Reading, a file shorter
 * than its manifest entry is -EBADMSG (named in err). Writing, 4 KiB
 * blocks (in file offsets) that are all zeros are skipped: the files were
 * truncated to size, so those are holes already. */
static int stream_io(struct stream *s, uint64_t off, uint8_t *buf, size_t len, char *err,
		     size_t errlen)
{
	while (len) {
		const struct mf_entry *e;
		uint64_t foff;
		size_t fi = 0, n;
		int rc = stream_seek(s, off, &fi);

		if (rc)
			return rc;
		e = &s->mf->e[s->ent[fi]];
		foff = off - s->start[fi];
		n = e->size - foff < len ? (size_t)(e->size - foff) : len;
		if (!s->wr) {
			rc = pread_full(s->fd, buf, n, foff);
			if (rc == -EBADMSG)
				snprintf(err, errlen, "%s: shorter than its manifest entry", e->path);
		} else {
			/* one pwrite per run of non-zero blocks, not per block */
			size_t run = 0, done = 0;
			while (done < n && !rc) {
				size_t b = HOLE_BLOCK - (size_t)((foff + done) % HOLE_BLOCK);
				if (b > n - done)
					b = n - done;
				if (all_zero(buf + done, b)) {
					if (done > run)
						rc = pwrite_full(s->fd, buf + run, done - run, foff + run);
					/* writing again: zeros only over what the failed
					 * attempt wrote, so untouched holes stay holes */
					if (!rc && s->rewrite)
						rc = zero_if_written(s->fd, buf + done, b, foff + done);
					run = done + b;
				}
				done += b;
			}
			if (!rc && done > run)
				rc = pwrite_full(s->fd, buf + run, done - run, foff + run);
		}
		if (rc)
			return rc;
		off += n;
		buf += n;
		len -= n;
	}
	return 0;
}

/* After a rewrite: every 4 KiB page of the files that lies wholly inside
 * stream bytes [off, off + len) and reads as zeros is punched back into a
 * hole (zero_if_written had to write zeros over the failed attempt's
 * bytes, in pieces where segments split a page). Pages that straddle the
 * range's ends are left alone, since another member owns their other part.
 * Such a page stays allocated only if the failed attempt wrote into it. */
static int stream_punch(struct stream *s, uint64_t off, uint64_t len)
{
	uint8_t page[HOLE_BLOCK];
	uint64_t end = off + len;

	while (off < end) {
		const struct mf_entry *e;
		uint64_t fa, fb, p;
		size_t fi = 0;
		int rc = stream_seek(s, off, &fi);

		if (rc)
			return rc;
		e = &s->mf->e[s->ent[fi]];
		fa = off - s->start[fi];
		fb = end - s->start[fi] < e->size ? end - s->start[fi] : e->size;
		/* a file's last partial page is wholly ours when the range
		 * reaches the file's end */
		for (p = (fa + HOLE_BLOCK - 1) / HOLE_BLOCK * HOLE_BLOCK;
		     p + HOLE_BLOCK <= fb || (p < fb && fb == e->size); p += HOLE_BLOCK) {
			size_t want = fb - p < HOLE_BLOCK ? (size_t)(fb - p) : HOLE_BLOCK;
			ssize_t n = pread(s->fd, page, want, (off_t)p);
			if (n != (ssize_t)want)
				return n < 0 ? -errno : -EIO;   /* inside the size: cannot be short */
			if (!all_zero(page, want))
				continue;
			if (fallocate(s->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)p,
				      HOLE_BLOCK) < 0 && errno != EOPNOTSUPP)
				return -errno;
		}
		off = s->start[fi] + fb;
	}
	return 0;
}

static bool shard_matches(const struct ec_shard *s, const struct ec_member_desc *d,
			  uint64_t total)
{
	return !memcmp(s->mf->hash, d->shard, 32) && d->off <= total && d->len <= total - d->off;
}

/* ---- data fragments ---- */

int ec_frag_data(const struct ec_geom *g, unsigned index, const struct ec_shard *src, int fd,
		 char *err, size_t errlen)
{
	uint8_t *hdr = NULL, *buf = NULL, tb[EC_TRL_LEN(EC_MAX_N)];
	struct trailer t = { 0 };
	struct stream s;
	char dummy[1];
	bool sopen = false;
	int rc;

	if (!err || !errlen) {
		err = dummy;
		errlen = sizeof dummy;
	}
	err[0] = '\0';
	if (!geom_ok(g) || index >= g->k || !src || !src->mf)
		return -EINVAL;
	rc = stream_open(&s, src, false);
	if (rc)
		return rc;
	sopen = true;
	if (!shard_matches(src, &g->d[index], s.total)) {
		snprintf(err, errlen, "data member %u: not a slice of this shard", index);
		rc = -EINVAL;
		goto out;
	}
	hdr = malloc(EC_HDR_LEN(g->k));
	buf = seg_alloc(g->seg);
	if (!hdr || !buf) {
		rc = -ENOMEM;
		goto out;
	}
	hdr_encode(g, index, hdr);
	rc = write_full(fd, hdr, EC_HDR_LEN(g->k));
	for (uint64_t pos = 0; !rc && pos < g->d[index].len; pos += g->seg) {
		size_t n = g->d[index].len - pos < g->seg ? (size_t)(g->d[index].len - pos) : g->seg;
		rc = stream_io(&s, g->d[index].off + pos, buf, n, err, errlen);
		if (!rc)
			rc = write_full(fd, buf, n);
		t.payload_crc = mf_crc32c(t.payload_crc, buf, n);
	}
	if (rc)
		goto out;
	t.mask = 1u << index;
	t.crc[index] = t.payload_crc;
	trl_encode(g->k, &t, tb);
	rc = write_full(fd, tb, EC_TRL_LEN(g->k));
out:
	if (sopen)
		stream_close(&s);
	free(hdr);
	free(buf);
	return rc;
}

/* ---- the code ---- */

/* ISA-L's Cauchy matrix: (k + m) x k, identity on top; any k rows of it
 * are invertible (MDS), which gf_gen_rs_matrix does not promise. */
static int coding_matrix(unsigned k, unsigned m, uint8_t **a)
{
	*a = malloc((size_t)(k + m) * k);
	if (!*a)
		return -ENOMEM;
	gf_gen_cauchy1_matrix(*a, (int)(k + m), (int)k);
	return 0;
}

int ec_encode(const int *in, unsigned k, const int *out, unsigned m, char *err, size_t errlen)
{
	struct frag *f = NULL, *byidx[EC_MAX_N] = { 0 };
	uint8_t *a = NULL, *tbls = NULL, *bufs = NULL, *hdr = NULL;
	uint8_t *dp[EC_MAX_N], *pp[EC_MAX_N], tb[EC_TRL_LEN(EC_MAX_N)];
	uint32_t dcrc[EC_MAX_N] = { 0 }, pcrc[EC_MAX_N] = { 0 };
	const struct ec_geom *g;
	uint64_t cw;
	char dummy[1];
	int rc;

	if (!err || !errlen) {
		err = dummy;
		errlen = sizeof dummy;
	}
	err[0] = '\0';
	if (!in || !out || k < 1 || m < 1 || k + m > EC_MAX_N)
		return -EINVAL;
	f = calloc(EC_MAX_N, sizeof *f);
	if (!f)
		return -ENOMEM;
	/* K and M are the caller's (in[] and out[] are that long); the
	 * headers, untrusted, must agree. */
	rc = frag_read_info(in[0], &f[0], err, errlen);
	if (rc)
		goto out;
	g = &f[0].g;
	if (g->k != k || g->m != m) {
		snprintf(err, errlen, "data fragment 0 is for rs:%u+%u, the caller asked for rs:%u+%u",
			 g->k, g->m, k, m);
		rc = -EBADMSG;
		goto out;
	}
	for (unsigned i = 0; i < k; i++) {
		if (i > 0) {
			rc = frag_read_info(in[i], &f[i], err, errlen);
			if (rc)
				goto out;
		}
		if (f[i].index >= k || byidx[f[i].index] || !geom_eq(&f[i].g, g)) {
			snprintf(err, errlen, "data fragment %u: %s", i,
				 f[i].index >= k ? "is a parity fragment" :
				 byidx[f[i].index] ? "index given twice" : "from another codeword");
			rc = -EBADMSG;
			goto out;
		}
		byidx[f[i].index] = &f[i];
	}
	cw = ec_cw_len(g);
	rc = coding_matrix(k, m, &a);
	if (rc)
		goto out;
	tbls = malloc((size_t)32 * k * m);
	bufs = seg_alloc((size_t)ec_work_bytes(k, m, g->seg));
	hdr = malloc(EC_HDR_LEN(k));
	if (!tbls || !bufs || !hdr) {
		rc = -ENOMEM;
		goto out;
	}
	ec_init_tables((int)k, (int)m, a + (size_t)k * k, tbls);
	for (unsigned j = 0; j < k; j++)
		dp[j] = bufs + (size_t)j * g->seg;
	for (unsigned j = 0; j < m; j++)
		pp[j] = bufs + (size_t)(k + j) * g->seg;
	for (unsigned j = 0; j < m; j++) {
		if (ftruncate(out[j], 0) < 0) {
			rc = -errno;
			goto out;
		}
		hdr_encode(g, k + j, hdr);
		rc = pwrite_full(out[j], hdr, EC_HDR_LEN(k), 0);
		if (rc)
			goto out;
	}
	for (uint64_t pos = 0; pos < cw; pos += g->seg) {
		size_t n = cw - pos < g->seg ? (size_t)(cw - pos) : g->seg;
		for (unsigned j = 0; j < k; j++) {
			const struct frag *d = byidx[j];
			rc = frag_read(d, pos, dp[j], n);
			if (rc == -EBADMSG)
				snprintf(err, errlen, "data fragment %u: truncated", j);
			if (rc)
				goto out;
			if (pos < d->len)
				dcrc[j] = mf_crc32c(dcrc[j], dp[j],
						    d->len - pos < n ? (size_t)(d->len - pos) : n);
		}
		ec_encode_data((int)n, (int)k, (int)m, tbls, dp, pp);
		for (unsigned j = 0; j < m; j++) {
			pcrc[j] = mf_crc32c(pcrc[j], pp[j], n);
			rc = pwrite_full(out[j], pp[j], n, EC_HDR_LEN(k) + pos);
			if (rc)
				goto out;
		}
	}
	/* Parity made of a corrupt member would be believed by every later
	 * decode: refuse it before any trailer is written. */
	for (unsigned j = 0; j < k; j++)
		if (dcrc[j] != byidx[j]->t.payload_crc) {
			snprintf(err, errlen, "data fragment %u: payload CRC32C mismatch", j);
			rc = -EBADMSG;
			goto out;
		}
	for (unsigned j = 0; j < m; j++) {
		struct trailer t = { .mask = k == 32 ? 0xffffffffu : (1u << k) - 1,
				     .payload_crc = pcrc[j] };
		memcpy(t.crc, dcrc, sizeof dcrc);
		trl_encode(k, &t, tb);
		rc = pwrite_full(out[j], tb, EC_TRL_LEN(k), EC_HDR_LEN(k) + cw);
		if (rc)
			goto out;
	}
out:
	free(a);
	free(tbls);
	free(bufs);
	free(hdr);
	free(f);
	return rc;
}

/* ---- incremental parity ---- */

struct ec_enc {
	struct ec_geom g;
	unsigned first, cnt;         /* parity slots K + first .. K + first + cnt - 1 */
	int out[EC_MAX_N];           /* [cnt] */
	uint8_t *tbls;               /* 32 x K x cnt */
	uint8_t *bufs;               /* (cnt + 1) x seg: one data, cnt parity segments */
	uint32_t added;              /* bit j: member j folded in */
	uint32_t crc[EC_MAX_N];      /* their payload CRCs */
	int failed;                  /* a spoilt fold: returned ever after */
};

/* Reads exactly len bytes from the stream; an early end is -EBADMSG. */
static int read_full(int fd, void *buf, size_t len)
{
	uint8_t *p = buf;

	while (len) {
		ssize_t n = read(fd, p, len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EBADMSG;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

void ec_enc_free(struct ec_enc *e)
{
	if (!e)
		return;
	free(e->tbls);
	free(e->bufs);
	free(e);
}

int ec_enc_open(const struct ec_geom *g, unsigned first, unsigned cnt, const int *out,
		struct ec_enc **ep)
{
	struct ec_enc *e = NULL;
	uint8_t *a = NULL, *hdr = NULL;
	int rc = -ENOMEM;

	if (!geom_ok(g) || !out || !ep || cnt < 1 || first >= g->m || cnt > g->m - first)
		return -EINVAL;
	e = calloc(1, sizeof *e);
	if (!e)
		return -ENOMEM;
	e->g = *g;
	e->first = first;
	e->cnt = cnt;
	memcpy(e->out, out, cnt * sizeof *out);
	e->tbls = malloc((size_t)32 * g->k * cnt);
	e->bufs = seg_alloc((size_t)(cnt + 1) * g->seg);
	hdr = malloc(EC_HDR_LEN(g->k));
	if (!e->tbls || !e->bufs || !hdr || coding_matrix(g->k, g->m, &a))
		goto out;
	/* only this holder's rows of the Cauchy matrix: a holder of one
	 * parity slot does 1/M of the work of all M */
	ec_init_tables((int)g->k, (int)cnt, a + (size_t)(g->k + first) * g->k, e->tbls);
	for (unsigned j = 0; j < cnt; j++) {
		/* the payload starts as zeros: holes, until members fold in */
		if (ftruncate(out[j], 0) < 0 ||
		    ftruncate(out[j], (off_t)ec_frag_size(g, g->k + first + j)) < 0) {
			rc = -errno;
			goto out;
		}
		hdr_encode(g, g->k + first + j, hdr);
		rc = pwrite_full(out[j], hdr, EC_HDR_LEN(g->k), 0);
		if (rc)
			goto out;
	}
	rc = 0;
out:
	free(a);
	free(hdr);
	if (rc) {
		ec_enc_free(e);
		return rc;
	}
	*ep = e;
	return 0;
}

int ec_enc_add(struct ec_enc *e, int fd, char *err, size_t errlen)
{
	const struct ec_geom *g;
	uint8_t fixed[44], *h = NULL, tb[EC_TRL_LEN(EC_MAX_N)], *pp[EC_MAX_N];
	struct frag f;
	uint32_t crc = 0;
	unsigned k, m;
	char dummy[1];
	int rc;

	if (!err || !errlen) {
		err = dummy;
		errlen = sizeof dummy;
	}
	err[0] = '\0';
	if (!e)
		return -EINVAL;
	if (e->failed)
		return e->failed;
	g = &e->g;
	memset(&f, 0, sizeof f);
	rc = read_full(fd, fixed, sizeof fixed);
	if (rc == -EBADMSG)
		snprintf(err, errlen, "data fragment: the stream ends inside its header");
	if (!rc)
		rc = hdr_fixed(fixed, &k, &m, err, errlen);
	if (rc)
		return rc;
	if (k != g->k || m != g->m) {
		snprintf(err, errlen, "data fragment for rs:%u+%u, the codeword is rs:%u+%u", k, m,
			 g->k, g->m);
		return -EBADMSG;
	}
	h = malloc(EC_HDR_LEN(k));
	if (!h)
		return -ENOMEM;
	memcpy(h, fixed, sizeof fixed);
	rc = read_full(fd, h + sizeof fixed, EC_HDR_LEN(k) - sizeof fixed);
	if (rc == -EBADMSG)
		snprintf(err, errlen, "data fragment: the stream ends inside its header");
	if (!rc)
		rc = hdr_parse(h, k, m, &f, err, errlen);
	free(h);
	if (rc)
		return rc;
	if (f.index >= k || !geom_eq(&f.g, g) || (e->added >> f.index & 1)) {
		snprintf(err, errlen, "data fragment %u: %s", f.index,
			 f.index >= k ? "is a parity fragment" :
			 !geom_eq(&f.g, g) ? "from another codeword" : "added twice");
		return -EBADMSG;
	}
	/* From here on the parity holds part of this member: a failure
	 * spoils the encoder. */
	for (unsigned j = 0; j < e->cnt; j++)
		pp[j] = e->bufs + (size_t)(j + 1) * g->seg;
	for (uint64_t pos = 0; !rc && pos < f.len; pos += g->seg) {
		size_t n = f.len - pos < g->seg ? (size_t)(f.len - pos) : g->seg;
		rc = read_full(fd, e->bufs, n);
		if (rc == -EBADMSG)
			snprintf(err, errlen, "data fragment %u: the stream ends inside its payload",
				 f.index);
		if (rc)
			break;
		crc = mf_crc32c(crc, e->bufs, n);
		for (unsigned j = 0; !rc && j < e->cnt; j++)
			rc = pread_full(e->out[j], pp[j], n, EC_HDR_LEN(k) + pos);
		if (rc)
			break;
		ec_encode_data_update((int)n, (int)k, (int)e->cnt, (int)f.index, e->tbls, e->bufs,
				      pp);
		for (unsigned j = 0; !rc && j < e->cnt; j++)
			rc = pwrite_full(e->out[j], pp[j], n, EC_HDR_LEN(k) + pos);
	}
	if (!rc) {
		rc = read_full(fd, tb, EC_TRL_LEN(k));
		if (rc == -EBADMSG)
			snprintf(err, errlen, "data fragment %u: the stream ends inside its trailer",
				 f.index);
	}
	if (!rc)
		rc = trl_parse(tb, &f, err, errlen);
	if (!rc && crc != f.t.payload_crc) {
		snprintf(err, errlen, "data fragment %u: payload CRC32C mismatch", f.index);
		rc = -EBADMSG;
	}
	if (rc) {
		e->failed = rc;
		return rc;
	}
	e->added |= 1u << f.index;
	e->crc[f.index] = crc;
	return 0;
}

int ec_enc_finish(struct ec_enc *e, char *err, size_t errlen)
{
	const struct ec_geom *g;
	uint8_t tb[EC_TRL_LEN(EC_MAX_N)];
	uint64_t cw;
	char dummy[1];
	int rc = 0;

	if (!err || !errlen) {
		err = dummy;
		errlen = sizeof dummy;
	}
	err[0] = '\0';
	if (!e)
		return -EINVAL;
	if (e->failed)
		return e->failed;
	g = &e->g;
	for (unsigned j = 0; j < g->k; j++)
		if (!(e->added >> j & 1)) {
			snprintf(err, errlen, "data fragment %u was not added", j);
			return -ENODATA;
		}
	cw = ec_cw_len(g);
	for (unsigned j = 0; j < e->cnt && !rc; j++) {
		struct trailer t = { .mask = g->k == 32 ? 0xffffffffu : (1u << g->k) - 1 };
		for (uint64_t pos = 0; !rc && pos < cw; pos += g->seg) {
			size_t n = cw - pos < g->seg ? (size_t)(cw - pos) : g->seg;
			rc = pread_full(e->out[j], e->bufs, n, EC_HDR_LEN(g->k) + pos);
			t.payload_crc = mf_crc32c(t.payload_crc, e->bufs, n);
		}
		memcpy(t.crc, e->crc, sizeof t.crc);
		trl_encode(g->k, &t, tb);
		if (!rc)
			rc = pwrite_full(e->out[j], tb, EC_TRL_LEN(g->k), EC_HDR_LEN(g->k) + cw);
	}
	if (rc)
		e->failed = rc;
	return rc;
}

/* Row `want` of the code expressed in the survivors rows[0..k-1]: the
 * coefficients c such that member want = sum c[i] * member rows[i]. */
static int decode_row(const uint8_t *a, unsigned k, const unsigned *rows, unsigned want,
		      uint8_t *c)
{
	uint8_t *b = malloc((size_t)k * k * 2), *inv;
	int rc = 0;

	if (!b)
		return -ENOMEM;
	inv = b + (size_t)k * k;
	for (unsigned i = 0; i < k; i++)
		memcpy(b + (size_t)i * k, a + (size_t)rows[i] * k, k);
	if (gf_invert_matrix(b, inv, (int)k) < 0) {
		rc = -EIO;   /* impossible for a Cauchy matrix */
		goto out;
	}
	for (unsigned j = 0; j < k; j++) {
		uint8_t s = 0;
		for (unsigned i = 0; i < k; i++)
			s ^= gf_mul(a[(size_t)want * k + i], inv[(size_t)i * k + j]);
		c[j] = s;
	}
out:
	free(b);
	return rc;
}

/* Appends "<what> <v> refused: <why>; " to err. */
static void refused(char *err, size_t errlen, const char *what, unsigned v, const char *why)
{
	size_t used = strnlen(err, errlen);

	if (used + 1 < errlen)
		snprintf(err + used, errlen - used, "%s %u refused: %s; ", what, v, why);
}

int ec_decode(const int *in, unsigned n, unsigned want, const struct ec_sink *sink, char *err,
	      size_t errlen)
{
	struct frag *f = NULL, *use[EC_MAX_N];
	uint8_t *a = NULL, *tbls = NULL, *bufs = NULL, *hdr = NULL, *outb, *src[EC_MAX_N];
	uint8_t c[EC_MAX_N], tb[EC_TRL_LEN(EC_MAX_N)];
	unsigned rows[EC_MAX_N], uidx[EC_MAX_N], nuse = 0, best = 0, k = 0;
	uint32_t icrc[EC_MAX_N];
	int *ok = NULL, rc;
	const struct ec_geom *g = NULL;
	struct trailer t = { 0 };
	uint64_t olen;
	uint32_t ocrc = 0, want_crc = 0;
	bool want_crc_known = false, sopen = false;
	struct stream s;
	char dummy[1], why[160];

	if (!err || !errlen) {
		err = dummy;
		errlen = sizeof dummy;
	}
	err[0] = '\0';
	if ((!in && n) || !sink || n > 4096)
		return -EINVAL;
	if (n == 0) {
		snprintf(err, errlen, "no fragment survives; K of K+M are needed to rebuild member %u",
			 want);
		return -ENODATA;
	}
	f = calloc(n, sizeof *f);
	ok = calloc(n, sizeof *ok);
	if (!f || !ok) {
		rc = -ENOMEM;
		goto out;
	}
	for (unsigned i = 0; i < n; i++) {
		why[0] = '\0';
		rc = frag_read_info(in[i], &f[i], why, sizeof why);
		if (rc && rc != -EBADMSG)
			goto out;
		ok[i] = !rc;
		if (rc)
			refused(err, errlen, "candidate", i, why);
	}
	/* The codeword is the one most candidates agree on. */
	for (unsigned i = 0; i < n; i++) {
		unsigned votes = 0;
		if (!ok[i])
			continue;
		for (unsigned j = 0; j < n; j++)
			votes += ok[j] && geom_eq(&f[i].g, &f[j].g);
		if (votes > best) {
			best = votes;
			g = &f[i].g;
		}
	}
	if (!g) {
		size_t used = strnlen(err, errlen);
		snprintf(err + used, errlen - used, "no usable fragment among %u candidates", n);
		rc = -ENODATA;
		goto out;
	}
	k = g->k;
	if (want >= k + g->m || (want >= k && sink->shard)) {
		rc = -EINVAL;
		goto out;
	}
	bufs = seg_alloc((size_t)(k + 1) * g->seg);
	if (!bufs) {
		rc = -ENOMEM;
		goto out;
	}
	rc = coding_matrix(k, g->m, &a);
	if (rc)
		goto out;
	tbls = malloc((size_t)32 * k);
	if (!tbls) {
		rc = -ENOMEM;
		goto out;
	}
	for (unsigned u = 0; u < k; u++)
		src[u] = bufs + (size_t)u * g->seg;
	outb = bufs + (size_t)k * g->seg;
	olen = member_len(g, want);
	if (sink->shard) {
		rc = stream_open(&s, sink->shard, true);
		if (rc)
			goto out;
		sopen = true;
		if (!shard_matches(sink->shard, &g->d[want], s.total)) {
			snprintf(err, errlen, "member %u is not a slice of the target shard", want);
			rc = -EINVAL;
			goto out;
		}
	}
retry:
	/* Pick k distinct members, `want` itself first if it is there. Into a
	 * shard, the payload CRCs are checked while decoding and a corrupt
	 * member costs a second decode (every block rewritten, then the zero
	 * pages punched: stream_punch);
	 * a stream cannot be rewritten, so for sink->fd each payload is
	 * checked in a pass of its own before any byte goes out. */
	nuse = 0;
	for (int pass = 0; pass < 2 && nuse < k; pass++)
		for (unsigned i = 0; i < n && nuse < k; i++) {
			bool dup = false;
			if (!ok[i] || (pass == 0) != (f[i].index == want))
				continue;
			if (!geom_eq(&f[i].g, g)) {
				refused(err, errlen, "candidate", i, "from another codeword");
				ok[i] = 0;
				continue;
			}
			for (unsigned u = 0; u < nuse; u++)
				dup |= use[u]->index == f[i].index;
			if (dup)
				continue;
			rc = sink->shard ? 0 : frag_check_payload(&f[i], bufs, g->seg);
			if (rc == -EBADMSG) {
				refused(err, errlen, "fragment", f[i].index,
					"payload CRC32C mismatch");
				ok[i] = 0;
				continue;
			}
			if (rc)
				goto out;
			rows[nuse] = f[i].index;
			uidx[nuse] = i;
			use[nuse++] = &f[i];
		}
	if (nuse < k) {
		size_t used = strnlen(err, errlen);
		snprintf(err + used, errlen - used,
			 "%u good fragments of %u+%u, %u needed to rebuild member %u", nuse, k,
			 g->m, k, want);
		rc = -ENODATA;
		goto out;
	}
	for (unsigned u = 0; u < nuse; u++)
		if (want < k && (use[u]->t.mask >> want & 1)) {
			want_crc = use[u]->t.crc[want];
			want_crc_known = true;
		}
	rc = decode_row(a, k, rows, want, c);
	if (rc)
		goto out;
	ec_init_tables((int)k, 1, c, tbls);
	if (!sink->shard) {
		if (!hdr && !(hdr = malloc(EC_HDR_LEN(k)))) {
			rc = -ENOMEM;
			goto out;
		}
		hdr_encode(g, want, hdr);
		rc = write_full(sink->fd, hdr, EC_HDR_LEN(k));
		if (rc)
			goto out;
	}
	memset(icrc, 0, sizeof icrc);
	ocrc = 0;
	for (uint64_t pos = 0; pos < olen; pos += g->seg) {
		size_t len = olen - pos < g->seg ? (size_t)(olen - pos) : g->seg;
		for (unsigned u = 0; u < k; u++) {
			rc = frag_read(use[u], pos, src[u], len);
			if (rc)
				goto out;
			if (pos < use[u]->len)
				icrc[u] = mf_crc32c(icrc[u], src[u],
						    use[u]->len - pos < len ? (size_t)(use[u]->len - pos) : len);
		}
		ec_encode_data((int)len, (int)k, 1, tbls, src, &outb);
		ocrc = mf_crc32c(ocrc, outb, len);
		rc = sink->shard ? stream_io(&s, g->d[want].off + pos, outb, len, err, errlen) :
				   write_full(sink->fd, outb, len);
		if (rc)
			goto out;
	}
	/* the rest of the survivors longer than the member, for their CRCs */
	for (unsigned u = 0; u < k; u++)
		for (uint64_t pos = olen; pos < use[u]->len; pos += g->seg) {
			size_t len = use[u]->len - pos < g->seg ? (size_t)(use[u]->len - pos) : g->seg;
			rc = frag_read(use[u], pos, src[u], len);
			if (rc)
				goto out;
			icrc[u] = mf_crc32c(icrc[u], src[u], len);
		}
	{
		bool bad = false;
		for (unsigned u = 0; u < k; u++)
			if (icrc[u] != use[u]->t.payload_crc) {
				refused(err, errlen, "fragment", use[u]->index, "payload CRC32C mismatch");
				ok[uidx[u]] = 0;
				bad = true;
			}
		if (bad && sink->shard) {
			s.rewrite = true;
			want_crc_known = false;
			goto retry;
		}
		if (bad) {
			rc = -EBADMSG;   /* changed after its check: the stream is spoilt */
			goto out;
		}
	}
	if (sink->shard && s.rewrite) {
		rc = stream_punch(&s, g->d[want].off, olen);
		if (rc)
			goto out;
	}
	err[0] = '\0';   /* rebuilt: what was refused on the way no longer matters */
	if (want_crc_known && ocrc != want_crc) {
		snprintf(err, errlen, "rebuilt member %u fails its CRC32C (%08x, fragments say %08x)",
			 want, ocrc, want_crc);
		rc = -EBADMSG;
		goto out;
	}
	if (!sink->shard) {
		/* Carry every member CRC the survivors knew: a rebuilt parity
		 * fragment is as good a witness as the lost one. */
		for (unsigned u = 0; u < nuse; u++)
			for (unsigned j = 0; j < k; j++)
				if (use[u]->t.mask >> j & 1) {
					t.mask |= 1u << j;
					t.crc[j] = use[u]->t.crc[j];
				}
		if (want < k) {
			t.mask = 1u << want;
			memset(t.crc, 0, sizeof t.crc);
			t.crc[want] = ocrc;
		}
		t.payload_crc = ocrc;
		trl_encode(k, &t, tb);
		rc = write_full(sink->fd, tb, EC_TRL_LEN(k));
	}
out:
	if (sopen)
		stream_close(&s);
	free(a);
	free(tbls);
	free(bufs);
	free(hdr);
	free(f);
	free(ok);
	return rc;
}

/* ---- the shard's tree around the decoded bytes ---- */

int ec_shard_prepare(const struct ec_shard *s)
{
	if (!s || !s->mf)
		return -EINVAL;
	if (mf_validate(s->mf, NULL, 0))
		return -EBADMSG;
	/* Sorted bytewise, so every directory comes before what it holds. */
	for (size_t i = 0; i < s->mf->n; i++) {
		const struct mf_entry *e = &s->mf->e[i];
		int fd;

		switch (e->type) {
		case MF_DIR:
			if (mkdirat(s->dirfd, e->path, 0700) < 0 && errno != EEXIST)
				return -errno;
			break;
		case MF_SYMLINK:
			if (unlinkat(s->dirfd, e->path, 0) < 0 && errno != ENOENT)
				return -errno;
			if (symlinkat(e->target, s->dirfd, e->path) < 0)
				return -errno;
			break;
		case MF_FIFO:
			if (unlinkat(s->dirfd, e->path, 0) < 0 && errno != ENOENT)
				return -errno;
			if (mkfifoat(s->dirfd, e->path, 0600) < 0)
				return -errno;
			break;
		case MF_FILE:
			fd = openat(s->dirfd, e->path,
				    O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
			if (fd < 0)
				return -errno;
			if (ftruncate(fd, (off_t)e->size) < 0) {
				int saved = -errno;
				close(fd);
				return saved;
			}
			close(fd);
			break;
		default:
			return -EBADMSG;
		}
	}
	return 0;
}

int ec_shard_finish(const struct ec_shard *s, char *err, size_t errlen)
{
	char dummy[1];

	if (!err || !errlen) {
		err = dummy;
		errlen = sizeof dummy;
	}
	if (!s || !s->mf)
		return -EINVAL;
	/* Deepest first, so a read-only directory is closed after its files. */
	for (size_t i = s->mf->n; i-- > 0;) {
		const struct mf_entry *e = &s->mf->e[i];
		if (e->type == MF_SYMLINK)
			continue;
		if (fchmodat(s->dirfd, e->path, e->mode & 07777, 0) < 0)
			return -errno;
	}
	return mf_verify(s->dirfd, s->mf, err, errlen);
}
