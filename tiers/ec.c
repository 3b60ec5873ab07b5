/* Erasure coding of shards: the `redundancy` setting, geometry sizes and the
 * shard's tree around decoded bytes (see ec.h; fragments ec_frag.c, encode
 * ec_enc.c, decode ec_dec.c). */
#include "tiers/ec.h"
#include "tiers/ec_i.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PIECE_ALIGN 4096u

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

	ec_err_buf(&err, &errlen, dummy, sizeof dummy);
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

uint64_t ec_frag_size(const struct ec_geom *g, unsigned index)
{
	return EC_HDR_LEN(g->k) + member_len(g, index) + EC_TRL_LEN(g->k);
}

uint64_t ec_work_bytes(unsigned k, unsigned m, uint32_t seg)
{
	return (uint64_t)(k + m) * seg;
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

	ec_err_buf(&err, &errlen, dummy, sizeof dummy);
	if (!s || !s->mf)
		return -EINVAL;
	/* Deepest first, so a read-only directory is closed after its files. */
	for (size_t i = s->mf->n; i-- > 0;) {
		const struct mf_entry *e = &s->mf->e[i];
		if (e->type == MF_SYMLINK)
			continue;
		if (fchmodat(s->dirfd, e->path, mf_restore_mode(e), 0) < 0)
			return -errno;
	}
	return mf_verify(s->dirfd, s->mf, err, errlen);
}
