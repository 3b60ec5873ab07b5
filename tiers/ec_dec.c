/* Erasure coding: any member back from K surviving fragments, with ISA-L
 * (see ec.h, ec_i.h). */
#include "tiers/ec.h"
#include "tiers/ec_i.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <isa-l/erasure_code.h>

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

/* One ec_decode call: the candidates, the codeword they agree on, the
 * members in use and the buffers. */
struct dec {
	const struct ec_sink *sink;
	unsigned n, want, k;
	char *err;
	size_t errlen;
	struct frag *f;                /* the n candidates */
	int *ok;                       /* [n]: usable */
	const struct ec_geom *g;       /* the majority's codeword */
	struct frag *use[EC_MAX_N];    /* the k members decoded from */
	unsigned rows[EC_MAX_N], uidx[EC_MAX_N], nuse;
	uint8_t *a, *tbls, *bufs, *hdr, *outb, *src[EC_MAX_N];
	uint64_t olen;                 /* the member's length */
	uint32_t icrc[EC_MAX_N], ocrc, want_crc;
	bool want_crc_known;
	struct stream s;               /* sink->shard's, open when sopen */
	bool sopen;
};

/* Every candidate's header and trailer read (a bad one refused); the
 * codeword is the one most candidates agree on. 0 or -errno. */
static int dec_candidates(struct dec *d, const int *in)
{
	char why[160];
	unsigned best = 0;
	int rc;

	d->f = calloc(d->n, sizeof *d->f);
	d->ok = calloc(d->n, sizeof *d->ok);
	if (!d->f || !d->ok)
		return -ENOMEM;
	for (unsigned i = 0; i < d->n; i++) {
		why[0] = '\0';
		rc = ec_frag_read_info(in[i], &d->f[i], why, sizeof why);
		if (rc && rc != -EBADMSG)
			return rc;
		d->ok[i] = !rc;
		if (rc)
			refused(d->err, d->errlen, "candidate", i, why);
	}
	/* The codeword is the one most candidates agree on. */
	for (unsigned i = 0; i < d->n; i++) {
		unsigned votes = 0;
		if (!d->ok[i])
			continue;
		for (unsigned j = 0; j < d->n; j++)
			votes += d->ok[j] && geom_eq(&d->f[i].g, &d->f[j].g);
		if (votes > best) {
			best = votes;
			d->g = &d->f[i].g;
		}
	}
	if (!d->g) {
		size_t used = strnlen(d->err, d->errlen);
		snprintf(d->err + used, d->errlen - used, "no usable fragment among %u candidates", d->n);
		return -ENODATA;
	}
	return 0;
}

/* The buffers ((K + 1) x seg), the coding matrix, and the target shard's
 * stream when decoding into one. 0 or -errno. */
static int dec_prepare(struct dec *d)
{
	const struct ec_geom *g = d->g;
	int rc;

	d->k = g->k;
	if (d->want >= d->k + g->m || (d->want >= d->k && d->sink->shard))
		return -EINVAL;
	d->bufs = ec_seg_alloc((size_t)(d->k + 1) * g->seg);
	if (!d->bufs)
		return -ENOMEM;
	rc = ec_coding_matrix(d->k, g->m, &d->a);
	if (rc)
		return rc;
	d->tbls = malloc((size_t)32 * d->k);
	if (!d->tbls)
		return -ENOMEM;
	for (unsigned u = 0; u < d->k; u++)
		d->src[u] = d->bufs + (size_t)u * g->seg;
	d->outb = d->bufs + (size_t)d->k * g->seg;
	d->olen = member_len(g, d->want);
	if (d->sink->shard) {
		rc = ec_stream_open(&d->s, d->sink->shard, true);
		if (rc)
			return rc;
		d->sopen = true;
		if (!shard_matches(d->sink->shard, &g->d[d->want], d->s.total)) {
			snprintf(d->err, d->errlen, "member %u is not a slice of the target shard", d->want);
			return -EINVAL;
		}
	}
	return 0;
}

/* Pick k distinct members, `want` itself first if it is there. Into a
 * shard, the payload CRCs are checked while decoding and a corrupt
 * member costs a second decode (every block rewritten, then the zero
 * pages punched: ec_stream_punch);
 * a stream cannot be rewritten, so for sink->fd each payload is
 * checked in a pass of its own before any byte goes out.
 * 0, -ENODATA (fewer than k good ones), or -errno. */
static int dec_pick(struct dec *d)
{
	const struct ec_geom *g = d->g;
	int rc;

	d->nuse = 0;
	for (int pass = 0; pass < 2 && d->nuse < d->k; pass++)
		for (unsigned i = 0; i < d->n && d->nuse < d->k; i++) {
			struct frag *f = &d->f[i];
			bool dup = false;
			if (!d->ok[i] || (pass == 0) != (f->index == d->want))
				continue;
			if (!geom_eq(&f->g, g)) {
				refused(d->err, d->errlen, "candidate", i, "from another codeword");
				d->ok[i] = 0;
				continue;
			}
			for (unsigned u = 0; u < d->nuse; u++)
				dup |= d->use[u]->index == f->index;
			if (dup)
				continue;
			rc = d->sink->shard ? 0 : ec_frag_check_payload(f, d->bufs, g->seg);
			if (rc == -EBADMSG) {
				refused(d->err, d->errlen, "fragment", f->index,
					"payload CRC32C mismatch");
				d->ok[i] = 0;
				continue;
			}
			if (rc)
				return rc;
			d->rows[d->nuse] = f->index;
			d->uidx[d->nuse] = i;
			d->use[d->nuse++] = f;
		}
	if (d->nuse < d->k) {
		size_t used = strnlen(d->err, d->errlen);
		snprintf(d->err + used, d->errlen - used,
			 "%u good fragments of %u+%u, %u needed to rebuild member %u", d->nuse, d->k,
			 g->m, d->k, d->want);
		return -ENODATA;
	}
	for (unsigned u = 0; u < d->nuse; u++)
		if (d->want < d->k && (d->use[u]->t.mask >> d->want & 1)) {
			d->want_crc = d->use[u]->t.crc[d->want];
			d->want_crc_known = true;
		}
	return 0;
}

/* Decodes member want from the members in use into the sink (a fragment
 * file: its header first), summing the CRCs of what it writes (ocrc) and
 * of every survivor's payload (icrc). 0 or -errno. */
static int dec_stream(struct dec *d)
{
	const struct ec_geom *g = d->g;
	unsigned k = d->k;
	uint8_t c[EC_MAX_N];
	int rc = decode_row(d->a, k, d->rows, d->want, c);

	if (rc)
		return rc;
	ec_init_tables((int)k, 1, c, d->tbls);
	if (!d->sink->shard) {
		if (!d->hdr && !(d->hdr = malloc(EC_HDR_LEN(k))))
			return -ENOMEM;
		ec_hdr_encode(g, d->want, d->hdr);
		rc = io_write_full(d->sink->fd, d->hdr, EC_HDR_LEN(k));
		if (rc)
			return rc;
	}
	memset(d->icrc, 0, sizeof d->icrc);
	d->ocrc = 0;
	for (uint64_t pos = 0; pos < d->olen; pos += g->seg) {
		size_t len = d->olen - pos < g->seg ? (size_t)(d->olen - pos) : g->seg;
		for (unsigned u = 0; u < k; u++) {
			struct frag *f = d->use[u];
			rc = ec_frag_read(f, pos, d->src[u], len);
			if (rc)
				return rc;
			if (pos < f->len)
				d->icrc[u] = mf_crc32c(d->icrc[u], d->src[u],
						       f->len - pos < len ? (size_t)(f->len - pos) : len);
		}
		ec_encode_data((int)len, (int)k, 1, d->tbls, d->src, &d->outb);
		d->ocrc = mf_crc32c(d->ocrc, d->outb, len);
		rc = d->sink->shard ? ec_stream_io(&d->s, g->d[d->want].off + pos, d->outb, len, d->err,
						   d->errlen) :
				      io_write_full(d->sink->fd, d->outb, len);
		if (rc)
			return rc;
	}
	/* the rest of the survivors longer than the member, for their CRCs */
	for (unsigned u = 0; u < k; u++)
		for (uint64_t pos = d->olen; pos < d->use[u]->len; pos += g->seg) {
			size_t len = d->use[u]->len - pos < g->seg ? (size_t)(d->use[u]->len - pos) : g->seg;
			rc = ec_frag_read(d->use[u], pos, d->src[u], len);
			if (rc)
				return rc;
			d->icrc[u] = mf_crc32c(d->icrc[u], d->src[u], len);
		}
	return 0;
}

/* The survivors' payload CRCs against their trailers: a mismatch refuses
 * the fragment. 0: all good; 1: decode again (into a shard, rewriting);
 * -EBADMSG: a stream that went out is spoilt. */
static int dec_check_survivors(struct dec *d)
{
	bool bad = false;

	for (unsigned u = 0; u < d->k; u++)
		if (d->icrc[u] != d->use[u]->t.payload_crc) {
			refused(d->err, d->errlen, "fragment", d->use[u]->index, "payload CRC32C mismatch");
			d->ok[d->uidx[u]] = 0;
			bad = true;
		}
	if (bad && d->sink->shard) {
		d->s.rewrite = true;
		d->want_crc_known = false;
		return 1;
	}
	if (bad)
		return -EBADMSG;   /* changed after its check: the stream is spoilt */
	return 0;
}

/* The rebuilt member checked against the CRC the fragments carry; a
 * rewritten shard's zero pages punched; a fragment file's trailer. 0 or
 * -errno. */
static int dec_finish(struct dec *d)
{
	struct trailer t = { 0 };
	uint8_t tb[EC_TRL_LEN(EC_MAX_N)];
	unsigned k = d->k;
	int rc;

	if (d->sink->shard && d->s.rewrite) {
		rc = ec_stream_punch(&d->s, d->g->d[d->want].off, d->olen);
		if (rc)
			return rc;
	}
	d->err[0] = '\0';   /* rebuilt: what was refused on the way no longer matters */
	if (d->want_crc_known && d->ocrc != d->want_crc) {
		snprintf(d->err, d->errlen, "rebuilt member %u fails its CRC32C (%08x, fragments say %08x)",
			 d->want, d->ocrc, d->want_crc);
		return -EBADMSG;
	}
	if (d->sink->shard)
		return 0;
	/* Carry every member CRC the survivors knew: a rebuilt parity
	 * fragment is as good a witness as the lost one. */
	for (unsigned u = 0; u < d->nuse; u++)
		for (unsigned j = 0; j < k; j++)
			if (d->use[u]->t.mask >> j & 1) {
				t.mask |= 1u << j;
				t.crc[j] = d->use[u]->t.crc[j];
			}
	if (d->want < k) {
		t.mask = 1u << d->want;
		memset(t.crc, 0, sizeof t.crc);
		t.crc[d->want] = d->ocrc;
	}
	t.payload_crc = d->ocrc;
	ec_trl_encode(k, &t, tb);
	return io_write_full(d->sink->fd, tb, EC_TRL_LEN(k));
}

int ec_decode(const int *in, unsigned n, unsigned want, const struct ec_sink *sink, char *err,
	      size_t errlen)
{
	struct dec d = { .sink = sink, .n = n, .want = want };
	char dummy[1];
	int rc;

	ec_err_buf(&err, &errlen, dummy, sizeof dummy);
	err[0] = '\0';
	if ((!in && n) || !sink || n > 4096)
		return -EINVAL;
	if (n == 0) {
		snprintf(err, errlen, "no fragment survives; K of K+M are needed to rebuild member %u",
			 want);
		return -ENODATA;
	}
	d.err = err;
	d.errlen = errlen;
	rc = dec_candidates(&d, in);
	if (!rc)
		rc = dec_prepare(&d);
	while (!rc) {
		rc = dec_pick(&d);
		if (!rc)
			rc = dec_stream(&d);
		if (!rc)
			rc = dec_check_survivors(&d);
		if (rc <= 0)
			break;
		rc = 0;     /* a corrupt survivor: pick again and rewrite */
	}
	if (!rc)
		rc = dec_finish(&d);
	if (d.sopen)
		ec_stream_close(&d.s);
	free(d.a);
	free(d.tbls);
	free(d.bufs);
	free(d.hdr);
	free(d.f);
	free(d.ok);
	return rc;
}
