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

	ec_err_buf(&err, &errlen, dummy, sizeof dummy);
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
		rc = ec_frag_read_info(in[i], &f[i], why, sizeof why);
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
	bufs = ec_seg_alloc((size_t)(k + 1) * g->seg);
	if (!bufs) {
		rc = -ENOMEM;
		goto out;
	}
	rc = ec_coding_matrix(k, g->m, &a);
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
		rc = ec_stream_open(&s, sink->shard, true);
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
	 * pages punched: ec_stream_punch);
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
			rc = sink->shard ? 0 : ec_frag_check_payload(&f[i], bufs, g->seg);
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
		ec_hdr_encode(g, want, hdr);
		rc = ec_write_full(sink->fd, hdr, EC_HDR_LEN(k));
		if (rc)
			goto out;
	}
	memset(icrc, 0, sizeof icrc);
	ocrc = 0;
	for (uint64_t pos = 0; pos < olen; pos += g->seg) {
		size_t len = olen - pos < g->seg ? (size_t)(olen - pos) : g->seg;
		for (unsigned u = 0; u < k; u++) {
			rc = ec_frag_read(use[u], pos, src[u], len);
			if (rc)
				goto out;
			if (pos < use[u]->len)
				icrc[u] = mf_crc32c(icrc[u], src[u],
						    use[u]->len - pos < len ? (size_t)(use[u]->len - pos) : len);
		}
		ec_encode_data((int)len, (int)k, 1, tbls, src, &outb);
		ocrc = mf_crc32c(ocrc, outb, len);
		rc = sink->shard ? ec_stream_io(&s, g->d[want].off + pos, outb, len, err, errlen) :
				   ec_write_full(sink->fd, outb, len);
		if (rc)
			goto out;
	}
	/* the rest of the survivors longer than the member, for their CRCs */
	for (unsigned u = 0; u < k; u++)
		for (uint64_t pos = olen; pos < use[u]->len; pos += g->seg) {
			size_t len = use[u]->len - pos < g->seg ? (size_t)(use[u]->len - pos) : g->seg;
			rc = ec_frag_read(use[u], pos, src[u], len);
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
		rc = ec_stream_punch(&s, g->d[want].off, olen);
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
		ec_trl_encode(k, &t, tb);
		rc = ec_write_full(sink->fd, tb, EC_TRL_LEN(k));
	}
out:
	if (sopen)
		ec_stream_close(&s);
	free(a);
	free(tbls);
	free(bufs);
	free(hdr);
	free(f);
	free(ok);
	return rc;
}
