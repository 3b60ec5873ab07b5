/* engine_ec.c — `redundancy=rs:K+M`: the setting, a step's parity holding
 * (a RAM-tier record: ram_parity_open), protecting a step and the ec_* data
 * requests (see engine_ec.h).
 * Data connection requests (first NT_REQ on a "data" connection); the
 * ones that write (ec_meta, ec_data) are taken only for this node's current
 * job, for a step not older than its protected one and within
 * EC_PENDING_STEPS steps above the LKG (admit_step), and only from a unit
 * of this node's group:
 *   ec_meta  {job, step, owner, manifest:b64} -> {ok}: the owner's manifest
 *            (its size and hash are the geometry of its pieces)
 *   ec_data  {job, step, group, cw, slot}, then one NT_FILE (the data
 *            fragment) -> {ok} once folded into this node's parity
 *   ec_get   {job, step, group, cw, slot} -> {size}, then one NT_FILE: a
 *            parity fragment stored here, or a data fragment cut on the fly
 *            from this node's own shard
 *   ec_metas {job, step} -> {metas: {"R": b64}}: the group's manifests
 * Layout: RAMDIR/shards/JOB/STEP/parity/{m<R>.mf, g<G>-c<CW>-s<SLOT>.frag,
 * sent, protected, *.tmp}. It is a catalog record of the RAM tier (SHF_PARITY):
 * the retention plan drops it with its step (fs/commit.c, also for room
 * under ram_size), the RAM tier's start-up scan checks it, mtcfs-admin
 * verify reads it; nothing here collects or scans it. */
#include "cluster/engine_ec.h"
#include "cluster/redund.h"
#include "common/crc32c.h"
#include "common/jobname.h"
#include "common/io.h"
#include "common/log.h"
#include "common/util.h"
#include "net/proto.h"
#include "tiers/lifecycle.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define EC_META_MAX EC_STORED_META_MAX   /* a manifest file read back from a holding */

/* One parity slot being folded on this node. */
struct enc_slot {
	struct enc_slot *next;
	char job[RCFG_JOB_MAX + 1];
	uint64_t step;
	unsigned gi, cw, slot;      /* slot: K + j */
	struct ec_enc *enc;
	/* the parity file being written ("*.frag.tmp"), staged through the
	 * RAM tier; pf.dirfd is set by each request (its own holding fd) */
	struct ram_pfile pf;
	uint32_t added;             /* data indices folded, bit per index */
};

struct eng_ec {
	/* protects the fields below; never held with e->mu, nor across
	 * ram_reserve; under it only a RAM key and the catalog (admit_step) */
	pthread_mutex_t mu;
	struct ec_redundancy mount, job;
	bool has_job;
	struct enc_slot *open;
};

/* ---------- setting ---------- */

int eng_ec_start(struct eng *e, const char *redundancy, char *err, size_t errlen)
{
	struct eng_ec *x = calloc(1, sizeof(*x));
	int rc;

	if (!x)
		return -ENOMEM;
	rc = ec_parse_redundancy(redundancy, &x->mount, err, errlen);
	if (rc < 0) {
		free(x);
		return rc;
	}
	pthread_mutex_init(&x->mu, NULL);
	e->ec = x;
	if (x->mount.kind == EC_RS)
		log_info("engine", "redundancy rs:%u+%u (mount option): steps are erasure coded, not replicated",
			 x->mount.k, x->mount.m);
	return 0;
}

void eng_ec_stop(struct eng *e)
{
	struct eng_ec *x = e ? e->ec : NULL;
	if (!x)
		return;
	while (x->open) {
		struct enc_slot *s = x->open;
		x->open = s->next;
		ec_enc_free(s->enc);
		if (s->pf.fd >= 0)
			close(s->pf.fd);   /* the start-up scan removes the file */
		free(s);
	}
	pthread_mutex_destroy(&x->mu);
	free(x);
	e->ec = NULL;
}

void eng_ec_set_job(struct eng *e, bool has, const struct ec_redundancy *r)
{
	if (!e->ec)
		return;
	pthread_mutex_lock(&e->ec->mu);
	e->ec->has_job = has;
	if (has)
		e->ec->job = *r;
	pthread_mutex_unlock(&e->ec->mu);
}

bool eng_ec_get(struct eng *e, struct ec_redundancy *r)
{
	struct ec_redundancy v = { EC_REPLICATION, 0, 0 };
	if (e && e->ec) {
		pthread_mutex_lock(&e->ec->mu);
		v = e->ec->has_job ? e->ec->job : e->ec->mount;
		pthread_mutex_unlock(&e->ec->mu);
	}
	if (r)
		*r = v;
	return v.kind == EC_RS;
}

/* ---------- shared helpers ---------- */

int ecx_ctx(struct eng *e, uint32_t nodes, uint32_t dp, struct eng_ec_ctx *x)
{
	int *same = NULL, rc;

	memset(x, 0, sizeof(*x));
	x->e = e;
	x->gi = -1;
	if (!eng_ec_get(e, &x->red) || nodes == 0)
		return -ENOENT;
	x->rank = eng_rank(e);
	if (x->rank < 0 || (uint32_t)x->rank >= nodes)
		return -ENOENT;
	x->nodes = nodes;
	x->dp = dp;
	same = calloc(nodes, sizeof(int));
	if (!same)
		return -ENOMEM;
	rc = ecplan_dp_same((int)nodes, (int)dp, same);
	if (rc == 0) {
		struct ecplan_in in = { .nodes = (int)nodes, .k = x->red.k, .m = x->red.m,
					.same = same };
		rc = ecplan_build(&in, &x->plan);
	}
	free(same);
	if (rc < 0)
		return rc;
	x->gi = x->plan->group[x->rank];
	x->pos = x->plan->pos[x->rank];
	return x->gi < 0 ? -ENOENT : 0;
}

void ecx_ctx_free(struct eng_ec_ctx *x)
{
	ecplan_free(x->plan);
	x->plan = NULL;
}

int ecx_dir(struct eng *e, const char *job, uint64_t step, bool create)
{
	return ram_parity_open(e->ram, job, step, create);
}

void ecx_label(const char *job, uint64_t step, unsigned gi, unsigned cw, uint8_t out[16])
{
	uint32_t h = mf_crc32c(0, job, strlen(job));

	memset(out, 0, 16);
	for (int i = 0; i < 8; i++)
		out[i] = (uint8_t)(step >> (8 * i));
	for (int i = 0; i < 4; i++)
		out[8 + i] = (uint8_t)(gi >> (8 * i));
	out[12] = (uint8_t)cw;
	out[13] = (uint8_t)(cw >> 8);
	out[14] = (uint8_t)h;
	out[15] = (uint8_t)(h >> 8);
}

static int read_meta(int dirfd, int owner, struct manifest **mf)
{
	char name[32], *buf = NULL;
	size_t len = 0;
	int rc;

	snprintf(name, sizeof(name), "m%d.mf", owner);
	rc = util_read_file_at(dirfd, name, EC_META_MAX, &buf, &len);
	if (rc == 0)
		rc = mf_decode((const uint8_t *)buf, len, mf);
	free(buf);
	return rc;
}

int ecx_store_meta(struct eng *e, int dirfd, const char *name, const void *buf, size_t len)
{
	struct eng_ec *ec = e->ec;
	struct ram_pfile pf;
	char *old = NULL;
	size_t olen = 0;
	int rc;

	/* reserved holding no lock, as every ram_reserve (its reclaim takes
	 * fs->mu and the engine's mu); given back when nothing is written */
	rc = ram_pfile_reserve(e->ram, dirfd, len, &pf);
	if (rc < 0)
		return rc;
	pthread_mutex_lock(&ec->mu);
	rc = util_read_file_at(dirfd, name, EC_META_MAX, &old, &olen);
	if (rc == 0) {
		rc = olen == len && !memcmp(old, buf, len) ? 1 : -EEXIST;
	} else if (rc == -ENOENT) {
		rc = ram_pfile_create(&pf, NULL, "meta");
		if (rc == 0)
			rc = io_write_full(pf.fd, buf, len);
		if (rc == 0)
			rc = ram_pfile_publish(e->ram, &pf, name);
	}
	pthread_mutex_unlock(&ec->mu);
	free(old);
	ram_pfile_abort(e->ram, &pf);   /* nothing left once published */
	return rc < 0 ? rc : 0;
}

int ecx_load_metas(const struct eng_ec_ctx *x, int dirfd, uint64_t *size, uint8_t (*hash)[32],
		   int rank, struct manifest **mine, int *missing)
{
	const struct ecplan_group *g = &x->plan->g[x->gi];

	for (unsigned p = 0; p < g->n; p++) {
		struct manifest *mf = NULL;
		int u = g->unit[p];
		int rc = read_meta(dirfd, u, &mf);
		if (rc < 0) {
			if (missing)
				*missing = u;
			return rc == -EBADMSG ? rc : -ENOENT;
		}
		size[u] = mf->total;
		memcpy(hash[u], mf->hash, 32);
		if (mine && u == rank)
			*mine = mf;
		else
			mf_free(mf);
	}
	return 0;
}

int ecx_connect(struct eng *e, uint32_t rank, struct nconn **c)
{
	char addr[256];
	int me, rc;

	rc = eng_addr_of(e, rank, addr, sizeof(addr));
	if (rc < 0)
		return rc;
	me = eng_rank(e);
	return nconn_connect(addr, me, "data", &e->auth, 5000, c, NULL);
}

void ecx_send_replicated(struct eng *e, const char *job, uint64_t step, uint32_t nodes,
			 uint32_t dp)
{
	struct proto_step_ev m = { .job = { job, nodes, dp }, .step = step, .workers = 1 };
	json_t *ev = proto_replicated_encode(&m);

	if (!ev || eng_ctl_event(e, ev) < 0)
		log_warn("engine", "cannot report step %" PRIu64 " as protected to the coordinator at %s",
			 step, e->coord_addr);
	json_decref(ev);
}

/* ---------- protecting a step ---------- */

static int call_ok(struct nconn *c)
{
	struct net_hdr h;
	json_t *resp = NULL;
	int rc = nconn_recv(c, DATA_TIMEOUT_MS, &h, &resp);
	if (rc == 0 && h.type == NT_ERROR)
		rc = net_error_errno(resp);
	else if (rc == 0 && !json_is_true(json_object_get(resp, "ok")))
		rc = -EPROTO;
	json_decref(resp);
	return rc;
}

static int send_meta(struct eng *e, uint32_t to, const char *job, uint64_t step, int owner,
		     const struct shard_rec *rec)
{
	struct nconn *c = NULL;
	char *b64 = xfer_b64_encode(rec->mf, rec->mflen);
	struct proto_ec pm = { .job = job, .step = step, .owner = (uint32_t)owner,
			       .manifest = b64 ? b64 : "", .has_to = true, .to = to };
	json_t *req = proto_ec_encode(PROTO_EC_META, &pm), *resp = NULL;
	int rc;

	free(b64);
	rc = ecx_connect(e, to, &c);
	if (rc == 0)
		rc = nconn_call(c, req, &resp, DATA_TIMEOUT_MS);
	if (rc < 0)
		eng_table_stale(e);   /* the retry looks the rank up again */
	json_decref(req);
	json_decref(resp);
	nconn_close(c);
	return rc;
}

static int send_data(struct eng *e, uint32_t to, const char *job, uint64_t step, unsigned gi,
		     unsigned cw, unsigned slot, int fd, uint64_t size)
{
	struct nconn *c = NULL;
	struct proto_ec pm = { .job = job, .step = step, .group = (uint32_t)gi, .cw = (uint32_t)cw,
			       .slot = (uint32_t)slot, .has_to = true, .to = to };
	json_t *req = proto_ec_encode(PROTO_EC_DATA, &pm);
	int rc;

	rc = ecx_connect(e, to, &c);
	if (rc == 0)
		rc = nconn_send(c, NT_REQ, 1, req);
	/* the fragment carries its own CRC32Cs (header, payload, trailer) */
	if (rc == 0)
		rc = nconn_send_file(c, "fragment", fd, size, 0);
	if (rc == 0)
		rc = call_ok(c);
	if (rc < 0)
		eng_table_stale(e);   /* the retry looks the rank up again */
	json_decref(req);
	nconn_close(c);
	return rc;
}

/* A send to one peer is tried 3 times within EC_SEND_BUDGET_MS, and not
 * again once the daemon stops (eng_retry_wait). */
#define EC_SEND_TRIES      3
#define EC_SEND_BUDGET_MS  10000

/* Every manifest of the group is here: send this node's data fragments to
 * the parity holders (once per step: the "sent" marker). */
static void send_frags(struct eng_ec_ctx *x, const char *job, uint64_t step)
{
	struct eng *e = x->e;
	const struct ecplan_group *g = &x->plan->g[x->gi];
	struct shard_key k = { .step = step, .rank = (uint32_t)x->rank };
	struct manifest *mine = NULL;
	uint64_t *size = calloc(x->nodes, sizeof(uint64_t));
	uint8_t (*hash)[32] = calloc(x->nodes, 32);
	int dirfd = -1, sfd = -1, mfd, rc, failed = 0;
	char err[300] = "";

	snprintf(k.job, sizeof(k.job), "%s", job);
	if (!size || !hash)
		goto out;
	dirfd = ecx_dir(e, job, step, false);
	if (dirfd < 0 || ecx_load_metas(x, dirfd, size, hash, x->rank, &mine, NULL) < 0)
		goto out;
	mfd = openat(dirfd, "sent", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (mfd < 0)
		goto out;     /* sent already (or cannot mark: then not twice) */
	close(mfd);
	sfd = ram_shard_open(e->ram, &k);
	if (sfd < 0) {
		log_warn("engine", "ec: job=%s step=%" PRIu64 ": own shard gone before its fragments were sent",
			 job, step);
		goto out;
	}
	struct ec_shard sh = { sfd, mine };
	for (unsigned t = 0; t < g->k; t++) {
		struct ec_geom geom;
		unsigned cw, slot;
		struct ram_pfile pf;
		uint64_t fsz;
		int fd;

		ecplan_piece(g, (unsigned)x->pos, t, &cw, &slot);
		if (ecplan_geom(x->plan, (unsigned)x->gi, cw, size, (const uint8_t(*)[32])hash,
				&geom) < 0)
			goto out;
		ecx_label(job, step, (unsigned)x->gi, cw, geom.label);
		fsz = ec_frag_size(&geom, slot);
		/* sent, then removed: staged through the RAM tier, never published */
		rc = ram_pfile_reserve(e->ram, dirfd, fsz, &pf);
		if (rc == 0 && ram_pfile_create(&pf, NULL, "out") < 0) {
			ram_pfile_abort(e->ram, &pf);
			goto out;
		}
		fd = pf.fd;
		if (rc == 0) {
			rc = ec_frag_data(&geom, slot, &sh, fd, err, sizeof(err));
			for (unsigned j = 0; rc == 0 && j < g->m; j++) {
				int to = g->unit[ecplan_slot_pos(g, cw, g->k + j)];
				int r2 = -EIO;
				uint64_t t0 = util_now_ns();
				for (int a = 0; a < EC_SEND_TRIES; a++) {
					r2 = send_data(e, (uint32_t)to, job, step, (unsigned)x->gi, cw,
						       slot, fd, fsz);
					if (r2 == 0 || a + 1 == EC_SEND_TRIES ||
					    !eng_retry_wait(e, a, t0, EC_SEND_BUDGET_MS))
						break;
				}
				if (r2 < 0) {
					failed++;
					log_warn("engine", "ec: job=%s step=%" PRIu64 " cw %u slot %u to rank %d failed: %s",
						 job, step, cw, slot, to, strerror(-r2));
				}
			}
		}
		if (rc < 0)
			log_warn("engine", "ec: job=%s step=%" PRIu64 " data fragment %u: %s", job,
				 step, t, err[0] ? err : strerror(-rc));
		ram_pfile_abort(e->ram, &pf);
		if (rc < 0)
			failed++;
	}
	log_info("engine", "ec: job=%s step=%" PRIu64 " sent %u data fragments to their parity holders (rs:%u+%u group %d)%s",
		 job, step, g->k, g->k, g->m, x->gi, failed ? " with failures" : "");
out:
	if (sfd >= 0)
		close(sfd);
	if (dirfd >= 0)
		close(dirfd);
	mf_free(mine);
	free(size);
	free(hash);
}

int ecx_submit(struct eng *e, const char *job, uint64_t step, uint32_t nodes, uint32_t dp,
	       void (*fn)(void *))
{
	struct ecx_step_job *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	*s = (struct ecx_step_job){ .e = e, .step = step, .nodes = nodes, .dp = dp };
	snprintf(s->job, sizeof(s->job), "%s", job);
	if (workq_submit(e->replq, fn, s) < 0) {
		free(s);
		return -ENOMEM;
	}
	return 0;
}

static void send_run(void *arg)
{
	struct ecx_step_job *s = arg;
	struct eng_ec_ctx x;
	if (ecx_ctx(s->e, s->nodes, s->dp, &x) == 0)
		send_frags(&x, s->job, s->step);
	ecx_ctx_free(&x);
	free(s);
}

/* After a manifest arrived: when the group's are all here, send (on the
 * replication worker, not this data thread). */
static void maybe_send(struct eng *e, const char *job, uint64_t step, uint32_t nodes, uint32_t dp)
{
	struct eng_ec_ctx x;
	uint64_t *size = NULL;
	uint8_t (*hash)[32] = NULL;
	int dirfd = -1;
	bool all = false;

	if (ecx_ctx(e, nodes, dp, &x) < 0)
		goto out;
	size = calloc(nodes, sizeof(uint64_t));
	hash = calloc(nodes, 32);
	dirfd = ecx_dir(e, job, step, false);
	all = size && hash && dirfd >= 0 && ecx_load_metas(&x, dirfd, size, hash, -1, NULL, NULL) == 0 &&
	      faccessat(dirfd, "sent", F_OK, 0) < 0;
	if (all)
		ecx_submit(e, job, step, nodes, dp, send_run);
out:
	if (dirfd >= 0)
		close(dirfd);
	free(size);
	free(hash);
	ecx_ctx_free(&x);
}

/* The scheme's protect: this node's manifest of k to its group, and its
 * data fragments once the group's geometry is known (maybe_send). */
static void rs_protect(struct eng *e, const struct shard_key *k, const uint8_t hash[32],
		       uint32_t nodes, uint32_t dp)
{
	struct eng_ec_ctx x;
	int dirfd = -1, rc;

	rc = ecx_ctx(e, nodes, dp, &x);
	if (rc < 0 || x.plan->rep[x.rank] != x.rank) {
		/* nothing to encode here (too few distinct shards, or a
		 * data-parallel twin whose unit the representative protects) */
		if (rc == -ENOENT && x.plan)
			log_warn("engine", "ec: job=%s step=%" PRIu64 ": not erasure coded: %s", k->job,
				 k->step, x.plan->why);
		ecx_send_replicated(e, k->job, k->step, nodes, dp);
		goto out;
	}
	dirfd = ecx_dir(e, k->job, k->step, true);
	if (dirfd < 0 || ecx_own_meta(&x, dirfd, k) < 0)
		goto out;
	maybe_send(e, k->job, k->step, nodes, dp);
out:
	if (dirfd >= 0)
		close(dirfd);
	ecx_ctx_free(&x);
}

int ecx_own_meta(struct eng_ec_ctx *x, int dirfd, const struct shard_key *k)
{
	struct eng *e = x->e;
	struct shard_rec rec = { 0 };
	const struct ecplan_group *g = &x->plan->g[x->gi];
	char name[32];
	int rc;

	rc = idx_get_shard(ram_idx(e->ram), k, &rec);
	if (rc == 0 && !rec.mf)
		rc = -ENOENT;
	snprintf(name, sizeof(name), "m%d.mf", x->rank);
	if (rc == 0)
		rc = ecx_store_meta(e, dirfd, name, rec.mf, rec.mflen);
	for (unsigned p = 0; rc == 0 && p < g->n; p++) {
		int to = g->unit[p], r2 = -EIO;
		uint64_t t0 = util_now_ns();
		if (to == x->rank)
			continue;
		for (int a = 0; a < EC_SEND_TRIES; a++) {
			r2 = send_meta(e, (uint32_t)to, k->job, k->step, x->rank, &rec);
			if (r2 == 0 || a + 1 == EC_SEND_TRIES ||
			    !eng_retry_wait(e, a, t0, EC_SEND_BUDGET_MS))
				break;
		}
		if (r2 < 0)
			log_warn("engine", "ec: job=%s step=%" PRIu64 ": manifest to rank %d failed: %s",
				 k->job, k->step, to, strerror(-r2));
	}
	idx_rec_clear(&rec);
	return rc;
}

/* ---------- serving ---------- */

static void send_error(struct nconn *c, uint32_t id, int err, const char *what)
{
	json_t *m = net_error_msg(err, what);
	nconn_send(c, NT_ERROR, id, m);
	json_decref(m);
}

static void send_ok(struct nconn *c, uint32_t id)
{
	json_t *m = json_pack("{s:b}", "ok", 1);
	nconn_send(c, NT_RESP, id, m);
	json_decref(m);
}

struct ec_req {
	const char *job;
	uint64_t step, group, cw, slot;
};

_Static_assert(PROTO_EC_MAX_N == EC_MAX_N, "net/proto bounds cw and slot by the code's size");

/* The request's fields through net/proto's decoder (-EBADMSG when it
 * refuses them); *owner for ec_meta. */
static int parse_req(enum proto_op op, json_t *m, struct ec_req *r, uint32_t *owner)
{
	struct proto_ec pm;

	memset(r, 0, sizeof(*r));
	if (proto_ec_decode(op, m, &pm, NULL, 0) < 0)
		return -EBADMSG;
	r->job = pm.job;
	r->step = pm.step;
	r->group = pm.group;
	r->cw = pm.cw;
	r->slot = pm.slot;
	if (owner)
		*owner = pm.owner;
	return 0;
}

static void job_shape(struct eng *e, uint32_t *nodes, uint32_t *dp)
{
	struct job_now now;

	jobid_get(e->jid, &now);
	*nodes = now.nodes;
	*dp = now.dp;
}

/* A request about a codeword member, and the plan for it. */
static int parse_ctx(struct eng *e, enum proto_op op, json_t *m, struct ec_req *r,
		     struct eng_ec_ctx *x)
{
	uint32_t nodes, dp;
	int rc = parse_req(op, m, r, NULL);
	if (rc < 0)
		return rc;
	job_shape(e, &nodes, &dp);
	return ecx_ctx(e, nodes, dp, x);
}

int ecx_recv_frag(struct eng *e, struct nconn *c, int dirfd, const char *prefix,
		  struct ram_pfile *pf)
{
	struct net_hdr h;
	json_t *f = NULL;
	uint64_t size = 0;
	uint32_t crc;
	int rc;

	*pf = (struct ram_pfile){ .dirfd = dirfd, .fd = -1 };
	rc = nconn_recv(c, DATA_TIMEOUT_MS, &h, &f);
	if (rc == 0 && (h.type != NT_FILE || net_json_u64(f, "size", EC_MAX_MEMBER, &size) < 0))
		rc = -EPROTO;
	json_decref(f);
	if (rc == 0)
		rc = ram_pfile_reserve(e->ram, dirfd, nconn_file_data(c), pf);
	if (rc == 0)
		rc = ram_pfile_create(pf, NULL, prefix);
	if (rc >= 0)
		rc = nconn_recv_file(c, pf->fd, size, DATA_TIMEOUT_MS, &crc);
	if (rc >= 0 && lseek(pf->fd, 0, SEEK_SET) < 0)
		rc = -errno;
	if (rc >= 0)
		return pf->fd;
	ram_pfile_abort(e->ram, pf);
	return rc;
}

/* At most this many steps above the job's LKG hold fragments here: the
 * steps being protected now (a node commits a step a little before or
 * after the others, not many steps ahead of them). */
#define EC_PENDING_STEPS 4

/* Of job's parity holdings here: how many are of steps above `lkg` (all
 * when !has_lkg), and the highest of them. */
static unsigned pending_steps(struct eng *e, const char *job, bool has_lkg, uint64_t lkg,
			      uint64_t *highest)
{
	struct shard_rec *recs = NULL;
	size_t n = 0;
	unsigned cnt = 0;

	*highest = 0;
	if (idx_list_records(ram_idx(e->ram), job, &recs, &n) < 0)
		return 0;
	for (size_t i = 0; i < n; i++) {
		uint64_t s = recs[i].key.step;
		if (!life_is_parity(&recs[i].key) || (has_lkg && s <= lkg))
			continue;
		cnt++;
		if (s > *highest)
			*highest = s;
	}
	idx_recs_free(recs, n);
	return cnt;
}

/* May an authenticated peer write fragments of (job, step) on this node
 * (ec_meta, ec_data)? Only for the node's current job, for a step not
 * older than the job's safe step (older fragments are collected), and
 * for a step without a fragment directory here yet only while fewer than
 * EC_PENDING_STEPS steps above the LKG have one; at the limit a lower
 * step takes the place of the highest (the least plausible: far ahead
 * of the job, written by nobody but the sender). The step's directory,
 * a dirfd, or -EPERM / -ERANGE / -errno with why. */
static int admit_step(struct eng *e, const char *job, uint64_t step, char *why, size_t whylen)
{
	char cur[RCFG_JOB_MAX + 1];
	struct job_now now;
	bool set, has_lkg, has_safe;
	uint64_t lkg = 0, safe = 0, highest;
	int fd, rc;

	pthread_mutex_lock(&e->mu);
	jobid_get(e->jid, &now);   /* its lock after mu */
	set = now.set;
	snprintf(cur, sizeof(cur), "%s", now.job);
	has_lkg = e->has_lkg && !strcmp(e->lkg_job, job);
	has_safe = has_lkg && e->has_safe;
	lkg = e->lkg;
	safe = e->safe;
	pthread_mutex_unlock(&e->mu);
	if (!set || strcmp(cur, job)) {
		snprintf(why, whylen, "job %s is not this node's job", job);
		return -EPERM;
	}
	if (has_safe && step < safe) {
		snprintf(why, whylen, "step %" PRIu64 " is older than the job's protected step %" PRIu64,
			 step, safe);
		return -ERANGE;
	}
	fd = ecx_dir(e, job, step, false);
	if (fd >= 0 || fd != -ENOENT)
		return fd;
	/* ec->mu keeps the count and the new holding together; under it a
	 * RAM key and the catalog (ram_parity_open, ram_drop), never the other
	 * way round */
	pthread_mutex_lock(&e->ec->mu);
	rc = ecx_dir(e, job, step, true);
	if (rc >= 0) {
		close(rc);
		rc = 0;
	}
	if (rc >= 0 && pending_steps(e, job, has_lkg, lkg, &highest) > EC_PENDING_STEPS) {
		/* the new one counts: one too many */
		struct shard_key k;
		if (highest > step) {
			uint64_t freed = 0;
			life_parity_key(job, highest, &k);
			ram_drop(e->ram, &k, &freed);
			log_warn("engine", "ec: job=%s: fragments of step %" PRIu64 " dropped for step %" PRIu64 " (at most %u steps above the LKG)",
				 job, highest, step, EC_PENDING_STEPS);
		} else {
			life_parity_key(job, step, &k);
			ram_drop(e->ram, &k, NULL);
			snprintf(why, whylen, "step %" PRIu64 " is too far ahead: %u steps above the LKG have fragments here already",
				 step, EC_PENDING_STEPS);
			rc = -ERANGE;
		}
	}
	pthread_mutex_unlock(&e->ec->mu);
	if (rc < 0)
		return rc;
	return ecx_dir(e, job, step, false);
}

static void serve_meta(struct eng *e, struct nconn *c, int peer, uint32_t id, json_t *m)
{
	struct eng_ec_ctx x = { 0 };
	struct manifest *mf = NULL;
	struct ec_req r;
	uint32_t owner;
	uint32_t nodes, dp;
	uint8_t *buf = NULL;
	size_t len = 0;
	char why[300] = "", name[32];
	int dirfd = -1, rc;

	if (parse_req(PROTO_EC_META, m, &r, &owner) < 0) {
		send_error(c, id, EINVAL, "bad ec_meta request");
		return;
	}
	if (peer < 0 || owner != (uint64_t)peer) {
		send_error(c, id, EPERM, "only a shard's owner sends its manifest");
		return;
	}
	job_shape(e, &nodes, &dp);
	rc = ecx_ctx(e, nodes, dp, &x);
	if (rc == 0 && (owner >= x.nodes || x.plan->group[owner] != x.gi ||
			x.plan->rep[owner] != (int)owner)) {
		/* a manifest goes to the units of its owner's group only */
		snprintf(why, sizeof(why), "rank %u stores no shard in this node's group", owner);
		rc = -EPERM;
	}
	if (rc == 0)
		rc = xfer_decode_manifest(m, &mf, why, sizeof(why));
	if (rc == 0)
		rc = mf_encode(mf, &buf, &len);
	if (rc == 0)
		rc = dirfd = admit_step(e, r.job, r.step, why, sizeof(why));
	snprintf(name, sizeof(name), "m%d.mf", (int)owner);
	if (rc >= 0) {
		rc = ecx_store_meta(e, dirfd, name, buf, len);
		if (rc == -EEXIST)
			snprintf(why, sizeof(why), "rank %u's manifest of step %" PRIu64 " is here already, with other content",
				 owner, r.step);
	}
	if (rc < 0) {
		log_warn("engine", "ec: manifest of job=%s step=%" PRIu64 " from rank %d refused: %s",
			 r.job, r.step, peer, why[0] ? why : strerror(-rc));
		send_error(c, id, -rc, why[0] ? why : "cannot store the manifest");
	} else {
		send_ok(c, id);
	}
	if (dirfd >= 0)
		close(dirfd);
	free(buf);
	mf_free(mf);
	ecx_ctx_free(&x);
	if (rc >= 0)
		maybe_send(e, r.job, r.step, nodes, dp);
}

static bool slot_done(int dirfd, unsigned gi, unsigned cw, unsigned slot)
{
	char name[64];
	snprintf(name, sizeof(name), "g%u-c%u-s%u.frag", gi, cw, slot);
	return faccessat(dirfd, name, F_OK, 0) == 0;
}

/* Every parity slot this node stores for the step is written: protected
 * here (once: the "protected" marker), say so to the coordinator. */
static void maybe_protected(struct eng_ec_ctx *x, int dirfd, const char *job, uint64_t step)
{
	const struct ecplan_group *g = &x->plan->g[x->gi];
	int fd;

	for (unsigned j = 0; j < g->m; j++)
		if (!slot_done(dirfd, (unsigned)x->gi, ecplan_parity_cw(g, (unsigned)x->pos, j), g->k + j))
			return;
	fd = openat(dirfd, "protected", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		return;
	close(fd);
	log_info("engine", "ec: job=%s step=%" PRIu64 " parity complete here (%u fragments, rs:%u+%u group %d)",
		 job, step, g->m, g->k, g->m, x->gi);
	ecx_send_replicated(x->e, job, step, x->nodes, x->dp);
}

/* Fold the data fragment in fd (checked: this codeword, this node a
 * holder of one of its parity slots) into that slot. Called with the
 * request's fields; 0 or -errno with why. */
/* Encoders whose parity file is gone: its step's holding was dropped (by
 * the retention plan, for room, or after a restore of an older step).
 * They are freed; what their file took went with the holding. Under
 * ec->mu. */
static void prune_slots(struct eng *e)
{
	for (struct enc_slot **pp = &e->ec->open; *pp;) {
		struct enc_slot *sl = *pp;
		struct stat st;
		if (fstat(sl->pf.fd, &st) == 0 && st.st_nlink > 0) {
			pp = &sl->next;
			continue;
		}
		*pp = sl->next;
		ec_enc_free(sl->enc);
		ram_pfile_abort(e->ram, &sl->pf);   /* unlinked: gives back the rest */
		free(sl);
	}
}

static int fold(struct eng_ec_ctx *x, int dirfd, const struct ec_req *r, int fd, char *why,
		size_t whylen)
{
	struct eng_ec *ec = x->e->ec;
	const struct ecplan_group *g = &x->plan->g[x->gi];
	struct ec_geom geom;
	struct enc_slot *s;
	struct ram_pfile pre;
	uint8_t label[16];
	unsigned index, j, slot;
	char tmp[64], fin[64];
	int rc;

	rc = ec_frag_info(fd, &geom, &index, why, whylen);
	if (rc < 0)
		return rc;
	ecx_label(r->job, r->step, (unsigned)r->group, (unsigned)r->cw, label);
	if (r->group != (uint64_t)x->gi || geom.k != g->k || geom.m != g->m ||
	    memcmp(geom.label, label, 16) || index != r->slot || index >= g->k) {
		snprintf(why, whylen, "fragment is not data slot %u of group %u codeword %u of this step",
			 (unsigned)r->slot, (unsigned)r->group, (unsigned)r->cw);
		return -EBADMSG;
	}
	for (j = 0; j < g->m; j++)
		if (ecplan_slot_pos(g, (unsigned)r->cw, g->k + j) == (unsigned)x->pos)
			break;
	if (j == g->m) {
		snprintf(why, whylen, "this node holds no parity of codeword %u", (unsigned)r->cw);
		return -EPERM;
	}
	slot = g->k + j;
	snprintf(tmp, sizeof(tmp), "g%u-c%u-s%u.frag.tmp", (unsigned)r->group, (unsigned)r->cw, slot);
	snprintf(fin, sizeof(fin), "g%u-c%u-s%u.frag", (unsigned)r->group, (unsigned)r->cw, slot);
	if (lseek(fd, 0, SEEK_SET) < 0)
		return -errno;
	/* The parity file's RAM is reserved before ec->mu, as every
	 * ram_reserve() is made holding no lock (its reclaim takes fs->mu and
	 * the engine's mu); a slot that exists already gives it back. */
	rc = ram_pfile_reserve(x->e->ram, dirfd, ec_frag_size(&geom, slot), &pre);
	if (rc < 0) {
		snprintf(why, whylen, "cannot start parity %s: %s", fin, strerror(-rc));
		return rc;
	}
	pthread_mutex_lock(&ec->mu);
	prune_slots(x->e);
	if (faccessat(dirfd, fin, F_OK, 0) == 0) {
		rc = 0;      /* complete already: a sender's retry */
		goto out;
	}
	for (s = ec->open; s; s = s->next)
		if (!strcmp(s->job, r->job) && s->step == r->step && s->gi == r->group &&
		    s->cw == r->cw && s->slot == slot)
			break;
	if (!s) {
		s = calloc(1, sizeof(*s));
		if (!s) {
			rc = -ENOMEM;
			goto out;
		}
		snprintf(s->job, sizeof(s->job), "%s", r->job);
		s->step = r->step;
		s->gi = (unsigned)r->group;
		s->cw = (unsigned)r->cw;
		s->slot = slot;
		rc = ram_pfile_create(&pre, tmp, NULL);
		if (rc == 0)
			rc = ec_enc_open(&geom, j, 1, &pre.fd, &s->enc);
		if (rc < 0) {
			free(s);
			snprintf(why, whylen, "cannot start parity %s: %s", fin, strerror(-rc));
			goto out;
		}
		s->pf = pre;   /* the slot's now */
		pre = (struct ram_pfile){ .dirfd = dirfd, .fd = -1 };
		s->next = ec->open;
		ec->open = s;
	}
	if (s->added & (1u << index)) {
		rc = 0;      /* this member again: a sender's retry */
		goto out;
	}
	s->pf.dirfd = dirfd;   /* this request's: the slot outlives the last one's */
	rc = ec_enc_add(s->enc, fd, why, whylen);
	if (rc == 0) {
		s->added |= 1u << index;
		if (s->added == (g->k >= 32 ? 0xffffffffu : (1u << g->k) - 1)) {
			rc = ec_enc_finish(s->enc, why, whylen);
			if (rc == 0)
				rc = ram_pfile_publish(x->e->ram, &s->pf, fin);
			goto drop;
		}
		goto out;
	}
drop:
	/* finished, or spoilt (a payload failed after folding): the slot goes */
	for (struct enc_slot **pp = &ec->open; *pp; pp = &(*pp)->next)
		if (*pp == s) {
			*pp = s->next;
			break;
		}
	ec_enc_free(s->enc);
	ram_pfile_abort(x->e->ram, &s->pf);   /* nothing left once published */
	free(s);
out:
	pthread_mutex_unlock(&ec->mu);
	ram_pfile_abort(x->e->ram, &pre);     /* a slot that existed: given back */
	if (rc == 0)
		maybe_protected(x, dirfd, r->job, r->step);
	return rc;
}

static void serve_data(struct eng *e, struct nconn *c, int peer, uint32_t id, json_t *m)
{
	struct eng_ec_ctx x = { 0 };
	struct ram_pfile in = { .fd = -1 };
	struct ec_req r;
	char why[400] = "";
	int dirfd = -1, fd = -1, rc;

	rc = parse_ctx(e, PROTO_EC_DATA, m, &r, &x);
	if (rc == 0 && (r.group != (uint64_t)x.gi || r.cw >= x.plan->g[x.gi].n ||
			r.slot >= x.plan->g[x.gi].k ||
			x.plan->g[x.gi].unit[ecplan_slot_pos(&x.plan->g[x.gi], (unsigned)r.cw,
							     (unsigned)r.slot)] != peer)) {
		/* a data member comes from its unit only, as a replica from its owner */
		snprintf(why, sizeof(why), "rank %d does not hold data slot %u of codeword %u", peer,
			 (unsigned)r.slot, (unsigned)r.cw);
		rc = -EPERM;
	}
	if (rc == 0)
		rc = dirfd = admit_step(e, r.job, r.step, why, sizeof(why));
	if (rc >= 0)
		rc = fd = ecx_recv_frag(e, c, dirfd, "in", &in);
	if (rc >= 0)
		rc = fold(&x, dirfd, &r, fd, why, sizeof(why));
	if (rc < 0) {
		log_warn("engine", "ec: data fragment for job=%s step=%" PRIu64 " refused: %s",
			 r.job ? r.job : "?", r.step, why[0] ? why : strerror(-rc));
		send_error(c, id, -rc, why[0] ? why : "fragment refused");
	} else {
		send_ok(c, id);
	}
	ram_pfile_abort(e->ram, &in);   /* folded: the received fragment goes */
	if (dirfd >= 0)
		close(dirfd);
	ecx_ctx_free(&x);
}

static int send_fd(struct nconn *c, uint32_t id, int fd)
{
	struct stat st;
	json_t *resp;
	int rc;

	if (fstat(fd, &st) < 0)
		return -errno;
	resp = json_pack("{s:I}", "size", (json_int_t)st.st_size);
	rc = nconn_send(c, NT_RESP, id, resp);
	json_decref(resp);
	return rc < 0 ? rc : nconn_send_file(c, "fragment", fd, (uint64_t)st.st_size, 0);
}

/* A data member: cut from this node's own shard on the fly, into a file
 * staged in the holding (pf, set up by the caller; removed by its
 * ram_pfile_abort once sent). Not reserved: a survivor serves a rebuild
 * even at its ram_size (a transient S/K; refusing would cost the restore). */
static int cut_data(struct eng_ec_ctx *x, const struct ec_req *r, struct ram_pfile *pf,
		    char *why, size_t whylen)
{
	const struct ecplan_group *g = &x->plan->g[x->gi];
	struct shard_key k = { .step = r->step, .rank = (uint32_t)x->rank };
	struct manifest *mine = NULL;
	uint64_t *size = calloc(x->nodes, sizeof(uint64_t));
	uint8_t (*hash)[32] = calloc(x->nodes, 32);
	struct ec_geom geom;
	int dirfd = pf->dirfd, sfd = -1, rc = -ENOMEM;

	snprintf(k.job, sizeof(k.job), "%s", r->job);
	if (!size || !hash)
		goto out;
	rc = -EINVAL;
	if (r->group != (uint64_t)x->gi || r->cw >= g->n ||
	    g->unit[ecplan_slot_pos(g, (unsigned)r->cw, (unsigned)r->slot)] != x->rank) {
		snprintf(why, whylen, "data slot %u of codeword %u is not this node's",
			 (unsigned)r->slot, (unsigned)r->cw);
		goto out;
	}
	rc = ecx_load_metas(x, dirfd, size, hash, x->rank, &mine, NULL);
	if (rc == 0)
		rc = ecplan_geom(x->plan, (unsigned)x->gi, (unsigned)r->cw, size,
				 (const uint8_t(*)[32])hash, &geom);
	if (rc < 0) {
		snprintf(why, whylen, "the group's manifests are not all here");
		goto out;
	}
	ecx_label(r->job, r->step, (unsigned)x->gi, (unsigned)r->cw, geom.label);
	sfd = rc = ram_shard_open(x->e->ram, &k);
	if (rc < 0) {
		snprintf(why, whylen, "own shard not held");
		goto out;
	}
	rc = ram_pfile_create(pf, NULL, "get");
	if (rc >= 0) {
		struct ec_shard sh = { sfd, mine };
		rc = ec_frag_data(&geom, (unsigned)r->slot, &sh, pf->fd, why, whylen);
	}
	if (rc >= 0 && lseek(pf->fd, 0, SEEK_SET) < 0)
		rc = -errno;
out:
	if (sfd >= 0)
		close(sfd);
	mf_free(mine);
	free(size);
	free(hash);
	return rc < 0 ? rc : pf->fd;
}

static void serve_get(struct eng *e, struct nconn *c, uint32_t id, json_t *m)
{
	struct eng_ec_ctx x = { 0 };
	struct ram_pfile cut = { .fd = -1 };
	struct ec_req r;
	char why[300] = "", name[64];
	int dirfd = -1, fd = -1, rc;

	rc = parse_ctx(e, PROTO_EC_GET, m, &r, &x);
	if (rc == 0)
		rc = dirfd = ecx_dir(e, r.job, r.step, false);
	if (rc >= 0 && r.slot >= x.plan->g[x.gi].k) {
		snprintf(name, sizeof(name), "g%u-c%u-s%u.frag", (unsigned)r.group, (unsigned)r.cw,
			 (unsigned)r.slot);
		fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
		rc = fd < 0 ? -errno : 0;
	} else if (rc >= 0) {
		cut.dirfd = dirfd;
		rc = cut_data(&x, &r, &cut, why, sizeof(why));
	}
	if (rc >= 0)
		rc = send_fd(c, id, cut.fd >= 0 ? cut.fd : fd);
	else
		send_error(c, id, -rc, why[0] ? why : "fragment not held here");
	if (rc < 0)
		log_warn("engine", "ec: serving job=%s step=%" PRIu64 " cw %u slot %u: %s",
			 r.job ? r.job : "?", r.step, (unsigned)r.cw, (unsigned)r.slot,
			 why[0] ? why : strerror(-rc));
	if (fd >= 0)
		close(fd);
	ram_pfile_abort(e->ram, &cut);
	if (dirfd >= 0)
		close(dirfd);
	ecx_ctx_free(&x);
}

static void serve_metas(struct eng *e, struct nconn *c, uint32_t id, json_t *m)
{
	struct eng_ec_ctx x = { 0 };
	struct ec_req r;
	json_t *resp = NULL, *metas;
	int dirfd = -1, rc;

	rc = parse_ctx(e, PROTO_EC_METAS, m, &r, &x);
	if (rc == 0)
		rc = dirfd = ecx_dir(e, r.job, r.step, false);
	if (rc < 0) {
		send_error(c, id, -rc, "no fragments of that step here");
		goto out;
	}
	resp = json_object();
	metas = json_object();
	json_object_set_new(resp, "metas", metas);
	const struct ecplan_group *g = &x.plan->g[x.gi];
	for (unsigned p = 0; p < g->n; p++) {
		char name[32], key[16], *buf = NULL, *b64;
		size_t len = 0;
		snprintf(name, sizeof(name), "m%d.mf", g->unit[p]);
		if (util_read_file_at(dirfd, name, EC_META_MAX, &buf, &len) < 0)
			continue;
		b64 = xfer_b64_encode((const uint8_t *)buf, len);
		snprintf(key, sizeof(key), "%d", g->unit[p]);
		if (b64)
			json_object_set_new(metas, key, json_string(b64));
		free(b64);
		free(buf);
	}
	nconn_send(c, NT_RESP, id, resp);
out:
	json_decref(resp);
	if (dirfd >= 0)
		close(dirfd);
	ecx_ctx_free(&x);
}

void eng_ec_serve(struct eng *e, struct nconn *c, int peer, uint32_t id, json_t *req,
		  enum proto_op op)
{
	if (!eng_ec_get(e, NULL))
		send_error(c, id, ENOSYS, "this node does not run redundancy rs:K+M");
	else if ((op == PROTO_EC_META || op == PROTO_EC_DATA) &&
		 eng_check_target(e, c, id, req, peer, proto_op_name(op)) < 0)
		return;   /* a write for another rank: answered */
	else if (op == PROTO_EC_META)
		serve_meta(e, c, peer, id, req);
	else if (op == PROTO_EC_DATA)
		serve_data(e, c, peer, id, req);
	else if (op == PROTO_EC_GET)
		serve_get(e, c, id, req);
	else if (op == PROTO_EC_METAS)
		serve_metas(e, c, id, req);
	else
		send_error(c, id, ENOSYS, "unknown op");
}

/* ---------- status ---------- */

/* The scheme's status: "parity": [[step, [[owner, hash], ...]], ...], the
 * steps this node stores all its parity of and the hashes of its group's
 * shards at each (the coordinator names a lost shard by them); nothing
 * under replication. */
static void rs_status(struct eng *e, const char *job, json_t *o)
{
	struct shard_rec *recs = NULL;
	size_t n = 0;
	json_t *arr;

	if (!eng_ec_get(e, NULL))
		return;
	arr = json_array();
	json_object_set_new(o, "parity", arr);
	if (!job_name_ok(job) || idx_list_records(ram_idx(e->ram), job, &recs, &n) < 0)
		return;
	for (size_t i = 0; i < n && json_array_size(arr) < 64; i++) {
		uint64_t step = recs[i].key.step;
		int sd;
		if (!life_is_parity(&recs[i].key))
			continue;
		sd = ecx_dir(e, job, step, false);
		if (sd < 0)
			continue;
		if (faccessat(sd, "protected", F_OK, 0) == 0) {
			json_t *hs = json_array();
			DIR *sdir = fdopendir(dup(sd));
			for (struct dirent *me; sdir && (me = readdir(sdir));) {
				struct manifest *mf = NULL;
				char hex[65];
				int owner, nn = 0;
				if (sscanf(me->d_name, "m%d.mf%n", &owner, &nn) != 1 || me->d_name[nn] ||
				    read_meta(sd, owner, &mf) < 0)
					continue;
				mf_hash_hex(mf->hash, hex);
				json_array_append_new(hs, json_pack("[i,s]", owner, hex));
				mf_free(mf);
			}
			if (sdir)
				closedir(sdir);
			json_array_append_new(arr, json_pack("[I,o]", (json_int_t)step, hs));
		}
		close(sd);
	}
	idx_recs_free(recs, n);
}

/* A shard of this node with no record here is rebuilt from the code (the
 * plan put it here because ecplan_restorable said so). */
static int rs_source(struct eng *e, const struct shard_key *k, uint32_t nodes, uint32_t dp,
		     struct tier *t)
{
	struct shard_rec rec = { 0 };
	bool have;
	int rc;

	have = idx_get_shard(ram_idx(e->ram), k, &rec) == 0;
	idx_rec_clear(&rec);
	if (have)
		return 0;
	rc = eng_ec_tier(e, nodes, dp, t);
	return rc < 0 ? rc : 1;
}

const struct redund_scheme redund_rs = {
	.name = "rs",
	.protect = rs_protect,
	.reprotect = eng_ec_restored,
	.source = rs_source,
	.status = rs_status,
};
