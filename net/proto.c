/* proto.c — see proto.h. Encoders add keys in the order the peers of this
 * version always sent them (jansson keeps insertion order and frames are
 * dumped compact), so the bytes on the wire are what they were before the
 * messages had types. Decoders are as strict as the handlers they replaced
 * were: a field a handler used to ignore when malformed is still ignored
 * (said at the field), everything else fails with -EINVAL and a reason. */
#include "net/proto.h"
#include "net/frame.h"
#include "common/jobname.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const op_names[PROTO_OP_COUNT] = {
	[PROTO_OP_UNKNOWN] = "?",
	[PROTO_REGISTER] = "register",
	[PROTO_TABLE] = "table",
	[PROTO_CATALOG] = "catalog",
	[PROTO_FETCH_FAILED] = "fetch_failed",
	[PROTO_READY] = "ready",
	[PROTO_STATUS] = "status",
	[PROTO_COMMITTED] = "committed",
	[PROTO_REPLICATED] = "replicated",
	[PROTO_BACKUP_DONE] = "backup_done",
	[PROTO_PLAN] = "plan",
	[PROTO_GO] = "go",
	[PROTO_RESTART] = "restart",
	[PROTO_LKG] = "lkg",
	[PROTO_BACKUP] = "backup",
	[PROTO_REPORT] = "report",
	[PROTO_PUSH] = "push",
	[PROTO_FETCH] = "fetch",
	[PROTO_LIST] = "list",
	[PROTO_EC_META] = "ec_meta",
	[PROTO_EC_DATA] = "ec_data",
	[PROTO_EC_GET] = "ec_get",
	[PROTO_EC_METAS] = "ec_metas",
	[PROTO_PEERS] = "peers",
};

const char *proto_op_name(enum proto_op op)
{
	return (unsigned)op < PROTO_OP_COUNT && op_names[op] ? op_names[op] : "?";
}

enum proto_op proto_op_parse(const char *s)
{
	for (int i = PROTO_OP_UNKNOWN + 1; s && i < PROTO_OP_COUNT; i++)
		if (!strcmp(s, op_names[i]))
			return (enum proto_op)i;
	return PROTO_OP_UNKNOWN;
}

int proto_msg_op(json_t *m, enum proto_op *op)
{
	const char *s;

	*op = PROTO_OP_UNKNOWN;
	if (net_json_str(m, "op", PROTO_OP_MAX, &s) < 0)
		return -EINVAL;
	*op = proto_op_parse(s);
	return 0;
}

int proto_dispatch(const struct proto_route *t, size_t n, void *ctx, struct proto_in *in)
{
	if (proto_msg_op(in->msg, &in->op) < 0)
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		if (t[i].op != in->op || in->type >= 16 || !(t[i].types & PROTO_T(in->type)))
			continue;
		t[i].fn(ctx, in);
		return 0;
	}
	return -ENOSYS;
}

/* ---- decode helpers: one reason per failure ---- */

struct why {
	char *s;
	size_t n;
};

__attribute__((format(printf, 2, 3)))
static int bad(struct why *w, const char *fmt, ...)
{
	va_list ap;

	if (w->s && w->n) {
		va_start(ap, fmt);
		vsnprintf(w->s, w->n, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

/* A required (opt false) or optional field; an optional one that is absent
 * leaves *out as it is and returns 0. */
static int get_u64(json_t *o, const char *k, uint64_t max, bool opt, uint64_t *out, struct why *w)
{
	int rc = net_json_u64(o, k, max, out);
	if (rc == -ENOENT && opt)
		return 0;
	if (rc == -ENOENT)
		return bad(w, "missing %s", k);
	if (rc < 0)
		return bad(w, "%s is not an integer in 0..%llu", k, (unsigned long long)max);
	return 0;
}

static int get_u32(json_t *o, const char *k, uint64_t max, bool opt, uint32_t *out, struct why *w)
{
	uint64_t v = *out;
	int rc = get_u64(o, k, max, opt, &v, w);
	if (rc == 0)
		*out = (uint32_t)v;
	return rc;
}

static int get_str(json_t *o, const char *k, size_t max, const char **out, struct why *w)
{
	int rc = net_json_str(o, k, max, out);
	if (rc == -ENOENT)
		return bad(w, "missing %s", k);
	if (rc < 0)
		return bad(w, "%s is not a string of at most %zu bytes", k, max);
	return 0;
}

static int get_hash(json_t *o, const char *k, uint8_t out[32], struct why *w)
{
	int rc = net_json_hex(o, k, out, 32);
	if (rc == -ENOENT)
		return bad(w, "missing %s", k);
	if (rc < 0)
		return bad(w, "%s is not 64 hex digits", k);
	return 0;
}

/* The lenient optional string: the value, or NULL when absent/malformed. */
static const char *opt_str(json_t *o, const char *k, size_t max)
{
	const char *s = NULL;
	return net_json_str(o, k, max, &s) == 0 ? s : NULL;
}

static int get_job(json_t *o, struct proto_job *j, struct why *w)
{
	uint64_t n = 0, d = 0;

	if (get_str(o, "job", PROTO_JOB_MAX, &j->name, w) < 0)
		return -EINVAL;
	if (!j->name[0])
		return bad(w, "empty job");
	if (get_u64(o, "nodes", PROTO_MAX_NODES, false, &n, w) < 0)
		return -EINVAL;
	if (n == 0)
		return bad(w, "nodes is 0");
	if (get_u64(o, "dp", PROTO_MAX_NODES, true, &d, w) < 0)
		return -EINVAL;
	if (d && n % d)
		return bad(w, "dp %llu does not divide nodes %llu", (unsigned long long)d,
			   (unsigned long long)n);
	j->nodes = (uint32_t)n;
	j->dp = (uint32_t)d;
	return 0;
}

/* ---- encode helpers ---- */

static json_t *op_obj(enum proto_op op)
{
	json_t *m = json_object();
	if (m && json_object_set_new(m, "op", json_string(op_names[op])) < 0) {
		json_decref(m);
		return NULL;
	}
	return m;
}

static void set_int(json_t *m, const char *k, uint64_t v)
{
	json_object_set_new(m, k, json_integer((json_int_t)v));
}

static void set_str(json_t *m, const char *k, const char *v)
{
	json_object_set_new(m, k, json_string(v ? v : ""));
}

static void set_hash(json_t *m, const char *k, const uint8_t h[32])
{
	char hex[65];
	net_hex_encode(h, 32, hex);
	json_object_set_new(m, k, json_string(hex));
}

static void set_job(json_t *m, const struct proto_job *j)
{
	set_str(m, "job", j->name);
	set_int(m, "nodes", j->nodes);
	set_int(m, "dp", j->dp);
}

/* ---- register, table ---- */

json_t *proto_register_encode(const struct proto_register *m)
{
	json_t *o = op_obj(PROTO_REGISTER);
	if (!o)
		return NULL;
	set_str(o, "addr", m->addr);
	if (m->job) {
		set_str(o, "job", m->job);
		set_int(o, "nodes", m->nodes);
		set_int(o, "dp", m->dp);
		if (m->has_bi) {
			set_int(o, "bi_min", m->bi_min);
			set_int(o, "bi_steps", m->bi_steps);
		}
	}
	if (m->want_table)
		json_object_set_new(o, "want_table", json_true());
	return o;
}

int proto_register_decode(json_t *o, struct proto_register *m, char *why, size_t whylen)
{
	struct why w = { why, whylen };
	uint64_t nodes = 0, dp = 0;

	memset(m, 0, sizeof(*m));
	if (get_str(o, "addr", PROTO_ADDR_MAX, &m->addr, &w) < 0)
		return -EINVAL;
	/* the hint: ignored, not an error, when malformed (as ever) */
	m->job = opt_str(o, "job", PROTO_JOB_MAX);
	if (m->job && net_json_u64(o, "nodes", PROTO_MAX_NODES, &nodes) == 0) {
		if (net_json_u64(o, "dp", PROTO_MAX_NODES, &dp) < 0)
			dp = 0;
		m->nodes = (uint32_t)nodes;
		m->dp = (uint32_t)dp;
		if (net_json_u64(o, "bi_min", 1u << 20, &nodes) == 0 &&
		    net_json_u64(o, "bi_steps", 1u << 30, &dp) == 0) {
			m->has_bi = true;
			m->bi_min = (uint32_t)nodes;
			m->bi_steps = (uint32_t)dp;
		}
	} else {
		m->job = NULL;
	}
	m->want_table = json_is_true(json_object_get(o, "want_table"));
	return 0;
}

json_t *proto_addrs_reply(bool ok, bool with_addrs, char *const *addrs, uint32_t naddrs,
			  uint64_t gen)
{
	json_t *r = json_object(), *a;

	if (!r)
		return NULL;
	if (ok)
		json_object_set_new(r, "ok", json_true());
	if (with_addrs) {
		a = json_array();
		for (uint32_t i = 0; a && i < naddrs; i++)
			json_array_append_new(a, addrs[i] ? json_string(addrs[i]) : json_null());
		json_object_set_new(r, "addrs", a);
	}
	if (gen)
		set_int(r, "gen", gen);
	return r;
}

uint64_t proto_addrs_gen(json_t *reply)
{
	uint64_t gen = 0;

	if (net_json_u64(reply, "gen", PROTO_STEP_MAX, &gen) < 0)
		gen = 0;
	return gen;
}

json_t *proto_peers_encode(uint64_t gen)
{
	json_t *o = op_obj(PROTO_PEERS);

	if (o)
		set_int(o, "gen", gen);
	return o;
}

int proto_peers_decode(json_t *o, uint64_t *gen, char *why, size_t whylen)
{
	struct why w = { why, whylen };

	*gen = 0;
	if (get_u64(o, "gen", PROTO_STEP_MAX, false, gen, &w) < 0)
		return -EINVAL;
	if (*gen == 0)
		return bad(&w, "gen is 0");
	return 0;
}

/* ---- catalog ---- */

json_t *proto_catalog_encode(const struct proto_catalog *m)
{
	json_t *o = op_obj(PROTO_CATALOG), *holds = json_array();
	char hex[65];

	if (!o || !holds) {
		json_decref(o);
		json_decref(holds);
		return NULL;
	}
	set_job(o, &m->job);
	if (m->workers)
		set_int(o, "workers", m->workers);
	for (size_t i = 0; i < m->nholds; i++) {
		const struct proto_hold *h = &m->holds[i];
		json_t *x;
		net_hex_encode(h->hash, 32, hex);
		x = json_pack("[i,I,s]", (int)h->owner, (json_int_t)h->step, hex);
		if (x && (h->has_worker || h->has_content))
			json_array_append_new(x, json_integer(h->worker));
		if (x && h->has_content) {
			net_hex_encode(h->content, 32, hex);
			json_array_append_new(x, json_string(hex));
		}
		json_array_append_new(holds, x);
	}
	json_object_set_new(o, "holds", holds);
	return o;
}

static int get_hold(json_t *h, uint32_t nodes, struct proto_hold *lh, struct why *w, size_t i)
{
	json_t *o = json_array_get(h, 0), *s = json_array_get(h, 1), *hx = json_array_get(h, 2);
	json_t *wk = json_array_get(h, 3), *ck = json_array_get(h, 4);

	memset(lh, 0, sizeof(*lh));
	if (!json_is_integer(o) || json_integer_value(o) < 0 ||
	    json_integer_value(o) >= (json_int_t)nodes)
		return bad(w, "holds[%zu]: owner is not a rank below %u", i, nodes);
	if (!json_is_integer(s) || json_integer_value(s) < 0)
		return bad(w, "holds[%zu]: step is not a non-negative integer", i);
	if (!json_is_string(hx) ||
	    net_hex_decode(json_string_value(hx), json_string_length(hx), lh->hash, 32) < 0)
		return bad(w, "holds[%zu]: hash is not 64 hex digits", i);
	/* worker absent: worker 0 */
	if (wk && (!json_is_integer(wk) || json_integer_value(wk) < 0 ||
		   json_integer_value(wk) >= PROTO_MAX_WORKERS))
		return bad(w, "holds[%zu]: worker is not in 0..%u", i, PROTO_MAX_WORKERS - 1);
	if (ck && (!json_is_string(ck) ||
		   net_hex_decode(json_string_value(ck), json_string_length(ck), lh->content, 32) < 0))
		return bad(w, "holds[%zu]: content is not 64 hex digits", i);
	lh->owner = (uint32_t)json_integer_value(o);
	lh->step = (uint64_t)json_integer_value(s);
	lh->has_worker = wk != NULL;
	lh->worker = wk ? (uint32_t)json_integer_value(wk) : 0;
	lh->has_content = ck != NULL;
	return 0;
}

int proto_catalog_decode(json_t *o, struct proto_catalog *m, char *why, size_t whylen)
{
	struct why w = { why, whylen };
	json_t *holds = json_object_get(o, "holds"), *h;
	uint64_t wk = 0;
	size_t i;

	memset(m, 0, sizeof(*m));
	if (get_job(o, &m->job, &w) < 0)
		return -EINVAL;
	if (!json_is_array(holds))
		return bad(&w, "holds is not an array");
	if (json_array_size(holds) > PROTO_MAX_HOLDS)
		return bad(&w, "more than %u holds", PROTO_MAX_HOLDS);
	/* workers: ignored when malformed or 0 (as ever) */
	if (net_json_u64(o, "workers", PROTO_MAX_WORKERS, &wk) == 0)
		m->workers = (uint32_t)wk;
	if (json_array_size(holds) == 0)
		return 0;
	m->holds = calloc(json_array_size(holds), sizeof(*m->holds));
	if (!m->holds)
		return -ENOMEM;
	json_array_foreach(holds, i, h) {
		if (get_hold(h, m->job.nodes, &m->holds[i], &w, i) < 0) {
			proto_catalog_free(m);
			return -EINVAL;
		}
		m->nholds = i + 1;
	}
	return 0;
}

void proto_catalog_free(struct proto_catalog *m)
{
	free(m->holds);
	m->holds = NULL;
	m->nholds = 0;
}

/* ---- fetch_failed, ready, status ---- */

json_t *proto_fetch_failed_encode(const struct proto_fetch_failed *m)
{
	json_t *o = op_obj(PROTO_FETCH_FAILED);
	if (!o)
		return NULL;
	set_str(o, "job", m->job);
	set_int(o, "plan", m->plan);
	set_int(o, "holder", m->holder);
	set_int(o, "owner", m->owner);
	set_int(o, "step", m->step);
	if (m->worker > 0)
		set_int(o, "worker", m->worker);
	if (m->bucket)
		json_object_set_new(o, "bucket", json_true());
	return o;
}

int proto_fetch_failed_decode(json_t *o, struct proto_fetch_failed *m, char *why, size_t whylen)
{
	struct why w = { why, whylen };
	uint64_t wk;

	memset(m, 0, sizeof(*m));
	if (get_str(o, "job", PROTO_JOB_MAX, &m->job, &w) < 0)
		return -EINVAL;
	m->bucket = json_is_true(json_object_get(o, "bucket"));
	/* plan: informational, ignored when malformed */
	if (net_json_u64(o, "plan", UINT32_MAX, &wk) == 0)
		m->plan = (uint32_t)wk;
	if (get_u32(o, "holder", PROTO_MAX_NODES - 1, false, &m->holder, &w) < 0 ||
	    get_u32(o, "owner", PROTO_MAX_NODES - 1, false, &m->owner, &w) < 0 ||
	    get_u64(o, "step", PROTO_STEP_MAX, false, &m->step, &w) < 0)
		return -EINVAL;
	/* worker: 0 when absent or malformed (as ever) */
	if (net_json_u64(o, "worker", PROTO_MAX_WORKERS - 1, &wk) == 0)
		m->worker = (uint32_t)wk;
	return 0;
}

json_t *proto_ready_encode(const struct proto_ready *m)
{
	json_t *o = op_obj(PROTO_READY);
	if (!o)
		return NULL;
	set_str(o, "job", m->job);
	set_int(o, "plan", m->plan);
	return o;
}

int proto_ready_decode(json_t *o, struct proto_ready *m, char *why, size_t whylen)
{
	struct why w = { why, whylen };

	memset(m, 0, sizeof(*m));
	if (get_str(o, "job", PROTO_JOB_MAX, &m->job, &w) < 0 ||
	    get_u32(o, "plan", UINT32_MAX, false, &m->plan, &w) < 0)
		return -EINVAL;
	return 0;
}

json_t *proto_status_encode(const struct proto_status *m)
{
	json_t *o = op_obj(PROTO_STATUS);
	if (o)
		set_str(o, "job", m->job);
	return o;
}

int proto_status_decode(json_t *o, struct proto_status *m, char *why, size_t whylen)
{
	(void)why;
	(void)whylen;
	m->job = opt_str(o, "job", PROTO_JOB_MAX);
	return 0;
}

static json_t *int_or_null(bool has, uint64_t v)
{
	return has ? json_integer((json_int_t)v) : json_null();
}

json_t *proto_status_reply_encode(const struct proto_status_reply *m)
{
	json_t *r = proto_addrs_reply(false, true, m->addrs, m->naddrs, 0), *nodes;

	if (!r)
		return NULL;
	json_object_set_new(r, "known", json_boolean(m->known));
	if (!m->known)
		return r;
	set_str(r, "job", m->job);
	set_int(r, "nodes_total", m->nodes_total);
	set_int(r, "dp", m->dp);
	json_object_set_new(r, "lkg", int_or_null(m->has_lkg, m->lkg));
	json_object_set_new(r, "replicated_lkg", int_or_null(m->has_safe, m->safe));
	set_str(r, "restore", m->restore);
	set_int(r, "plan", m->plan);
	json_object_set_new(r, "last_backup_step",
			    int_or_null(m->has_last_backup, m->last_backup_step));
	json_object_set_new(r, "backup_running",
			    m->backup_running ? json_string(m->backup_running) : json_null());
	nodes = json_array();
	for (uint32_t x = 0; nodes && x < m->nodes_total; x++) {
		const struct proto_status_node *nd = &m->nodes[x];
		json_t *n = json_object(), *cm = json_array();
		for (uint32_t k = 0; cm && k < nd->ncommits && k < PROTO_STATUS_COMMITS; k++)
			json_array_append_new(cm, json_integer((json_int_t)nd->commits[k]));
		set_int(n, "rank", x);
		json_object_set_new(n, "connected", json_boolean(nd->connected));
		json_object_set_new(n, "commits", cm);
		json_array_append_new(nodes, n);
	}
	json_object_set_new(r, "nodes", nodes);
	return r;
}

/* ---- committed, replicated ---- */

static json_t *step_ev_encode(enum proto_op op, const struct proto_step_ev *m)
{
	json_t *o = op_obj(op);
	if (!o)
		return NULL;
	set_job(o, &m->job);
	set_int(o, "step", m->step);
	if (op == PROTO_COMMITTED)
		set_hash(o, "hash", m->hash);
	if (m->workers > 1) {
		set_int(o, "worker", m->worker);
		set_int(o, "workers", m->workers);
	}
	if (op == PROTO_COMMITTED) {
		set_int(o, "bi_min", m->bi_min);
		set_int(o, "bi_steps", m->bi_steps);
	}
	return o;
}

static int step_ev_decode(enum proto_op op, json_t *o, struct proto_step_ev *m, struct why *w)
{
	uint64_t v;

	memset(m, 0, sizeof(*m));
	m->workers = 1;
	if (op == PROTO_COMMITTED && get_hash(o, "hash", m->hash, w) < 0)
		return -EINVAL;
	if (get_job(o, &m->job, w) < 0 ||
	    get_u64(o, "step", PROTO_STEP_MAX, false, &m->step, w) < 0)
		return -EINVAL;
	/* worker, workers: absent from a node keeping one shard per step */
	if (get_u32(o, "workers", PROTO_MAX_WORKERS, true, &m->workers, w) < 0 ||
	    get_u32(o, "worker", PROTO_MAX_WORKERS - 1, true, &m->worker, w) < 0)
		return -EINVAL;
	if (m->workers == 0)
		return bad(w, "workers is 0");
	if (m->worker >= m->workers)
		return bad(w, "worker %u is not below workers %u", m->worker, m->workers);
	if (op != PROTO_COMMITTED)
		return 0;
	/* the backup interval: ignored when malformed (as ever) */
	if (net_json_u64(o, "bi_min", 1u << 20, &v) == 0) {
		m->has_bi_min = true;
		m->bi_min = (uint32_t)v;
	}
	if (net_json_u64(o, "bi_steps", 1u << 30, &v) == 0) {
		m->has_bi_steps = true;
		m->bi_steps = (uint32_t)v;
	}
	return 0;
}

json_t *proto_committed_encode(const struct proto_step_ev *m)
{
	return step_ev_encode(PROTO_COMMITTED, m);
}

int proto_committed_decode(json_t *o, struct proto_step_ev *m, char *why, size_t whylen)
{
	struct why w = { why, whylen };
	return step_ev_decode(PROTO_COMMITTED, o, m, &w);
}

json_t *proto_replicated_encode(const struct proto_step_ev *m)
{
	return step_ev_encode(PROTO_REPLICATED, m);
}

int proto_replicated_decode(json_t *o, struct proto_step_ev *m, char *why, size_t whylen)
{
	struct why w = { why, whylen };
	return step_ev_decode(PROTO_REPLICATED, o, m, &w);
}

/* ---- backup_done ---- */

json_t *proto_backup_done_encode(const struct proto_backup_done *m)
{
	json_t *o = op_obj(PROTO_BACKUP_DONE);
	if (!o)
		return NULL;
	set_str(o, "job", m->job);
	set_str(o, "name", m->name);
	set_int(o, "step", m->step);
	json_object_set_new(o, "ok", json_boolean(m->ok));
	if (m->error)
		set_str(o, "error", m->error);
	return o;
}

int proto_backup_done_decode(json_t *o, struct proto_backup_done *m, char *why, size_t whylen)
{
	struct why w = { why, whylen };

	memset(m, 0, sizeof(*m));
	if (get_str(o, "job", PROTO_JOB_MAX, &m->job, &w) < 0 ||
	    get_str(o, "name", PROTO_NAME_MAX, &m->name, &w) < 0 ||
	    get_u64(o, "step", PROTO_STEP_MAX, true, &m->step, &w) < 0)
		return -EINVAL;
	m->ok = json_is_true(json_object_get(o, "ok"));
	m->error = opt_str(o, "error", PROTO_ERRTEXT_MAX);
	return 0;
}

/* ---- plan, go, restart ---- */

json_t *proto_plan_encode(const struct proto_plan *m)
{
	json_t *o = op_obj(PROTO_PLAN);
	char hex[65];

	if (!o)
		return NULL;
	set_int(o, "plan", m->plan);
	json_object_set_new(o, "found", json_boolean(m->found));
	if (m->notes && m->notes[0])
		set_str(o, "notes", m->notes);
	if (m->found && m->bucket) {
		set_int(o, "step", m->step);
		set_str(o, "source", "bucket");
		set_str(o, "backup", m->backup);
		if (m->has_owner) {
			set_int(o, "owner", m->src.owner);
			if (m->nshards > 1) {
				json_t *a = json_array();
				for (uint32_t w = 0; a && w < m->nshards; w++)
					json_array_append_new(a, json_integer(m->shards[w].owner));
				json_object_set_new(o, "owners", a);
			}
		}
	} else if (m->found && m->src.addr) {
		set_int(o, "step", m->step);
		set_int(o, "holder", m->src.holder);
		set_int(o, "owner", m->src.owner);
		set_hash(o, "hash", m->src.hash);
		set_str(o, "addr", m->src.addr);
		if (m->nshards > 1) {
			/* one source per worker shard; worker 0's is also the
			 * entry's own fields above */
			json_t *a = json_array();
			for (uint32_t w = 0; a && w < m->nshards; w++) {
				const struct proto_plan_src *x = &m->shards[w];
				net_hex_encode(x->hash, 32, hex);
				json_array_append_new(a, json_pack("{s:i,s:i,s:i,s:s,s:s}", "worker",
								   (int)w, "holder", (int)x->holder,
								   "owner", (int)x->owner, "hash", hex,
								   "addr", x->addr ? x->addr : ""));
			}
			json_object_set_new(o, "shards", a);
		}
	}
	return o;
}

static int get_src(json_t *o, struct proto_plan_src *x, struct why *w)
{
	if (get_u32(o, "holder", PROTO_MAX_NODES - 1, false, &x->holder, w) < 0 ||
	    get_u32(o, "owner", PROTO_MAX_NODES - 1, false, &x->owner, w) < 0 ||
	    get_hash(o, "hash", x->hash, w) < 0)
		return -EINVAL;
	x->addr = opt_str(o, "addr", 255);
	if (!x->addr)
		x->addr = "";
	return 0;
}

int proto_plan_decode(json_t *o, struct proto_plan *m, struct proto_plan_src *shards,
		      size_t maxshards, char *why, size_t whylen)
{
	struct why w = { why, whylen };
	const char *src = NULL;
	json_t *a, *x;
	size_t i;

	memset(m, 0, sizeof(*m));
	if (get_u32(o, "plan", UINT32_MAX, false, &m->plan, &w) < 0)
		return -EINVAL;
	m->found = json_is_true(json_object_get(o, "found"));
	m->notes = opt_str(o, "notes", PROTO_NOTES_MAX);
	if (!m->found)
		return 0;
	if (get_u64(o, "step", PROTO_STEP_MAX, false, &m->step, &w) < 0)
		return -EINVAL;
	if (net_json_str(o, "source", 16, &src) == 0 && !strcmp(src, "bucket")) {
		m->bucket = true;
		if (get_str(o, "backup", PROTO_NAME_MAX, &m->backup, &w) < 0)
			return -EINVAL;
		if (!json_object_get(o, "owner"))
			return 0;
		if (get_u32(o, "owner", PROTO_MAX_NODES - 1, false, &m->src.owner, &w) < 0)
			return -EINVAL;
		m->src.holder = m->src.owner;
		m->src.addr = "";
		m->has_owner = true;
		a = json_object_get(o, "owners");
		if (!a)
			return 0;
		if (!json_is_array(a) || json_array_size(a) > maxshards)
			return bad(&w, "owners is not an array of at most %zu", maxshards);
		json_array_foreach(a, i, x) {
			json_int_t v = json_is_integer(x) ? json_integer_value(x) : -1;
			if (v < 0 || v >= (json_int_t)PROTO_MAX_NODES)
				return bad(&w, "owners[%zu] is not a rank", i);
			memset(&shards[i], 0, sizeof(shards[i]));
			shards[i].holder = shards[i].owner = (uint32_t)v;
			shards[i].addr = "";
		}
		m->shards = shards;
		m->nshards = (uint32_t)json_array_size(a);
		return 0;
	}
	if (get_src(o, &m->src, &w) < 0)
		return -EINVAL;
	a = json_object_get(o, "shards");
	if (!a)
		return 0;
	if (!json_is_array(a) || json_array_size(a) > maxshards)
		return bad(&w, "shards is not an array of at most %zu", maxshards);
	json_array_foreach(a, i, x) {
		uint64_t wk;
		if (get_u64(x, "worker", PROTO_MAX_WORKERS - 1, false, &wk, &w) < 0)
			return -EINVAL;
		if (wk != i)
			return bad(&w, "shards[%zu] names worker %llu", i, (unsigned long long)wk);
		if (get_src(x, &shards[i], &w) < 0)
			return -EINVAL;
	}
	m->shards = shards;
	m->nshards = (uint32_t)json_array_size(a);
	return 0;
}

json_t *proto_go_encode(uint32_t plan)
{
	json_t *o = op_obj(PROTO_GO);
	if (o)
		set_int(o, "plan", plan);
	return o;
}

json_t *proto_restart_encode(void)
{
	return op_obj(PROTO_RESTART);
}

/* ---- lkg, backup, report ---- */

json_t *proto_lkg_encode(const struct proto_lkg *m)
{
	json_t *o = op_obj(PROTO_LKG);
	if (!o)
		return NULL;
	set_str(o, "job", m->job);
	set_int(o, "step", m->step);
	if (m->has_safe)
		set_int(o, "safe", m->safe);
	return o;
}

int proto_lkg_decode(json_t *o, struct proto_lkg *m, char *why, size_t whylen)
{
	struct why w = { why, whylen };

	memset(m, 0, sizeof(*m));
	if (get_str(o, "job", PROTO_JOB_MAX, &m->job, &w) < 0 ||
	    get_u64(o, "step", PROTO_STEP_MAX, false, &m->step, &w) < 0)
		return -EINVAL;
	/* safe: dropped when malformed or above step (as ever) */
	m->has_safe = net_json_u64(o, "safe", PROTO_STEP_MAX, &m->safe) == 0 && m->safe <= m->step;
	if (!m->has_safe)
		m->safe = 0;
	return 0;
}

json_t *proto_backup_encode(const struct proto_backup *m)
{
	json_t *o = op_obj(PROTO_BACKUP);
	if (!o)
		return NULL;
	set_str(o, "job", m->job);
	set_str(o, "name", m->name);
	set_int(o, "step", m->step);
	json_object_set_new(o, "data", json_boolean(m->data));
	return o;
}

int proto_backup_decode(json_t *o, struct proto_backup *m, char *why, size_t whylen)
{
	struct why w = { why, whylen };

	memset(m, 0, sizeof(*m));
	if (get_str(o, "job", PROTO_JOB_MAX, &m->job, &w) < 0 ||
	    get_u64(o, "step", PROTO_STEP_MAX, false, &m->step, &w) < 0 ||
	    get_str(o, "name", PROTO_NAME_MAX, &m->name, &w) < 0)
		return -EINVAL;
	m->data = !json_is_false(json_object_get(o, "data"));
	return 0;
}

json_t *proto_report_encode(const struct proto_report *m)
{
	json_t *o = op_obj(PROTO_REPORT);
	if (!o)
		return NULL;
	set_str(o, "job", m->job);
	set_str(o, "text", m->text);
	return o;
}

int proto_report_decode(json_t *o, struct proto_report *m, char *why, size_t whylen)
{
	struct why w = { why, whylen };

	memset(m, 0, sizeof(*m));
	m->job = opt_str(o, "job", PROTO_JOB_MAX);
	if (get_str(o, "text", PROTO_TEXT_MAX, &m->text, &w) < 0)
		return -EINVAL;
	return 0;
}

/* ---- data connection ---- */

json_t *proto_list_encode(const char *job)
{
	json_t *o = op_obj(PROTO_LIST);
	if (o)
		set_str(o, "job", job);
	return o;
}

/* ---- erasure coding ---- */

static bool ec_op(enum proto_op op)
{
	return op == PROTO_EC_META || op == PROTO_EC_DATA || op == PROTO_EC_GET ||
	       op == PROTO_EC_METAS;
}

json_t *proto_ec_encode(enum proto_op op, const struct proto_ec *m)
{
	json_t *o;

	if (!ec_op(op) || !(o = op_obj(op)))
		return NULL;
	set_str(o, "job", m->job);
	set_int(o, "step", m->step);
	if (op == PROTO_EC_DATA || op == PROTO_EC_GET) {
		set_int(o, "group", m->group);
		set_int(o, "cw", m->cw);
		set_int(o, "slot", m->slot);
	} else if (op == PROTO_EC_META) {
		set_int(o, "owner", m->owner);
		set_str(o, "manifest", m->manifest);
	}
	if (m->has_to)
		set_int(o, "to", m->to);
	return o;
}

int proto_ec_decode(enum proto_op op, json_t *o, struct proto_ec *m, char *why, size_t whylen)
{
	struct why w = { why, whylen };

	memset(m, 0, sizeof(*m));
	if (!ec_op(op))
		return bad(&w, "not an erasure-coding request");
	if (get_str(o, "job", PROTO_JOB_MAX, &m->job, &w) < 0)
		return -EINVAL;
	if (!job_name_ok(m->job))
		return bad(&w, "job is not a job name");
	if (get_u64(o, "step", PROTO_STEP_MAX, false, &m->step, &w) < 0)
		return -EINVAL;
	if ((op == PROTO_EC_DATA || op == PROTO_EC_GET) &&
	    (get_u32(o, "group", PROTO_MAX_NODES - 1, false, &m->group, &w) < 0 ||
	     get_u32(o, "cw", PROTO_EC_MAX_N - 1, false, &m->cw, &w) < 0 ||
	     get_u32(o, "slot", PROTO_EC_MAX_N - 1, false, &m->slot, &w) < 0))
		return -EINVAL;
	if (op == PROTO_EC_META &&
	    (get_u32(o, "owner", PROTO_MAX_NODES - 1, false, &m->owner, &w) < 0 ||
	     get_str(o, "manifest", NET_MAX_PAYLOAD, &m->manifest, &w) < 0))
		return -EINVAL;
	m->has_to = json_object_get(o, "to") != NULL;
	if (m->has_to && get_u32(o, "to", PROTO_MAX_NODES - 1, false, &m->to, &w) < 0)
		return -EINVAL;
	return 0;
}
