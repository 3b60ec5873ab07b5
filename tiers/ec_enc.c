/* Erasure coding: parity from data fragments, whole (ec_encode) and
 * incremental (ec_enc_*), with ISA-L (see ec.h, ec_i.h). */
#include "tiers/ec.h"
#include "tiers/ec_i.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <isa-l/erasure_code.h>

/* ---- the code ---- */

/* ISA-L's Cauchy matrix: (k + m) x k, identity on top; any k rows of it
 * are invertible (MDS), which gf_gen_rs_matrix does not promise. */
int ec_coding_matrix(unsigned k, unsigned m, uint8_t **a)
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

	ec_err_buf(&err, &errlen, dummy, sizeof dummy);
	err[0] = '\0';
	if (!in || !out || k < 1 || m < 1 || k + m > EC_MAX_N)
		return -EINVAL;
	f = calloc(EC_MAX_N, sizeof *f);
	if (!f)
		return -ENOMEM;
	/* K and M are the caller's (in[] and out[] are that long); the
	 * headers, untrusted, must agree. */
	rc = ec_frag_read_info(in[0], &f[0], err, errlen);
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
			rc = ec_frag_read_info(in[i], &f[i], err, errlen);
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
	rc = ec_coding_matrix(k, m, &a);
	if (rc)
		goto out;
	tbls = malloc((size_t)32 * k * m);
	bufs = ec_seg_alloc((size_t)ec_work_bytes(k, m, g->seg));
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
		ec_hdr_encode(g, k + j, hdr);
		rc = ec_pwrite_full(out[j], hdr, EC_HDR_LEN(k), 0);
		if (rc)
			goto out;
	}
	for (uint64_t pos = 0; pos < cw; pos += g->seg) {
		size_t n = cw - pos < g->seg ? (size_t)(cw - pos) : g->seg;
		for (unsigned j = 0; j < k; j++) {
			const struct frag *d = byidx[j];
			rc = ec_frag_read(d, pos, dp[j], n);
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
			rc = ec_pwrite_full(out[j], pp[j], n, EC_HDR_LEN(k) + pos);
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
		ec_trl_encode(k, &t, tb);
		rc = ec_pwrite_full(out[j], tb, EC_TRL_LEN(k), EC_HDR_LEN(k) + cw);
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
	e->bufs = ec_seg_alloc((size_t)(cnt + 1) * g->seg);
	hdr = malloc(EC_HDR_LEN(g->k));
	if (!e->tbls || !e->bufs || !hdr || ec_coding_matrix(g->k, g->m, &a))
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
		ec_hdr_encode(g, g->k + first + j, hdr);
		rc = ec_pwrite_full(out[j], hdr, EC_HDR_LEN(g->k), 0);
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

	ec_err_buf(&err, &errlen, dummy, sizeof dummy);
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
		rc = ec_hdr_fixed(fixed, &k, &m, err, errlen);
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
		rc = ec_hdr_parse(h, k, m, &f, err, errlen);
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
			rc = ec_pread_full(e->out[j], pp[j], n, EC_HDR_LEN(k) + pos);
		if (rc)
			break;
		ec_encode_data_update((int)n, (int)k, (int)e->cnt, (int)f.index, e->tbls, e->bufs,
				      pp);
		for (unsigned j = 0; !rc && j < e->cnt; j++)
			rc = ec_pwrite_full(e->out[j], pp[j], n, EC_HDR_LEN(k) + pos);
	}
	if (!rc) {
		rc = read_full(fd, tb, EC_TRL_LEN(k));
		if (rc == -EBADMSG)
			snprintf(err, errlen, "data fragment %u: the stream ends inside its trailer",
				 f.index);
	}
	if (!rc)
		rc = ec_trl_parse(tb, &f, err, errlen);
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

	ec_err_buf(&err, &errlen, dummy, sizeof dummy);
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
			rc = ec_pread_full(e->out[j], e->bufs, n, EC_HDR_LEN(g->k) + pos);
			t.payload_crc = mf_crc32c(t.payload_crc, e->bufs, n);
		}
		memcpy(t.crc, e->crc, sizeof t.crc);
		ec_trl_encode(g->k, &t, tb);
		if (!rc)
			rc = ec_pwrite_full(e->out[j], tb, EC_TRL_LEN(g->k), EC_HDR_LEN(g->k) + cw);
	}
	if (rc)
		e->failed = rc;
	return rc;
}
