/* engine.c — see engine.h.
 * Data connection requests (first NT_REQ on a "data" connection):
 *   push  {key:{job,step,owner,worker}, manifest:b64}
 *         -> {have:true} (already held, or same content held: linked)
 *         -> {send:true}, then one NT_FILE per file of the manifest, then
 *            {ok:true} once every CRC32C matched and the replica is published
 *   fetch {job, step, owner, worker} -> {manifest:b64}, then one NT_FILE per file */
#include "cluster/engine.h"
#include "tiers/backup.h"
#include "tiers/bucket.h"
#include "cluster/placement.h"
#include "net/auth.h"
#include "net/client.h"
#include "cluster/coord.h"
#include "net/frame.h"
#include "net/server.h"
#include "net/tls.h"
#include "common/jobname.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "common/workq.h"

#include <errno.h>
#include <stdarg.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#define CTL_TIMEOUT_MS   10000
#define DATA_TIMEOUT_MS  60000
#define MAX_PEERS        64
#define MAX_HOLDS        64

struct pending_call {
	uint32_t id;
	bool done;
	int rc;
	json_t *resp;
};

struct eng {
	struct ram_tier *ram;
	struct eng_cb cb;
	struct net_auth auth;
	char listen[256];
	char coord_addr[256];
	char **addrs;                 /* static peers table */
	uint32_t naddrs;
	int restore_timeout_s;
	struct nsrv *srv;
	struct coord *coord;
	struct workq *replq;
	struct workq *bkq;            /* backup uploads, in order */
	struct bkt *bkt;              /* NULL: no bucket */

	pthread_mutex_t mu;           /* protects the fields below */
	int rank;
	bool rank_fixed;              /* rank= or the peers= table says it: a yaml
				       * with another node-rank is refused */
	char job[RCFG_JOB_MAX + 1];
	uint32_t nodes, dp;
	uint32_t workers;             /* shards per node and step, in the cluster and
				       * in a backup: workers-per-node with framework:
				       * pytorch (each worker's .save is its own
				       * shard), else 1 */
	bool save_files;              /* framework: pytorch: backups per worker file */
	int peers[MAX_PEERS];
	int npeers;
	bool job_set;
	uint32_t bi_min, bi_steps;    /* the job's backup interval */
	char pin_job[RCFG_JOB_MAX + 1];
	uint64_t pin_step;            /* a backup is uploading it */
	int pins;
	bool has_lkg;
	uint64_t lkg;
	bool has_safe;                /* lkg_job's step committed and replicated job-wide */
	uint64_t safe;
	char lkg_job[RCFG_JOB_MAX + 1];
	char **table;                 /* rank -> address from the coordinator */
	uint32_t ntable;

	/* control connection to the coordinator */
	pthread_mutex_t ctl_mu;       /* protects ctl state; taken before mu */
	pthread_cond_t ctl_cv;
	/* a restore in progress (protected by ctl_mu): its thread's calls to
	 * the coordinator end with -ECANCELED once a new replicator.yaml
	 * interrupts it */
	bool restoring, restore_cancel;
	pthread_t restore_thr;
	struct nconn *ctl;
	bool ctl_renaming;            /* ctl closed on purpose: a new node-rank */
	bool ctl_reader_running;
	pthread_t ctl_reader;
	uint32_t next_id;
	struct pending_call *calls[16];
	bool stopping;
};

/* ---------- small helpers ---------- */

static char *b64_encode(const uint8_t *p, size_t n)
{
	size_t outlen = 4 * ((n + 2) / 3) + 1;
	char *o = malloc(outlen);
	if (o)
		EVP_EncodeBlock((unsigned char *)o, p, (int)n);
	return o;
}

static int b64_decode(const char *s, size_t slen, uint8_t **out, size_t *outlen)
{
	uint8_t *o;
	int n;
	size_t pad = 0;

	if (slen % 4 || slen > NET_MAX_PAYLOAD)
		return -EBADMSG;
	o = malloc(slen / 4 * 3 + 1);
	if (!o)
		return -ENOMEM;
	n = EVP_DecodeBlock(o, (const unsigned char *)s, (int)slen);
	if (n < 0) {
		free(o);
		return -EBADMSG;
	}
	if (slen >= 1 && s[slen - 1] == '=')
		pad++;
	if (slen >= 2 && s[slen - 2] == '=')
		pad++;
	*out = o;
	*outlen = (size_t)n - pad;
	return 0;
}

static int parse_key(json_t *o, struct shard_key *k)
{
	const char *job;
	uint64_t step, owner, worker;
	if (net_json_str(o, "job", RCFG_JOB_MAX, &job) < 0 || !job_name_ok(job) ||
	    net_json_u64(o, "step", UINT64_MAX >> 1, &step) < 0 ||
	    net_json_u64(o, "owner", RCFG_NODES_MAX - 1, &owner) < 0 ||
	    net_json_u64(o, "worker", RCFG_WORKERS_MAX - 1, &worker) < 0)
		return -EBADMSG;
	memset(k, 0, sizeof(*k));
	snprintf(k->job, sizeof(k->job), "%s", job);
	k->step = step;
	k->rank = (uint32_t)owner;
	k->worker = (uint32_t)worker;
	return 0;
}

static json_t *key_json(const struct shard_key *k)
{
	json_t *o = json_object();
	json_object_set_new(o, "job", json_string(k->job));
	json_object_set_new(o, "step", json_integer((json_int_t)k->step));
	json_object_set_new(o, "owner", json_integer(k->rank));
	json_object_set_new(o, "worker", json_integer(k->worker));
	return o;
}

static void report(struct eng *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void report(struct eng *e, const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	log_err("engine", "%s", line);
	if (e->cb.report)
		e->cb.report(e->cb.arg, line);
}

/* Receive the files of mf into the stage: every file must arrive as an
 * NT_FILE with exactly the manifest's path and size, and its CRC32C must
 * match. Directories and symlinks come from the manifest itself. */
static int recv_files(struct eng *e, struct nconn *c, struct ram_stage *st,
		      const struct manifest *mf, char *why, size_t whylen)
{
	for (size_t i = 0; i < mf->n; i++) {
		const struct mf_entry *en = &mf->e[i];
		if (en->type == MF_DIR) {
			/* modes come from the network: no setuid/setgid/sticky bits */
			if (mkdirat(st->fd, en->path, (en->mode & 0777) | 0700) < 0 && errno != EEXIST) {
				snprintf(why, whylen, "mkdir %s: %s", en->path, strerror(errno));
				return -errno;
			}
		} else if (en->type == MF_SYMLINK) {
			/* its target passed mf_validate in mf_decode: the rule the
			 * owner applied when it sealed the shard */
			if (symlinkat(en->target, st->fd, en->path) < 0) {
				snprintf(why, whylen, "symlink %s: %s", en->path, strerror(errno));
				return -errno;
			}
		} else if (en->type == MF_FIFO) {
			if (mkfifoat(st->fd, en->path, 0600) < 0 ||
			    fchmodat(st->fd, en->path, en->mode & 0777, 0) < 0) {
				snprintf(why, whylen, "mkfifo %s: %s", en->path, strerror(errno));
				return -errno;
			}
		}
	}
	for (size_t i = 0; i < mf->n; i++) {
		const struct mf_entry *en = &mf->e[i];
		struct net_hdr h;
		json_t *m = NULL;
		const char *path;
		uint64_t size, resv;
		uint32_t crc, got;
		struct stat sb;
		int fd, rc;

		if (en->type != MF_FILE)
			continue;
		rc = nconn_recv(c, DATA_TIMEOUT_MS, &h, &m);
		if (rc < 0) {
			snprintf(why, whylen, "receiving %s: %s", en->path, strerror(-rc));
			return rc;
		}
		if (h.type == NT_ERROR) {
			rc = net_error_errno(m);
			snprintf(why, whylen, "sender failed: %s",
				 json_string_value(json_object_get(m, "error")) ?: "?");
			json_decref(m);
			return rc;
		}
		if (h.type != NT_FILE || net_file_hdr_parse(m, &path, &size, &crc) < 0 ||
		    strcmp(path, en->path) || size != en->size || crc != en->crc32c) {
			snprintf(why, whylen, "unexpected frame instead of %s", en->path);
			json_decref(m);
			return -EPROTO;
		}
		json_decref(m);
		/* a sparse file costs its data extents, not its size */
		resv = nconn_file_data(c) + 4096;
		if (ram_reserve(e->ram, resv) < 0) {
			snprintf(why, whylen, "RAM tier full (%s needs %llu bytes)", en->path,
				 (unsigned long long)resv);
			return -ENOSPC;
		}
		fd = openat(st->fd, en->path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
			    (en->mode & 0777) | 0400);
		if (fd < 0) {
			rc = -errno;
			ram_adjust(e->ram, -(int64_t)resv);
			snprintf(why, whylen, "create %s: %s", en->path, strerror(-rc));
			return rc;
		}
		rc = nconn_recv_file(c, fd, size, DATA_TIMEOUT_MS, &got);
		if (fstat(fd, &sb) == 0)
			ram_adjust(e->ram, (int64_t)sb.st_blocks * 512 - (int64_t)resv);
		close(fd);
		if (rc < 0) {
			snprintf(why, whylen, "receiving %s: %s", en->path, strerror(-rc));
			return rc;
		}
		if (got != en->crc32c) {
			snprintf(why, whylen, "%s: crc32c %08x, manifest says %08x", en->path, got,
				 en->crc32c);
			return -EBADMSG;
		}
	}
	return 0;
}

static int send_files(struct nconn *c, int dirfd, const struct manifest *mf)
{
	for (size_t i = 0; i < mf->n; i++) {
		const struct mf_entry *en = &mf->e[i];
		int fd, rc;
		if (en->type != MF_FILE)
			continue;
		fd = openat(dirfd, en->path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0)
			return -errno;
		rc = nconn_send_file(c, en->path, fd, en->size, en->crc32c);
		close(fd);
		if (rc < 0)
			return rc;
	}
	return 0;
}

static void send_error(struct nconn *c, uint32_t id, int err, const char *what)
{
	json_t *m = net_error_msg(err, what);
	nconn_send(c, NT_ERROR, id, m);
	json_decref(m);
}

/* ---------- serving data connections ---------- */

static void serve_fetch(struct eng *e, struct nconn *c, uint32_t id, json_t *req)
{
	struct shard_rec rec = { 0 };
	struct manifest *mf = NULL;
	struct shard_key k;
	json_t *resp;
	char *b64;
	int dfd = -1, rc;

	if (parse_key(req, &k) < 0) {
		send_error(c, id, EINVAL, "bad fetch request");
		return;
	}
	rc = idx_get_shard(ram_idx(e->ram), &k, &rec);
	if (rc < 0 || !rec.mf || rec.state < SH_COMMITTED || rec.state == SH_BAD ||
	    mf_decode(rec.mf, rec.mflen, &mf) < 0) {
		send_error(c, id, ENOENT, "shard not held here");
		goto out;
	}
	dfd = ram_shard_open(e->ram, &k);
	if (dfd < 0) {
		send_error(c, id, ENOENT, "shard directory missing");
		goto out;
	}
	b64 = b64_encode(rec.mf, rec.mflen);
	resp = json_object();
	json_object_set_new(resp, "manifest", json_string(b64 ? b64 : ""));
	free(b64);
	rc = nconn_send(c, NT_RESP, id, resp);
	json_decref(resp);
	if (rc == 0)
		rc = send_files(c, dfd, mf);
	if (rc < 0)
		log_warn("engine", "serving job=%s step=%llu node=%u failed: %s", k.job,
			 (unsigned long long)k.step, k.rank, strerror(-rc));
	else
		log_info("engine", "served job=%s step=%llu node=%u bytes=%llu", k.job,
			 (unsigned long long)k.step, k.rank, (unsigned long long)mf->total);
out:
	if (dfd >= 0)
		close(dfd);
	mf_free(mf);
	idx_rec_clear(&rec);
}

static int decode_manifest_field(json_t *o, struct manifest **mf, char *why, size_t whylen)
{
	const char *s;
	uint8_t *raw = NULL;
	size_t rawlen;
	int rc;

	if (net_json_str(o, "manifest", NET_MAX_PAYLOAD, &s) < 0)
		return -EBADMSG;
	rc = b64_decode(s, strlen(s), &raw, &rawlen);
	if (rc < 0)
		return rc;
	rc = mf_decode_err(raw, rawlen, mf, why, whylen);
	free(raw);
	return rc;
}

static void serve_push(struct eng *e, struct nconn *c, int peer, uint32_t id, json_t *req)
{
	struct shard_rec rec = { 0 };
	struct manifest *mf = NULL;
	struct ram_stage st = { .fd = -1 };
	struct shard_key k, same;
	char why[512] = "";
	json_t *resp;
	int rc;

	if (parse_key(json_object_get(req, "key"), &k) < 0) {
		send_error(c, id, EINVAL, "bad push request");
		goto out;
	}
	if (decode_manifest_field(req, &mf, why, sizeof(why)) < 0) {
		log_warn("engine", "push of job=%s step=%llu node=%u refused: %s", k.job,
			 (unsigned long long)k.step, k.rank, why);
		send_error(c, id, EINVAL, why);
		goto out;
	}
	pthread_mutex_lock(&e->mu);
	bool mine = e->rank >= 0 && k.rank == (uint32_t)e->rank;
	pthread_mutex_unlock(&e->mu);
	if (!mine && (peer < 0 || k.rank != (uint32_t)peer)) {
		/* replicas are pushed by their owner only */
		log_warn("engine", "rank %d tried to push node %u's shard (job=%s step=%llu): refused",
			 peer, k.rank, k.job, (unsigned long long)k.step);
		send_error(c, id, EPERM, "only a shard's owner may push it");
		goto out;
	}
	if (mine) {
		/* this node's own shards come from its own commits and restores only */
		log_warn("engine", "rank %d tried to push a shard under this node's own key (job=%s step=%llu): refused",
			 peer, k.job, (unsigned long long)k.step);
		send_error(c, id, EPERM, "a peer cannot push this node's own shard");
		goto out;
	}
	if (idx_get_shard(ram_idx(e->ram), &k, &rec) == 0 && rec.state >= SH_COMMITTED &&
	    rec.state != SH_BAD && !memcmp(rec.hash, mf->hash, 32)) {
		resp = json_pack("{s:b}", "have", 1);
		nconn_send(c, NT_RESP, id, resp);
		json_decref(resp);
		goto out;
	}
	rc = ram_stage_begin(e->ram, &k, &st);
	if (rc < 0) {
		send_error(c, id, -rc, "cannot stage");
		goto out;
	}
	if (ram_find_hash(e->ram, mf->hash, &same) == 0) {
		if (ram_stage_link(e->ram, &st, &same) == 0 && ram_stage_publish(e->ram, &st, mf, 0) == 0) {
			/* same content already here (data parallelism): metadata only */
			log_info("engine", "replica job=%s step=%llu node=%u linked from node %u (same content)",
				 k.job, (unsigned long long)k.step, k.rank, same.rank);
			resp = json_pack("{s:b}", "have", 1);
			nconn_send(c, NT_RESP, id, resp);
			json_decref(resp);
			goto out;
		}
		/* the link half-done (the holder was dropped meanwhile): start over */
		ram_stage_abort(e->ram, &st);
		rc = ram_stage_begin(e->ram, &k, &st);
		if (rc < 0) {
			send_error(c, id, -rc, "cannot stage");
			goto out;
		}
	}
	resp = json_pack("{s:b}", "send", 1);
	rc = nconn_send(c, NT_RESP, id, resp);
	json_decref(resp);
	if (rc < 0)
		goto out;
	rc = recv_files(e, c, &st, mf, why, sizeof(why));
	if (rc == 0)
		rc = ram_stage_publish(e->ram, &st, mf, 0);
	if (rc < 0) {
		log_warn("engine", "replica job=%s step=%llu node=%u from rank %d rejected: %s",
			 k.job, (unsigned long long)k.step, k.rank, peer, why[0] ? why : strerror(-rc));
		send_error(c, id, -rc, why[0] ? why : "replica rejected");
		goto out;
	}
	metrics_add(MC_REPLICAS_RECEIVED, 1);
	log_info("engine", "replica job=%s step=%llu node=%u from rank %d bytes=%llu", k.job,
		 (unsigned long long)k.step, k.rank, peer, (unsigned long long)mf->total);
	resp = json_pack("{s:b}", "ok", 1);
	nconn_send(c, NT_RESP, id, resp);
	json_decref(resp);
out:
	if (st.fd >= 0 || st.rel[0])
		ram_stage_abort(e->ram, &st);
	mf_free(mf);
	idx_rec_clear(&rec);
}

/* {job} -> this node's holdings, for mtcfs-admin's cluster view. */
static void serve_list(struct eng *e, struct nconn *c, uint32_t id, json_t *req)
{
	struct shard_rec *recs = NULL;
	const char *job = NULL;
	size_t n = 0;
	json_t *resp = json_object(), *arr = json_array();

	if (net_json_str(req, "job", RCFG_JOB_MAX, &job) < 0)
		job = NULL;
	if (idx_list_shards(ram_idx(e->ram), job, &recs, &n) == 0) {
		for (size_t i = 0; i < n; i++) {
			json_array_append_new(arr, json_pack("{s:s,s:I,s:i,s:s,s:b,s:I}",
				"job", recs[i].key.job, "step", (json_int_t)recs[i].key.step,
				"owner", (int)recs[i].key.rank, "state", shard_state_name(recs[i].state),
				"own", (recs[i].flags & SHF_OWN) != 0, "bytes", (json_int_t)recs[i].bytes));
		}
		idx_recs_free(recs, n);
	}
	pthread_mutex_lock(&e->mu);
	json_object_set_new(resp, "rank", json_integer(e->rank));
	pthread_mutex_unlock(&e->mu);
	json_object_set_new(resp, "shards", arr);
	nconn_send(c, NT_RESP, id, resp);
	json_decref(resp);
}

static void on_data(void *arg, struct nconn *c, int peer_rank)
{
	struct eng *e = arg;
	struct net_hdr h;
	json_t *m = NULL;
	const char *op;

	if (nconn_recv(c, DATA_TIMEOUT_MS, &h, &m) < 0 || h.type != NT_REQ ||
	    net_json_str(m, "op", 32, &op) < 0) {
		json_decref(m);
		nconn_close(c);
		return;
	}
	if (!strcmp(op, "fetch"))
		serve_fetch(e, c, h.req_id, m);
	else if (!strcmp(op, "push"))
		serve_push(e, c, peer_rank, h.req_id, m);
	else if (!strcmp(op, "list"))
		serve_list(e, c, h.req_id, m);
	else
		send_error(c, h.req_id, ENOSYS, "unknown op");
	json_decref(m);
	nconn_close(c);
}

/* The server starts before the coordinator exists (the coordinator needs
 * the server to send): until it is published, control messages get an
 * error. */
static struct coord *coord_of(struct eng *e)
{
	return __atomic_load_n(&e->coord, __ATOMIC_ACQUIRE);
}

static void on_msg(void *arg, uint64_t conn, int peer_rank, uint8_t type, uint32_t req_id,
		   json_t *msg)
{
	struct eng *e = arg;
	struct coord *c = coord_of(e);
	if (c)
		coord_on_msg(c, conn, peer_rank, type, req_id, msg);
	else if (type == NT_REQ)
		nsrv_send(e->srv, conn, NT_ERROR, req_id, net_error_msg(EAGAIN, "starting"));
	json_decref(msg);
}

static void on_close(void *arg, uint64_t conn, int peer_rank)
{
	struct eng *e = arg;
	struct coord *c = coord_of(e);
	if (c)
		coord_on_close(c, conn, peer_rank);
}

static const struct nsrv_ops srv_ops = {
	.on_msg = on_msg,
	.on_close = on_close,
	.on_data = on_data,
};

/* ---------- the control connection ---------- */

static void ctl_fail_all(struct eng *e, int rc)
{
	for (size_t i = 0; i < sizeof(e->calls) / sizeof(e->calls[0]); i++) {
		if (e->calls[i] && !e->calls[i]->done) {
			e->calls[i]->done = true;
			e->calls[i]->rc = rc;
		}
	}
	pthread_cond_broadcast(&e->ctl_cv);
}

/* ---------- backups ---------- */

static int ctl_event(struct eng *e, json_t *ev);

struct bk_upload {
	struct eng *e;
	char job[RCFG_JOB_MAX + 1];
	char name[64];
	uint64_t step;
	bool data;
};

/* Worker w of "<job>-s<digits>-n<rank>-w<w>.save" at the top of a shard
 * (GKE's file_naming), else -1. */
static int64_t save_worker(const char *path, const char *job, uint32_t rank, uint64_t step)
{
	size_t jl = strlen(job), d, pl = strlen(path);
	char want[32];
	const char *p = path;
	uint64_t v, w;
	char num[24];

	if (pl < 5 || strchr(path, '/') || strcmp(path + pl - 5, ".save") ||
	    strncmp(p, job, jl) || strncmp(p + jl, "-s", 2))
		return -1;
	p += jl + 2;
	d = strspn(p, "0123456789");
	if (d == 0 || d >= sizeof(num))
		return -1;
	memcpy(num, p, d);
	num[d] = '\0';
	if (util_parse_u64(num, UINT64_MAX, &v) < 0 || v != step)
		return -1;
	p += d;
	snprintf(want, sizeof(want), "-n%u-w", rank);
	if (strncmp(p, want, strlen(want)))
		return -1;
	p += strlen(want);
	d = strspn(p, "0123456789");
	if (d == 0 || d >= sizeof(num) || strcmp(p + d, ".save"))
		return -1;
	memcpy(num, p, d);
	num[d] = '\0';
	if (util_parse_u64(num, RCFG_WORKERS_MAX - 1, &w) < 0)
		return -1;
	return (int64_t)w;
}

/* Worker w's .save entry of shard mf, or NULL. */
static const struct mf_entry *save_entry(const struct manifest *mf, const struct shard_key *k,
					 uint32_t w, bool *any)
{
	const struct mf_entry *r = NULL;
	for (size_t i = 0; i < mf->n; i++) {
		int64_t x = mf->e[i].type == MF_FILE ?
			    save_worker(mf->e[i].path, k->job, k->rank, k->step) : -1;
		if (x < 0)
			continue;
		*any = true;
		if ((uint64_t)x == w)
			r = &mf->e[i];
	}
	return r;
}

/* framework: pytorch: each worker's file is its own shard in the bucket,
 * as GKE's replicator backs them up (one .meta per worker, <hash>.data one
 * object). In the cluster too each worker's file is its own shard (k is
 * worker 0's, open as fd with manifest mf); a worker-0 shard holding every
 * worker's file (restored from a backup of the older layout, or written by
 * an earlier mtcfs) serves them all. -ENODATA when the shard has no .save
 * file at all (a step directory committed in pytorch mode): the caller
 * backs it up whole. */
static int upload_workers(struct eng *e, const struct bk_upload *u, const struct shard_key *k,
			  int fd, const struct manifest *mf, uint32_t workers, char *err,
			  size_t errlen)
{
	bool any = false;
	int rc;

	if (!save_entry(mf, k, 0, &any) || !any)
		return any ? -ENOENT : -ENODATA;
	for (uint32_t w = 0; w < workers; w++) {
		struct shard_key wk = *k;
		struct shard_rec rec = { 0 };
		struct manifest *wmf = NULL;
		const struct mf_entry *ent = save_entry(mf, k, w, &any);
		int wfd = -1;

		wk.worker = w;
		if (!ent && idx_get_shard(ram_idx(e->ram), &wk, &rec) == 0 && rec.mf &&
		    rec.state >= SH_COMMITTED && rec.state != SH_BAD &&
		    mf_decode(rec.mf, rec.mflen, &wmf) == 0 &&
		    (ent = save_entry(wmf, k, w, &any)) != NULL &&
		    (wfd = ram_shard_open(e->ram, &wk)) < 0)
			ent = NULL;
		idx_rec_clear(&rec);
		if (!ent) {
			snprintf(err, errlen, "the shard of step %llu has no .save file of worker %u",
				 (unsigned long long)k->step, w);
			mf_free(wmf);
			return -ENOENT;
		}
		rc = bk_upload_file(e->bkt, u->job, u->name, &wk, wfd >= 0 ? wfd : fd, ent, u->data);
		if (wfd >= 0)
			close(wfd);
		mf_free(wmf);
		if (rc < 0) {
			snprintf(err, errlen, "%s", bkt_last_error());
			return rc;
		}
	}
	return 0;
}

static void backup_run(void *arg)
{
	struct bk_upload *u = arg;
	struct eng *e = u->e;
	struct shard_rec rec = { 0 };
	struct manifest *mf = NULL;
	struct shard_key k = { 0 };
	char err[512] = "";
	uint64_t t0 = util_now_ns();
	json_t *ev;
	uint32_t workers;
	bool save_files;
	int fd = -1, rc;

	snprintf(k.job, sizeof(k.job), "%s", u->job);
	k.step = u->step;
	pthread_mutex_lock(&e->mu);
	k.rank = (uint32_t)e->rank;
	save_files = e->save_files && !strcmp(e->job, u->job);
	workers = e->workers ? e->workers : 1;
	pthread_mutex_unlock(&e->mu);
	rc = idx_get_shard(ram_idx(e->ram), &k, &rec);
	if (rc < 0 || !rec.mf || mf_decode(rec.mf, rec.mflen, &mf) < 0) {
		snprintf(err, sizeof(err), "step %llu is not held on node %u",
			 (unsigned long long)k.step, k.rank);
		rc = rc < 0 ? rc : -ENOENT;
		goto out;
	}
	fd = ram_shard_open(e->ram, &k);
	if (fd < 0) {
		rc = fd;
		snprintf(err, sizeof(err), "shard directory missing");
		goto out;
	}
	rc = save_files ? upload_workers(e, u, &k, fd, mf, workers, err, sizeof(err)) : -ENODATA;
	if (rc == -ENODATA) {
		rc = bk_upload_shard(e->bkt, u->job, u->name, &k, fd, mf, u->data);
		if (rc < 0)
			snprintf(err, sizeof(err), "%s", bkt_last_error());
	}
	if (rc < 0)
		goto out;
	idx_set_state(ram_idx(e->ram), &k, SH_BACKED_UP, 0, 0);
	metrics_add(MC_BACKUPS, 1);
	metrics_add(MC_BACKUP_BYTES, u->data ? mf->total : 0);
	metrics_observe(MH_BACKUP_SECONDS, (double)(util_now_ns() - t0) / 1e9);
	log_info("engine", "backed up job=%s step=%llu node=%u to %s/%s/%s bytes=%llu data=%d secs=%.2f",
		 u->job, (unsigned long long)u->step, k.rank, bkt_url(e->bkt), u->job, u->name,
		 (unsigned long long)mf->total, u->data, (double)(util_now_ns() - t0) / 1e9);
out:
	if (rc < 0) {
		metrics_add(MC_BACKUP_FAILURES, 1);
		report(e, "backup %s of job %s step %llu failed: %s", u->name, u->job,
		       (unsigned long long)u->step, err[0] ? err : strerror(-rc));
	}
	if (fd >= 0)
		close(fd);
	mf_free(mf);
	idx_rec_clear(&rec);
	pthread_mutex_lock(&e->mu);
	e->pins--;
	pthread_mutex_unlock(&e->mu);
	ev = json_pack("{s:s,s:s,s:s,s:I,s:b}", "op", "backup_done", "job", u->job, "name", u->name,
		       "step", (json_int_t)u->step, "ok", rc == 0);
	if (rc < 0)
		json_object_set_new(ev, "error", json_string(err[0] ? err : strerror(-rc)));
	if (ctl_event(e, ev) < 0)
		log_warn("engine", "cannot report backup %s to the coordinator", u->name);
	json_decref(ev);
	free(u);
}

bool eng_pinned(struct eng *e, const char *job, uint64_t step)
{
	bool r;
	if (!e)
		return false;
	pthread_mutex_lock(&e->mu);
	r = e->pins > 0 && e->pin_step == step && !strcmp(e->pin_job, job);
	pthread_mutex_unlock(&e->mu);
	return r;
}

static void handle_event(struct eng *e, json_t *m)
{
	const char *op, *job;
	uint64_t step;

	if (net_json_str(m, "op", 32, &op) < 0)
		return;
	if (!strcmp(op, "backup") && e->bkt && net_json_str(m, "job", RCFG_JOB_MAX, &job) == 0 &&
	    net_json_u64(m, "step", UINT64_MAX >> 1, &step) == 0) {
		const char *name;
		struct bk_upload *u;
		if (net_json_str(m, "name", 63, &name) < 0 || !bk_backup_name_ok(name))
			return;
		u = calloc(1, sizeof(*u));
		if (!u)
			return;
		u->e = e;
		snprintf(u->job, sizeof(u->job), "%s", job);
		snprintf(u->name, sizeof(u->name), "%s", name);
		u->step = step;
		u->data = !json_is_false(json_object_get(m, "data"));
		pthread_mutex_lock(&e->mu);
		e->pins++;
		e->pin_step = step;
		snprintf(e->pin_job, sizeof(e->pin_job), "%s", job);
		pthread_mutex_unlock(&e->mu);
		if (workq_submit(e->bkq, backup_run, u) < 0) {
			pthread_mutex_lock(&e->mu);
			e->pins--;
			pthread_mutex_unlock(&e->mu);
			free(u);
		}
		return;
	}
	if (!strcmp(op, "report")) {
		const char *text;
		if (net_json_str(m, "text", 1000, &text) == 0)
			report(e, "%s", text);
		return;
	}
	if (!strcmp(op, "lkg") && net_json_str(m, "job", RCFG_JOB_MAX, &job) == 0 &&
	    net_json_u64(m, "step", UINT64_MAX >> 1, &step) == 0) {
		uint64_t safe = 0;
		bool has_safe = net_json_u64(m, "safe", UINT64_MAX >> 1, &safe) == 0 && safe <= step;
		bool news;
		pthread_mutex_lock(&e->mu);
		news = !e->has_lkg || e->lkg != step || strcmp(e->lkg_job, job);
		if (strcmp(e->lkg_job, job))
			e->has_safe = false;
		e->has_lkg = true;
		e->lkg = step;
		if (has_safe) {
			e->has_safe = true;
			e->safe = safe;
		}
		snprintf(e->lkg_job, sizeof(e->lkg_job), "%s", job);
		pthread_mutex_unlock(&e->mu);
		if (news)
			log_info("engine", "job %s: step %llu complete on every node", job,
				 (unsigned long long)step);
		if (has_safe)
			log_dbg("engine", "job %s: step %llu committed and replicated on every node",
				job, (unsigned long long)safe);
		if (e->cb.on_lkg)
			e->cb.on_lkg(e->cb.arg, job, step);
	}
}

static void *ctl_reader(void *arg)
{
	struct eng *e = arg;
	struct nconn *c;

	pthread_setname_np(pthread_self(), "mtcfs-ctlrd");
	pthread_mutex_lock(&e->ctl_mu);
	c = e->ctl;
	pthread_mutex_unlock(&e->ctl_mu);
	for (;;) {
		struct net_hdr h;
		json_t *m = NULL;
		int rc = nconn_recv(c, 1000, &h, &m);

		if (rc == -ETIMEDOUT || rc == -EAGAIN) {
			bool stop;
			pthread_mutex_lock(&e->ctl_mu);
			stop = e->stopping;
			pthread_mutex_unlock(&e->ctl_mu);
			if (stop)
				break;
			continue;
		}
		if (rc < 0) {
			bool renamed;
			pthread_mutex_lock(&e->ctl_mu);
			renamed = e->ctl_renaming;
			pthread_mutex_unlock(&e->ctl_mu);
			if (renamed)
				log_info("engine", "control connection closed: this node has a new rank");
			else
				log_warn("engine", "control connection to the coordinator lost: %s",
					 strerror(-rc));
			break;
		}
		if (h.type == NT_EVENT) {
			handle_event(e, m);
			json_decref(m);
			continue;
		}
		pthread_mutex_lock(&e->ctl_mu);
		for (size_t i = 0; i < sizeof(e->calls) / sizeof(e->calls[0]); i++) {
			struct pending_call *p = e->calls[i];
			if (p && !p->done && p->id == h.req_id) {
				p->done = true;
				p->rc = h.type == NT_ERROR ? net_error_errno(m) : 0;
				p->resp = m;
				m = NULL;
				pthread_cond_broadcast(&e->ctl_cv);
				break;
			}
		}
		pthread_mutex_unlock(&e->ctl_mu);
		json_decref(m);
	}
	pthread_mutex_lock(&e->ctl_mu);
	if (e->ctl == c)
		e->ctl = NULL;
	ctl_fail_all(e, -ECONNRESET);
	pthread_mutex_unlock(&e->ctl_mu);
	nconn_close(c);
	return NULL;
}

static json_t *register_msg(struct eng *e)
{
	json_t *m = json_object();
	json_object_set_new(m, "op", json_string("register"));
	json_object_set_new(m, "addr", json_string(e->listen));
	pthread_mutex_lock(&e->mu);
	if (e->job_set) {
		json_object_set_new(m, "job", json_string(e->job));
		json_object_set_new(m, "nodes", json_integer(e->nodes));
		json_object_set_new(m, "dp", json_integer(e->dp));
	}
	pthread_mutex_unlock(&e->mu);
	return m;
}

/* A send on the control connection failed (ctl_mu held): a coordinator
 * that has not read for the whole io timeout, or a broken stream. Shut the
 * socket: the reader tears the connection down and the next call makes a
 * new one (and registers again) instead of failing on a dead stream. */
static void ctl_send_failed(struct eng *e, int rc)
{
	if (!e->ctl)
		return;
	log_warn("engine", "sending to the coordinator at %s failed: %s; reconnecting",
		 e->coord_addr, strerror(-rc));
	nconn_shutdown(e->ctl);
}

/* Connect the control connection if needed. ctl_mu held. */
static int ctl_ensure_locked(struct eng *e)
{
	struct nconn *c = NULL;
	int rank, rc;

	if (e->ctl)
		return 0;
	if (e->stopping)
		return -ESHUTDOWN;
	if (e->ctl_reader_running) {
		pthread_mutex_unlock(&e->ctl_mu);
		pthread_join(e->ctl_reader, NULL);
		pthread_mutex_lock(&e->ctl_mu);
		e->ctl_reader_running = false;
		if (e->ctl)
			return 0;
	}
	pthread_mutex_lock(&e->mu);
	rank = e->rank;
	pthread_mutex_unlock(&e->mu);
	if (!e->coord_addr[0])
		return -ENOTCONN;
	rc = nconn_connect(e->coord_addr, rank, "control", &e->auth, 5000, &c, NULL);
	if (rc < 0)
		return rc;
	e->ctl = c;
	rc = pthread_create(&e->ctl_reader, NULL, ctl_reader, e);
	if (rc) {
		e->ctl = NULL;
		nconn_close(c);
		return -rc;
	}
	e->ctl_reader_running = true;
	return 0;
}

/* One request on the control connection; *resp owned by the caller. */
/* ctl_mu held: the calling thread runs a restore that was interrupted. */
static bool restore_cancelled_locked(struct eng *e)
{
	return e->restoring && e->restore_cancel && pthread_equal(e->restore_thr, pthread_self());
}

void eng_restore_interrupt(struct eng *e)
{
	pthread_mutex_lock(&e->ctl_mu);
	if (e->restoring) {
		e->restore_cancel = true;
		pthread_cond_broadcast(&e->ctl_cv);
	}
	pthread_mutex_unlock(&e->ctl_mu);
}

static int ctl_call(struct eng *e, json_t *req, json_t **resp, int timeout_ms)
{
	struct pending_call p = { 0 };
	struct timespec ts;
	size_t slot = SIZE_MAX;
	int rc;

	*resp = NULL;
	pthread_mutex_lock(&e->ctl_mu);
	if (restore_cancelled_locked(e)) {
		rc = -ECANCELED;
		goto out;
	}
	rc = ctl_ensure_locked(e);
	if (rc < 0)
		goto out;
	for (size_t i = 0; i < sizeof(e->calls) / sizeof(e->calls[0]); i++)
		if (!e->calls[i]) {
			slot = i;
			break;
		}
	if (slot == SIZE_MAX) {
		rc = -EBUSY;
		goto out;
	}
	p.id = ++e->next_id ? e->next_id : ++e->next_id;
	e->calls[slot] = &p;
	rc = nconn_send(e->ctl, NT_REQ, p.id, req);
	if (rc < 0) {
		e->calls[slot] = NULL;
		ctl_send_failed(e, rc);
		goto out;
	}
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += timeout_ms / 1000;
	ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	while (!p.done) {
		if (restore_cancelled_locked(e)) {
			/* the answer, if it comes, finds no waiter and is dropped */
			p.rc = -ECANCELED;
			break;
		}
		if (pthread_cond_timedwait(&e->ctl_cv, &e->ctl_mu, &ts) == ETIMEDOUT) {
			p.rc = -ETIMEDOUT;
			break;
		}
	}
	e->calls[slot] = NULL;
	rc = p.rc;
	*resp = p.resp;
out:
	pthread_mutex_unlock(&e->ctl_mu);
	return rc;
}

static int ctl_event(struct eng *e, json_t *ev)
{
	int rc;
	pthread_mutex_lock(&e->ctl_mu);
	rc = ctl_ensure_locked(e);
	if (rc == 0) {
		rc = nconn_send(e->ctl, NT_EVENT, 0, ev);
		if (rc < 0)
			ctl_send_failed(e, rc);
	}
	pthread_mutex_unlock(&e->ctl_mu);
	return rc;
}

static int do_register(struct eng *e, bool want_table)
{
	json_t *req = register_msg(e), *resp = NULL;
	int rc;
	json_t *addrs;

	if (want_table)
		json_object_set_new(req, "want_table", json_true());
	rc = ctl_call(e, req, &resp, CTL_TIMEOUT_MS);
	addrs = json_object_get(resp, "addrs");
	json_decref(req);
	if (rc == 0 && json_is_array(addrs)) {
		size_t i;
		json_t *a;
		pthread_mutex_lock(&e->mu);
		for (uint32_t x = 0; x < e->ntable; x++)
			free(e->table[x]);
		free(e->table);
		e->ntable = 0;
		e->table = calloc(json_array_size(addrs) + 1, sizeof(char *));
		if (e->table) {
			json_array_foreach(addrs, i, a)
				e->table[i] = json_is_string(a) ? strdup(json_string_value(a)) : NULL;
			e->ntable = (uint32_t)json_array_size(addrs);
		}
		pthread_mutex_unlock(&e->mu);
	}
	json_decref(resp);
	return rc;
}

/* Address of a rank: the static table, else the coordinator's. */
static int addr_of(struct eng *e, uint32_t rank, char *out, size_t len)
{
	int rc = -ENOENT;
	if (rank < e->naddrs) {
		snprintf(out, len, "%s", e->addrs[rank]);
		return 0;
	}
	for (int attempt = 0; attempt < 2 && rc < 0; attempt++) {
		pthread_mutex_lock(&e->mu);
		if (rank < e->ntable && e->table[rank]) {
			snprintf(out, len, "%s", e->table[rank]);
			rc = 0;
		}
		pthread_mutex_unlock(&e->mu);
		if (rc < 0 && attempt == 0)
			do_register(e, true);
	}
	return rc;
}

/* ---------- replication ---------- */

struct repl_job {
	struct eng *e;
	struct shard_key key;
	uint8_t hash[32];
	int attempt;
};

static int push_to(struct eng *e, uint32_t peer, const struct shard_key *k,
		   const struct shard_rec *rec, const struct manifest *mf)
{
	char addr[256];
	struct nconn *c = NULL;
	json_t *req, *resp = NULL;
	char *b64;
	int rank, dfd = -1, rc;

	rc = addr_of(e, peer, addr, sizeof(addr));
	if (rc < 0)
		return rc;
	pthread_mutex_lock(&e->mu);
	rank = e->rank;
	pthread_mutex_unlock(&e->mu);
	rc = nconn_connect(addr, rank, "data", &e->auth, 5000, &c, NULL);
	if (rc < 0)
		return rc;
	b64 = b64_encode(rec->mf, rec->mflen);
	req = json_object();
	json_object_set_new(req, "op", json_string("push"));
	json_object_set_new(req, "key", key_json(k));
	json_object_set_new(req, "manifest", json_string(b64 ? b64 : ""));
	free(b64);
	rc = nconn_call(c, req, &resp, DATA_TIMEOUT_MS);
	json_decref(req);
	if (rc < 0)
		goto out;
	if (json_is_true(json_object_get(resp, "have"))) {
		rc = 1;   /* the peer had the content: nothing sent */
		goto out;
	}
	if (!json_is_true(json_object_get(resp, "send"))) {
		rc = -EPROTO;
		goto out;
	}
	json_decref(resp);
	resp = NULL;
	dfd = ram_shard_open(e->ram, k);
	if (dfd < 0) {
		rc = dfd;
		goto out;
	}
	rc = send_files(c, dfd, mf);
	if (rc == 0) {
		struct net_hdr h;
		rc = nconn_recv(c, DATA_TIMEOUT_MS, &h, &resp);
		if (rc == 0 && h.type == NT_ERROR)
			rc = net_error_errno(resp);
		else if (rc == 0 && !json_is_true(json_object_get(resp, "ok")))
			rc = -EPROTO;
	}
out:
	if (dfd >= 0)
		close(dfd);
	json_decref(resp);
	nconn_close(c);
	return rc;
}

static void repl_run(void *arg)
{
	struct repl_job *j = arg;
	struct eng *e = j->e;
	struct shard_rec rec = { 0 };
	struct manifest *mf = NULL;
	int peers[MAX_PEERS], npeers, failed = 0;
	uint32_t nodes, dp, workers;
	char hex[65];
	json_t *ev;

	pthread_mutex_lock(&e->mu);
	npeers = e->npeers;
	memcpy(peers, e->peers, sizeof(peers));
	nodes = e->nodes;
	dp = e->dp;
	workers = e->workers ? e->workers : 1;
	pthread_mutex_unlock(&e->mu);

	/* tell the coordinator first: it decides the job-wide LKG */
	net_hex_encode(j->hash, 32, hex);
	if (j->attempt == 0) {
		ev = json_object();
		json_object_set_new(ev, "op", json_string("committed"));
		json_object_set_new(ev, "job", json_string(j->key.job));
		json_object_set_new(ev, "nodes", json_integer(nodes));
		json_object_set_new(ev, "dp", json_integer(dp));
		json_object_set_new(ev, "step", json_integer((json_int_t)j->key.step));
		json_object_set_new(ev, "hash", json_string(hex));
		if (workers > 1) {
			/* one shard per worker: the step is the job's once
			 * every (node, worker) committed it */
			json_object_set_new(ev, "worker", json_integer(j->key.worker));
			json_object_set_new(ev, "workers", json_integer(workers));
		}
		pthread_mutex_lock(&e->mu);
		json_object_set_new(ev, "bi_min", json_integer(e->bi_min));
		json_object_set_new(ev, "bi_steps", json_integer(e->bi_steps));
		pthread_mutex_unlock(&e->mu);
		if (ctl_event(e, ev) < 0)
			log_warn("engine", "cannot report step %llu to the coordinator at %s",
				 (unsigned long long)j->key.step, e->coord_addr);
		json_decref(ev);
	}
	if (idx_get_shard(ram_idx(e->ram), &j->key, &rec) < 0 || !rec.mf ||
	    mf_decode(rec.mf, rec.mflen, &mf) < 0)
		goto out;   /* dropped meanwhile: nothing to replicate */
	for (int i = 0; i < npeers; i++) {
		uint64_t t0 = util_now_ns();
		int rc = push_to(e, (uint32_t)peers[i], &j->key, &rec, mf);
		double secs = (double)(util_now_ns() - t0) / 1e9;
		if (rc < 0) {
			failed++;
			metrics_add(MC_REPL_FAILURES, 1);
			log_warn("engine", "replicating job=%s step=%llu to rank %d failed: %s",
				 j->key.job, (unsigned long long)j->key.step, peers[i], strerror(-rc));
		} else {
			metrics_add(MC_REPL_SHARDS, 1);
			metrics_add(MC_REPL_BYTES, rc == 1 ? 0 : mf->total);
			metrics_observe(MH_REPL_SECONDS, secs);
			log_info("engine", "replicated job=%s step=%llu to rank %d bytes=%llu secs=%.3f worker=%u",
				 j->key.job, (unsigned long long)j->key.step, peers[i],
				 (unsigned long long)mf->total, secs, j->key.worker);
		}
	}
	if (!failed) {
		/* every copy it should have exists: the coordinator may let the
		 * job's older steps go */
		if (npeers > 0)
			idx_set_state(ram_idx(e->ram), &j->key, SH_REPLICATED, 0, 0);
		ev = json_object();
		json_object_set_new(ev, "op", json_string("replicated"));
		json_object_set_new(ev, "job", json_string(j->key.job));
		json_object_set_new(ev, "nodes", json_integer(nodes));
		json_object_set_new(ev, "dp", json_integer(dp));
		json_object_set_new(ev, "step", json_integer((json_int_t)j->key.step));
		if (workers > 1) {
			json_object_set_new(ev, "worker", json_integer(j->key.worker));
			json_object_set_new(ev, "workers", json_integer(workers));
		}
		if (ctl_event(e, ev) < 0)
			log_warn("engine", "cannot report step %llu as replicated to the coordinator at %s",
				 (unsigned long long)j->key.step, e->coord_addr);
		json_decref(ev);
	} else if (failed && j->attempt < 3) {
		struct repl_job *again = malloc(sizeof(*again));
		if (again) {
			*again = *j;
			again->attempt++;
			struct timespec ts = { .tv_sec = 1 << j->attempt, .tv_nsec = 0 };
			nanosleep(&ts, NULL);
			if (workq_submit(e->replq, repl_run, again) < 0)
				free(again);
		}
	} else if (failed) {
		report(e, "job %s step %llu: could not be replicated to %d of %d peers; it has fewer copies than configured",
		       j->key.job, (unsigned long long)j->key.step, failed, npeers);
	}
out:
	mf_free(mf);
	idx_rec_clear(&rec);
	free(j);
}

void eng_committed(struct eng *e, const struct shard_key *k, const uint8_t hash[32])
{
	struct repl_job *j;
	if (!e)
		return;
	j = calloc(1, sizeof(*j));
	if (!j)
		return;
	j->e = e;
	j->key = *k;
	memcpy(j->hash, hash, 32);
	if (workq_submit(e->replq, repl_run, j) < 0)
		free(j);
}

void eng_drain(struct eng *e)
{
	if (e)
		workq_drain(e->replq);
}

bool eng_gc_step(struct eng *e, const char *job, uint64_t *step)
{
	bool r;
	pthread_mutex_lock(&e->mu);
	r = e->has_lkg && e->has_safe && !strcmp(e->lkg_job, job);
	if (r)
		*step = e->safe < e->lkg ? e->safe : e->lkg;
	pthread_mutex_unlock(&e->mu);
	return r;
}

bool eng_lkg(struct eng *e, const char *job, uint64_t *step)
{
	bool r;
	pthread_mutex_lock(&e->mu);
	r = e->has_lkg && !strcmp(e->lkg_job, job);
	if (r)
		*step = e->lkg;
	pthread_mutex_unlock(&e->mu);
	return r;
}

void eng_status(struct eng *e, uint32_t *nodes, bool *coordinator_up)
{
	pthread_mutex_lock(&e->ctl_mu);
	*coordinator_up = e->ctl != NULL;
	pthread_mutex_unlock(&e->ctl_mu);
	pthread_mutex_lock(&e->mu);
	*nodes = e->job_set ? e->nodes : e->naddrs;
	pthread_mutex_unlock(&e->mu);
}

int eng_rank(const struct eng *e)
{
	int r;
	pthread_mutex_lock((pthread_mutex_t *)&e->mu);
	r = e->rank;
	pthread_mutex_unlock((pthread_mutex_t *)&e->mu);
	return r;
}

/* A registered node (coordinator=, no rank= and no peers= table) takes the
 * node-rank of each new replicator.yaml, as GKE's replicator does. The
 * coordinator knows a node by the rank it connected with: the control
 * connection is closed (and waited for, up to 5 s) so that the next call
 * connects and registers as the new rank. Shards of the old rank stay in
 * the catalog as what they are: that owner's, held here. */
static void ctl_new_identity(struct eng *e, int old_rank, int new_rank)
{
	struct timespec ts;

	log_info("engine", "node-rank changes from %d to %d: reconnecting to the coordinator as rank %d",
		 old_rank, new_rank, new_rank);
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 5;
	pthread_mutex_lock(&e->ctl_mu);
	if (e->ctl) {
		e->ctl_renaming = true;
		nconn_shutdown(e->ctl);
	}
	while (e->ctl && pthread_cond_timedwait(&e->ctl_cv, &e->ctl_mu, &ts) != ETIMEDOUT)
		;
	e->ctl_renaming = false;
	pthread_mutex_unlock(&e->ctl_mu);
}

int eng_set_job(struct eng *e, const struct rcfg *c, char *err, size_t errlen)
{
	int peers[MAX_PEERS], n;

	int old_rank;

	pthread_mutex_lock(&e->mu);
	if (e->rank >= 0 && c->node_rank != e->rank && e->rank_fixed) {
		snprintf(err, errlen, "node-rank: %d, but this node is rank %d (mount options rank=/peers=/listen=)",
			 c->node_rank, e->rank);
		pthread_mutex_unlock(&e->mu);
		return -EINVAL;
	}
	old_rank = e->rank;
	if (e->naddrs && (uint32_t)c->nodes != e->naddrs) {
		snprintf(err, errlen, "nodes: %d, but the mount's peers= table has %u entries",
			 c->nodes, e->naddrs);
		pthread_mutex_unlock(&e->mu);
		return -EINVAL;
	}
	if (c->peer_ranks) {
		n = c->n_peer_ranks > MAX_PEERS ? MAX_PEERS : c->n_peer_ranks;
		memcpy(peers, c->peer_ranks, (size_t)n * sizeof(int));
	} else {
		n = place_peers(c->node_rank, c->nodes, c->peers_per_node, c->assume_dp, peers, MAX_PEERS);
		if (n < 0)
			n = 0;
	}
	e->rank = c->node_rank;
	snprintf(e->job, sizeof(e->job), "%s", c->job);
	e->nodes = (uint32_t)c->nodes;
	e->dp = (uint32_t)c->assume_dp;
	e->save_files = c->framework == RCFG_FW_PYTORCH;
	e->workers = e->save_files && c->workers_per_node > 1 ? (uint32_t)c->workers_per_node : 1;
	memcpy(e->peers, peers, (size_t)n * sizeof(int));
	e->npeers = n;
	e->job_set = true;
	e->bi_min = (uint32_t)c->backup_interval_minutes;
	e->bi_steps = (uint32_t)c->backup_interval_steps;
	if (strcmp(e->lkg_job, c->job))
		e->has_lkg = e->has_safe = false;
	pthread_mutex_unlock(&e->mu);
	log_info("engine", "job=%s rank=%d nodes=%d peers=%d", c->job, c->node_rank, c->nodes, n);
	if (old_rank >= 0 && old_rank != c->node_rank)
		ctl_new_identity(e, old_rank, c->node_rank);
	if (do_register(e, false) < 0)
		log_warn("engine", "cannot register with the coordinator at %s yet", e->coord_addr);
	return 0;
}

/* ---------- restore ---------- */

/* The source of one worker's shard (framework: pytorch, workers > 1). */
struct plan_src {
	uint32_t holder, owner;
	uint8_t hash[32];
	char addr[256];
};

struct plan_entry {
	uint32_t plan;
	bool found;
	bool bucket;
	char backup[64];
	char notes[1024];
	uint64_t step;
	uint32_t holder, owner;       /* worker 0's shard (the only one, mostly) */
	uint8_t hash[32];
	char addr[256];
	uint32_t nsrc;                /* > 0: one source per worker in src[] */
	struct plan_src src[RCFG_WORKERS_MAX];
};

static int parse_plan(json_t *m, struct plan_entry *p)
{
	uint64_t v;
	const char *addr = "";

	memset(p, 0, sizeof(*p));
	if (net_json_u64(m, "plan", UINT32_MAX, &v) < 0)
		return -EPROTO;
	p->plan = (uint32_t)v;
	p->found = json_is_true(json_object_get(m, "found"));
	{
		const char *notes;
		if (net_json_str(m, "notes", sizeof(p->notes) - 1, &notes) == 0)
			snprintf(p->notes, sizeof(p->notes), "%s", notes);
	}
	if (!p->found)
		return 0;
	{
		const char *src, *bk;
		if (net_json_str(m, "source", 16, &src) == 0 && !strcmp(src, "bucket")) {
			if (net_json_u64(m, "step", UINT64_MAX >> 1, &p->step) < 0 ||
			    net_json_str(m, "backup", 63, &bk) < 0 || !bk_backup_name_ok(bk))
				return -EPROTO;
			p->bucket = true;
			snprintf(p->backup, sizeof(p->backup), "%s", bk);
			return 0;
		}
	}
	if (net_json_u64(m, "step", UINT64_MAX >> 1, &p->step) < 0 ||
	    net_json_u64(m, "holder", RCFG_NODES_MAX - 1, &v) < 0)
		return -EPROTO;
	p->holder = (uint32_t)v;
	if (net_json_u64(m, "owner", RCFG_NODES_MAX - 1, &v) < 0 || net_json_hex(m, "hash", p->hash, 32) < 0)
		return -EPROTO;
	p->owner = (uint32_t)v;
	net_json_str(m, "addr", 255, &addr);
	snprintf(p->addr, sizeof(p->addr), "%s", addr);
	{
		json_t *a = json_object_get(m, "shards"), *x;
		size_t i;
		if (!a)
			return 0;
		if (!json_is_array(a) || json_array_size(a) > RCFG_WORKERS_MAX)
			return -EPROTO;
		json_array_foreach(a, i, x) {
			struct plan_src *ps = &p->src[i];
			const char *xa = "";
			if (net_json_u64(x, "worker", RCFG_WORKERS_MAX - 1, &v) < 0 || v != i ||
			    net_json_u64(x, "holder", RCFG_NODES_MAX - 1, &v) < 0)
				return -EPROTO;
			ps->holder = (uint32_t)v;
			if (net_json_u64(x, "owner", RCFG_NODES_MAX - 1, &v) < 0 ||
			    net_json_hex(x, "hash", ps->hash, 32) < 0)
				return -EPROTO;
			ps->owner = (uint32_t)v;
			net_json_str(x, "addr", 255, &xa);
			snprintf(ps->addr, sizeof(ps->addr), "%s", xa);
		}
		p->nsrc = (uint32_t)json_array_size(a);
	}
	return 0;
}

/* A worker shard's content key (framework: pytorch): its one .save file
 * apart from the name, which carries the rank: SHA-256 over a tag, the
 * size and the CRC32C. Column mates under D agree on it when their
 * workers saved the same bytes (GKE compares the files' BLAKE3). 0, or
 * -ENODATA when the shard is not one worker file. */
static int content_key(const struct shard_rec *r, uint8_t out[32])
{
	static const char tag[] = "mtcfs-worker-file-v1";
	struct manifest *mf = NULL;
	uint8_t buf[sizeof(tag) + 12];
	unsigned int hl = 0;
	int rc = -ENODATA;

	if (!r->mf || mf_decode(r->mf, r->mflen, &mf) < 0)
		return -ENODATA;
	if (mf->n == 1 && mf->e[0].type == MF_FILE &&
	    save_worker(mf->e[0].path, r->key.job, r->key.rank, r->key.step) ==
	    (int64_t)r->key.worker) {
		memcpy(buf, tag, sizeof(tag));
		for (int i = 0; i < 8; i++)
			buf[sizeof(tag) + i] = (uint8_t)(mf->e[0].size >> (8 * i));
		for (int i = 0; i < 4; i++)
			buf[sizeof(tag) + 8 + i] = (uint8_t)(mf->e[0].crc32c >> (8 * i));
		if (EVP_Digest(buf, sizeof(buf), out, &hl, EVP_sha256(), NULL) && hl == 32)
			rc = 0;
	}
	mf_free(mf);
	return rc;
}

/* Shards per node and step of job c: one per worker in framework:
 * pytorch, else one. */
static uint32_t job_workers(const struct rcfg *c)
{
	return c->framework == RCFG_FW_PYTORCH && c->workers_per_node > 1 ?
	       (uint32_t)c->workers_per_node : 1;
}

static json_t *catalog_msg(struct eng *e, const struct rcfg *c)
{
	struct shard_rec *recs = NULL;
	size_t n = 0, k = 0;
	uint32_t W = job_workers(c);
	json_t *m = json_object(), *holds = json_array();

	json_object_set_new(m, "op", json_string("catalog"));
	json_object_set_new(m, "job", json_string(c->job));
	json_object_set_new(m, "nodes", json_integer(c->nodes));
	json_object_set_new(m, "dp", json_integer(c->assume_dp));
	if (W > 1)
		json_object_set_new(m, "workers", json_integer(W));
	if (idx_list_shards(ram_idx(e->ram), c->job, &recs, &n) == 0) {
		for (size_t i = n; i-- > 0 && k < (size_t)MAX_HOLDS * W;) {
			char hex[65];
			if (recs[i].state < SH_COMMITTED || recs[i].state == SH_BAD || !recs[i].mf ||
			    recs[i].key.worker >= W || recs[i].key.rank >= (uint32_t)c->nodes)
				continue;
			net_hex_encode(recs[i].hash, 32, hex);
			if (W > 1) {
				uint8_t ck[32];
				char ckhex[65];
				json_t *x = json_pack("[i,I,s,i]", (int)recs[i].key.rank,
						      (json_int_t)recs[i].key.step, hex,
						      (int)recs[i].key.worker);
				if (content_key(&recs[i], ck) == 0) {
					net_hex_encode(ck, 32, ckhex);
					json_array_append_new(x, json_string(ckhex));
				}
				json_array_append_new(holds, x);
			}
			else
				json_array_append_new(holds, json_pack("[i,I,s]", (int)recs[i].key.rank,
								       (json_int_t)recs[i].key.step, hex));
			k++;
		}
		idx_recs_free(recs, n);
	}
	json_object_set_new(m, "holds", holds);
	return m;
}

/* This node's shard of backup p->backup into dirfd.  framework: pytorch
 * backups hold one file per worker (GKE's layout, which mtcfs writes too):
 * each comes back under the worker's .save name, so the node's shard is
 * what its workers saved; a backup of the older mtcfs layout (one shard
 * holding every worker's file, with a manifest) is read whole. */
static int fetch_backup(struct eng *e, const struct rcfg *c, const struct plan_entry *p,
			int dirfd, struct manifest **mf)
{
	uint32_t rank = (uint32_t)c->node_rank;
	int rc = -EMEDIUMTYPE;

	if (c->framework == RCFG_FW_PYTORCH) {
		/* with one shard per worker, fetch_backup_w() */
		for (uint32_t w = 0; w < (uint32_t)c->workers_per_node; w++) {
			char fn[NAME_MAX + 1];
			if ((size_t)snprintf(fn, sizeof(fn), "%s-s%llu-n%u-w%u.save", c->job,
					     (unsigned long long)p->step, rank, w) >= sizeof(fn))
				return -ENAMETOOLONG;
			rc = bk_fetch_file(e->bkt, c->job, p->backup, rank, w, dirfd, fn);
			if (rc == -EMEDIUMTYPE && w == 0)
				break;
			if (rc < 0)
				return rc;
		}
		if (rc == 0)
			return mf_build(dirfd, mf);
	}
	return bk_fetch_shard(e->bkt, c->job, p->backup, rank, 0, dirfd, mf);
}

/* Worker w's file of backup p->backup into dirfd, as that worker's own
 * shard (one shard per worker). *whole: the backup is of the older mtcfs
 * layout (one shard holding every worker's file): it was fetched whole
 * into dirfd, as worker 0's shard. */
static int fetch_backup_w(struct eng *e, const struct rcfg *c, const struct plan_entry *p,
			  uint32_t w, int dirfd, struct manifest **mf, bool *whole)
{
	uint32_t rank = (uint32_t)c->node_rank;
	char fn[NAME_MAX + 1];
	int rc;

	*whole = false;
	if ((size_t)snprintf(fn, sizeof(fn), "%s-s%llu-n%u-w%u.save", c->job,
			     (unsigned long long)p->step, rank, w) >= sizeof(fn))
		return -ENAMETOOLONG;
	rc = bk_fetch_file(e->bkt, c->job, p->backup, rank, w, dirfd, fn);
	if (rc == 0)
		return mf_build(dirfd, mf);
	if (rc != -EMEDIUMTYPE || w != 0)
		return rc;
	*whole = true;
	return bk_fetch_shard(e->bkt, c->job, p->backup, rank, 0, dirfd, mf);
}

/* framework: pytorch under D: a column mate's shard restored as this
 * node's holds files named for the mate's rank. GKE's coordinator gives
 * the node its mate's per-worker hashes and its restore writes them under
 * the node's own names (coordinator.py: infer_missing_meta, restore.py),
 * so each worker's marker finds its file: rename the staged files to this
 * rank's names (the step's spelling kept) and rebuild the manifest. */
static int adopt_mate_files(const struct rcfg *c, int dirfd, uint64_t step, uint32_t owner,
			    uint32_t rank, struct manifest **mf)
{
	size_t jl = strlen(c->job);
	struct manifest *nm = NULL;
	char from[32], to[32];
	int rc;

	snprintf(from, sizeof(from), "-n%u-w", owner);
	snprintf(to, sizeof(to), "-n%u-w", rank);
	for (size_t i = 0; i < (*mf)->n; i++) {
		const char *p = (*mf)->e[i].path, *q;
		char nn[NAME_MAX + 1];

		if ((*mf)->e[i].type != MF_FILE || save_worker(p, c->job, owner, step) < 0)
			continue;
		q = p + jl + 2 + strspn(p + jl + 2, "0123456789");   /* at "-n<owner>-w" */
		if ((size_t)snprintf(nn, sizeof(nn), "%.*s%s%s", (int)(q - p), p, to,
				     q + strlen(from)) >= sizeof(nn))
			return -ENAMETOOLONG;
		if (renameat(dirfd, p, dirfd, nn) < 0)
			return -errno;
	}
	rc = mf_build(dirfd, &nm);
	if (rc < 0)
		return rc;
	mf_free(*mf);
	*mf = nm;
	return 0;
}

/* Make this node's shard of plan p of worker w (0 unless one shard per
 * worker; p's holder, owner, hash and addr are that worker's) present
 * under its own key. *whole: a bucket restore brought every worker's file
 * in worker 0's shard (a backup of the older layout). */
static int obtain(struct eng *e, const struct rcfg *c, const struct plan_entry *p, uint32_t w,
		  bool *whole, char *why, size_t whylen)
{
	struct shard_key mine = { 0 }, src = { 0 };
	struct ram_stage st = { .fd = -1 };
	struct manifest *mf = NULL;
	struct nconn *conn = NULL;
	json_t *req = NULL, *resp = NULL;
	char addr[256];
	int rc;

	*whole = false;
	snprintf(mine.job, sizeof(mine.job), "%s", c->job);
	mine.step = p->step;
	mine.rank = (uint32_t)c->node_rank;
	mine.worker = w;
	src = mine;
	src.rank = p->owner;

	if (p->bucket) {
		if (!e->bkt) {
			snprintf(why, whylen, "the plan restores backup %s but this node has no bucket= option",
				 p->backup);
			return -ENOENT;
		}
		rc = ram_stage_begin(e->ram, &mine, &st);
		if (rc == 0)
			rc = job_workers(c) > 1 ? fetch_backup_w(e, c, p, w, st.fd, &mf, whole) :
			     fetch_backup(e, c, p, st.fd, &mf);
		if (rc < 0)
			snprintf(why, whylen, "backup %s: %s", p->backup, bkt_last_error());
		if (rc == 0)
			rc = ram_stage_publish(e->ram, &st, mf, SHF_OWN | SHF_RESTORED);
		if (rc == 0) {
			ram_recount(e->ram);
			metrics_add(MC_RESTORE_BYTES, mf->total);
			log_info("engine", "restored job=%s step=%llu from backup %s bytes=%llu worker=%u",
				 c->job, (unsigned long long)p->step, p->backup,
				 (unsigned long long)mf->total, w);
		}
		if (st.fd >= 0 || st.rel[0])
			ram_stage_abort(e->ram, &st);
		mf_free(mf);
		return rc;
	}

	if (p->holder == (uint32_t)c->node_rank) {
		char err[300];
		rc = ram_verify(e->ram, &src, err, sizeof(err));
		if (rc < 0) {
			snprintf(why, whylen, "local copy of node %u's shard fails verification: %.300s",
				 p->owner, err);
			idx_set_state(ram_idx(e->ram), &src, SH_BAD, 0, 0);
			return rc;
		}
		if (p->owner == mine.rank)
			return idx_set_state(ram_idx(e->ram), &mine, 0, SHF_OWN | SHF_RESTORED, 0);
		/* a column mate's shard held here: same data under our key */
		struct shard_rec rec = { 0 };
		rc = idx_get_shard(ram_idx(e->ram), &src, &rec);
		if (rc == 0)
			rc = mf_decode(rec.mf, rec.mflen, &mf);
		idx_rec_clear(&rec);
		if (rc == 0)
			rc = ram_stage_begin(e->ram, &mine, &st);
		if (rc == 0)
			rc = ram_stage_link(e->ram, &st, &src);
		if (rc == 0 && c->framework == RCFG_FW_PYTORCH)
			rc = adopt_mate_files(c, st.fd, p->step, p->owner, mine.rank, &mf);
		if (rc == 0)
			rc = ram_stage_publish(e->ram, &st, mf, SHF_OWN | SHF_RESTORED);
		if (rc < 0) {
			snprintf(why, whylen, "linking node %u's shard: %s", p->owner, strerror(-rc));
			ram_stage_abort(e->ram, &st);
		}
		mf_free(mf);
		return rc;
	}
	if (p->addr[0])
		snprintf(addr, sizeof(addr), "%s", p->addr);
	else if ((rc = addr_of(e, p->holder, addr, sizeof(addr))) < 0) {
		snprintf(why, whylen, "no address for rank %u", p->holder);
		return rc;
	}
	rc = nconn_connect(addr, c->node_rank, "data", &e->auth, 5000, &conn, NULL);
	if (rc < 0) {
		snprintf(why, whylen, "connecting to rank %u at %s: %s", p->holder, addr, strerror(-rc));
		return rc;
	}
	req = key_json(&src);
	json_object_set_new(req, "op", json_string("fetch"));
	rc = nconn_call(conn, req, &resp, DATA_TIMEOUT_MS);
	if (rc < 0) {
		snprintf(why, whylen, "rank %u refused the fetch: %s", p->holder, strerror(-rc));
		goto out;
	}
	rc = decode_manifest_field(resp, &mf, why, whylen);
	if (rc < 0) {
		log_warn("engine", "rank %u sent a manifest that is refused: %s", p->holder, why);
	}
	if (rc < 0 || memcmp(mf->hash, p->hash, 32)) {
		snprintf(why, whylen, "rank %u sent a manifest that does not match the plan", p->holder);
		rc = -EBADMSG;
		goto out;
	}
	rc = ram_stage_begin(e->ram, &mine, &st);
	if (rc == 0)
		rc = recv_files(e, conn, &st, mf, why, whylen);
	if (rc == 0 && p->owner != mine.rank && c->framework == RCFG_FW_PYTORCH &&
	    (rc = adopt_mate_files(c, st.fd, p->step, p->owner, mine.rank, &mf)) < 0)
		snprintf(why, whylen, "renaming node %u's files as this node's: %s", p->owner,
			 strerror(-rc));
	if (rc == 0)
		rc = ram_stage_publish(e->ram, &st, mf, SHF_OWN | SHF_RESTORED);
	if (rc == 0)
		metrics_add(MC_RESTORE_BYTES, mf->total);
	if (rc == 0)
		log_info("engine", "restored job=%s step=%llu from rank %u bytes=%llu worker=%u",
			 c->job, (unsigned long long)p->step, p->holder,
			 (unsigned long long)mf->total, w);
out:
	if (st.fd >= 0 || st.rel[0])
		ram_stage_abort(e->ram, &st);
	json_decref(req);
	json_decref(resp);
	nconn_close(conn);
	mf_free(mf);
	return rc;
}

static void to_restore_plan(const struct rcfg *c, const struct plan_entry *p, struct restore_plan *rp)
{
	memset(rp, 0, sizeof(*rp));
	rp->found = p->found;
	if (!p->found)
		return;
	rp->step = p->step;
	snprintf(rp->key.job, sizeof(rp->key.job), "%s", c->job);
	rp->key.step = p->step;
	rp->key.rank = (uint32_t)c->node_rank;
	if (p->bucket) {
		rp->source = RS_BUCKET;
		snprintf(rp->backup, sizeof(rp->backup), "%s", p->backup);
		return;
	}
	rp->source = p->holder == (uint32_t)c->node_rank ? RS_LOCAL : RS_PEER;
}

int eng_restore(struct eng *e, const struct rcfg *c, restore_report_fn rep, void *arg,
		void (*prerestore)(void *arg, const struct restore_plan *p),
		struct restore_plan *plan)
{
	int call_ms = (e->restore_timeout_s + 30) * 1000;
	uint64_t deadline = util_now_ns() + (uint64_t)(3 * e->restore_timeout_s + 60) * 1000000000ULL;
	json_t *req = NULL, *resp = NULL;
	struct plan_entry p;
	char last_notes[1024] = "";
	int rc, rounds = 0;

	pthread_mutex_lock(&e->ctl_mu);
	e->restoring = true;
	e->restore_cancel = false;
	e->restore_thr = pthread_self();
	pthread_mutex_unlock(&e->ctl_mu);
restart:
	json_decref(req);
	req = catalog_msg(e, c);
	rc = ctl_call(e, req, &resp, call_ms);
	if (rc == -ECANCELED)
		goto out;
	if (rc < 0) {
		char line[512];
		snprintf(line, sizeof(line), "restore: the coordinator at %s did not answer: %s",
			 e->coord_addr, strerror(-rc));
		if (rep)
			rep(arg, line);
		/* a WARN per attempt: the restore that fails in the end is the
		 * one ERROR (ctl: "replicator.yaml rejected: restore failed") */
		log_warn("engine", "%s%s", line, util_now_ns() < deadline && rounds < 20
			 ? "; retrying in 1 s" : "; giving up");
		if (util_now_ns() < deadline && rounds++ < 20) {
			struct timespec ts;
			pthread_mutex_lock(&e->ctl_mu);
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += 1;
			if (!e->restore_cancel)   /* a new yaml ends the pause too */
				pthread_cond_timedwait(&e->ctl_cv, &e->ctl_mu, &ts);
			pthread_mutex_unlock(&e->ctl_mu);
			goto restart;
		}
		goto out;
	}
	for (;;) {
		const char *op = "";
		char why[512] = "";

		if (net_json_str(resp, "op", 32, &op) == 0 && !strcmp(op, "restart")) {
			json_decref(resp);
			resp = NULL;
			goto restart;
		}
		rc = parse_plan(resp, &p);
		json_decref(resp);
		resp = NULL;
		if (rc < 0)
			goto out;
		to_restore_plan(c, &p, plan);
		if (p.notes[0] && rep && strcmp(p.notes, last_notes)) {
			rep(arg, p.notes);
			snprintf(last_notes, sizeof(last_notes), "%s", p.notes);
		}
		if (prerestore)
			prerestore(arg, plan);
		if (p.found) {
			/* each worker's shard from its own source (one shard
			 * per worker), as GKE restores each worker's file */
			uint32_t W = job_workers(c), fw = 0;
			struct plan_entry *pw = NULL;
			rc = 0;
			for (uint32_t w = 0; w < W && rc == 0; w++) {
				bool whole = false;
				if (w > 0 && !p.bucket && w >= p.nsrc) {
					rc = -EPROTO;
					snprintf(why, sizeof(why), "the plan names no source for worker %u", w);
					break;
				}
				if (w > 0 && !p.bucket) {
					if (!pw && !(pw = malloc(sizeof(*pw)))) {
						rc = -ENOMEM;
						break;
					}
					*pw = p;
					pw->holder = p.src[w].holder;
					pw->owner = p.src[w].owner;
					memcpy(pw->hash, p.src[w].hash, 32);
					snprintf(pw->addr, sizeof(pw->addr), "%s", p.src[w].addr);
				}
				fw = w;
				rc = obtain(e, c, w > 0 && !p.bucket ? pw : &p, w, &whole, why,
					    sizeof(why));
				if (whole)
					break;   /* every worker's file came in worker 0's shard */
			}
			if (rc < 0 && fw > 0 && pw) {
				p.holder = pw->holder;   /* the failed source, for fetch_failed */
				p.owner = pw->owner;
			}
			free(pw);
			if (rc < 0) {
				json_t *ff;
				char line[800];
				if (p.bucket)
					snprintf(line, sizeof(line),
						 "restore of step %llu from backup %s failed (%s); asking for another backup",
						 (unsigned long long)p.step, p.backup, why);
				else
					snprintf(line, sizeof(line),
						 "restore of step %llu: source rank %u failed (%s); asking for another source",
						 (unsigned long long)p.step, p.holder, why);
				log_warn("engine", "%s", line);
				if (rep)
					rep(arg, line);
				ff = json_object();
				json_object_set_new(ff, "op", json_string("fetch_failed"));
				json_object_set_new(ff, "job", json_string(c->job));
				json_object_set_new(ff, "plan", json_integer(p.plan));
				json_object_set_new(ff, "holder", json_integer(p.holder));
				json_object_set_new(ff, "owner", json_integer(p.owner));
				json_object_set_new(ff, "step", json_integer((json_int_t)p.step));
				if (fw > 0)
					json_object_set_new(ff, "worker", json_integer(fw));
				if (p.bucket)
					json_object_set_new(ff, "bucket", json_true());
				rc = ctl_call(e, ff, &resp, call_ms);
				json_decref(ff);
				if (rc < 0 || util_now_ns() > deadline)
					goto out;
				continue;
			}
		}
		/* the job-wide barrier */
		json_t *rd = json_object();
		json_object_set_new(rd, "op", json_string("ready"));
		json_object_set_new(rd, "job", json_string(c->job));
		json_object_set_new(rd, "plan", json_integer(p.plan));
		rc = ctl_call(e, rd, &resp, call_ms);
		json_decref(rd);
		if (rc < 0)
			goto out;
		if (net_json_str(resp, "op", 32, &op) == 0 && !strcmp(op, "go")) {
			json_decref(resp);
			resp = NULL;
			if (p.found) {
				pthread_mutex_lock(&e->mu);
				e->has_lkg = e->has_safe = true;
				e->lkg = e->safe = p.step;   /* older steps belong to the past */
				snprintf(e->lkg_job, sizeof(e->lkg_job), "%s", c->job);
				pthread_mutex_unlock(&e->mu);
			}
			rc = 0;
			break;
		}
		if (util_now_ns() > deadline) {
			rc = -ETIMEDOUT;
			goto out;
		}
		/* a new plan (another node's source failed): go around again */
	}
out:
	pthread_mutex_lock(&e->ctl_mu);
	if (e->restore_cancel)
		rc = -ECANCELED;   /* whatever the round got to: a new one replaces it */
	e->restoring = false;
	e->restore_cancel = false;
	pthread_mutex_unlock(&e->ctl_mu);
	if (rc == -ECANCELED)
		log_info("engine", "restore of job %s interrupted by a new replicator.yaml", c->job);
	json_decref(req);
	json_decref(resp);
	return rc;
}

/* ---------- the bucket, as the coordinator asks for it ---------- */

static bool excluded(const char (*ex)[64], size_t n, const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (!strcmp(ex[i], name))
			return true;
	return false;
}

struct exclusions {
	const char (*ex)[64];
	size_t n;
};

static bool usable(void *arg, const struct bk_backup *v)
{
	const struct exclusions *x = arg;
	return v->complete && !excluded(x->ex, x->n, v->name);
}

static int bk_decide(void *arg, const char *job, uint32_t nodes, const char (*ex)[64], size_t nex,
		     bool need_newest, struct coord_bk_decision *d)
{
	struct exclusions exl = { ex, nex };
	struct eng *e = arg;
	struct bk_backup *v = NULL, one;
	char rv[BK_NAME_MAX];
	size_t n = 0, nl = 0;
	uint32_t workers;
	int rc;

	memset(d, 0, sizeof(*d));
	pthread_mutex_lock(&e->mu);
	workers = e->workers ? e->workers : 1;
	pthread_mutex_unlock(&e->mu);
	rc = bk_get_restore_version(e->bkt, job, rv);
	if (rc == 0 || rc == -EBADMSG) {
		d->forced = true;
		if (rc == -EBADMSG) {
			snprintf(d->notes, sizeof(d->notes),
				 "%s/%s/restore.version does not name a backup; nothing is restored",
				 bkt_url(e->bkt), job);
			return 0;
		}
		snprintf(d->name, sizeof(d->name), "%s", rv);
		memset(&one, 0, sizeof(one));
		rc = bk_check_backup(e->bkt, job, rv, nodes, workers, &one);
		if (rc == 0 && one.complete && !excluded(ex, nex, rv)) {
			d->forced_ok = true;
			d->step = one.step;
		} else {
			snprintf(d->notes, sizeof(d->notes),
				 "restore.version names backup %s, which %s; nothing is restored (no fallback)",
				 rv, rc < 0 ? "does not exist" : excluded(ex, nex, rv) ? "failed to restore" :
				 one.why[0] ? one.why : "is incomplete");
		}
		bk_backup_clear(&one);
		return 0;
	}
	if (rc != -ENOENT)
		return rc;
	if (!need_newest)
		return 0;
	/* newest first, and no further than the first usable one */
	rc = bk_list_backups_until(e->bkt, job, nodes, workers, usable, &exl, &v, &n);
	if (rc < 0)
		return rc;
	for (size_t i = 0; i < n; i++) {
		if (excluded(ex, nex, v[i].name))
			continue;
		if (v[i].complete) {
			d->have_newest = true;
			d->step = v[i].step;
			snprintf(d->name, sizeof(d->name), "%s", v[i].name);
			break;
		}
		if (nl < sizeof(d->notes) - 1)
			nl += (size_t)snprintf(d->notes + nl, sizeof(d->notes) - nl, "%sbackup %s skipped: %s",
					       nl ? "; " : "", v[i].name, v[i].why);
		if (nl >= sizeof(d->notes))
			nl = sizeof(d->notes) - 1;
	}
	bk_backups_free(v, n);
	return 0;
}

/* The clock backups are named by.  MTCFS_TEST_MINUTE_SECS=N (tests only,
 * 1..60) makes a minute of it last N real seconds from the first call, so
 * tests of the one-backup-per-minute rule need not wait real minutes. */
static time_t backup_clock(unsigned *real_s_per_min)
{
	/* only the coordinator's one worker thread calls this */
	static time_t t0;
	static unsigned scale;
	time_t now = time(NULL);

	*real_s_per_min = 60;
	if (!t0) {
		const char *v = getenv("MTCFS_TEST_MINUTE_SECS");
		uint64_t n;
		if (v && util_parse_u64(v, 60, &n) == 0 && n >= 1)
			scale = (unsigned)n;
		t0 = now;
	}
	if (!scale)
		return now;
	*real_s_per_min = scale;
	return t0 + (now - t0) * 60 / (time_t)scale;
}

static int bk_name(void *arg, const char *job, char *out, size_t outlen, unsigned *retry_s)
{
	struct eng *e = arg;
	char name[BK_NAME_MAX];
	unsigned per_min;
	time_t t = backup_clock(&per_min);
	int rc = bk_new_name(e->bkt, job, t, name);

	*retry_s = 0;
	if (rc == -EAGAIN) {
		/* real seconds until the clock's next minute, rounded up */
		*retry_s = (unsigned)(((60 - t % 60) * per_min + 59) / 60);
		snprintf(out, outlen, "%s", bkt_last_error());
	} else if (rc < 0) {
		report(e, "backup of job %s not started: %s", job, bkt_last_error());
		snprintf(out, outlen, "%s", bkt_last_error());
	} else {
		snprintf(out, outlen, "%s", name);
	}
	return rc;
}

static int bk_discard(void *arg, const char *job, const char *name, char *out, size_t outlen)
{
	struct eng *e = arg;
	int rc = bk_discard_attempt(e->bkt, job, name);

	if (rc < 0) {
		report(e, "backup %s of job %s failed and cannot be removed: %s", name, job,
		       bkt_last_error());
		snprintf(out, outlen, "%s", bkt_last_error());
	}
	return rc;
}

static void bk_clear_rv(void *arg, const char *job)
{
	struct eng *e = arg;
	int rc = bk_clear_restore_version(e->bkt, job);
	if (rc < 0)
		log_err("engine", "cannot delete %s/%s/restore.version: %s", bkt_url(e->bkt), job,
			bkt_last_error());
	else
		log_info("engine", "deleted %s/%s/restore.version after the first commit following its restore",
			 bkt_url(e->bkt), job);
}

/* ---------- life cycle ---------- */

static int split_peers(struct eng *e, const char *peers)
{
	char *dup = strdup(peers), *p = dup, *comma;
	if (!dup)
		return -ENOMEM;
	while (p && *p) {
		char **na;
		comma = strchr(p, ',');
		if (comma)
			*comma = '\0';
		na = realloc(e->addrs, (e->naddrs + 1) * sizeof(*na));
		if (!na) {
			free(dup);
			return -ENOMEM;
		}
		e->addrs = na;
		e->addrs[e->naddrs++] = strdup(p);
		p = comma ? comma + 1 : NULL;
	}
	free(dup);
	return e->naddrs ? 0 : -EINVAL;
}

int eng_start(struct ram_tier *ram, const struct eng_opts *o, const struct eng_cb *cb,
	      struct eng **out)
{
	struct eng *e = calloc(1, sizeof(*e));
	int rc;

	if (!e)
		return -ENOMEM;
	e->ram = ram;
	if (cb)
		e->cb = *cb;
	e->rank = o->rank;
	e->restore_timeout_s = o->restore_timeout_s > 0 ? o->restore_timeout_s : 300;
	pthread_mutex_init(&e->mu, NULL);
	pthread_mutex_init(&e->ctl_mu, NULL);
	pthread_cond_init(&e->ctl_cv, NULL);
	if (!o->listen && (o->peers || o->coordinator)) {
		log_err("engine", "the peer tier needs listen=HOST:PORT");
		rc = -EINVAL;
		goto fail;
	}
	/* a bucket without peers: this node is a job of its own, its
	 * coordinator on an ephemeral loopback port */
	snprintf(e->listen, sizeof(e->listen), "%s", o->listen ? o->listen : "127.0.0.1:0");
	if (o->peers && (rc = split_peers(e, o->peers)) < 0) {
		log_err("engine", "peers=%s is not a list of HOST:PORT", o->peers);
		goto fail;
	}
	e->rank_fixed = e->rank >= 0 || e->naddrs > 0;
	if (e->rank < 0 && e->naddrs) {
		for (uint32_t i = 0; i < e->naddrs; i++)
			if (!strcmp(e->addrs[i], e->listen))
				e->rank = (int)i;
		if (e->rank < 0) {
			log_err("engine", "listen=%s is not in peers=%s and no rank= is given", e->listen, o->peers);
			rc = -EINVAL;
			goto fail;
		}
	}
	if (o->coordinator)
		snprintf(e->coord_addr, sizeof(e->coord_addr), "%s", o->coordinator);
	else if (e->naddrs)
		snprintf(e->coord_addr, sizeof(e->coord_addr), "%s", e->addrs[0]);
	if (o->secret_file) {
		rc = auth_load_secret(o->secret_file, &e->auth);
		if (rc < 0)
			goto fail;
	}
	if (o->tls_cert || o->tls_key || o->tls_ca) {
		char err[512];
		rc = net_tls_load(o->tls_cert, o->tls_key, o->tls_ca, &e->auth.tls, err, sizeof(err));
		if (rc < 0) {
			log_err("engine", "%s", err);
			goto fail;
		}
	}
	rc = workq_start("mtcfs-repl", &e->replq);
	if (rc == 0)
		rc = workq_start("mtcfs-backup", &e->bkq);
	if (rc < 0)
		goto fail;
	if (o->bucket) {
		struct bkt_opts bo = { .gcs_endpoint = o->gcs_endpoint, .gcs_key_file = o->gcs_key_file };
		rc = bkt_open(o->bucket, &bo, &e->bkt);
		if (rc < 0) {
			log_err("engine", "bucket=%s: %s", o->bucket, bkt_last_error());
			goto fail;
		}
	} else {
		log_info("engine", "no bucket configured: there is no backup tier");
	}
	rc = nsrv_start(e->listen, e->rank, &e->auth, &srv_ops, e, &e->srv);
	if (rc < 0) {
		log_err("engine", "cannot listen on %s: %s", e->listen, strerror(-rc));
		goto fail;
	}
	if (strstr(e->listen, ":0") && e->listen[strlen(e->listen) - 1] == '0' &&
	    e->listen[strlen(e->listen) - 2] == ':') {
		char *colon = strrchr(e->listen, ':');
		snprintf(colon + 1, sizeof(e->listen) - (size_t)(colon + 1 - e->listen), "%d",
			 nsrv_port(e->srv));
	}
	if (!e->coord_addr[0])
		snprintf(e->coord_addr, sizeof(e->coord_addr), "%s", e->listen);
	{
		struct coord *c = NULL;
		rc = coord_start(e->srv, e->restore_timeout_s, &c);
		if (rc < 0)
			goto fail;
		__atomic_store_n(&e->coord, c, __ATOMIC_RELEASE);
	}
	if (e->bkt) {
		struct coord_bucket bcb = { .decide = bk_decide, .new_name = bk_name, .discard = bk_discard,
					   .clear_restore_version = bk_clear_rv, .arg = e };
		coord_set_bucket(e->coord, &bcb);
	}
	{
		/* how mtcfs-admin reaches the cluster from this RAMDIR */
		json_t *pm = json_pack("{s:s,s:s,s:s?,s:i,s:s?,s:s?,s:s?}", "listen", e->listen,
				       "coordinator", e->coord_addr, "secret_file", o->secret_file,
				       "rank", e->rank, "tls_cert", o->tls_cert, "tls_key", o->tls_key,
				       "tls_ca", o->tls_ca);
		char *txt = json_dumps(pm, JSON_COMPACT);
		if (txt)
			idx_put_meta(ram_idx(ram), "peer", txt, strlen(txt));
		free(txt);
		json_decref(pm);
	}
	log_info("engine", "peer tier up listen=%s rank=%d coordinator=%s peers=%u", e->listen,
		 e->rank, e->coord_addr, e->naddrs);
	*out = e;
	return 0;
fail:
	eng_stop(e);
	return rc;
}

void eng_stop(struct eng *e)
{
	if (!e)
		return;
	pthread_mutex_lock(&e->ctl_mu);
	e->stopping = true;
	if (e->ctl)
		nconn_shutdown(e->ctl);
	pthread_mutex_unlock(&e->ctl_mu);
	if (e->ctl_reader_running)
		pthread_join(e->ctl_reader, NULL);
	e->ctl_reader_running = false;
	workq_stop(e->replq);
	workq_stop(e->bkq);
	coord_quiesce(e->coord);
	nsrv_stop(e->srv);
	coord_stop(e->coord);
	for (uint32_t i = 0; i < e->naddrs; i++)
		free(e->addrs[i]);
	free(e->addrs);
	for (uint32_t i = 0; i < e->ntable; i++)
		free(e->table[i]);
	free(e->table);
	net_tls_free(e->auth.tls);   /* every connection using it is closed */
	e->auth.tls = NULL;
	auth_clear(&e->auth);
	bkt_close(e->bkt);
	pthread_mutex_destroy(&e->mu);
	pthread_mutex_destroy(&e->ctl_mu);
	pthread_cond_destroy(&e->ctl_cv);
	free(e);
}
