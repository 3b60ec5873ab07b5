/* engine_ec_rst.c — the erasure-coded tier as a restore source (see
 * engine_ec.h): this node lost its shard of a step; the coordinator
 * planned it here because enough members of each of its pieces'
 * codewords survive. get() fetches the group's manifests (ec_metas), then
 * for each piece K members of its codeword (ec_get: parity files from
 * their holders, data fragments cut by the survivors from their own
 * shards; more only when one is corrupt or cannot be fetched) and decodes
 * the piece into the stage (ec_decode: a fragment that fails its CRC32C is
 * passed over and another used);
 * ec_shard_finish checks every rebuilt file against the manifest. */
#include "cluster/engine_ec.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct ec_tier {
	struct eng *e;
	uint32_t nodes, dp;
	unsigned fetched, passed;   /* for got()'s log line */
	uint64_t reserved;          /* the rebuilt shard's bytes, in ram_size */
	uint64_t t0;
	char red[32];
	char notes[400];
};

/* The group's manifests from any surviving member, stored into dirfd. */
static int fetch_metas(struct eng_ec_ctx *x, int dirfd, const char *job, uint64_t step,
		       char *why, size_t whylen)
{
	const struct ecplan_group *g = &x->plan->g[x->gi];
	int rc = -ENOENT;

	for (unsigned p = 0; p < g->n; p++) {
		struct nconn *c = NULL;
		json_t *req, *resp = NULL, *metas;
		const char *key;
		json_t *v;
		int u = g->unit[p], stored = 0;

		if (u == x->rank)
			continue;
		req = proto_ec_encode(PROTO_EC_METAS, &(struct proto_ec){ .job = job, .step = step });
		rc = ecx_connect(x->e, (uint32_t)u, &c);
		if (rc == 0)
			rc = nconn_call(c, req, &resp, DATA_TIMEOUT_MS);
		json_decref(req);
		nconn_close(c);
		metas = rc == 0 ? json_object_get(resp, "metas") : NULL;
		json_object_foreach(metas, key, v) {
			struct manifest *mf = NULL;
			uint8_t *buf = NULL;
			size_t len = 0;
			char name[32], *end;
			long owner = strtol(key, &end, 10);
			json_t *wrap = json_pack("{s:O}", "manifest", v);
			if (*end || owner < 0 || owner >= (long)x->nodes ||
			    xfer_decode_manifest(wrap, &mf, NULL, 0) < 0 || mf_encode(mf, &buf, &len) < 0) {
				json_decref(wrap);
				mf_free(mf);
				continue;
			}
			snprintf(name, sizeof(name), "m%ld.mf", owner);
			/* one held here already stays (another is not taken) */
			if (ecx_store_meta(x->e, dirfd, name, buf, len) == 0)
				stored++;
			json_decref(wrap);
			free(buf);
			mf_free(mf);
		}
		json_decref(resp);
		if (stored == (int)g->n)
			return 0;
	}
	snprintf(why, whylen, "no surviving member of group %d has the group's manifests", x->gi);
	return rc < 0 ? rc : -ENOENT;
}

/* Member slot of codeword cw from rank into a temporary file of dirfd,
 * staged through the RAM tier (pf; the caller aborts it once decoded). */
static int fetch_member(struct eng_ec_ctx *x, int dirfd, const char *job, uint64_t step,
			unsigned cw, unsigned slot, int rank, struct ram_pfile *pf)
{
	struct nconn *c = NULL;
	json_t *req, *resp = NULL;
	int rc;

	req = proto_ec_encode(PROTO_EC_GET, &(struct proto_ec){ .job = job, .step = step,
				.group = (uint32_t)x->gi, .cw = cw, .slot = slot });
	rc = ecx_connect(x->e, (uint32_t)rank, &c);
	if (rc == 0)
		rc = nconn_call(c, req, &resp, DATA_TIMEOUT_MS);
	if (rc == 0)
		rc = ecx_recv_frag(x->e, c, dirfd, "rst", pf);
	json_decref(req);
	json_decref(resp);
	nconn_close(c);
	return rc;
}

/* Fetch candidate members cand[*next..] into fds[] until `want` more are
 * there or the candidates run out (a member that cannot be fetched is
 * logged and the next one asked). Returns how many were added. */
static unsigned fetch_more(struct eng_ec_ctx *x, int dirfd, const char *job, uint64_t step,
			   unsigned cw, const unsigned *cand, const int *crank, unsigned ncand,
			   unsigned *next, unsigned want, int *fds, struct ram_pfile *pf,
			   unsigned *n)
{
	unsigned added = 0;

	while (added < want && *next < ncand) {
		unsigned i = (*next)++;
		int fd = fetch_member(x, dirfd, job, step, cw, cand[i], crank[i], &pf[*n]);
		if (fd < 0) {
			log_info("engine", "ec restore: job=%s step=%" PRIu64 " cw %u slot %u from rank %d: %s",
				 job, step, cw, cand[i], crank[i], strerror(-fd));
			continue;
		}
		fds[(*n)++] = fd;
		added++;
	}
	return added;
}

/* Member `slot` of codeword cw rebuilt into sink. Any K members give it
 * back: K are fetched (the minimum; others are asked only when one cannot
 * be fetched), and only when the decode finds one of them corrupt (or a
 * stale header) are the rest fetched and the decode run again over all of
 * them, the first ones first: into a shard, ec_decode then meets the
 * corrupt member again in the same place and rewrites every block of the
 * member (so no wrong byte of the failed try stays behind in a block that
 * should be a hole); into a fragment file the sink starts over empty.
 * T (may be NULL) counts what was fetched and passed over. */
static int rebuild_member(struct ec_tier *T, struct eng_ec_ctx *x, int dirfd, const char *job,
			  uint64_t step, unsigned cw, unsigned slot, const struct ec_sink *sink,
			  char *why, size_t whylen)
{
	const struct ecplan_group *g = &x->plan->g[x->gi];
	int fds[EC_MAX_N], crank[EC_MAX_N];
	unsigned cand[EC_MAX_N], ncand = 0, next = 0;
	struct ram_pfile pf[EC_MAX_N];
	unsigned n = 0;
	int rc;

	for (unsigned s = 0; s < g->n; s++) {
		int r = g->unit[ecplan_slot_pos(g, cw, s)];
		if (s == slot || r == x->rank)
			continue;
		cand[ncand] = s;
		crank[ncand++] = r;
	}
	fetch_more(x, dirfd, job, step, cw, cand, crank, ncand, &next, g->k, fds, pf, &n);
	rc = n ? ec_decode(fds, n, slot, sink, why, whylen) : -ENODATA;
	if ((rc == -ENODATA || rc == -EBADMSG) && n && next < ncand &&
	    fetch_more(x, dirfd, job, step, cw, cand, crank, ncand, &next, ncand, fds, pf,
		       &n) > 0) {
		if (sink->shard || (ftruncate(sink->fd, 0) == 0 && lseek(sink->fd, 0, SEEK_SET) == 0)) {
			why[0] = '\0';
			rc = ec_decode(fds, n, slot, sink, why, whylen);
		}
	}
	if (T)
		T->fetched += n;
	if (rc == -ENODATA && !n)
		snprintf(why, whylen, "no member of codeword %u could be fetched", cw);
	for (unsigned i = 0; i < n; i++) {
		struct ec_geom gg;
		unsigned idx;
		char e2[200];
		/* count what the decode passed over, for the log line */
		if (T && ec_frag_verify(fds[i], &gg, &idx, e2, sizeof(e2)) < 0) {
			T->passed++;
			snprintf(T->notes, sizeof(T->notes), "cw %u: a fragment was passed over (%s)",
				 cw, e2);
		}
		ram_pfile_abort(x->e->ram, &pf[i]);   /* decoded: the fetched member goes */
	}
	return rc;
}

/* Piece t of this node's shard into the staged files. */
static int decode_piece(struct ec_tier *T, struct eng_ec_ctx *x, int dirfd, const char *job,
			uint64_t step, unsigned t, const struct ec_shard *sh, char *why,
			size_t whylen)
{
	struct ec_sink sink = { .shard = sh, .fd = -1 };
	unsigned cw, slot;

	ecplan_piece(&x->plan->g[x->gi], (unsigned)x->pos, t, &cw, &slot);
	return rebuild_member(T, x, dirfd, job, step, cw, slot, &sink, why, whylen);
}

/* ---- after a rebuild: this node's parity of the step, rebuilt too ---- */

/* Whichever of this node's M parity fragments of the step are missing
 * (wiped, or the encoding was cut short by a lost node) are rebuilt from
 * the codewords' other members (ec_decode of a parity slot), so the step
 * survives M more losses without waiting for the next one to be
 * protected. Other nodes lost with this one are at most M - 1 more
 * members of each codeword: K are left; members that other nodes are
 * still rebuilding (their manifests, their shard) come on a later try.
 * On the replication worker. */
static bool have_metas(struct eng_ec_ctx *x, int dirfd)
{
	uint64_t *size = calloc(x->nodes, sizeof(uint64_t));
	uint8_t (*hash)[32] = calloc(x->nodes, 32);
	bool ok = size && hash && ecx_load_metas(x, dirfd, size, hash, -1, NULL, NULL) == 0;
	free(size);
	free(hash);
	return ok;
}

/* Bytes of parity fragment (cw, slot) of the step, from the group's
 * manifests here: what its rebuild reserves before it writes. 0 or -errno. */
static int parity_size(struct eng_ec_ctx *x, int dirfd, const char *job, uint64_t step,
		       unsigned cw, unsigned slot, uint64_t *fsz)
{
	uint64_t *size = calloc(x->nodes, sizeof(uint64_t));
	uint8_t (*hash)[32] = calloc(x->nodes, 32);
	struct ec_geom geom;
	int rc = -ENOMEM;

	if (size && hash)
		rc = ecx_load_metas(x, dirfd, size, hash, -1, NULL, NULL);
	if (rc == 0)
		rc = ecplan_geom(x->plan, (unsigned)x->gi, cw, size, (const uint8_t(*)[32])hash,
				 &geom);
	if (rc == 0) {
		ecx_label(job, step, (unsigned)x->gi, cw, geom.label);
		*fsz = ec_frag_size(&geom, slot);
	}
	free(size);
	free(hash);
	return rc;
}

static unsigned reprotect_once(struct eng_ec_ctx *x, int dirfd, const char *job, uint64_t step)
{
	const struct ecplan_group *g = &x->plan->g[x->gi];
	unsigned built = 0;
	char why[400] = "";

	if (!have_metas(x, dirfd))   /* others cut data members from them */
		fetch_metas(x, dirfd, job, step, why, sizeof(why));
	for (unsigned j = 0; j < g->m; j++) {
		unsigned cw = ecplan_parity_cw(g, (unsigned)x->pos, j), slot = g->k + j;
		char fin[64];
		struct ram_pfile pf;
		int rc;

		snprintf(fin, sizeof(fin), "g%d-c%u-s%u.frag", x->gi, cw, slot);
		if (faccessat(dirfd, fin, F_OK, 0) == 0) {
			built++;
			continue;
		}
		/* staged through the RAM tier as every file of a holding:
		 * reserved before it is written (ram_size may reclaim for it,
		 * or refuse it), published once rebuilt */
		uint64_t fsz = 0;
		why[0] = '\0';
		pf = (struct ram_pfile){ .dirfd = dirfd, .fd = -1 };
		rc = parity_size(x, dirfd, job, step, cw, slot, &fsz);
		if (rc == 0 && (rc = ram_pfile_reserve(x->e->ram, dirfd, fsz, &pf)) < 0) {
			snprintf(why, sizeof(why), "no room for its %" PRIu64 " bytes (ram_size)", fsz);
			log_warn("engine", "ec: job=%s step=%" PRIu64 ": parity cw %u slot %u refused: %s",
				 job, step, cw, slot, why);
			continue;
		}
		if (rc == 0 && ram_pfile_create(&pf, NULL, "par") < 0) {
			ram_pfile_abort(x->e->ram, &pf);
			break;
		}
		struct ec_sink sink = { .shard = NULL, .fd = pf.fd };
		if (rc == 0)
			rc = rebuild_member(NULL, x, dirfd, job, step, cw, slot, &sink, why,
					    sizeof(why));
		if (rc == 0)
			rc = ram_pfile_publish(x->e->ram, &pf, fin);
		ram_pfile_abort(x->e->ram, &pf);   /* nothing left once published */
		if (rc < 0) {
			log_info("engine", "ec: job=%s step=%" PRIu64 ": parity cw %u slot %u not rebuilt yet: %s",
				 job, step, cw, slot, why[0] ? why : strerror(-rc));
			continue;
		}
		built++;
	}
	return built;
}

/* How long a node keeps trying to rebuild its parity of a restored step:
 * the other nodes rebuild their shards and send their manifests at the
 * same time, so the first tries may find members missing. */
#define REPROTECT_BUDGET_MS 30000

static void reprotect_run(void *arg)
{
	struct ecx_step_job *r = arg;
	struct shard_key k = { .step = r->step };
	struct eng_ec_ctx x;
	uint64_t t0 = util_now_ns();
	int dirfd = -1, fd, rc;

	snprintf(k.job, sizeof(k.job), "%s", r->job);
	rc = ecx_ctx(r->e, r->nodes, r->dp, &x);
	if (rc < 0 || x.plan->rep[x.rank] != x.rank) {
		/* no parity stored here (a data-parallel twin, whose unit the
		 * representative protects, or too few distinct shards) */
		if (x.plan)
			ecx_send_replicated(r->e, r->job, r->step, r->nodes, r->dp);
		goto out;
	}
	dirfd = ecx_dir(r->e, r->job, r->step, true);
	if (dirfd < 0)
		goto out;
	const struct ecplan_group *g = &x.plan->g[x.gi];
	if (faccessat(dirfd, "protected", F_OK, 0) == 0) {
		ecx_send_replicated(r->e, r->job, r->step, r->nodes, r->dp);
		goto out;
	}
	/* this node's manifest again: the group cuts data members by it, and
	 * it may never have been sent (killed right after the commit) */
	k.rank = (uint32_t)x.rank;
	if (ecx_own_meta(&x, dirfd, &k) < 0)
		log_info("engine", "ec: job=%s step=%" PRIu64 ": this node's manifest of it is not held here",
			 r->job, r->step);
	for (int a = 0;; a++) {
		if (reprotect_once(&x, dirfd, r->job, r->step) == g->m) {
			fd = openat(dirfd, "protected", O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
			if (fd >= 0)
				close(fd);
			log_info("engine", "ec: job=%s step=%" PRIu64 " parity rebuilt here (%u fragments, rs:%u+%u group %d)",
				 r->job, r->step, g->m, g->k, g->m, x.gi);
			ecx_send_replicated(r->e, r->job, r->step, r->nodes, r->dp);
			goto out;
		}
		if (!eng_retry_wait(r->e, a, t0, REPROTECT_BUDGET_MS))
			break;
	}
	log_warn("engine", "ec: job=%s step=%" PRIu64 ": this node's parity could not be rebuilt; older steps are kept until a newer one is protected",
		 r->job, r->step);
out:
	if (dirfd >= 0)
		close(dirfd);
	ecx_ctx_free(&x);
	free(r);
}

void eng_ec_restored(struct eng *e, const char *job, uint64_t step, uint32_t nodes, uint32_t dp)
{
	if (eng_ec_get(e, NULL))
		ecx_submit(e, job, step, nodes, dp, reprotect_run);
}

static int ec_get(void *self, struct tier_get *g, struct ram_stage *st, struct manifest **mf,
		  char *why, size_t whylen)
{
	struct ec_tier *T = self;
	struct eng_ec_ctx x;
	struct manifest *mine = NULL;
	uint64_t *size = NULL;
	uint8_t (*hash)[32] = NULL;
	int dirfd = -1, rc;

	T->t0 = util_now_ns();
	rc = ecx_ctx(T->e, T->nodes, T->dp, &x);
	if (rc < 0) {
		snprintf(why, whylen, "this node is in no erasure-coded group");
		goto out;
	}
	/* a data-parallel twin rebuilds its unit's shard (identical to its
	 * own) as the representative would: from the representative's
	 * manifest and the other units' members */
	x.rank = x.plan->rep[x.rank];
	ec_redundancy_str(&x.red, T->red, sizeof(T->red));
	size = calloc(T->nodes, sizeof(uint64_t));
	hash = calloc(T->nodes, 32);
	rc = !size || !hash ? -ENOMEM : 0;
	if (rc == 0)
		rc = dirfd = ecx_dir(T->e, g->want.job, g->want.step, true);
	if (rc >= 0)
		rc = fetch_metas(&x, dirfd, g->want.job, g->want.step, why, whylen);
	if (rc == 0)
		rc = ecx_load_metas(&x, dirfd, size, hash, x.rank, &mine, NULL);
	if (rc == 0 && !mine) {
		/* a data-parallel twin: its column mates hold its data */
		snprintf(why, whylen, "node %d is not its unit's representative: nothing to rebuild here",
			 x.rank);
		rc = -ENOENT;
	}
	/* the rebuilt files are written here, not through a reservation of
	 * their own: take the shard's size first (ENOSPC before any work) */
	if (rc == 0 && (rc = ram_reserve(g->ram, mine->total)) == 0)
		T->reserved = mine->total;
	if (rc == 0)
		rc = ram_stage_begin(g->ram, &g->as, st);
	struct ec_shard sh = { st->fd, mine };
	if (rc == 0)
		rc = ec_shard_prepare(&sh);
	for (unsigned t = 0; rc == 0 && t < x.plan->g[x.gi].k; t++)
		rc = decode_piece(T, &x, dirfd, g->want.job, g->want.step, t, &sh, why, whylen);
	if (rc == 0)
		rc = ec_shard_finish(&sh, why, whylen);
	if (rc == 0) {
		*mf = mine;
		mine = NULL;
	}
out:
	if (dirfd >= 0)
		close(dirfd);
	mf_free(mine);
	free(size);
	free(hash);
	ecx_ctx_free(&x);
	if (rc < 0 && T->reserved) {
		ram_adjust(g->ram, -(int64_t)T->reserved);
		T->reserved = 0;
	}
	if (rc < 0 && !why[0])
		snprintf(why, whylen, "erasure-coded restore: %s", strerror(-rc));
	return rc;
}

static void ec_got(void *self, const struct tier_get *g, const struct manifest *mf, int rc,
		   char *why, size_t whylen)
{
	struct ec_tier *T = self;
	if (rc < 0) {
		ram_adjust(g->ram, -(int64_t)T->reserved);
		snprintf(why, whylen, "publishing the rebuilt shard: %s", strerror(-rc));
		return;
	}
	/* the reservation was the manifest's size; holes take no RAM: count
	 * what is held, as after a restore from the bucket */
	ram_recount(g->ram);   /* its parity follows after the barrier: eng_ec_restored */
	metrics_add(MC_RESTORE_BYTES, mf->total);
	log_info("engine", "restored job=%s step=%" PRIu64 " from erasure code %s: %u fragments fetched, %u passed over%s%s bytes=%" PRIu64 " secs=%.3f",
		 g->as.job, g->as.step, T->red, T->fetched, T->passed, T->notes[0] ? "; " : "",
		 T->notes, mf->total, (double)(util_now_ns() - T->t0) / 1e9);
}

static void ec_close(void *self)
{
	free(self);
}

static const struct tier_ops ec_tier_ops = {
	.name = "ec",
	.get = ec_get,
	.got = ec_got,
	.close = ec_close,
};

int eng_ec_tier(struct eng *e, uint32_t nodes, uint32_t dp, struct tier *t)
{
	struct ec_tier *T = calloc(1, sizeof(*T));
	if (!T)
		return -ENOMEM;
	T->e = e;
	T->nodes = nodes;
	T->dp = dp;
	t->ops = &ec_tier_ops;
	t->self = T;
	return 0;
}
