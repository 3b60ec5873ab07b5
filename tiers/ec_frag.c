/* Erasure coding: the fragment format (header, trailer), its file I/O, a
 * shard's byte stream and data fragments (see ec.h, ec_i.h). */
#include "tiers/ec.h"
#include "tiers/ec_i.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define HOLE_BLOCK 4096u   /* zero blocks of this size are left unwritten */

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
void ec_hdr_encode(const struct ec_geom *g, unsigned index, uint8_t *h)
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

void ec_trl_encode(unsigned k, const struct trailer *t, uint8_t *b)
{
	put32(b, t->mask);
	for (unsigned j = 0; j < k; j++)
		put32(b + 4 + 4 * j, t->crc[j]);
	put32(b + 4 + 4 * k, t->payload_crc);
	put32(b + 8 + 4 * k, mf_crc32c(0, b, 8 + 4 * k));
}

/* ---- full I/O ---- */

int ec_write_full(int fd, const void *buf, size_t len)
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

int ec_pwrite_full(int fd, const void *buf, size_t len, uint64_t off)
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
int ec_pread_full(int fd, void *buf, size_t len, uint64_t off)
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

void *ec_seg_alloc(size_t n)
{
	void *p = NULL;

	return posix_memalign(&p, 64, n ? n : 1) ? NULL : p;
}

/* ---- fragment headers ---- */

/* The fixed start of a header: K and M, to know its length. */
int ec_hdr_fixed(const uint8_t fixed[44], unsigned *k, unsigned *m, char *err, size_t errlen)
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
int ec_hdr_parse(const uint8_t *h, unsigned k, unsigned m, struct frag *f, char *err,
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
int ec_trl_parse(const uint8_t *tb, struct frag *f, char *err, size_t errlen)
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

int ec_frag_read_info(int fd, struct frag *f, char *err, size_t errlen)
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
	rc = ec_pread_full(fd, fixed, sizeof fixed, 0);
	if (rc == -EBADMSG) {
		snprintf(err, errlen, "not an mtcfs fragment (magic or version)");
		return rc;
	}
	if (!rc)
		rc = ec_hdr_fixed(fixed, &k, &m, err, errlen);
	if (rc)
		return rc;
	h = malloc(EC_HDR_LEN(k));
	if (!h)
		return -ENOMEM;
	rc = ec_pread_full(fd, h, EC_HDR_LEN(k), 0);
	if (rc)
		goto short_or_rc;
	rc = ec_hdr_parse(h, k, m, f, err, errlen);
	if (rc)
		goto out;
	want = ec_frag_size(&f->g, f->index);
	if ((uint64_t)st.st_size != want) {
		snprintf(err, errlen, "fragment %u is %lld bytes, its header says %llu", f->index,
			 (long long)st.st_size, (unsigned long long)want);
		rc = -EBADMSG;
		goto out;
	}
	rc = ec_pread_full(fd, tb, EC_TRL_LEN(k), want - EC_TRL_LEN(k));
	if (rc)
		goto short_or_rc;
	rc = ec_trl_parse(tb, f, err, errlen);
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

	ec_err_buf(&err, &errlen, dummy, sizeof dummy);
	rc = ec_frag_read_info(fd, &f, err, errlen);
	if (rc)
		return rc;
	if (g)
		*g = f.g;
	if (index)
		*index = f.index;
	return 0;
}

/* Reads payload bytes [off, off + len) of f into buf, zeros past its end. */
int ec_frag_read(const struct frag *f, uint64_t off, uint8_t *buf, size_t len)
{
	size_t have = off >= f->len ? 0 : (f->len - off < len ? (size_t)(f->len - off) : len);
	int rc = have ? ec_pread_full(f->fd, buf, have, EC_HDR_LEN(f->g.k) + off) : 0;

	memset(buf + have, 0, len - have);
	return rc;
}

/* CRC32C of f's whole payload against its trailer. */
int ec_frag_check_payload(const struct frag *f, uint8_t *buf, size_t seg)
{
	uint32_t crc = 0;
	int rc;

	for (uint64_t off = 0; off < f->len; off += seg) {
		size_t n = f->len - off < seg ? (size_t)(f->len - off) : seg;
		rc = ec_pread_full(f->fd, buf, n, EC_HDR_LEN(f->g.k) + off);
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

	ec_err_buf(&err, &errlen, dummy, sizeof dummy);
	err[0] = '\0';
	rc = ec_frag_read_info(fd, &f, err, errlen);
	if (rc)
		return rc;
	buf = ec_seg_alloc(f.g.seg);
	if (!buf)
		return -ENOMEM;
	rc = ec_frag_check_payload(&f, buf, f.g.seg);
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

int ec_stream_open(struct stream *s, const struct ec_shard *sh, bool wr)
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

void ec_stream_close(struct stream *s)
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
	int rc = ec_pread_full(fd, cur, len, off);

	if (rc)
		return rc == -EBADMSG ? -EIO : rc;   /* inside the size: cannot be short */
	return all_zero(cur, len) ? 0 : ec_pwrite_full(fd, zeros, len, off);
}

/* Stream bytes [off, off + len) to or from buf. Reading, a file shorter
 * than its manifest entry is -EBADMSG (named in err). Writing, 4 KiB
 * blocks (in file offsets) that are all zeros are skipped: the files were
 * truncated to size, so those are holes already. */
int ec_stream_io(struct stream *s, uint64_t off, uint8_t *buf, size_t len, char *err,
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
			rc = ec_pread_full(s->fd, buf, n, foff);
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
						rc = ec_pwrite_full(s->fd, buf + run, done - run, foff + run);
					/* writing again: zeros only over what the failed
					 * attempt wrote, so untouched holes stay holes */
					if (!rc && s->rewrite)
						rc = zero_if_written(s->fd, buf + done, b, foff + done);
					run = done + b;
				}
				done += b;
			}
			if (!rc && done > run)
				rc = ec_pwrite_full(s->fd, buf + run, done - run, foff + run);
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
int ec_stream_punch(struct stream *s, uint64_t off, uint64_t len)
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

	ec_err_buf(&err, &errlen, dummy, sizeof dummy);
	err[0] = '\0';
	if (!geom_ok(g) || index >= g->k || !src || !src->mf)
		return -EINVAL;
	rc = ec_stream_open(&s, src, false);
	if (rc)
		return rc;
	sopen = true;
	if (!shard_matches(src, &g->d[index], s.total)) {
		snprintf(err, errlen, "data member %u: not a slice of this shard", index);
		rc = -EINVAL;
		goto out;
	}
	hdr = malloc(EC_HDR_LEN(g->k));
	buf = ec_seg_alloc(g->seg);
	if (!hdr || !buf) {
		rc = -ENOMEM;
		goto out;
	}
	ec_hdr_encode(g, index, hdr);
	rc = ec_write_full(fd, hdr, EC_HDR_LEN(g->k));
	for (uint64_t pos = 0; !rc && pos < g->d[index].len; pos += g->seg) {
		size_t n = g->d[index].len - pos < g->seg ? (size_t)(g->d[index].len - pos) : g->seg;
		rc = ec_stream_io(&s, g->d[index].off + pos, buf, n, err, errlen);
		if (!rc)
			rc = ec_write_full(fd, buf, n);
		t.payload_crc = mf_crc32c(t.payload_crc, buf, n);
	}
	if (rc)
		goto out;
	t.mask = 1u << index;
	t.crc[index] = t.payload_crc;
	ec_trl_encode(g->k, &t, tb);
	rc = ec_write_full(fd, tb, EC_TRL_LEN(g->k));
out:
	if (sopen)
		ec_stream_close(&s);
	free(hdr);
	free(buf);
	return rc;
}
