/* mtcfs-admin: the operator's view of a node and of a job's bucket. Node
 * commands read RAMDIR's catalog read-only (safe while the daemon runs) and
 * ask the running daemons; bucket commands (backups, restore-version, prune)
 * go through tiers/backup over the bucket URL. Single-threaded except for
 * prune --delete's delete workers. Exit codes: 0 ok, 1 a check failed or the
 * request was refused, 2 usage, 3 cannot read the node's state or the bucket. */
#include "common/log.h"
#include "common/util.h"
#include "tiers/catalog.h"
#include "tiers/manifest.h"
#include "tiers/backup.h"
#include "tiers/bucket.h"
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

static bool want_json;

static int open_catalog(const char *ramdir, struct idx **x)
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

static int cmd_ls(const char *ramdir, const char *job)
{
	struct shard_rec *recs = NULL;
	struct idx *x = NULL;
	size_t n = 0;
	int rc;

	if (open_catalog(ramdir, &x) < 0)
		return 3;
	rc = idx_list_shards(x, job, &recs, &n);
	if (rc < 0) {
		fprintf(stderr, "mtcfs-admin: reading catalog: %s\n", strerror(-rc));
		idx_close(x);
		return 3;
	}
	if (want_json) {
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

struct holding { uint64_t step; uint32_t owner, worker, holder; bool ok; };

struct view {
	char job[RCFG_JOB_MAX + 1];
	uint32_t nodes;
	bool has_lkg, coord_ok;
	uint64_t lkg;
	bool *reached;            /* [nodes] */
	struct holding *h;
	size_t nh, cap;
};

static void add_holding(struct view *v, uint64_t step, uint32_t owner, uint32_t worker,
			uint32_t holder, bool ok)
{
	if (v->nh == v->cap) {
		size_t nc = v->cap ? v->cap * 2 : 64;
		struct holding *nh = realloc(v->h, nc * sizeof(*nh));
		if (!nh)
			return;
		v->h = nh;
		v->cap = nc;
	}
	v->h[v->nh++] = (struct holding){ step, owner, worker, holder, ok };
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
		if (!json_is_string(a) || (int)r == my_rank)
			continue;
		if (nconn_connect(json_string_value(a), AUTH_RANK_TOOL, "data", &auth, 2000, &d, NULL) < 0)
			continue;
		lr = proto_list_encode(v->job);
		if (nconn_call(d, lr, &lresp, 5000) == 0) {
			v->reached[r] = true;
			json_array_foreach(json_object_get(lresp, "shards"), i, sh) {
				const char *st = json_string_value(json_object_get(sh, "state"));
				add_holding(v, (uint64_t)json_integer_value(json_object_get(sh, "step")),
					    (uint32_t)json_integer_value(json_object_get(sh, "owner")),
					    (uint32_t)json_integer_value(json_object_get(sh, "worker")), r,
					    st && state_ok(st));
			}
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

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? 1 : x > y ? -1 : 0;   /* newest first */
}

static int cmd_steps(const char *ramdir, const char *job)
{
	struct view v = { 0 };
	struct shard_rec *recs = NULL;
	struct idx *x = NULL;
	struct rcfg cfg = { 0 };
	char err[256];
	void *val = NULL;
	size_t len, n = 0, ns = 0;
	uint64_t *steps = NULL;
	int my_rank = 0, rc = 0;
	uint32_t workers = 1;   /* shards per node: one per worker in framework: pytorch */

	if (open_catalog(ramdir, &x) < 0)
		return 3;
	if (idx_get_meta(x, "config", &val, &len) == 0) {
		if (rcfg_parse(val, len, NULL, &cfg, err, sizeof(err)) == 0) {
			snprintf(v.job, sizeof(v.job), "%s", cfg.job);
			v.nodes = (uint32_t)cfg.nodes;
			my_rank = cfg.node_rank;
			if (cfg.framework == RCFG_FW_PYTORCH && cfg.workers_per_node > 1)
				workers = (uint32_t)cfg.workers_per_node;
		}
		free(val);
	}
	if (job)
		snprintf(v.job, sizeof(v.job), "%s", job);
	if (!v.job[0]) {
		fprintf(stderr, "mtcfs-admin: no job configured on this node; use --job NAME\n");
		idx_close(x);
		return 2;
	}
	if (v.nodes == 0)
		v.nodes = 1;
	v.reached = calloc(v.nodes, sizeof(bool));
	if (idx_list_shards(x, v.job, &recs, &n) == 0) {
		for (size_t i = 0; i < n; i++)
			if (recs[i].key.rank < v.nodes)
				add_holding(&v, recs[i].key.step, recs[i].key.rank, recs[i].key.worker,
					    (uint32_t)my_rank, state_ok(shard_state_name(recs[i].state)));
		idx_recs_free(recs, n);
	}
	if ((uint32_t)my_rank < v.nodes)
		v.reached[my_rank] = true;
	query_cluster(&v, x, my_rank);
	idx_close(x);

	steps = malloc((v.nh + 1) * sizeof(*steps));
	for (size_t i = 0; steps && i < v.nh; i++)
		steps[ns++] = v.h[i].step;
	if (steps)
		qsort(steps, ns, sizeof(*steps), cmp_u64);
	{
		size_t u = 0;
		for (size_t i = 0; i < ns; i++)
			if (u == 0 || steps[u - 1] != steps[i])
				steps[u++] = steps[i];
		ns = u;
	}
	json_t *root = json_object(), *arr = json_array();
	json_object_set_new(root, "job", json_string(v.job));
	json_object_set_new(root, "nodes", json_integer(v.nodes));
	json_object_set_new(root, "lkg", v.has_lkg ? json_integer((json_int_t)v.lkg) : json_null());
	json_object_set_new(root, "coordinator_reachable", json_boolean(v.coord_ok));
	{
		json_t *re = json_array();
		for (uint32_t r = 0; r < v.nodes; r++)
			json_array_append_new(re, json_boolean(v.reached[r]));
		json_object_set_new(root, "nodes_reached", re);
	}
	if (!want_json) {
		char lkg[32] = "unknown";
		if (v.has_lkg)
			snprintf(lkg, sizeof(lkg), "step %llu", (unsigned long long)v.lkg);
		printf("job %s, %u node%s, last complete step (LKG): %s%s\n", v.job, v.nodes,
		       v.nodes == 1 ? "" : "s", lkg,
		       v.coord_ok ? " (coordinator's view)" : " (this node's view only)");
		printf("cells: the ranks holding a verified copy of that node's shard in RAM%s\n",
		       workers > 1 ? " (one per worker; *: some worker's shard has no copy)" : "");
		printf("%-10s", "STEP");
		for (uint32_t r = 0; r < v.nodes; r++) {
			char hd[16];
			snprintf(hd, sizeof(hd), "node%u%s", r, v.reached[r] ? "" : "?");
			printf(" %-10s", hd);
		}
		printf(" STATUS\n");
	}
	for (size_t i = 0; i < ns; i++) {
		json_t *row = json_object(), *cells = json_object(), *missing = json_array();
		char status[256] = "complete";
		size_t sl = 0;
		bool complete = true;
		if (!want_json)
			printf("%-10llu", (unsigned long long)steps[i]);
		for (uint32_t o = 0; o < v.nodes; o++) {
			json_t *hs = json_array();
			char cell[64] = "";
			size_t cl = 0;
			uint64_t have = 0;   /* workers (< 64 shown) with a verified copy */
			uint32_t nw = 0;
			for (size_t k = 0; k < v.nh; k++) {
				bool seen = false;
				if (v.h[k].step != steps[i] || v.h[k].owner != o || !v.h[k].ok ||
				    v.h[k].worker >= workers)
					continue;
				if (v.h[k].worker < 64 && !(have >> v.h[k].worker & 1)) {
					have |= 1ull << v.h[k].worker;
					nw++;
				}
				/* a holder of several of the node's worker shards shows once */
				for (size_t j = 0; j < json_array_size(hs); j++)
					seen |= json_integer_value(json_array_get(hs, j)) ==
						(json_int_t)v.h[k].holder;
				if (seen)
					continue;
				json_array_append_new(hs, json_integer(v.h[k].holder));
				cl += (size_t)snprintf(cell + cl, sizeof(cell) - cl, "%s%u",
						       cl ? "," : "", v.h[k].holder);
				if (cl >= sizeof(cell))
					cl = sizeof(cell) - 1;
			}
			/* complete: a copy of each of the node's shards (every worker's) */
			if (nw < (workers < 64 ? workers : 64)) {
				complete = false;
				json_array_append_new(missing, json_integer(o));
				if (json_array_size(hs) == 0)
					snprintf(cell, sizeof(cell), "-");
				else if (cl + 1 < sizeof(cell))
					snprintf(cell + cl, sizeof(cell) - cl, "*");
			}
			char key[16];
			snprintf(key, sizeof(key), "%u", o);
			json_object_set_new(cells, key, hs);
			if (!want_json)
				printf(" %-10s", cell);
		}
		if (!complete) {
			sl = (size_t)snprintf(status, sizeof(status), "incomplete: no copy of node");
			for (size_t k = 0; k < json_array_size(missing) && sl < sizeof(status); k++)
				sl += (size_t)snprintf(status + sl, sizeof(status) - sl, "%s %lld",
						       k ? "," : "",
						       (long long)json_integer_value(json_array_get(missing, k)));
		}
		if (v.has_lkg && steps[i] == v.lkg && sl < sizeof(status))
			snprintf(status + strlen(status), sizeof(status) - strlen(status), "  <- LKG");
		if (!want_json)
			printf(" %s\n", status);
		json_object_set_new(row, "step", json_integer((json_int_t)steps[i]));
		json_object_set_new(row, "complete", json_boolean(complete));
		json_object_set_new(row, "lkg", json_boolean(v.has_lkg && steps[i] == v.lkg));
		json_object_set_new(row, "holders", cells);
		json_object_set_new(row, "missing", missing);
		json_array_append_new(arr, row);
	}
	json_object_set_new(root, "steps", arr);
	if (want_json) {
		json_dumpf(root, stdout, JSON_INDENT(1));
		putchar('\n');
	} else if (ns == 0) {
		printf("(no steps held)\n");
	}
	json_decref(root);
	free(steps);
	free(v.h);
	free(v.reached);
	rcfg_free(&cfg);
	return rc;
}

/* ---- verify: re-read every local shard and compare with its manifest ---- */

static bool on_tty;

static void progress(uint64_t done, uint64_t total, uint64_t t0_ns, const char *what)
{
	double secs, rate;
	if (!on_tty || want_json)
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

	if (open_catalog(ramdir, &x) < 0)
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

static int cmd_verify(const char *ramdir, const char *job)
{
	struct shard_rec *recs = NULL;
	struct idx *x = NULL;
	size_t n = 0, bad = 0, sealing = 0;
	uint64_t total = 0, done = 0, t0 = util_now_ns();
	json_t *arr = json_array();
	int rc;

	if (open_catalog(ramdir, &x) < 0)
		return 3;
	rc = idx_list_shards(x, job, &recs, &n);
	idx_close(x);
	if (rc < 0) {
		fprintf(stderr, "mtcfs-admin: reading catalog: %s\n", strerror(-rc));
		return 3;
	}
	on_tty = isatty(STDERR_FILENO);
	for (size_t i = 0; i < n; i++)
		total += recs[i].bytes;
	for (size_t i = 0; i < n; i++) {
		struct shard_rec *r = &recs[i];
		struct manifest *mf = NULL;
		char rel[512], path[PATH_MAX], err[512] = "", what[200], why[300] = "";
		const char *verdict;
		int fd = -1;

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
		if (want_json) {
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
	if (want_json) {
		json_t *root = json_pack("{s:o,s:I,s:I,s:I}", "shards", arr, "bad", (json_int_t)bad,
					 "sealing", (json_int_t)sealing, "bytes", (json_int_t)total);
		json_dumpf(root, stdout, JSON_INDENT(1));
		putchar('\n');
		json_decref(root);
	} else {
		json_decref(arr);
		printf("%zu shard%s, %zu bad, %zu not sealed, %.1f MiB checked in %.2f s\n", n,
		       n == 1 ? "" : "s", bad, sealing, (double)total / 1048576.0,
		       (double)(util_now_ns() - t0) / 1e9);
	}
	idx_recs_free(recs, n);
	/* a shard stuck sealing is as unusable as a bad one: a check fails */
	return bad || sealing ? 1 : 0;
}

/* ---- status ---- */

static json_t *meta_json(struct idx *x, const char *name)
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

static char *meta_str(struct idx *x, const char *name)
{
	void *v = NULL;
	size_t len;
	if (idx_get_meta(x, name, &v, &len) < 0)
		return NULL;
	return v;   /* NUL-terminated by idx_get_meta */
}

static void human_bytes(uint64_t v, char *out, size_t len);

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
				human_bytes((uint64_t)json_integer_value(v), buf, sizeof(buf));
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

	if (open_catalog(ramdir, &x) < 0) {
		json_decref(root);
		return 3;
	}
	daemon = meta_json(x, "daemon");
	peer = meta_json(x, "peer");
	phase = meta_str(x, "phase");
	config = meta_str(x, "config");
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
	if (want_json) {
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

static int cmd_status(const char *ramdir, bool watch)
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

/* ---- bucket commands: backups, restore-version, prune ---- */

#define NODES_MAX (1u << 20)        /* --nodes bound: the completeness check walks nodes x workers */
#define DEL_THREADS 8               /* concurrent deletes of one backup's manifests and data */

struct opts {
	const char *job, *bucket, *gcs_endpoint, *key_file;
	const char *ramdir;             /* --ramdir: bucket and job from its configuration */
	bool watch, force, del, prefer_recent;
	bool nodes_set;
	uint32_t nodes;
	bool keep_set[PRUNE_NKINDS];
	unsigned keep[PRUNE_NKINDS];
	bool incomplete_set;            /* --incomplete-older-than given */
	uint64_t incomplete_older_s;    /* its value in seconds */
	const char *incomplete_arg;     /* as given, for the plan's words */
	const char *args[8];
	int nargs;
};

static void human_bytes(uint64_t v, char *out, size_t len)
{
	static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
	double d = (double)v;
	int u = 0;

	while (d >= 1024 && u < 5) {
		d /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(out, len, "%llu B", (unsigned long long)v);
	else
		snprintf(out, len, "%.1f %s", d, units[u]);
}

static void print_json(json_t *root)
{
	json_dumpf(root, stdout, JSON_INDENT(1));
	putchar('\n');
	json_decref(root);
}

/* A bucket URL as given on the command line: 0, 2 (usage) or 3 (cannot read). */
static int open_bucket(const struct opts *o, struct bkt **b)
{
	struct bkt_opts bo = { .gcs_endpoint = o->gcs_endpoint, .gcs_key_file = o->key_file };
	struct stat st;
	int rc;

	if (strncmp(o->bucket, "gs://", 5) && strncmp(o->bucket, "file://", 7)) {
		fprintf(stderr, "mtcfs-admin: --bucket %s: not gs://BUCKET[/PREFIX] or file:///PATH\n",
			o->bucket);
		return 2;
	}
	/* bkt_open creates a missing file:// directory: an admin reading a bucket must not */
	if (!strncmp(o->bucket, "file://", 7) && o->bucket[7] == '/') {
		if (stat(o->bucket + 7, &st) < 0) {
			fprintf(stderr, "mtcfs-admin: cannot read bucket %s: %s\n", o->bucket, strerror(errno));
			return 3;
		}
		if (!S_ISDIR(st.st_mode)) {
			fprintf(stderr, "mtcfs-admin: cannot read bucket %s: not a directory\n", o->bucket);
			return 3;
		}
	}
	rc = bkt_open(o->bucket, &bo, b);
	if (rc < 0) {
		fprintf(stderr, "mtcfs-admin: cannot open bucket %s: %s\n", o->bucket,
			bkt_last_error()[0] ? bkt_last_error() : strerror(-rc));
		return 3;
	}
	return 0;
}

/* What the bucket holds for a job, judged the way a restore judges it. */
struct bview {
	struct bkt *b;
	struct bk_backup *v;
	size_t n;
	uint32_t nodes;             /* the node count completeness is judged for */
	bool nodes_given;
	uint32_t *own;              /* [n] nodes each backup's .meta names show */
	bool *ambiguous;            /* [n] complete for its own count, short of nodes */
	struct prune_item *items;   /* [n] for tiers/prune */
	int rv_rc;                  /* restore.version: 0, -ENOENT (absent), -EBADMSG (invalid) */
	char rv[BK_NAME_MAX];
	long rv_idx;                /* restore.version's backup in v[], or -1 */
	long pick;                  /* the backup a restore from the bucket would use, or -1 */
	char pick_note[640];        /* the pick, or why there is none, in words */
};

static void bview_free(struct bview *w)
{
	bk_backups_free(w->v, w->n);
	free(w->own);
	free(w->ambiguous);
	free(w->items);
	bkt_close(w->b);
	memset(w, 0, sizeof(*w));
}

static int bucket_fail(const struct bview *w, const char *what, int rc)
{
	fprintf(stderr, "mtcfs-admin: cannot read bucket %s (%s): %s\n", bkt_url(w->b), what,
		bkt_last_error()[0] ? bkt_last_error() : strerror(-rc));
	return 3;
}

/* Nodes [from, to) have no .meta in v: add their entries, as bk_check_backup
 * does for a gap when it is told the node count. */
static int add_missing_nodes(struct bk_backup *v, uint32_t from, uint32_t to)
{
	struct bk_shard *ns;

	if (from >= to)
		return 0;
	ns = realloc(v->shards, (v->nshards + (to - from)) * sizeof(*ns));
	if (!ns)
		return -ENOMEM;
	v->shards = ns;
	for (uint32_t nd = from; nd < to; nd++) {
		struct bk_shard *s = &v->shards[v->nshards++];
		memset(s, 0, sizeof(*s));
		s->node = nd;
		snprintf(s->why, sizeof(s->why), "no .meta");
	}
	return 0;
}

/* Load every backup of o->job with restore.version and the restore pick.
 * Without --nodes, a backup is judged for the most nodes any backup of the
 * job shows: one that is complete only for fewer (an upload in progress, a
 * node whose .meta never came, or a job that shrank) is incomplete and
 * `ambiguous` (prune never deletes it). 0, or an exit code. */
static int load_view(const struct opts *o, struct bview *w)
{
	int rc;

	memset(w, 0, sizeof(*w));
	w->rv_idx = w->pick = -1;
	rc = open_bucket(o, &w->b);
	if (rc)
		return rc;
	w->nodes_given = o->nodes_set;
	/* workers 0: as many as the .meta names show (framework: pytorch
	 * backups hold one shard per worker) */
	rc = bk_list_backups(w->b, o->job, o->nodes_set ? o->nodes : 0, 0, &w->v, &w->n);
	if (rc < 0)
		return bucket_fail(w, "listing the backups", rc);
	w->own = calloc(w->n ? w->n : 1, sizeof(*w->own));
	w->ambiguous = calloc(w->n ? w->n : 1, sizeof(*w->ambiguous));
	w->items = calloc(w->n ? w->n : 1, sizeof(*w->items));
	if (!w->own || !w->ambiguous || !w->items)
		return bucket_fail(w, "memory", -ENOMEM);
	w->nodes = o->nodes_set ? o->nodes : 0;
	for (size_t i = 0; i < w->n; i++) {
		for (size_t k = 0; k < w->v[i].nshards; k++)
			if (w->v[i].shards[k].node + 1 > w->own[i])
				w->own[i] = w->v[i].shards[k].node + 1;
		if (!o->nodes_set && w->own[i] > w->nodes)
			w->nodes = w->own[i];
	}
	for (size_t i = 0; !o->nodes_set && i < w->n; i++) {
		struct bk_backup *v = &w->v[i];
		if (w->own[i] == 0 || w->own[i] >= w->nodes)
			continue;
		if (v->complete) {
			char which[48];
			v->complete = false;
			w->ambiguous[i] = true;
			if (w->nodes - w->own[i] > 1)
				snprintf(which, sizeof(which), "nodes %u..%u", w->own[i], w->nodes - 1);
			else
				snprintf(which, sizeof(which), "node %u", w->own[i]);
			snprintf(v->why, sizeof(v->why), "no .meta for %s: its .meta names show %u node%s, "
				 "other backups %u (complete if the job has %u; --nodes decides)", which,
				 w->own[i], w->own[i] == 1 ? "" : "s", w->nodes, w->own[i]);
		}
		if (add_missing_nodes(v, w->own[i], w->nodes) < 0)
			return bucket_fail(w, "memory", -ENOMEM);
	}
	for (size_t i = 0; i < w->n; i++)
		w->items[i] = (struct prune_item){ .name = w->v[i].name, .complete = w->v[i].complete,
						   .hold = w->ambiguous[i],
						   .hold_why = "complete only for fewer nodes (--nodes decides)" };

	w->rv_rc = bk_get_restore_version(w->b, o->job, w->rv);
	if (w->rv_rc < 0 && w->rv_rc != -ENOENT && w->rv_rc != -EBADMSG)
		return bucket_fail(w, "reading restore.version", w->rv_rc);
	for (size_t i = 0; w->rv_rc == 0 && i < w->n; i++)
		if (!strcmp(w->v[i].name, w->rv))
			w->rv_idx = (long)i;
	w->pick = prune_restore_pick(w->items, w->n, w->rv_rc == 0 ? w->rv : NULL, w->rv_rc == -EBADMSG);
	if (w->pick >= 0 && w->rv_rc == 0)
		snprintf(w->pick_note, sizeof(w->pick_note), "restore.version names %s (complete, step %llu): "
			 "a restore from the bucket would use it", w->rv,
			 (unsigned long long)w->v[w->pick].step);
	else if (w->pick >= 0)
		snprintf(w->pick_note, sizeof(w->pick_note), "a restore from the bucket would use %s "
			 "(step %llu), the newest complete backup", w->v[w->pick].name,
			 (unsigned long long)w->v[w->pick].step);
	else if (w->rv_rc == -EBADMSG)
		snprintf(w->pick_note, sizeof(w->pick_note),
			 "restore.version does not name a backup: nothing would be restored");
	else if (w->rv_rc == 0 && w->rv_idx >= 0)
		snprintf(w->pick_note, sizeof(w->pick_note),
			 "restore.version names %s (incomplete): nothing would be restored", w->rv);
	else if (w->rv_rc == 0)
		snprintf(w->pick_note, sizeof(w->pick_note),
			 "restore.version names %s (no such backup): nothing would be restored", w->rv);
	else
		snprintf(w->pick_note, sizeof(w->pick_note), "no complete backup: nothing would be restored");
	return 0;
}

static const char *nodes_note(const struct bview *w)
{
	static char s[160];

	if (w->nodes_given)
		snprintf(s, sizeof(s), "judged for %u node%s (--nodes)", w->nodes, w->nodes == 1 ? "" : "s");
	else
		snprintf(s, sizeof(s), "judged for %u node%s (the most any backup's .meta names show; "
			 "--nodes N sets the job's count)", w->nodes, w->nodes == 1 ? "" : "s");
	return s;
}

/* Nodes of v whose every shard is complete. */
static uint32_t nodes_ok(const struct bk_backup *v, uint32_t nodes)
{
	uint32_t ok = 0;

	for (uint32_t nd = 0; nd < nodes; nd++) {
		bool any = false, good = true;
		for (size_t k = 0; k < v->nshards; k++) {
			if (v->shards[k].node != nd)
				continue;
			any = true;
			good &= v->shards[k].complete;
		}
		ok += any && good;
	}
	return ok;
}

static json_t *backup_json(const struct bview *w, size_t i)
{
	const struct bk_backup *v = &w->v[i];
	json_t *o = json_object(), *sh = json_array();
	char hex[65];

	json_object_set_new(o, "name", json_string(v->name));
	json_object_set_new(o, "step", json_integer((json_int_t)v->step));
	json_object_set_new(o, "bytes", json_integer((json_int_t)v->bytes));
	json_object_set_new(o, "complete", json_boolean(v->complete));
	json_object_set_new(o, "why", v->complete ? json_null() : json_string(v->why));
	json_object_set_new(o, "nodes_seen", json_integer(v->nodes_seen));
	json_object_set_new(o, "nodes_complete", json_integer(nodes_ok(v, w->nodes)));
	json_object_set_new(o, "complete_for_fewer_nodes", w->ambiguous[i] ? json_integer(w->own[i]) : json_null());
	json_object_set_new(o, "restore", json_boolean((long)i == w->pick));
	json_object_set_new(o, "restore_version", json_boolean((long)i == w->rv_idx));
	for (size_t k = 0; k < v->nshards; k++) {
		const struct bk_shard *s = &v->shards[k];
		bool has_hash = false;
		for (int j = 0; j < 32; j++)
			has_hash |= s->hash[j] != 0;
		mf_hash_hex(s->hash, hex);
		json_array_append_new(sh, json_pack("{s:i,s:i,s:I,s:o,s:b,s:o}", "node", (int)s->node,
			"worker", (int)s->worker, "step", (json_int_t)s->step,
			"hash", has_hash ? json_string(hex) : json_null(), "complete", s->complete,
			"why", s->complete ? json_null() : json_string(s->why)));
	}
	json_object_set_new(o, "shards", sh);
	return o;
}

static void json_bucket_head(json_t *root, const struct opts *o, const struct bview *w)
{
	json_object_set_new(root, "bucket", json_string(bkt_url(w->b)));
	json_object_set_new(root, "job", json_string(o->job));
	json_object_set_new(root, "nodes", json_integer(w->nodes));
	json_object_set_new(root, "nodes_given", json_boolean(w->nodes_given));
	json_object_set_new(root, "restore_version",
			    w->rv_rc == 0 ? json_string(w->rv) : json_null());
	json_object_set_new(root, "restore_version_invalid", json_boolean(w->rv_rc == -EBADMSG));
	json_object_set_new(root, "restore", w->pick >= 0 ? json_pack("{s:s,s:I}", "name",
			    w->v[w->pick].name, "step", (json_int_t)w->v[w->pick].step) : json_null());
	json_object_set_new(root, "restore_note", json_string(w->pick_note));
}

static void rv_line(const struct bview *w)
{
	if (w->rv_rc == -ENOENT)
		printf("restore.version: none\n");
	else if (w->rv_rc == -EBADMSG)
		printf("restore.version: invalid (does not name a backup)\n");
	else if (w->rv_idx < 0)
		printf("restore.version: %s (no such backup)\n", w->rv);
	else if (w->v[w->rv_idx].complete)
		printf("restore.version: %s (complete)\n", w->rv);
	else
		printf("restore.version: %s (incomplete: %s)\n", w->rv, w->v[w->rv_idx].why);
}

static int cmd_backups(const struct opts *o)
{
	struct bview w;
	int rc = load_view(o, &w);

	if (rc) {
		bview_free(&w);
		return rc;
	}
	if (want_json) {
		json_t *root = json_object(), *arr = json_array();
		json_bucket_head(root, o, &w);
		for (size_t i = 0; i < w.n; i++)
			json_array_append_new(arr, backup_json(&w, i));
		json_object_set_new(root, "backups", arr);
		print_json(root);
		bview_free(&w);
		return 0;
	}
	printf("bucket %s, job %s: %zu backup%s, %s\n", bkt_url(w.b), o->job, w.n, w.n == 1 ? "" : "s",
	       nodes_note(&w));
	rv_line(&w);
	if (w.n)
		printf("%-24s %10s %9s %12s  %s\n", "BACKUP", "STEP", "NODES OK", "DATA", "STATUS");
	for (size_t i = 0; i < w.n; i++) {
		const struct bk_backup *v = &w.v[i];
		char sz[32], nd[32];
		size_t shown = 0, bad = 0;

		human_bytes(v->bytes, sz, sizeof(sz));
		snprintf(nd, sizeof(nd), "%u/%u", nodes_ok(v, w.nodes), w.nodes);
		printf("%-24s %10llu %9s %12s  %s%s%s\n", v->name, (unsigned long long)v->step, nd, sz,
		       v->complete ? "complete" : "incomplete", (long)i == w.pick ? "  <- restore" : "",
		       (long)i == w.rv_idx ? "  (restore.version)" : "");
		if (v->complete)
			continue;
		/* why, per node: the first reason (unless it is the first shard's),
		 * then each shard in trouble */
		for (size_t k = 0; k < v->nshards; k++) {
			const struct bk_shard *s = &v->shards[k];
			char line[200];
			if (s->complete)
				continue;
			snprintf(line, sizeof(line), "node %u worker %u: %s", s->node, s->worker, s->why);
			if (bad == 0 && strcmp(line, v->why))
				printf("    %s\n", v->why);
			if (bad++ >= 8)
				continue;
			printf("    %s\n", line);
			shown++;
		}
		if (bad == 0)
			printf("    %s\n", v->why);
		if (bad > shown)
			printf("      ... and %zu more\n", bad - shown);
	}
	if (w.n == 0)
		printf("(no backups)\n");
	printf("%s\n", w.pick_note);
	bview_free(&w);
	return 0;
}

static int cmd_restore_version(const struct opts *o)
{
	const char *sub = o->args[1];
	struct bview w;
	int rc;

	if (!strcmp(sub, "clear")) {
		char old[BK_NAME_MAX] = "";
		int had;
		memset(&w, 0, sizeof(w));
		if ((rc = open_bucket(o, &w.b)) != 0)
			return rc;
		had = bk_get_restore_version(w.b, o->job, old);
		if (had < 0 && had != -ENOENT && had != -EBADMSG) {
			rc = bucket_fail(&w, "reading restore.version", had);
		} else if ((rc = bk_clear_restore_version(w.b, o->job)) < 0) {
			rc = bucket_fail(&w, "deleting restore.version", rc);
		} else if (want_json) {
			print_json(json_pack("{s:s,s:s,s:o,s:b}", "bucket", bkt_url(w.b), "job", o->job,
					     "previous", had == 0 ? json_string(old) : json_null(),
					     "cleared", had != -ENOENT));
		} else if (had == -ENOENT) {
			printf("restore.version was not set\n");
		} else {
			printf("restore.version cleared (was %s)\n", had == 0 ? old : "invalid");
		}
		bview_free(&w);
		return rc;
	}
	if (!strcmp(sub, "set") && !bk_backup_name_ok(o->args[2])) {
		fprintf(stderr, "mtcfs-admin: restore-version set: \"%s\" cannot be a backup name\n", o->args[2]);
		return 2;
	}
	if ((rc = load_view(o, &w)) != 0) {
		bview_free(&w);
		return rc;
	}
	if (!strcmp(sub, "show")) {
		const struct bk_backup *v = w.rv_idx >= 0 ? &w.v[w.rv_idx] : NULL;
		if (want_json) {
			json_t *root = json_object();
			json_bucket_head(root, o, &w);
			json_object_set_new(root, "exists", json_boolean(v != NULL));
			json_object_set_new(root, "complete", json_boolean(v && v->complete));
			json_object_set_new(root, "step", v ? json_integer((json_int_t)v->step) : json_null());
			json_object_set_new(root, "why", v && !v->complete ? json_string(v->why) : json_null());
			print_json(root);
		} else if (w.rv_rc == -ENOENT) {
			printf("none\n%s\n", w.pick_note);
		} else if (w.rv_rc == -EBADMSG) {
			printf("invalid\nrestore.version does not name a backup: nothing would be restored "
			       "(`restore-version clear` removes it)\n");
		} else if (!v) {
			printf("%s\nno such backup: %s\n", w.rv, w.pick_note);
		} else if (v->complete) {
			printf("%s\ncomplete (step %llu): a restore from the bucket would use it\n", w.rv,
			       (unsigned long long)v->step);
		} else {
			printf("%s\nincomplete: %s\n%s\n", w.rv, v->why, w.pick_note);
		}
		rc = w.rv_rc == -EBADMSG ? 1 : 0;
		bview_free(&w);
		return rc;
	}
	/* set NAME */
	{
		const char *name = o->args[2];
		const struct bk_backup *v = NULL;
		char why[700] = "";
		for (size_t i = 0; i < w.n; i++)
			if (!strcmp(w.v[i].name, name))
				v = &w.v[i];
		if (!v)
			snprintf(why, sizeof(why), "job %s has no backup %s in %s", o->job, name, bkt_url(w.b));
		else if (!v->complete)
			snprintf(why, sizeof(why), "backup %s is incomplete: %s", name, v->why);
		if (why[0] && !o->force) {
			fprintf(stderr, "mtcfs-admin: restore-version set refused: %s (a restore would find "
				"nothing to restore; --force sets it anyway)\n", why);
			if (want_json)
				print_json(json_pack("{s:s,s:s,s:b,s:s}", "bucket", bkt_url(w.b), "job", o->job,
						     "refused", 1, "reason", why));
			bview_free(&w);
			return 1;
		}
		rc = bk_set_restore_version(w.b, o->job, name);
		if (rc < 0) {
			rc = bucket_fail(&w, "writing restore.version", rc);
			bview_free(&w);
			return rc;
		}
		if (want_json) {
			print_json(json_pack("{s:s,s:s,s:s,s:o,s:b,s:b,s:o}", "bucket", bkt_url(w.b),
					     "job", o->job, "restore_version", name, "previous",
					     w.rv_rc == 0 ? json_string(w.rv) : json_null(),
					     "complete", v && v->complete, "forced", why[0] != 0,
					     "why", why[0] ? json_string(why) : json_null()));
		} else {
			printf("restore.version = %s (was %s)%s%s\n", name,
			       w.rv_rc == 0 ? w.rv : w.rv_rc == -EBADMSG ? "invalid" : "none",
			       why[0] ? "; forced: " : "", why);
		}
		bview_free(&w);
		return 0;
	}
}

/* ---- prune --delete: every object of a backup, the .meta files first ---- */

struct dobj {
	char *name;
	uint64_t size;
	int phase;                  /* 0 .meta, 1 .manifest, 2 data and the rest */
	uint64_t node, worker;      /* .meta: the order within phase 0 */
};

struct dlist {
	struct dobj *v;
	size_t n, cap;
	const char *job;
	size_t skip;                /* "JOB/NAME/" */
};

static int dlist_add(void *arg, const struct bkt_entry *e)
{
	struct dlist *d = arg;
	const char *rel = e->name + d->skip;
	struct dobj *o;
	size_t rl = strlen(rel);

	if (e->is_prefix || strlen(e->name) < d->skip)
		return 0;
	if (d->n == d->cap) {
		size_t nc = d->cap ? d->cap * 2 : 64;
		struct dobj *nv = realloc(d->v, nc * sizeof(*nv));
		if (!nv)
			return -ENOMEM;
		d->v = nv;
		d->cap = nc;
	}
	o = &d->v[d->n];
	memset(o, 0, sizeof(*o));
	o->name = strdup(e->name);
	if (!o->name)
		return -ENOMEM;
	o->size = e->size;
	o->phase = 2;
	o->node = o->worker = UINT64_MAX;
	if (!strchr(rel, '/') && rl > 5 && !strcmp(rel + rl - 5, ".meta")) {
		/* "<job>-s<step>-n<node>-w<w>.meta": node 0 first, so what is left of a
		 * half-deleted backup never looks complete, even judged by its own names */
		const char *n = strrchr(rel, 'n'), *w = strrchr(rel, 'w');
		char *end;
		o->phase = 0;
		if (n && w && n > rel && n[-1] == '-' && w > n) {
			unsigned long long nv = strtoull(n + 1, &end, 10), wv;
			if (*end == '-' && end + 1 == w) {
				wv = strtoull(w + 1, &end, 10);
				if (!strcmp(end, ".meta")) {
					o->node = nv;
					o->worker = wv;
				}
			}
		}
	} else if (!strchr(rel, '/') && rl > 9 && !strcmp(rel + rl - 9, ".manifest")) {
		o->phase = 1;
	}
	d->n++;
	return 0;
}

static int dobj_cmp(const void *pa, const void *pb)
{
	const struct dobj *a = pa, *b = pb;

	if (a->phase != b->phase)
		return a->phase - b->phase;
	if (a->node != b->node)
		return a->node < b->node ? -1 : 1;
	if (a->worker != b->worker)
		return a->worker < b->worker ? -1 : 1;
	return strcmp(a->name, b->name);
}

static void dlist_free(struct dlist *d)
{
	for (size_t i = 0; i < d->n; i++)
		free(d->v[i].name);
	free(d->v);
	memset(d, 0, sizeof(*d));
}

struct delrun {
	struct bkt *b;
	const struct dobj *v;
	size_t from, to;            /* this phase's objects */
	atomic_size_t next;
	atomic_size_t done;         /* over the whole prune */
	atomic_uint_fast64_t bytes;
	pthread_mutex_t mu;
	int rc;                     /* first failure; protected by mu */
	char err[768];              /* protected by mu */
};

static void *del_worker(void *arg)
{
	struct delrun *r = arg;

	for (;;) {
		size_t i = atomic_fetch_add(&r->next, 1);
		int rc;

		if (i >= r->to)
			break;
		pthread_mutex_lock(&r->mu);
		rc = r->rc;
		pthread_mutex_unlock(&r->mu);
		if (rc)
			break;              /* stop at the first failure */
		rc = bkt_delete(r->b, r->v[i].name);
		if (rc == -ENOENT)
			rc = 0;             /* gone already */
		if (rc < 0) {
			pthread_mutex_lock(&r->mu);
			if (!r->rc) {
				r->rc = rc;
				snprintf(r->err, sizeof(r->err), "%s: %s", r->v[i].name,
					 bkt_last_error()[0] ? bkt_last_error() : strerror(-rc));
			}
			pthread_mutex_unlock(&r->mu);
			break;
		}
		atomic_fetch_add(&r->done, 1);
		atomic_fetch_add(&r->bytes, r->v[i].size);
	}
	return NULL;
}

static void del_progress(struct delrun *r, const char *name, size_t total, uint64_t total_bytes,
			 uint64_t t0)
{
	size_t done = atomic_load(&r->done);
	uint64_t bytes = atomic_load(&r->bytes);
	double secs = (double)(util_now_ns() - t0) / 1e9, rate = secs > 0 ? (double)done / secs : 0;
	char b1[32], b2[32];

	human_bytes(bytes, b1, sizeof(b1));
	human_bytes(total_bytes, b2, sizeof(b2));
	fprintf(stderr, "\r%-24.24s %zu/%zu objects  %s/%s  %.0f obj/s  ETA %4.0fs ", name, done, total,
		b1, b2, rate, rate > 0 ? (double)(total - done) / rate : 0.0);
}

/* Delete objects [from, to) of v with up to threads at once, showing progress. */
static int del_phase(struct delrun *r, size_t from, size_t to, int threads, bool tty,
		     const char *name, size_t total, uint64_t total_bytes, uint64_t t0)
{
	pthread_t th[DEL_THREADS];
	int nt = 0;

	if (from >= to)
		return r->rc;
	r->from = from;
	r->to = to;
	atomic_store(&r->next, from);
	if (threads > DEL_THREADS)
		threads = DEL_THREADS;
	if ((size_t)threads > to - from)
		threads = (int)(to - from);
	for (int i = 1; i < threads; i++)
		if (pthread_create(&th[nt], NULL, del_worker, r) == 0)
			nt++;
	if (!tty) {
		del_worker(r);
	} else {
		/* a helper thread deletes too; this one draws the progress line */
		pthread_t self_th;
		bool started = pthread_create(&self_th, NULL, del_worker, r) == 0;
		if (!started)
			del_worker(r);
		/* until the helper is done: it stops when the objects run out or
		 * at the first failure, like every worker */
		while (started && pthread_tryjoin_np(self_th, NULL) == EBUSY) {
			struct timespec ts = { 0, 200 * 1000 * 1000 };
			del_progress(r, name, total, total_bytes, t0);
			nanosleep(&ts, NULL);
		}
	}
	for (int i = 0; i < nt; i++)
		pthread_join(th[i], NULL);
	if (tty)
		del_progress(r, name, total, total_bytes, t0);
	return r->rc;
}

/* ---- prune ---- */

static void policy_words(const struct opts *o, char *out, size_t len)
{
	size_t l = 0;

	out[0] = '\0';
	for (int k = 0; k < PRUNE_NKINDS; k++)
		if (o->keep[k] && l < len)
			l += (size_t)snprintf(out + l, len - l, "%skeep-%s %u", l ? ", " : "",
					      prune_kind_name((enum prune_kind)k), o->keep[k]);
	if (!l)
		l += (size_t)snprintf(out, len, "every complete backup");
	else if (l < len)
		l += (size_t)snprintf(out + l, len - l, "; a period keeps its %s backup%s",
				      o->prefer_recent ? "newest" : "oldest",
				      o->prefer_recent ? " (--prefer-recent)" : "");
	if (o->incomplete_set && l < len)
		snprintf(out + l, len - l, "; incomplete backups that started more than %s ago go, "
			 "but the newest", o->incomplete_arg);
}

static json_t *reasons_json(const struct prune_item *it)
{
	json_t *a = json_array();
	char buf[64];
	static const struct { unsigned bit; const char *word; } prot[] = {
		{ PRUNE_RESTORE_PICK, "restore-pick" }, { PRUNE_RESTORE_VERSION, "restore-version" },
		{ PRUNE_NEWEST_COMPLETE, "newest-complete" }, { PRUNE_IN_PROGRESS, "in-progress" },
		{ PRUNE_UNDATED, "not-a-timestamp" }, { PRUNE_HELD, "complete-for-fewer-nodes" },
	};

	if (it->flags & (1u << PRUNE_LAST)) {
		snprintf(buf, sizeof(buf), "last #%u", it->last_rank);
		json_array_append_new(a, json_string(buf));
	}
	for (int k = PRUNE_HOURLY; k < PRUNE_NKINDS; k++) {
		if (!(it->flags & (1u << k)))
			continue;
		snprintf(buf, sizeof(buf), "%s %s", prune_kind_name((enum prune_kind)k), it->label[k]);
		json_array_append_new(a, json_string(buf));
	}
	for (size_t i = 0; i < sizeof(prot) / sizeof(prot[0]); i++)
		if (it->flags & prot[i].bit)
			json_array_append_new(a, json_string(prot[i].word));
	return a;
}

static int cmd_prune(const struct opts *o)
{
	struct prune_policy pol = { .prefer_recent = o->prefer_recent };
	struct prune_result res;
	struct bview w;
	struct delrun *r = NULL;
	struct dlist *dl = NULL;
	json_t *root = NULL, *arr = NULL, *deleted = NULL;
	char policy[256], why[1024];
	size_t nplan = 0, total = 0, ndel = 0;
	uint64_t total_bytes = 0, t0;
	bool any = false, tty = isatty(STDERR_FILENO) && !want_json;
	int rc;

	for (int k = 0; k < PRUNE_NKINDS; k++) {
		pol.keep[k] = o->keep[k];
		any |= o->keep[k] > 0;
	}
	if (!any && !o->incomplete_set) {
		fprintf(stderr, "mtcfs-admin prune: no --keep-* option above 0: the policy would keep nothing "
			"(refusing; see mtcfs-admin prune --help)\n");
		return 2;
	}
	/* --incomplete-older-than alone removes failed attempts only: every
	 * complete backup stays */
	if (!any)
		pol.keep[PRUNE_LAST] = UINT_MAX;
	if (o->incomplete_set) {
		time_t now = time(NULL);
		pol.incomplete_before = (int64_t)now - (int64_t)o->incomplete_older_s;
		if (pol.incomplete_before < 1)
			pol.incomplete_before = 1;
	}
	if ((rc = load_view(o, &w)) != 0) {
		bview_free(&w);
		return rc;
	}
	if (prune_plan(&pol, w.rv_rc == 0 ? w.rv : NULL, w.rv_rc == -EBADMSG, w.items, w.n, &res) < 0) {
		rc = bucket_fail(&w, "memory", -ENOMEM);
		goto out;
	}
	policy_words(o, policy, sizeof(policy));
	root = json_object();
	arr = json_array();
	json_bucket_head(root, o, &w);
	json_object_set_new(root, "policy", json_pack("{s:i,s:i,s:i,s:i,s:i,s:i,s:b}",
		"keep_last", (int)o->keep[PRUNE_LAST], "keep_hourly", (int)o->keep[PRUNE_HOURLY],
		"keep_daily", (int)o->keep[PRUNE_DAILY], "keep_weekly", (int)o->keep[PRUNE_WEEKLY],
		"keep_monthly", (int)o->keep[PRUNE_MONTHLY], "keep_yearly", (int)o->keep[PRUNE_YEARLY],
		"prefer_recent", o->prefer_recent));
	json_object_set_new(json_object_get(root, "policy"), "incomplete_older_than_s",
			    o->incomplete_set ? json_integer((json_int_t)o->incomplete_older_s) : json_null());
	json_object_set_new(root, "dry_run", json_boolean(!o->del));
	if (!want_json) {
		printf("bucket %s, job %s: %zu backup%s, %s\n", bkt_url(w.b), o->job, w.n, w.n == 1 ? "" : "s",
		       nodes_note(&w));
		printf("policy: %s\n", policy);
		rv_line(&w);
		printf("%s\n", w.pick_note);
		if (w.n)
			printf("%-6s %-24s %10s %-11s %12s  %s\n", "ACTION", "BACKUP", "STEP", "COMPLETE", "DATA",
			       "REASON");
	}
	for (size_t i = 0; i < w.n; i++) {
		const struct prune_item *it = &w.items[i];
		const struct bk_backup *v = &w.v[i];
		char sz[32];

		snprintf(why, sizeof(why), "%s", it->why);
		if (!it->keep && !v->complete) {
			size_t l = strlen(why);
			snprintf(why + l, sizeof(why) - l, " (%s)", v->why);
		}
		if (!it->keep) {
			nplan++;
			total_bytes += v->bytes;
		}
		json_array_append_new(arr, json_pack("{s:s,s:I,s:b,s:I,s:s,s:o,s:s}", "name", v->name,
			"step", (json_int_t)v->step, "complete", v->complete, "bytes", (json_int_t)v->bytes,
			"action", it->keep ? "keep" : "delete", "reasons", reasons_json(it), "why", why));
		if (!want_json) {
			human_bytes(v->bytes, sz, sizeof(sz));
			printf("%-6s %-24s %10llu %-11s %12s  %s\n", it->keep ? "keep" : "delete", v->name,
			       (unsigned long long)v->step, v->complete ? "yes" : w.ambiguous[i] ? "fewer-nodes" : "no",
			       sz, why);
		}
	}
	json_object_set_new(root, "backups", arr);
	json_object_set_new(root, "keep", json_integer((json_int_t)res.kept));
	json_object_set_new(root, "delete", json_integer((json_int_t)res.pruned));
	if (!o->del) {
		if (!want_json) {
			char sz[32];
			human_bytes(total_bytes, sz, sizeof(sz));
			printf("dry run: would delete %zu of %zu backup%s (%s of data), keep %zu; --delete deletes them\n",
			       nplan, w.n, w.n == 1 ? "" : "s", sz, res.kept);
		}
		rc = 0;
		goto out;
	}

	/* --delete. restore.version may have changed since the plan: read it again */
	{
		char rv2[BK_NAME_MAX] = "";
		int rc2 = bk_get_restore_version(w.b, o->job, rv2);
		if (rc2 < 0 && rc2 != -ENOENT && rc2 != -EBADMSG) {
			rc = bucket_fail(&w, "reading restore.version", rc2);
			goto out;
		}
		for (size_t i = 0; rc2 == 0 && i < w.n; i++) {
			if (!w.items[i].keep && !strcmp(w.v[i].name, rv2)) {
				fprintf(stderr, "mtcfs-admin prune: restore.version changed to %s, which this plan "
					"deletes; nothing deleted, run prune again\n", rv2);
				rc = 1;
				goto out;
			}
		}
	}
	dl = calloc(w.n ? w.n : 1, sizeof(*dl));
	r = calloc(1, sizeof(*r));
	if (!dl || !r) {
		rc = bucket_fail(&w, "memory", -ENOMEM);
		goto out;
	}
	pthread_mutex_init(&r->mu, NULL);
	r->b = w.b;
	total_bytes = 0;
	for (size_t i = 0; i < w.n; i++) {
		char prefix[PATH_MAX];
		if (w.items[i].keep)
			continue;
		snprintf(prefix, sizeof(prefix), "%s/%s/", o->job, w.v[i].name);
		dl[i].skip = strlen(prefix);
		dl[i].job = o->job;
		rc = bkt_list_ex(w.b, prefix, NULL, dlist_add, &dl[i]);
		if (rc < 0) {
			rc = bucket_fail(&w, "listing a backup to delete", rc);
			goto out;
		}
		if (dl[i].n)
			qsort(dl[i].v, dl[i].n, sizeof(*dl[i].v), dobj_cmp);
		total += dl[i].n;
		for (size_t k = 0; k < dl[i].n; k++)
			total_bytes += dl[i].v[k].size;
	}
	deleted = json_array();
	t0 = util_now_ns();
	/* oldest first: an interrupted prune leaves the newer ones */
	for (size_t i = w.n; i-- > 0;) {
		size_t m = 0, f = 0, done0 = atomic_load(&r->done);
		uint64_t bytes0 = atomic_load(&r->bytes);
		struct dlist *d = &dl[i];

		if (w.items[i].keep)
			continue;
		while (m < d->n && d->v[m].phase == 0)
			m++;
		f = m;
		while (f < d->n && d->v[f].phase == 1)
			f++;
		r->v = d->v;
		/* the .meta files first, one at a time, node 0 first; then the
		 * manifests; then the data: never a complete-looking half backup */
		if (del_phase(r, 0, m, 1, tty, w.v[i].name, total, total_bytes, t0) == 0 &&
		    del_phase(r, m, f, DEL_THREADS, tty, w.v[i].name, total, total_bytes, t0) == 0)
			del_phase(r, f, d->n, DEL_THREADS, tty, w.v[i].name, total, total_bytes, t0);
		if (tty)
			fprintf(stderr, "\r%-100s\r", "");
		if (r->rc) {
			fprintf(stderr, "mtcfs-admin prune: deleting backup %s failed: %s (its .meta files go "
				"first: what is left is incomplete and the next prune deletes it)\n",
				w.v[i].name, r->err);
			rc = 3;
			break;
		}
		ndel++;
		json_array_append_new(deleted, json_pack("{s:s,s:I,s:I}", "name", w.v[i].name, "objects",
			(json_int_t)(atomic_load(&r->done) - done0), "bytes",
			(json_int_t)(atomic_load(&r->bytes) - bytes0)));
		if (!want_json)
			printf("deleted %s: %zu objects, %llu bytes\n", w.v[i].name, atomic_load(&r->done) - done0,
			       (unsigned long long)(atomic_load(&r->bytes) - bytes0));
	}
	{
		double secs = (double)(util_now_ns() - t0) / 1e9;
		char sz[32];
		human_bytes(atomic_load(&r->bytes), sz, sizeof(sz));
		json_object_set_new(root, "deleted", json_pack("{s:o,s:I,s:I,s:f,s:b}", "backups", deleted,
			"objects", (json_int_t)atomic_load(&r->done), "bytes", (json_int_t)atomic_load(&r->bytes),
			"seconds", secs, "ok", r->rc == 0));
		deleted = NULL;
		if (!want_json)
			printf("deleted %zu of %zu backup%s: %zu objects, %s in %.2f s\n", ndel, nplan,
			       nplan == 1 ? "" : "s", atomic_load(&r->done), sz, secs);
	}
	if (!r->rc)
		rc = 0;
out:
	if (root && want_json && (rc == 0 || r))
		print_json(root);   /* a failed delete still reports what it did */
	else
		json_decref(root);
	json_decref(deleted);
	for (size_t i = 0; dl && i < w.n; i++)
		dlist_free(&dl[i]);
	free(dl);
	if (r)
		pthread_mutex_destroy(&r->mu);
	free(r);
	bview_free(&w);
	return rc;
}

/* ---- the command table, options, help ---- */

enum {
	O_JSON = 1u << 0, O_JOB = 1u << 1, O_WATCH = 1u << 2, O_BUCKET = 1u << 3,
	O_NODES = 1u << 4, O_FORCE = 1u << 5, O_DELETE = 1u << 6, O_KEEP = 1u << 7,
};

#define BUCKET_OPTS \
	"  --bucket URL          gs://BUCKET[/PREFIX] or file:///PATH (the mount's bucket=)\n" \
	"  --job NAME            the job (the replicator.yaml's job-name)\n" \
	"  --gcs-endpoint URL    Cloud Storage endpoint (else STORAGE_EMULATOR_HOST, else Google's)\n" \
	"  --key-file PATH       service-account JSON key (else GOOGLE_APPLICATION_CREDENTIALS, else\n" \
	"                        the metadata server; none with STORAGE_EMULATOR_HOST)\n" \
	"  --ramdir RAMDIR       a node's RAM tier: --bucket, --gcs-endpoint and --key-file\n" \
	"                        default to the daemon's bucket=, gcs_endpoint=, gcs_key_file=\n" \
	"                        (recorded in RAMDIR's catalog at mount), --job to the job-name\n" \
	"                        of the last replicator.yaml the node accepted\n" \
	"  --json                one JSON document on stdout\n"

#define NODES_OPT \
	"  --nodes N             judge completeness for N nodes (the job's node count); default:\n" \
	"                        the most nodes any backup's .meta names show (a backup complete\n" \
	"                        only for fewer nodes is shown incomplete, and prune keeps it)\n"

#define EXIT_CODES \
	"exit: 0 ok, 1 a check failed or the request was refused, 2 usage, 3 cannot read the\n" \
	"      node or the bucket\n"

struct command {
	const char *name;
	unsigned opts;
	int nargs_min, nargs_max;   /* positional arguments after the command */
	const char *synopsis;
	const char *help;
};

static const struct command commands[] = {
	{ "ls", O_JSON | O_JOB | O_WATCH, 1, 1, "ls RAMDIR [--job NAME] [--json]",
	  "The shards in the node's catalog (readable while the daemon runs) with state, content\n"
	  "hash, and every file's size and CRC32C.\n" EXIT_CODES },
	{ "steps", O_JSON | O_JOB | O_WATCH, 1, 1, "steps RAMDIR [--job NAME] [--json]",
	  "The step x node matrix: for each step and each node's shard, the ranks holding a verified\n"
	  "copy in RAM, whether the step is complete (which nodes' shards are missing when not), and\n"
	  "the LKG. Asks the coordinator and every node (found via RAMDIR's catalog); when they\n"
	  "cannot be reached it says so and shows this node's view.\n" EXIT_CODES },
	{ "status", O_JSON | O_JOB | O_WATCH, 1, 1, "status RAMDIR [--watch] [--json]",
	  "Phase, job, rank, peers and their reachability, RAM use, last commit, replication lag.\n"
	  "--watch redraws every second (clearing the screen on a terminal only).\n"
	  "exit: 0 the daemon runs, 1 it does not, 2 usage, 3 cannot read the node\n" },
	{ "verify", O_JSON | O_JOB | O_WATCH, 1, 1, "verify RAMDIR [--job NAME] [--json]",
	  "Re-read every local shard and check each file's CRC32C against its manifest. Progress\n"
	  "(MiB/s, ETA) on stderr when it is a terminal.\n"
	  "A shard marked bad by mtcfs, or whose seal never finished, fails the check too.\n"
	  "exit: 0 all good, 1 a shard is bad or not sealed, 2 usage, 3 cannot read the node\n" },
	{ "backups", O_JSON | O_JOB | O_BUCKET | O_NODES, 0, 0,
	  "backups {--bucket URL --job NAME | --ramdir RAMDIR} [--nodes N] [--json]",
	  "The job's backups in the bucket, newest first: step, data bytes, how many nodes' shards\n"
	  "are complete, and for an incomplete backup why, per node (a missing .meta, manifest or\n"
	  "data file, a size or CRC32C mismatch, mixed steps). Says which backup a restore from the\n"
	  "bucket would use: the one restore.version names if it is complete (if it is incomplete\n"
	  "or missing, nothing is restored: no fallback), else the newest complete backup. (The\n"
	  "daemon restores from the bucket when restore.version is set or when no step is complete\n"
	  "in the cluster's RAM.)\n\n" BUCKET_OPTS NODES_OPT
	  "exit: 0 the bucket was read (whatever it holds; JSON \"restore\" is null when nothing\n"
	  "      would be restored), 2 usage, 3 cannot read the bucket\n" },
	{ "restore-version", O_JSON | O_JOB | O_BUCKET | O_NODES | O_FORCE, 1, 2,
	  "restore-version set NAME | clear | show {--bucket URL --job NAME | --ramdir RAMDIR} [--force] [--json]",
	  "JOB/restore.version names the backup the next restore must use (no fallback). The daemon\n"
	  "deletes it after the first commit that follows a restore from it.\n"
	  "  show        first line: the name, or \"none\"; then whether that backup is complete and\n"
	  "              what a restore would do (exit 0; 1 when the file names no valid backup)\n"
	  "  set NAME    refuses (exit 1, with the reason) a backup that does not exist or is\n"
	  "              incomplete, unless --force\n"
	  "  clear       delete it (exit 0 also when it was not set)\n\n" BUCKET_OPTS NODES_OPT
	  "  --force               set even a missing or incomplete backup\n" EXIT_CODES },
	{ "prune", O_JSON | O_JOB | O_BUCKET | O_NODES | O_DELETE | O_KEEP, 0, 0,
	  "prune {--bucket URL --job NAME | --ramdir RAMDIR} [--keep-last N] [--keep-hourly N] [--keep-daily N]\n"
	  "         [--keep-weekly N] [--keep-monthly N] [--keep-yearly N] [--prefer-recent]\n"
	  "         [--incomplete-older-than AGE] [--delete] [--json]",
	  "Retention policy for the job's backups (like restic/borg forget). Backup names are UTC\n"
	  "timestamps YYYY-MM-DD_HH-MM[-N]. Only complete backups count for the policy; a backup is\n"
	  "kept when any rule keeps it:\n"
	  "  --keep-last N     the N newest complete backups\n"
	  "  --keep-hourly N   one backup for each of the N newest UTC hours that have one\n"
	  "  --keep-daily N    ... UTC days ...\n"
	  "  --keep-weekly N   ... ISO 8601 weeks, Monday..Sunday (2027-01-01 is in 2026-W53) ...\n"
	  "  --keep-monthly N  ... UTC months ...\n"
	  "  --keep-yearly N   ... UTC years ...\n"
	  "                    (periods without a complete backup do not count)\n"
	  "  --prefer-recent   a period's NEWEST backup represents it (restic's and borg's rule);\n"
	  "                    by default its OLDEST does (the first backup of a period stays its\n"
	  "                    representative as newer ones arrive)\n"
	  "Never deleted, whatever the policy: the backup a restore would use, the one\n"
	  "restore.version names, the newest complete backup, incomplete backups newer than it\n"
	  "(they may still be uploading), backups complete only for fewer nodes than --nodes\n"
	  "defaults to, names that are not timestamps. Everything else is deleted: complete backups\n"
	  "no rule keeps and incomplete backups older than the newest complete one.\n"
	  "  --incomplete-older-than AGE\n"
	  "                    failed attempts stop accumulating: incomplete backups that started\n"
	  "                    (their name's minute) more than AGE ago (90s, 30m, 2h, 7d) are deleted\n"
	  "                    even when newer than the newest complete one; never the newest of\n"
	  "                    them (it may be uploading now), never a complete backup. Alone, it\n"
	  "                    keeps every complete backup\n"
	  "Dry run by default: prints each backup with keep/delete and the reasons.\n"
	  "  --delete          delete the pruned backups, oldest first: every object under\n"
	  "                    JOB/NAME/, the .meta files first (node 0 first), then the manifests,\n"
	  "                    then the data, so a half-deleted backup is never complete-looking;\n"
	  "                    progress (objects, bytes, rate, ETA) on stderr when it is a terminal\n"
	  "At least one --keep-* above 0 (or --incomplete-older-than) is required.\n\n"
	  BUCKET_OPTS NODES_OPT
	  "exit: 0 planned (dry run) or deleted, 1 refused (restore.version changed meanwhile),\n"
	  "      2 usage, 3 cannot read the bucket or a delete failed\n" },
};

static const struct command *find_command(const char *name)
{
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (!strcmp(commands[i].name, name))
			return &commands[i];
	return NULL;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: mtcfs-admin COMMAND [ARGS] [--json]     (mtcfs-admin COMMAND --help: details;\n"
		"       mtcfs-admin --version)\n\n"
		"node commands (RAMDIR: the node's RAM tier directory; its catalog is read read-only):\n"
		"  ls RAMDIR [--job NAME]   shards in the node's catalog with their files, sizes, CRC32C\n"
		"  steps RAMDIR [--job NAME] step x node matrix: which nodes hold each node's shard, the LKG\n"
		"  status RAMDIR [--watch]  phase, job, rank, peers and their reachability, RAM use, last commit, replication lag\n"
		"  verify RAMDIR [--job NAME] re-check the CRC32C of every local shard; exit 1 on any mismatch\n\n"
		"bucket commands (--bucket gs://BUCKET[/PREFIX] | file:///PATH --job NAME; also\n"
		"--gcs-endpoint URL, --key-file PATH; STORAGE_EMULATOR_HOST is honoured; or\n"
		"--ramdir RAMDIR: the bucket options that node was mounted with and its job):\n"
		"  backups [--nodes N]      the job's backups: step, size, completeness per node (why not),\n"
		"                           and which one a restore would use\n"
		"  restore-version set NAME [--force] | clear | show\n"
		"                           the backup the next restore must use\n"
		"  prune --keep-{last,hourly,daily,weekly,monthly,yearly} N [--prefer-recent] [--delete]\n"
		"                           retention policy for backups; dry run unless --delete\n"
		"  help [COMMAND]           this text, or a command's\n\n"
		EXIT_CODES);
}

static void command_help(const struct command *c, FILE *f)
{
	fprintf(f, "usage: mtcfs-admin %s\n\n%s", c->synopsis, c->help);
}

static int parse_count(const char *opt, const char *s, uint64_t max, uint64_t *v)
{
	if (!s || util_parse_u64(s, max, v) < 0) {
		fprintf(stderr, "mtcfs-admin: %s needs a number 0..%llu, not \"%s\"\n", opt,
			(unsigned long long)max, s ? s : "");
		return -EINVAL;
	}
	return 0;
}

/* "90s", "30m", "2h", "7d": seconds into *v; at least 1 s, at most 10 years. */
static int parse_duration(const char *opt, const char *s, uint64_t *v)
{
	static const struct { char unit; uint64_t secs; } units[] = {
		{ 's', 1 }, { 'm', 60 }, { 'h', 3600 }, { 'd', 86400 },
	};
	char num[24];
	size_t l = s ? strlen(s) : 0;
	uint64_t n;

	for (size_t i = 0; l >= 2 && l - 1 < sizeof(num) && i < sizeof(units) / sizeof(units[0]); i++) {
		if (s[l - 1] != units[i].unit)
			continue;
		memcpy(num, s, l - 1);
		num[l - 1] = '\0';
		if (util_parse_u64(num, 10ULL * 366 * 86400 / units[i].secs, &n) < 0 || n == 0)
			break;
		*v = n * units[i].secs;
		return 0;
	}
	fprintf(stderr, "mtcfs-admin: %s needs a duration like 90s, 30m, 2h or 7d, not \"%s\"\n", opt,
		s ? s : "");
	return -EINVAL;
}

/* RAMDIR's configuration, for the bucket commands: the bucket=,
 * gcs_endpoint= and gcs_key_file= mount options the daemon recorded in the
 * catalog when it started (meta "daemon") and the job-name of the last
 * replicator.yaml it accepted (meta "config"). Only what the command line
 * left out is taken; endpoint and key only with the recorded bucket. The
 * strings live in static storage until exit. 0, or an exit code. */
static int opts_from_ramdir(const char *cmd, struct opts *o)
{
	static char bucket[4096], endpoint[1024], key[PATH_MAX], job[RCFG_JOB_MAX + 1];
	struct idx *x = NULL;
	struct rcfg cfg = { 0 };
	char err[256], *config;
	json_t *d;

	if (open_catalog(o->ramdir, &x) < 0)
		return 3;
	d = meta_json(x, "daemon");
	config = meta_str(x, "config");
	idx_close(x);
	if (!o->bucket) {
		const char *b = json_string_value(json_object_get(d, "bucket"));
		const char *ep = json_string_value(json_object_get(d, "gcs_endpoint"));
		const char *kf = json_string_value(json_object_get(d, "gcs_key_file"));
		if (b && snprintf(bucket, sizeof(bucket), "%s", b) < (int)sizeof(bucket)) {
			o->bucket = bucket;
			if (ep && !o->gcs_endpoint &&
			    snprintf(endpoint, sizeof(endpoint), "%s", ep) < (int)sizeof(endpoint))
				o->gcs_endpoint = endpoint;
			if (kf && !o->key_file && snprintf(key, sizeof(key), "%s", kf) < (int)sizeof(key))
				o->key_file = key;
		} else {
			fprintf(stderr, "mtcfs-admin %s: %s: %s; give --bucket URL\n", cmd, o->ramdir,
				d ? "the node was mounted without bucket=" : "no daemon has recorded its options");
		}
	}
	if (!o->job) {
		if (config && rcfg_parse(config, strlen(config), NULL, &cfg, err, sizeof(err)) == 0 &&
		    snprintf(job, sizeof(job), "%s", cfg.job) < (int)sizeof(job) && job[0])
			o->job = job;
		else
			fprintf(stderr, "mtcfs-admin %s: %s: no replicator.yaml configured a job yet; "
				"give --job NAME\n", cmd, o->ramdir);
		rcfg_free(&cfg);
	}
	json_decref(d);
	free(config);
	return 0;
}

int main(int argc, char **argv)
{
	static const char *const keep_opts[PRUNE_NKINDS] = {
		"--keep-last", "--keep-hourly", "--keep-daily", "--keep-weekly", "--keep-monthly",
		"--keep-yearly",
	};
	const struct command *c = NULL;
	struct opts o = { 0 };
	unsigned used = 0;
	bool help = false;

	/* a command's output is its answer: the library's INFO lines (the
	 * daemon's default) stay out of it; warnings and errors still show */
	log_set_level(LOG_WARN);
	for (int i = 1; i < argc; i++) {
		char optbuf[64];
		const char *a = argv[i], *val = NULL, *eq;
		bool takes = false;
		unsigned bit = 0;
		uint64_t v;
		int k;

		if (a[0] != '-' || a[1] == '\0') {
			if (o.nargs == 8) {
				fprintf(stderr, "mtcfs-admin: too many arguments\n");
				return 2;
			}
			o.args[o.nargs++] = a;
			continue;
		}
		/* --opt=value */
		eq = strchr(a, '=');
		if (eq && !strncmp(a, "--", 2) && (size_t)(eq - a) < sizeof(optbuf)) {
			memcpy(optbuf, a, (size_t)(eq - a));
			optbuf[eq - a] = '\0';
			val = eq + 1;
			a = optbuf;
		}
		for (k = 0; k < PRUNE_NKINDS && strcmp(a, keep_opts[k]); k++)
			;
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			help = true;
			continue;
		} else if (!strcmp(a, "-V") || !strcmp(a, "--version")) {
			printf("mtcfs-admin %s\n", MTCFS_VERSION);
			return 0;
		} else if (!strcmp(a, "--json")) {
			want_json = true;
			bit = O_JSON;
		} else if (!strcmp(a, "--watch")) {
			o.watch = true;
			bit = O_WATCH;
		} else if (!strcmp(a, "--force")) {
			o.force = true;
			bit = O_FORCE;
		} else if (!strcmp(a, "--delete")) {
			o.del = true;
			bit = O_DELETE;
		} else if (!strcmp(a, "--prefer-recent")) {
			o.prefer_recent = true;
			bit = O_KEEP;
		} else if (!strcmp(a, "--job") || !strcmp(a, "--bucket") || !strcmp(a, "--gcs-endpoint") ||
			   !strcmp(a, "--key-file") || !strcmp(a, "--nodes") || !strcmp(a, "--ramdir") ||
			   !strcmp(a, "--incomplete-older-than") || k < PRUNE_NKINDS) {
			takes = true;
		} else {
			fprintf(stderr, "mtcfs-admin: unknown option %s\n", argv[i]);
			usage(stderr);
			return 2;
		}
		if (!takes) {
			if (val) {
				fprintf(stderr, "mtcfs-admin: %s takes no value\n", a);
				return 2;
			}
			used |= bit;
			continue;
		}
		if (!val) {
			if (i + 1 >= argc) {
				fprintf(stderr, "mtcfs-admin: %s needs a value\n", a);
				return 2;
			}
			val = argv[++i];
		}
		if (!strcmp(a, "--job")) {
			o.job = val;
			bit = O_JOB;
		} else if (!strcmp(a, "--bucket")) {
			o.bucket = val;
			bit = O_BUCKET;
		} else if (!strcmp(a, "--gcs-endpoint")) {
			o.gcs_endpoint = val;
			bit = O_BUCKET;
		} else if (!strcmp(a, "--key-file")) {
			o.key_file = val;
			bit = O_BUCKET;
		} else if (!strcmp(a, "--ramdir")) {
			o.ramdir = val;
			bit = O_BUCKET;
		} else if (!strcmp(a, "--nodes")) {
			if (parse_count(a, val, NODES_MAX, &v) < 0)
				return 2;
			o.nodes_set = v > 0;       /* 0: as the .meta names show */
			o.nodes = (uint32_t)v;
			bit = O_NODES;
		} else if (!strcmp(a, "--incomplete-older-than")) {
			if (parse_duration(a, val, &o.incomplete_older_s) < 0)
				return 2;
			o.incomplete_set = true;
			o.incomplete_arg = val;
			bit = O_KEEP;
		} else {
			if (parse_count(a, val, 1000000, &v) < 0)
				return 2;
			o.keep[k] = (unsigned)v;
			o.keep_set[k] = true;
			bit = O_KEEP;
		}
		used |= bit;
	}
	if (o.nargs == 0) {
		usage(help ? stdout : stderr);
		return help ? 0 : 2;
	}
	if (!strcmp(o.args[0], "help")) {
		if (o.nargs > 1 && (c = find_command(o.args[1])) != NULL)
			command_help(c, stdout);
		else if (o.nargs > 1) {
			fprintf(stderr, "mtcfs-admin: unknown command %s\n", o.args[1]);
			return 2;
		} else
			usage(stdout);
		return 0;
	}
	c = find_command(o.args[0]);
	if (!c) {
		fprintf(stderr, "mtcfs-admin: unknown command %s\n", o.args[0]);
		usage(stderr);
		return 2;
	}
	if (help) {
		command_help(c, stdout);
		return 0;
	}
	if (used & ~c->opts) {
		static const struct { unsigned bit; const char *words; } names[] = {
			{ O_BUCKET, "--bucket/--gcs-endpoint/--key-file/--ramdir" }, { O_NODES, "--nodes" },
			{ O_FORCE, "--force" }, { O_DELETE, "--delete" },
			{ O_KEEP, "--keep-*/--prefer-recent/--incomplete-older-than" }, { O_WATCH, "--watch" }, { O_JOB, "--job" },
		};
		for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
			if (used & ~c->opts & names[i].bit)
				fprintf(stderr, "mtcfs-admin %s: %s is not an option of this command\n", c->name,
					names[i].words);
		fprintf(stderr, "usage: mtcfs-admin %s\n", c->synopsis);
		return 2;
	}
	if (o.nargs - 1 < c->nargs_min || o.nargs - 1 > c->nargs_max) {
		fprintf(stderr, "usage: mtcfs-admin %s\n", c->synopsis);
		return 2;
	}
	if (c->opts & O_BUCKET) {
		if (o.ramdir && (!o.bucket || !o.job)) {
			int e = opts_from_ramdir(c->name, &o);
			if (e)
				return e;
		}
		if (!o.bucket || !o.job) {
			fprintf(stderr, "mtcfs-admin %s: --bucket URL and --job NAME are required (or "
				"--ramdir RAMDIR of a node mounted with bucket= and configured by a "
				"replicator.yaml)\n"
				"usage: mtcfs-admin %s\n", c->name, c->synopsis);
			return 2;
		}
		if (!bk_job_name_ok(o.job)) {
			fprintf(stderr, "mtcfs-admin %s: \"%s\" cannot be a job name\n", c->name, o.job);
			return 2;
		}
	}
	if (!strcmp(c->name, "ls"))
		return cmd_ls(o.args[1], o.job);
	if (!strcmp(c->name, "steps"))
		return cmd_steps(o.args[1], o.job);
	if (!strcmp(c->name, "status"))
		return cmd_status(o.args[1], o.watch);
	if (!strcmp(c->name, "verify"))
		return cmd_verify(o.args[1], o.job);
	if (!strcmp(c->name, "backups"))
		return cmd_backups(&o);
	if (!strcmp(c->name, "prune"))
		return cmd_prune(&o);
	/* restore-version */
	if (!strcmp(o.args[1], "set") ? o.nargs != 3
	    : (strcmp(o.args[1], "show") && strcmp(o.args[1], "clear")) || o.nargs != 2) {
		fprintf(stderr, "usage: mtcfs-admin %s\n", c->synopsis);
		return 2;
	}
	if (o.force && strcmp(o.args[1], "set")) {
		fprintf(stderr, "mtcfs-admin restore-version: --force goes with set\n");
		return 2;
	}
	return cmd_restore_version(&o);
}
