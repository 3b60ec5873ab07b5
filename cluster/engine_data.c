/* engine_data.c — the data server (see engine_int.h).
 * Data connection requests (first NT_REQ on a "data" connection):
 *   push  {key:{job,step,owner,worker}, manifest:b64, [to]}
 *         -> ESTALE when "to" is not this node's rank (eng_check_target)
 *         -> {have:true} (already held, or same content held: linked)
 *         -> {send:true}, then one NT_FILE per file of the manifest, then
 *            {ok:true} once every CRC32C matched and the replica is published
 *   fetch {job, step, owner, worker} -> {manifest:b64}, then one NT_FILE per file */
#include "cluster/engine_int.h"
#include "cluster/engine_ec.h"
#include "cluster/redund.h"
#include "common/jobname.h"
#include "common/log.h"
#include "common/metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


/* ---------- small helpers ---------- */

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

static void send_error(struct nconn *c, uint32_t id, int err, const char *what)
{
	json_t *m = net_error_msg(err, what);
	nconn_send(c, NT_ERROR, id, m);
	json_decref(m);
}

/* A push or an erasure-code write names the rank it is for ("to"): 0 when
 * that is this node's rank or the sender did not say (a node before "to"),
 * else -ESTALE, answered and logged. The sender's table is older than a
 * rank change or a move; what it sends would land on the wrong node and be
 * counted as held by the rank it meant. */
int eng_check_target(struct eng *e, struct nconn *c, uint32_t id, json_t *req, int peer,
		     const char *what)
{
	uint64_t to;
	int me, rc = net_json_u64(req, "to", RCFG_NODES_MAX - 1, &to);
	char text[160];

	if (rc == -ENOENT)
		return 0;
	if (rc < 0) {
		send_error(c, id, EINVAL, "bad to");
		return -EINVAL;
	}
	me = eng_rank(e);
	if (me >= 0 && to == (uint64_t)me)
		return 0;
	log_warn("engine", "%s from rank %d refused: it is for rank %llu and this node is rank %d (the sender's peer table is stale)",
		 what, peer, (unsigned long long)to, me);
	snprintf(text, sizeof(text), "this node is rank %d, not rank %llu", me,
		 (unsigned long long)to);
	send_error(c, id, ESTALE, text);
	return -ESTALE;
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
	b64 = xfer_b64_encode(rec.mf, rec.mflen);
	resp = json_object();
	json_object_set_new(resp, "manifest", json_string(b64 ? b64 : ""));
	free(b64);
	rc = nconn_send(c, NT_RESP, id, resp);
	json_decref(resp);
	if (rc == 0)
		rc = xfer_send_files(c, dfd, mf);
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
	if (xfer_decode_manifest(req, &mf, why, sizeof(why)) < 0) {
		log_warn("engine", "push of job=%s step=%llu node=%u refused: %s", k.job,
			 (unsigned long long)k.step, k.rank, why);
		send_error(c, id, EINVAL, why);
		goto out;
	}
	if (eng_check_target(e, c, id, req, peer, "a push") < 0)
		goto out;
	int me = eng_rank(e);
	bool mine = me >= 0 && k.rank == (uint32_t)me;
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
	rc = xfer_recv_files(e->ram, c, &st, mf, why, sizeof(why));
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
			char hex[65];
			uint8_t ck[32];
			json_t *sh;

			mf_hash_hex(recs[i].hash, hex);
			sh = json_pack("{s:s,s:I,s:i,s:i,s:s,s:s,s:b,s:I}",
				"job", recs[i].key.job, "step", (json_int_t)recs[i].key.step,
				"owner", (int)recs[i].key.rank, "worker", (int)recs[i].key.worker,
				"hash", hex, "state", shard_state_name(recs[i].state),
				"own", (recs[i].flags & SHF_OWN) != 0, "bytes", (json_int_t)recs[i].bytes);
			if (sh && eng_content_key(&recs[i], ck) == 0) {
				mf_hash_hex(ck, hex);
				json_object_set_new(sh, "content", json_string(hex));
			}
			json_array_append_new(arr, sh);
		}
		idx_recs_free(recs, n);
	}
	json_object_set_new(resp, "rank", json_integer(eng_rank(e)));
	json_object_set_new(resp, "shards", arr);
	json_t *ec = job ? redund_status(e, job) : NULL;   /* for mtcfs-admin steps */
	if (ec)
		json_object_set_new(resp, "ec", ec);
	nconn_send(c, NT_RESP, id, resp);
	json_decref(resp);
}

/* The data server's ops (ctx: the engine; in->stream: the connection). */
static void on_fetch(void *arg, const struct proto_in *in)
{
	serve_fetch(arg, in->stream, in->req_id, in->msg);
}

static void on_push(void *arg, const struct proto_in *in)
{
	serve_push(arg, in->stream, in->rank, in->req_id, in->msg);
}

static void on_list(void *arg, const struct proto_in *in)
{
	serve_list(arg, in->stream, in->req_id, in->msg);
}

static void on_ec(void *arg, const struct proto_in *in)
{
	eng_ec_serve(arg, in->stream, in->rank, in->req_id, in->msg, in->op);   /* engine_ec.c */
}

static const struct proto_route data_routes[] = {
	{ PROTO_FETCH,    PROTO_T(NT_REQ), on_fetch },
	{ PROTO_PUSH,     PROTO_T(NT_REQ), on_push },
	{ PROTO_LIST,     PROTO_T(NT_REQ), on_list },
	{ PROTO_EC_META,  PROTO_T(NT_REQ), on_ec },
	{ PROTO_EC_DATA,  PROTO_T(NT_REQ), on_ec },
	{ PROTO_EC_GET,   PROTO_T(NT_REQ), on_ec },
	{ PROTO_EC_METAS, PROTO_T(NT_REQ), on_ec },
};

/* One request per data connection; one without a string "op" just
 * closes it. */
static void on_data(void *arg, struct nconn *c, int peer_rank)
{
	struct net_hdr h;
	json_t *m = NULL;
	enum proto_op op;
	struct proto_in in = { .rank = peer_rank, .stream = c };

	if (nconn_recv(c, DATA_TIMEOUT_MS, &h, &m) < 0 || h.type != NT_REQ ||
	    proto_msg_op(m, &op) < 0) {
		json_decref(m);
		nconn_close(c);
		return;
	}
	in.type = h.type;
	in.req_id = h.req_id;
	in.msg = m;
	if (proto_dispatch(data_routes, sizeof(data_routes) / sizeof(data_routes[0]), arg, &in) < 0)
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

const struct nsrv_ops eng_srv_ops = {
	.on_msg = on_msg,
	.on_close = on_close,
	.on_data = on_data,
};
