/* admin_node.c — mtcfs-admin's node commands (see admin_i.h): ls, steps,
 * verify and status read RAMDIR's catalog read-only (safe while the daemon
 * runs) and ask the running daemons and the coordinator over the wire. */
#include "tools/admin_i.h"
#include "common/log.h"
#include "common/util.h"
#include "tiers/catalog.h"
#include "tiers/ec.h"
#include "tiers/lifecycle.h"
#include "tiers/manifest.h"
#include "tiers/backup.h"
#include "tiers/bucket.h"
#include "cluster/coord_ec.h"
#include "cluster/engine.h"
#include "cluster/lkg.h"
#include "cluster/prune.h"
#include "tiers/ramtier.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "cluster/rcfg.h"
#include "net/auth.h"
#include "net/client.h"
#include "net/tls.h"
#include "net/frame.h"
#include "net/proto.h"

int admin_open_catalog(const char *ramdir, struct idx **x)
{
	char db[PATH_MAX];
	int rc;

	snprintf(db, sizeof(db), "%s/db", ramdir);
	if (access(db, R_OK) < 0) {
		fprintf(stderr, "mtcfs-admin: %s has no mtcfs catalog (%s)\n", ramdir, strerror(errno));
		return -ENOENT;
	}
	rc = idx_open(db, true, x);
	if (rc < 0)
		fprintf(stderr, "mtcfs-admin: cannot open catalog %s: %s\n", db, strerror(-rc));
	return rc;
}

static const char *type_name(uint8_t t)
{
	return t == MF_FILE ? "file" : t == MF_DIR ? "dir" : t == MF_FIFO ? "fifo" : "symlink";
}

static json_t *shard_json(const struct shard_rec *r, bool with_files)
{
	json_t *o = json_object();
	char hex[65];

	json_object_set_new(o, "job", json_string(r->key.job));
	json_object_set_new(o, "step", json_integer((json_int_t)r->key.step));
	json_object_set_new(o, "rank", json_integer(r->key.rank));
	json_object_set_new(o, "worker", json_integer(r->key.worker));
	json_object_set_new(o, "state", json_string(shard_state_name(r->state)));
	json_object_set_new(o, "own", json_boolean(r->flags & SHF_OWN));
	json_object_set_new(o, "hidden", json_boolean(r->flags & SHF_HIDDEN));
	json_object_set_new(o, "restored", json_boolean(r->flags & SHF_RESTORED));
	json_object_set_new(o, "commit_time", json_integer((json_int_t)r->commit_time));
	if (r->mf) {
		struct manifest *mf = NULL;
		mf_hash_hex(r->hash, hex);
		json_object_set_new(o, "hash", json_string(hex));
		json_object_set_new(o, "bytes", json_integer((json_int_t)r->bytes));
		json_object_set_new(o, "nfiles", json_integer(r->nfiles));
		if (with_files && mf_decode(r->mf, r->mflen, &mf) == 0) {
			json_t *files = json_array();
			for (size_t i = 0; i < mf->n; i++) {
				const struct mf_entry *e = &mf->e[i];
				json_t *f = json_object();
				char crc[9];
				json_object_set_new(f, "path", json_string(e->path));
				json_object_set_new(f, "type", json_string(type_name(e->type)));
				json_object_set_new(f, "mode", json_integer(e->mode));
				if (e->type == MF_FILE) {
					snprintf(crc, sizeof(crc), "%08x", e->crc32c);
					json_object_set_new(f, "size", json_integer((json_int_t)e->size));
					json_object_set_new(f, "crc32c", json_string(crc));
				}
				if (e->target)
					json_object_set_new(f, "target", json_string(e->target));
				json_array_append_new(files, f);
			}
			json_object_set_new(o, "files", files);
			mf_free(mf);
		}
	} else {
		json_object_set_new(o, "hash", json_null());
		json_object_set_new(o, "bytes", json_integer(0));
		json_object_set_new(o, "files", json_array());
	}
	return o;
}

int admin_cmd_ls(const char *ramdir, const char *job)
{
	struct shard_rec *recs = NULL;
	struct idx *x = NULL;
	size_t n = 0;
	int rc;

	if (admin_open_catalog(ramdir, &x) < 0)
		return 3;
	rc = idx_list_shards(x, job, &recs, &n);
	if (rc < 0) {
		fprintf(stderr, "mtcfs-admin: reading catalog: %s\n", strerror(-rc));
		idx_close(x);
		return 3;
	}
	if (admin_json) {
		json_t *root = json_object(), *arr = json_array();
		for (size_t i = 0; i < n; i++)
			json_array_append_new(arr, shard_json(&recs[i], true));
		json_object_set_new(root, "shards", arr);
		json_dumpf(root, stdout, JSON_INDENT(1));
		putchar('\n');
		json_decref(root);
	} else {
		printf("%-16s %8s %5s %3s %-10s %6s %14s  %s\n", "JOB", "STEP", "RANK", "W",
		       "STATE", "FILES", "BYTES", "HASH");
		for (size_t i = 0; i < n; i++) {
			struct shard_rec *r = &recs[i];
			struct manifest *mf = NULL;
			char hex[65] = "-";
			if (r->mf)
				mf_hash_hex(r->hash, hex);
			printf("%-16s %8llu %5u %3u %-10s %6u %14llu  %.16s%s\n", r->key.job,
			       (unsigned long long)r->key.step, r->key.rank, r->key.worker,
			       shard_state_name(r->state), r->nfiles, (unsigned long long)r->bytes, hex,
			       (r->flags & SHF_OWN) ? "" : "  (replica)");
			if (r->mf && mf_decode(r->mf, r->mflen, &mf) == 0) {
				for (size_t j = 0; j < mf->n; j++) {
					const struct mf_entry *e = &mf->e[j];
					if (e->type == MF_FILE)
						printf("    %08x %14llu  %s\n", e->crc32c,
						       (unsigned long long)e->size, e->path);
					else
						printf("    %8s %14s  %s%s\n", "", type_name(e->type), e->path,
						       e->type == MF_DIR ? "/" : "");
				}
				mf_free(mf);
			}
		}
	}
	idx_recs_free(recs, n);
	idx_close(x);
	return 0;
}

/* ---- steps: the step x node matrix, from the cluster when reachable ---- */

struct holding {
	uint64_t step;
	uint32_t owner, worker, holder;
	bool ok;                  /* a verified copy (committed, replicated, backed up) */
	uint8_t hash[32];
	bool has_content;         /* a worker file's content key (eng_content_key) */
	uint8_t content[32];
};

struct view {
	char job[RCFG_JOB_MAX + 1];
	uint32_t nodes, dp;       /* dp: assume-data-parallelism, 0 = none */
	bool has_lkg, coord_ok;
	uint64_t lkg;
	bool *reached;            /* [nodes] */
	struct holding *h;
	size_t nh, cap;
	struct coord_ec *ec;      /* the nodes' redundancy rs:K+M reports */
};

static void add_holding(struct view *v, const struct holding *h)
{
	if (v->nh == v->cap) {
		size_t nc = v->cap ? v->cap * 2 : 64;
		struct holding *nh = realloc(v->h, nc * sizeof(*nh));
		if (!nh)
			return;
		v->h = nh;
		v->cap = nc;
	}
	v->h[v->nh++] = *h;
}

static bool state_ok(const char *st)
{
	return !strcmp(st, "committed") || !strcmp(st, "replicated") || !strcmp(st, "backed-up");
}

/* The credentials the node uses (its "peer" record: secret_file, tls_*),
 * so the tool can talk to the cluster as a member. 0 or -errno (the
 * reason is printed). Release with peer_auth_clear. */
static int peer_auth(json_t *pm, struct net_auth *auth)
{
	const char *secret = json_string_value(json_object_get(pm, "secret_file"));
	const char *cert = json_string_value(json_object_get(pm, "tls_cert"));
	const char *key = json_string_value(json_object_get(pm, "tls_key"));
	const char *ca = json_string_value(json_object_get(pm, "tls_ca"));
	char err[512];
	int rc;

	memset(auth, 0, sizeof(*auth));
	if (secret) {
		rc = auth_load_secret(secret, auth);
		if (rc < 0) {
			fprintf(stderr, "mtcfs-admin: secret_file %s: %s\n", secret, strerror(-rc));
			return rc;
		}
	}
	if (cert || key || ca) {
		rc = net_tls_load(cert, key, ca, &auth->tls, err, sizeof(err));
		if (rc < 0) {
			fprintf(stderr, "mtcfs-admin: %s\n", err);
			auth_clear(auth);
			return rc;
		}
	}
	return 0;
}

static void peer_auth_clear(struct net_auth *auth)
{
	net_tls_free(auth->tls);
	auth->tls = NULL;
	auth_clear(auth);
}

/* Ask every node for its holdings (data connection "list"). */
/* One shard of a node's list answer (cluster/engine_data.c serve_list). */
static void add_listed(struct view *v, json_t *sh, uint32_t holder)
{
	const char *st = json_string_value(json_object_get(sh, "state"));
	const char *hash = json_string_value(json_object_get(sh, "hash"));
	const char *content = json_string_value(json_object_get(sh, "content"));
	struct holding h = {
		.step = (uint64_t)json_integer_value(json_object_get(sh, "step")),
		.owner = (uint32_t)json_integer_value(json_object_get(sh, "owner")),
		.worker = (uint32_t)json_integer_value(json_object_get(sh, "worker")),
		.holder = holder,
		.ok = st && state_ok(st),
	};

	/* a node of an older mtcfs sends no hash: its copy counts, but not
	 * for a column's agreement */
	if (!hash || mf_hash_parse(hash, h.hash) < 0)
		memset(h.hash, 0xff, sizeof(h.hash));
	h.has_content = content && mf_hash_parse(content, h.content) == 0;
	if (h.owner < v->nodes)
		add_holding(v, &h);
}

static void query_cluster(struct view *v, struct idx *x, int my_rank)
{
	struct net_auth auth = { 0 };
	struct nconn *c = NULL;
	json_t *pm = NULL, *req = NULL, *resp = NULL, *addrs;
	const char *coord;
	void *val = NULL;
	size_t len;

	if (idx_get_meta(x, "peer", &val, &len) < 0)
		return;
	pm = json_loadb(val, len, 0, NULL);
	free(val);
	if (!pm || net_json_str(pm, "coordinator", 255, &coord) < 0)
		goto out;
	if (peer_auth(pm, &auth) < 0)
		goto out;
	if (nconn_connect(coord, AUTH_RANK_TOOL, "control", &auth, 3000, &c, NULL) < 0) {
		fprintf(stderr, "mtcfs-admin: coordinator %s not reachable; showing this node's view only\n", coord);
		goto out;
	}
	req = proto_status_encode(&(struct proto_status){ .job = v->job });
	if (nconn_call(c, req, &resp, 5000) < 0)
		goto out;
	v->coord_ok = true;
	if (json_is_integer(json_object_get(resp, "lkg"))) {
		v->has_lkg = true;
		v->lkg = (uint64_t)json_integer_value(json_object_get(resp, "lkg"));
	}
	addrs = json_object_get(resp, "addrs");
	for (uint32_t r = 0; r < v->nodes && r < json_array_size(addrs); r++) {
		json_t *a = json_array_get(addrs, r), *lr = NULL, *lresp = NULL, *sh;
		struct nconn *d = NULL;
		size_t i;
		bool self = (int)r == my_rank;   /* its holdings: the local catalog */
		if (!json_is_string(a))
			continue;
		if (nconn_connect(json_string_value(a), AUTH_RANK_TOOL, "data", &auth, 2000, &d, NULL) < 0)
			continue;
		lr = proto_list_encode(v->job);
		if (nconn_call(d, lr, &lresp, 5000) == 0) {
			v->reached[r] = true;
			coord_ec_report(&v->ec, v->nodes, (int)r, lresp, NULL, 0);
			json_array_foreach(self ? NULL : json_object_get(lresp, "shards"), i, sh)
				add_listed(v, sh, r);
		}
		json_decref(lr);
		json_decref(lresp);
		nconn_close(d);
	}
out:
	json_decref(pm);
	json_decref(req);
	json_decref(resp);
	nconn_close(c);
	peer_auth_clear(&auth);
}

/* [nodes]: the owners of step that no reached node holds and that the
 * erasure code rebuilds (the coordinator's rule, coord_ec.h), or NULL. */
static bool *ec_rebuilt(const struct view *v, uint64_t step)
{
	struct lkg_hold *h = calloc(v->nh + 1, sizeof(*h)), *aug = NULL;
	bool *out = calloc(v->nodes, sizeof(bool));
	size_t n = 0;

	for (size_t k = 0; h && k < v->nh; k++)
		if (v->h[k].step == step && v->h[k].ok && v->h[k].worker == 0)
			h[n++] = (struct lkg_hold){ .holder = v->h[k].holder, .owner = v->h[k].owner,
						    .step = step };
	struct lkg_input in = { .nodes = v->nodes, .h = h, .nh = n, .live = v->reached };
	if (h && out)
		aug = coord_ec_rebuilt(v->ec, v->job, &in, true);
	for (size_t i = n; aug && i < in.nh; i++)
		out[in.h[i].owner] = true;
	free(aug);
	free(h);
	return out;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? 1 : x > y ? -1 : 0;   /* newest first */
}

/* The view of job's steps from this node: its configuration (job, nodes,
 * rank, *workers: shards per node, one per worker in framework: pytorch)
 * and catalog, then the coordinator's and the other nodes' (query_cluster).
 * 0, or the exit code: 3 the catalog is unreadable, 2 no job. */
static int load_view(const char *ramdir, const char *job, struct view *v, uint32_t *workers)
{
	struct shard_rec *recs = NULL;
	struct idx *x = NULL;
	struct rcfg cfg = { 0 };
	char err[256];
	void *val = NULL;
	size_t len, n = 0;
	int my_rank = 0;

	if (admin_open_catalog(ramdir, &x) < 0)
		return 3;
	if (idx_get_meta(x, "config", &val, &len) == 0) {
		if (rcfg_parse(val, len, NULL, &cfg, err, sizeof(err)) == 0) {
			snprintf(v->job, sizeof(v->job), "%s", cfg.job);
			v->nodes = (uint32_t)cfg.nodes;
			v->dp = cfg.assume_dp > 0 ? (uint32_t)cfg.assume_dp : 0;
			my_rank = cfg.node_rank;
			*workers = rcfg_workers(&cfg);
		}
		free(val);
	}
	rcfg_free(&cfg);
	if (job)
		snprintf(v->job, sizeof(v->job), "%s", job);
	if (!v->job[0]) {
		fprintf(stderr, "mtcfs-admin: no job configured on this node; use --job NAME\n");
		idx_close(x);
		return 2;
	}
	if (v->nodes == 0)
		v->nodes = 1;
	v->reached = calloc(v->nodes, sizeof(bool));
	if (idx_list_shards(x, v->job, &recs, &n) == 0) {
		for (size_t i = 0; i < n; i++) {
			struct holding h = { .step = recs[i].key.step, .owner = recs[i].key.rank,
					     .worker = recs[i].key.worker, .holder = (uint32_t)my_rank,
					     .ok = state_ok(shard_state_name(recs[i].state)) };
			memcpy(h.hash, recs[i].hash, 32);
			h.has_content = eng_content_key(&recs[i], h.content) == 0;
			if (h.owner < v->nodes)
				add_holding(v, &h);
		}
		idx_recs_free(recs, n);
	}
	if ((uint32_t)my_rank < v->nodes)
		v->reached[my_rank] = true;
	query_cluster(v, x, my_rank);
	idx_close(x);
	return 0;
}

/* The steps anyone holds, newest first, each once: *ns of them in a
 * malloc'd array (NULL, *ns 0, without memory). */
static uint64_t *held_steps(const struct view *v, size_t *ns)
{
	uint64_t *steps = malloc((v->nh + 1) * sizeof(*steps));
	size_t n = 0, u = 0;

	for (size_t i = 0; steps && i < v->nh; i++)
		steps[n++] = v->h[i].step;
	if (steps)
		qsort(steps, n, sizeof(*steps), cmp_u64);
	for (size_t i = 0; i < n; i++)
		if (u == 0 || steps[u - 1] != steps[i])
			steps[u++] = steps[i];
	*ns = u;
	return steps;
}

/* The table's title lines and column heads (text output only). */
static void print_steps_header(const struct view *v, uint32_t workers)
{
	char lkg[32] = "unknown";

	if (v->has_lkg)
		snprintf(lkg, sizeof(lkg), "step %llu", (unsigned long long)v->lkg);
	printf("job %s, %u node%s, last complete step (LKG): %s%s\n", v->job, v->nodes,
	       v->nodes == 1 ? "" : "s", lkg,
	       v->coord_ok ? " (coordinator's view)" : " (this node's view only)");
	printf("cells: the ranks holding a verified copy of that node's shard in RAM%s%s\n",
	       workers > 1 ? " (one per worker; *: some worker's shard has no copy)" : "",
	       v->ec ? " (rs: no copy, rebuilt from the erasure code)" : "");
	printf("%-10s", "STEP");
	for (uint32_t r = 0; r < v->nodes; r++) {
		char hd[16];
		snprintf(hd, sizeof(hd), "node%u%s", r, v->reached[r] ? "" : "?");
		printf(" %-10s", hd);
	}
	printf(" STATUS\n");
}

/* The ranks holding a verified copy of node o's shards of step, each once:
 * into hs (JSON) and cell ("0,2", *cl its length). Returns how many of the
 * node's worker shards (the first 64) have a copy. */
static uint32_t node_holders(const struct view *v, uint64_t step, uint32_t o, uint32_t workers,
			     json_t *hs, char *cell, size_t size, size_t *cl)
{
	uint64_t have = 0;   /* workers (< 64 shown) with a verified copy */
	uint32_t nw = 0;

	*cl = 0;
	for (size_t k = 0; k < v->nh; k++) {
		bool seen = false;
		if (v->h[k].step != step || v->h[k].owner != o || !v->h[k].ok ||
		    v->h[k].worker >= workers)
			continue;
		if (v->h[k].worker < 64 && !(have >> v->h[k].worker & 1)) {
			have |= 1ull << v->h[k].worker;
			nw++;
		}
		/* a holder of several of the node's worker shards shows once */
		for (size_t j = 0; j < json_array_size(hs); j++)
			seen |= json_integer_value(json_array_get(hs, j)) ==
				(json_int_t)v->h[k].holder;
		if (seen)
			continue;
		json_array_append_new(hs, json_integer(v->h[k].holder));
		*cl += (size_t)snprintf(cell + *cl, size - *cl, "%s%u", *cl ? "," : "", v->h[k].holder);
		if (*cl >= size)
			*cl = size - 1;
	}
	return nw;
}

/* Node o's cell in step's row, into cells (and printed): its holders; "rs"
 * (o into rebuilt) when the erasure code rebuilds it (rs[o]); "col" when
 * its column's shards cover it under assume-data-parallelism; "-" or a
 * trailing "*" (o into missing) when the planner (cluster/lkg.c:
 * covered) finds no source for a shard of it. Returns whether the node's
 * shards are all there. */
static bool node_cell(const struct view *v, uint64_t step, uint32_t o, uint32_t workers,
		      bool covered, const bool *rs, json_t *cells, json_t *missing,
		      json_t *rebuilt)
{
	json_t *hs = json_array();
	char cell[64] = "", key[16];
	size_t cl;
	bool complete = true;
	uint32_t nw = node_holders(v, step, o, workers, hs, cell, sizeof(cell), &cl);

	(void)nw;
	if (covered) {
		/* every worker's shard has a source: its own copy, or its column's */
		if (json_array_size(hs) == 0)
			snprintf(cell, sizeof(cell), "col");
	} else if (rs && rs[o]) {
		/* no copy, but K members of each of its codewords */
		json_array_append_new(rebuilt, json_integer(o));
		snprintf(cell, sizeof(cell), "rs");
	} else {
		complete = false;
		json_array_append_new(missing, json_integer(o));
		if (json_array_size(hs) == 0)
			snprintf(cell, sizeof(cell), "-");
		else if (cl + 1 < sizeof(cell))
			snprintf(cell + cl, sizeof(cell) - cl, "*");
	}
	snprintf(key, sizeof(key), "%u", o);
	json_object_set_new(cells, key, hs);
	if (!admin_json)
		printf(" %-10s", cell);
	return complete;
}

/* A step's STATUS: "complete" or the nodes missing, under rs:K+M the nodes
 * storing all their parity of it (and the row's "ec" member), "<- LKG". */
static void step_status(const struct view *v, uint64_t step, bool complete, json_t *missing,
			json_t *rebuilt, json_t *row, char *status, size_t size)
{
	json_t *parity = json_array();
	size_t sl = 0;
	char red[32];

	if (!complete) {
		sl = (size_t)snprintf(status, size, "incomplete: no copy of node");
		for (size_t k = 0; k < json_array_size(missing) && sl < size; k++)
			sl += (size_t)snprintf(status + sl, size - sl, "%s %lld", k ? "," : "",
					       (long long)json_integer_value(json_array_get(missing, k)));
	}
	if (coord_ec_red(v->ec, red, sizeof(red))) {
		/* rs:K+M: which nodes store all their parity of the step */
		for (uint32_t r = 0; r < v->nodes; r++)
			if (coord_ec_parity(v->ec, r, step))
				json_array_append_new(parity, json_integer(r));
		sl = strlen(status);
		snprintf(status + sl, size - sl, "  %s parity %zu/%u nodes", red,
			 json_array_size(parity), v->nodes);
		json_object_set_new(row, "ec", json_pack("{s:s,s:O,s:O}", "redundancy", red,
							 "parity", parity, "rebuilt", rebuilt));
	}
	json_decref(parity);
	if (v->has_lkg && step == v->lkg && sl < size)
		snprintf(status + strlen(status), size - strlen(status), "  <- LKG");
}

/* [nodes]: which nodes have every worker's shard of step covered, as the
 * coordinator's planner judges it (lkg_step_covered: a verified copy, or
 * under D the column's when it agrees), or NULL without memory. */
static bool *covered(const struct view *v, uint64_t step, uint32_t workers)
{
	struct lkg_hold *h = calloc(v->nh + 1, sizeof(*h));
	bool *out = calloc(v->nodes, sizeof(bool));
	size_t n = 0;

	for (size_t k = 0; h && k < v->nh; k++) {
		const struct holding *x = &v->h[k];
		if (x->step != step || !x->ok)
			continue;
		h[n] = (struct lkg_hold){ .holder = x->holder, .owner = x->owner,
					  .worker = x->worker, .step = step,
					  .has_content = x->has_content };
		memcpy(h[n].hash, x->hash, 32);
		memcpy(h[n].content, x->content, 32);
		n++;
	}
	struct lkg_input in = { .nodes = v->nodes, .dp = v->dp, .workers = workers, .h = h,
				.nh = n };
	if (!h || !out || lkg_step_covered(&in, step, out) < 0) {
		free(out);
		out = NULL;
	}
	free(h);
	return out;
}

/* One row of the table (printed) and of "steps" (returned). */
static json_t *step_row(const struct view *v, uint64_t step, uint32_t workers)
{
	json_t *row = json_object(), *cells = json_object(), *missing = json_array();
	json_t *rebuilt = json_array();
	char status[256] = "complete";
	bool complete = true;
	bool *rs = ec_rebuilt(v, step), *cov = covered(v, step, workers);

	if (!admin_json)
		printf("%-10llu", (unsigned long long)step);
	for (uint32_t o = 0; o < v->nodes; o++)
		if (!node_cell(v, step, o, workers, cov && cov[o], rs, cells, missing, rebuilt))
			complete = false;
	free(cov);
	step_status(v, step, complete, missing, rebuilt, row, status, sizeof(status));
	json_decref(rebuilt);
	free(rs);
	if (!admin_json)
		printf(" %s\n", status);
	json_object_set_new(row, "step", json_integer((json_int_t)step));
	json_object_set_new(row, "complete", json_boolean(complete));
	json_object_set_new(row, "lkg", json_boolean(v->has_lkg && step == v->lkg));
	json_object_set_new(row, "holders", cells);
	json_object_set_new(row, "missing", missing);
	return row;
}

int admin_cmd_steps(const char *ramdir, const char *job)
{
	struct view v = { 0 };
	uint32_t workers = 1;   /* shards per node: one per worker in framework: pytorch */
	size_t ns = 0;
	uint64_t *steps;
	json_t *root, *arr, *re;
	int rc = load_view(ramdir, job, &v, &workers);

	if (rc)
		return rc;
	steps = held_steps(&v, &ns);
	root = json_object();
	arr = json_array();
	json_object_set_new(root, "job", json_string(v.job));
	json_object_set_new(root, "nodes", json_integer(v.nodes));
	json_object_set_new(root, "lkg", v.has_lkg ? json_integer((json_int_t)v.lkg) : json_null());
	json_object_set_new(root, "coordinator_reachable", json_boolean(v.coord_ok));
	re = json_array();
	for (uint32_t r = 0; r < v.nodes; r++)
		json_array_append_new(re, json_boolean(v.reached[r]));
	json_object_set_new(root, "nodes_reached", re);
	if (!admin_json)
		print_steps_header(&v, workers);
	for (size_t i = 0; i < ns; i++)
		json_array_append_new(arr, step_row(&v, steps[i], workers));
	json_object_set_new(root, "steps", arr);
	if (admin_json) {
		json_dumpf(root, stdout, JSON_INDENT(1));
		putchar('\n');
	} else if (ns == 0) {
		printf("(no steps held)\n");
	}
	json_decref(root);
	free(steps);
	free(v.h);
	free(v.reached);
	coord_ec_free(v.ec);
	return 0;
}

/* ---- verify: re-read every local shard and compare with its manifest ---- */

static bool on_tty;

static void progress(uint64_t done, uint64_t total, uint64_t t0_ns, const char *what)
{
	double secs, rate;
	if (!on_tty || admin_json)
		return;
	secs = (double)(util_now_ns() - t0_ns) / 1e9;
	rate = secs > 0 ? (double)done / secs : 0;
	fprintf(stderr, "\r%-40.40s %6.1f%%  %8.1f MiB/s  ETA %4.0fs ", what,
		total ? 100.0 * (double)done / (double)total : 100.0, rate / 1048576.0,
		rate > 0 ? (double)(total - done) / rate : 0.0);
}

/* Is the daemon that wrote RAMDIR's catalog running? */
static bool daemon_alive(const char *ramdir)
{
	struct idx *x = NULL;
	void *v = NULL;
	size_t len;
	bool alive = false;

	if (admin_open_catalog(ramdir, &x) < 0)
		return false;
	if (idx_get_meta(x, "daemon", &v, &len) == 0) {
		json_t *j = json_loadb(v, len, 0, NULL);
		json_int_t pid = json_integer_value(json_object_get(j, "pid"));
		alive = pid > 0 && kill((pid_t)pid, 0) == 0;
		json_decref(j);
		free(v);
	}
	idx_close(x);
	return alive;
}

/* verify's erasure-code part: every parity fragment (header, payload and
 * trailer CRC32C) and group manifest of the parity holdings (catalog
 * records, SHF_PARITY, in shards/JOB/STEP/parity). */
struct frag_verify {
	json_t *arr;
	size_t n, bad;
	uint64_t bytes;
};

static int verify_stored(void *arg, int stepfd, const struct ec_stored *s)
{
	struct frag_verify *v = arg;
	const char *what = s->kind == ECS_FRAG ? "parity" : "manifest";
	const char *verdict = s->verdict < 0 ? "bad" : "ok";

	(void)stepfd;
	if (s->kind != ECS_FRAG && s->kind != ECS_META)
		return 0;   /* markers, and files being written now */
	v->n++;
	v->bytes += s->bytes;
	if (s->verdict < 0)
		v->bad++;
	if (admin_json) {
		json_t *o = json_pack("{s:s,s:I,s:s,s:s,s:s,s:I}", "job", s->job, "step",
				      (json_int_t)s->step, "file", s->name, "kind", what, "result",
				      verdict, "bytes", (json_int_t)s->bytes);
		if (s->verdict < 0)
			json_object_set_new(o, "error", json_string(s->why));
		json_array_append_new(v->arr, o);
	} else {
		printf("%-4s %-16s step %-8llu %s %s%s%s\n", verdict, s->job,
		       (unsigned long long)s->step, what, s->name, s->verdict < 0 ? ": " : "",
		       s->verdict < 0 ? s->why : "");
	}
	return 0;
}

/* One parity holding r: its directory walked, every file checked whole. */
static void verify_parity(const char *ramdir, const struct shard_rec *r, struct frag_verify *fv)
{
	char rel[512], path[PATH_MAX];
	int fd = -1, rc;

	if (ram_shard_relpath(&r->key, rel, sizeof(rel)) == 0 &&
	    snprintf(path, sizeof(path), "%s/shards/%s", ramdir, rel) < (int)sizeof(path))
		fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "mtcfs-admin: job %s step %llu: parity holding's directory missing\n",
			r->key.job, (unsigned long long)r->key.step);
		fv->bad++;
		return;
	}
	rc = ec_stored_walk_dir(fd, r->key.job, r->key.step, EC_CHECK_ALL, verify_stored, fv);
	if (rc < 0) {
		fprintf(stderr, "mtcfs-admin: reading %s: %s\n", path, strerror(-rc));
		fv->bad++;
	}
	close(fd);
}

int admin_cmd_verify(const char *ramdir, const char *job)
{
	struct shard_rec *recs = NULL;
	struct idx *x = NULL;
	size_t n = 0, bad = 0, sealing = 0, nparity = 0;
	uint64_t total = 0, done = 0, t0 = util_now_ns();
	json_t *arr = json_array();
	struct frag_verify fv = { .arr = json_array() };
	int rc;

	if (admin_open_catalog(ramdir, &x) < 0)
		return 3;
	rc = idx_list_records(x, job, &recs, &n);
	idx_close(x);
	if (rc < 0) {
		fprintf(stderr, "mtcfs-admin: reading catalog: %s\n", strerror(-rc));
		return 3;
	}
	on_tty = isatty(STDERR_FILENO);
	for (size_t i = 0; i < n; i++)
		if (!life_is_parity(&recs[i].key))
			total += recs[i].bytes;
	for (size_t i = 0; i < n; i++) {
		struct shard_rec *r = &recs[i];
		struct manifest *mf = NULL;
		char rel[512], path[PATH_MAX], err[512] = "", what[200], why[300] = "";
		const char *verdict;
		int fd = -1;

		if (life_is_parity(&r->key)) {
			verify_parity(ramdir, r, &fv);   /* a holding, not a shard */
			nparity++;
			continue;
		}
		snprintf(what, sizeof(what), "%s step %llu node %u", r->key.job,
			 (unsigned long long)r->key.step, r->key.rank);
		progress(done, total, t0, what);
		if (r->state == SH_SEALING) {
			/* a seal that never finished (or one running right now):
			 * nothing vouches for these files yet */
			verdict = "sealing";
			snprintf(err, sizeof(err), "the seal has not finished%s",
				 daemon_alive(ramdir) ? " (it may be running now)" : " and mtcfs is not running");
		} else if (r->state == SH_BAD) {
			/* the daemon's verdict stands even if the bytes match now */
			verdict = "bad";
			snprintf(err, sizeof(err), "%s", r->mf ? "marked bad by mtcfs (files did not match the manifest)"
							       : "marked bad by mtcfs: the committed tree could not be sealed (see its log)");
		} else if (!r->mf || mf_decode_err(r->mf, r->mflen, &mf, why, sizeof(why)) < 0) {
			verdict = "bad";
			snprintf(err, sizeof(err), "manifest does not decode: %s", r->mf ? why : "none");
		} else if (ram_shard_relpath(&r->key, rel, sizeof(rel)) < 0 ||
			   snprintf(path, sizeof(path), "%s/shards/%s", ramdir, rel) >= (int)sizeof(path) ||
			   (fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
			verdict = "bad";
			snprintf(err, sizeof(err), "shard directory missing");
		} else if (mf_verify(fd, mf, err, sizeof(err)) < 0) {
			verdict = "bad";
		} else {
			verdict = "ok";
		}
		if (fd >= 0)
			close(fd);
		mf_free(mf);
		done += r->bytes;
		if (!strcmp(verdict, "bad"))
			bad++;
		else if (!strcmp(verdict, "sealing"))
			sealing++;
		if (admin_json) {
			json_t *o = json_pack("{s:s,s:I,s:i,s:b,s:s,s:I}", "job", r->key.job,
					      "step", (json_int_t)r->key.step, "rank", (int)r->key.rank,
					      "own", (r->flags & SHF_OWN) != 0, "result", verdict,
					      "bytes", (json_int_t)r->bytes);
			if (err[0])
				json_object_set_new(o, "error", json_string(err));
			json_array_append_new(arr, o);
		} else {
			if (on_tty)
				fprintf(stderr, "\r%-80s\r", "");
			printf("%-4s %-16s step %-8llu node %-4u %s%s%s\n", verdict, r->key.job,
			       (unsigned long long)r->key.step, r->key.rank,
			       (r->flags & SHF_OWN) ? "own" : "replica", err[0] ? ": " : "", err);
		}
	}
	if (admin_json) {
		json_t *root = json_pack("{s:o,s:I,s:I,s:I,s:o,s:I}", "shards", arr, "bad",
					 (json_int_t)(bad + fv.bad), "sealing", (json_int_t)sealing,
					 "bytes", (json_int_t)total, "fragments", fv.arr,
					 "fragments_bad", (json_int_t)fv.bad);
		json_dumpf(root, stdout, JSON_INDENT(1));
		putchar('\n');
		json_decref(root);
	} else {
		json_decref(arr);
		json_decref(fv.arr);
		printf("%zu shard%s, %zu bad, %zu not sealed, %.1f MiB checked in %.2f s\n",
		       n - nparity, n - nparity == 1 ? "" : "s", bad, sealing, (double)total / 1048576.0,
		       (double)(util_now_ns() - t0) / 1e9);
		if (fv.n)
			printf("%zu erasure-code file%s (parity fragments and manifests), %zu bad, %.1f MiB\n",
			       fv.n, fv.n == 1 ? "" : "s", fv.bad, (double)fv.bytes / 1048576.0);
	}
	idx_recs_free(recs, n);
	/* a shard stuck sealing is as unusable as a bad one: a check fails */
	return bad || sealing || fv.bad ? 1 : 0;
}

/* ---- status ---- */

json_t *admin_meta_json(struct idx *x, const char *name)
{
	void *v = NULL;
	size_t len;
	json_t *j = NULL;
	if (idx_get_meta(x, name, &v, &len) == 0) {
		j = json_loadb(v, len, 0, NULL);
		free(v);
	}
	return j;
}

char *admin_meta_str(struct idx *x, const char *name)
{
	void *v = NULL;
	size_t len;
	if (idx_get_meta(x, name, &v, &len) < 0)
		return NULL;
	return v;   /* NUL-terminated by idx_get_meta */
}


/* "2026-12-01 13:15:02 UTC (4 min ago)" for Unix seconds t. */
static void human_time(int64_t t, int64_t now, char *out, size_t len)
{
	time_t tt = (time_t)t;
	struct tm tm;
	char ago[48];
	int64_t d = now - t;

	if (!gmtime_r(&tt, &tm)) {
		snprintf(out, len, "%lld", (long long)t);
		return;
	}
	if (d < 0)
		snprintf(ago, sizeof(ago), "in the future");
	else if (d < 120)
		snprintf(ago, sizeof(ago), "%lld s ago", (long long)d);
	else if (d < 2 * 3600)
		snprintf(ago, sizeof(ago), "%lld min ago", (long long)(d / 60));
	else if (d < 2 * 86400)
		snprintf(ago, sizeof(ago), "%lld h ago", (long long)(d / 3600));
	else
		snprintf(ago, sizeof(ago), "%lld days ago", (long long)(d / 86400));
	snprintf(out, len, "%04d-%02d-%02d %02d:%02d:%02d UTC (%s)", tm.tm_year + 1900, tm.tm_mon + 1,
		 tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ago);
}

/* status for people: sizes in binary units, times as UTC dates with their
 * age, peers as "rank up/down"; --json keeps the raw numbers. */
static void status_print_human(json_t *root, int64_t now)
{
	static const char *const sizes[] = { "ram_size", "ram_used" };
	static const char *const times[] = { "started", "last_commit_time" };
	const char *k;
	json_t *v;

	json_object_foreach(root, k, v) {
		char buf[128], *t = NULL;
		bool done = false;

		for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]) && !done; i++)
			if (!strcmp(k, sizes[i]) && json_is_integer(v)) {
				admin_human_bytes((uint64_t)json_integer_value(v), buf, sizeof(buf));
				done = true;
			}
		for (size_t i = 0; i < sizeof(times) / sizeof(times[0]) && !done; i++)
			if (!strcmp(k, times[i]) && json_is_integer(v)) {
				human_time((int64_t)json_integer_value(v), now, buf, sizeof(buf));
				done = true;
			}
		if (!done && !strcmp(k, "peers") && json_is_array(v)) {
			size_t i, l = 0;
			json_t *p;
			buf[0] = '\0';
			json_array_foreach(v, i, p)
				if (l < sizeof(buf))
					l += (size_t)snprintf(buf + l, sizeof(buf) - l, "%s%lld %s", i ? ", " : "",
						(long long)json_integer_value(json_object_get(p, "rank")),
						json_is_true(json_object_get(p, "connected")) ? "up" : "down");
			if (!json_array_size(v))
				snprintf(buf, sizeof(buf), "none");
			done = true;
		}
		if (!done && json_is_null(v)) {
			snprintf(buf, sizeof(buf), "-");
			done = true;
		}
		if (!done && json_is_boolean(v)) {
			snprintf(buf, sizeof(buf), "%s", json_is_true(v) ? "yes" : "no");
			done = true;
		}
		if (!done)
			t = json_is_string(v) ? strdup(json_string_value(v))
					      : json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
		printf("%-24s %s\n", k, done ? buf : t ? t : "");
		free(t);
	}
}

static int status_once(const char *ramdir)
{
	struct idx *x = NULL;
	struct rcfg cfg = { 0 };
	struct shard_rec *recs = NULL;
	json_t *root = json_object(), *daemon, *peer;
	char *phase, *config, err[256];
	size_t n = 0;
	bool alive = false, have_cfg = false;
	uint64_t newest_commit = 0, newest_repl = 0, commit_time = 0;
	bool any_commit = false, any_repl = false;

	if (admin_open_catalog(ramdir, &x) < 0) {
		json_decref(root);
		return 3;
	}
	daemon = admin_meta_json(x, "daemon");
	peer = admin_meta_json(x, "peer");
	phase = admin_meta_str(x, "phase");
	config = admin_meta_str(x, "config");
	if (config && rcfg_parse(config, strlen(config), NULL, &cfg, err, sizeof(err)) == 0)
		have_cfg = true;
	if (daemon) {
		json_int_t pid = json_integer_value(json_object_get(daemon, "pid"));
		alive = pid > 0 && kill((pid_t)pid, 0) == 0;
	}
	json_object_set_new(root, "ramdir", json_string(ramdir));
	json_object_set_new(root, "daemon_running", json_boolean(alive));
	if (daemon && json_object_get(daemon, "started"))
		json_object_set(root, "started", json_object_get(daemon, "started"));
	json_object_set_new(root, "phase", json_string(alive ? (phase ? phase : "waiting-for-config") : "stopped"));
	if (have_cfg) {
		json_object_set_new(root, "job", json_string(cfg.job));
		json_object_set_new(root, "rank", json_integer(cfg.node_rank));
		json_object_set_new(root, "nodes", json_integer(cfg.nodes));
	}
	if (daemon) {
		const char *mp = json_string_value(json_object_get(daemon, "mountpoint"));
		struct statvfs sv;
		json_object_set(root, "mountpoint", json_object_get(daemon, "mountpoint"));
		json_object_set(root, "ram_size", json_object_get(daemon, "ram_size"));
		if (alive && mp && statvfs(mp, &sv) == 0)
			json_object_set_new(root, "ram_used",
					    json_integer((json_int_t)((sv.f_blocks - sv.f_bfree) * sv.f_frsize)));
	}
	if (have_cfg && idx_list_shards(x, cfg.job, &recs, &n) == 0) {
		for (size_t i = 0; i < n; i++) {
			if (!(recs[i].flags & SHF_OWN) || recs[i].state < SH_COMMITTED || recs[i].state == SH_BAD)
				continue;
			if (!any_commit || recs[i].key.step >= newest_commit) {
				newest_commit = recs[i].key.step;
				commit_time = recs[i].commit_time;
				any_commit = true;
			}
			if (recs[i].state >= SH_REPLICATED && (!any_repl || recs[i].key.step > newest_repl)) {
				newest_repl = recs[i].key.step;
				any_repl = true;
			}
		}
		idx_recs_free(recs, n);
	}
	json_object_set_new(root, "last_commit_step", any_commit ? json_integer((json_int_t)newest_commit) : json_null());
	json_object_set_new(root, "last_commit_time", any_commit ? json_integer((json_int_t)commit_time) : json_null());
	json_object_set_new(root, "last_replicated_step", any_repl ? json_integer((json_int_t)newest_repl) : json_null());
	json_object_set_new(root, "replication_lag_steps",
			    any_commit && have_cfg && cfg.nodes > 1
				    ? json_integer(any_repl ? (json_int_t)(newest_commit - newest_repl) : 1)
				    : json_null());
	if (peer) {
		struct net_auth auth = { 0 };
		const char *coord = json_string_value(json_object_get(peer, "coordinator"));
		struct nconn *c = NULL;
		json_t *req, *resp = NULL, *peers = json_array();
		json_object_set(root, "listen", json_object_get(peer, "listen"));
		json_object_set(root, "coordinator", json_object_get(peer, "coordinator"));
		if (peer_auth(peer, &auth) == 0 && coord &&
		    nconn_connect(coord, AUTH_RANK_TOOL, "control", &auth, 2000, &c, NULL) == 0) {
			req = proto_status_encode(&(struct proto_status){ .job = have_cfg ? cfg.job : "" });
			if (nconn_call(c, req, &resp, 3000) == 0) {
				json_t *nodes = json_object_get(resp, "nodes"), *nd;
				size_t i;
				json_object_set_new(root, "coordinator_reachable", json_true());
				json_object_set(root, "lkg", json_object_get(resp, "lkg"));
				/* GC keeps every step from this one (older versions: absent) */
				if (json_object_get(resp, "replicated_lkg"))
					json_object_set(root, "replicated_lkg",
							json_object_get(resp, "replicated_lkg"));
				json_array_foreach(nodes, i, nd)
					json_array_append_new(peers, json_pack("{s:O,s:O}", "rank",
						json_object_get(nd, "rank"), "connected", json_object_get(nd, "connected")));
			}
			json_decref(req);
			json_decref(resp);
			nconn_close(c);
		} else {
			json_object_set_new(root, "coordinator_reachable", json_false());
		}
		json_object_set_new(root, "peers", peers);
		peer_auth_clear(&auth);
	}
	if (admin_json) {
		json_dumpf(root, stdout, JSON_INDENT(1));
		putchar('\n');
	} else {
		status_print_human(root, (int64_t)time(NULL));
	}
	json_decref(root);
	json_decref(daemon);
	json_decref(peer);
	free(phase);
	free(config);
	rcfg_free(&cfg);
	idx_close(x);
	return alive ? 0 : 1;
}

int admin_cmd_status(const char *ramdir, bool watch)
{
	int rc;
	if (!watch)
		return status_once(ramdir);
	for (;;) {
		if (isatty(STDOUT_FILENO))
			printf("\033[H\033[2J");
		rc = status_once(ramdir);
		fflush(stdout);
		if (rc == 3)
			return rc;
		sleep(1);
	}
}
