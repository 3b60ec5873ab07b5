/* backup: judging a backup complete and listing a job's backups (see
 * backup.h, backup_i.h). */
#include "tiers/backup.h"
#include "tiers/backup_i.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* "YYYY-MM-DD_HH-MM" with an optional "-N": the base length (16) and N
 * (1 without a suffix), or false. */
static bool parse_backup_name(const char *s, unsigned *n)
{
	static const char pat[] = "dddd-dd-dd_dd-dd";
	uint64_t v;

	for (size_t i = 0; i < sizeof(pat) - 1; i++) {
		if (pat[i] == 'd' ? (s[i] < '0' || s[i] > '9') : s[i] != pat[i])
			return false;
	}
	if (s[16] == '\0') {
		*n = 1;
		return true;
	}
	if (s[16] != '-' || util_parse_u64(s + 17, SUFFIX_MAX, &v) < 0 || v < 2 || s[17] == '0')
		return false;
	*n = (unsigned)v;
	return true;
}

/* Newest first: timestamp names by (base, N) descending, then the others. */
static int backup_cmp(const void *pa, const void *pb)
{
	const char *a = ((const struct bk_backup *)pa)->name;
	const char *b = ((const struct bk_backup *)pb)->name;
	unsigned na, nb;
	bool ta = parse_backup_name(a, &na), tb = parse_backup_name(b, &nb);
	int c;

	if (ta != tb)
		return ta ? -1 : 1;
	if (!ta)
		return strcmp(b, a);
	c = strncmp(b, a, 16);
	if (c)
		return c;
	return na < nb ? 1 : na > nb ? -1 : 0;
}

/* ---- completeness ---- */

struct verdict {                 /* one distinct hash of a backup */
	uint8_t hash[32];
	bool gke_dir;                /* GKE's "D<hash>.data/" without a manifest */
	bool file;                   /* GKE's framework: pytorch "<hash>.data", one file */
	bool ok;
	char why[128];
};

static void judge_hash(struct bkt *b, const char *job, const char *backup,
		       const struct objs *all, struct verdict *v)
{
	char hex[65], name[PATH_MAX], path[PATH_MAX];
	struct manifest *mf = NULL;
	int rc;

	mf_hash_hex(v->hash, hex);
	if (v->gke_dir) {
		/* GKE's replicator writes no manifest: the shard is there when
		 * its .data directory is (GKE's own test).  The BLAKE3 hash is
		 * not recomputed (no BLAKE3 library in Debian 12, and Orbax's is
		 * over TensorStore entries); each object's bytes are checked
		 * against the CRC32C the bucket lists when it is fetched. */
		char base[67];
		size_t first, count;
		bk_data_base(v->hash, true, base);
		if (bk_gke_objects(all, base, &first, &count, v->why, sizeof(v->why)) < 0)
			return;
		if (count == 0) {
			snprintf(v->why, sizeof(v->why), "no D%.16s….data/", hex);
			return;
		}
		v->ok = true;
		return;
	}
	snprintf(name, sizeof(name), "%s.manifest", hex);
	if (!bk_objs_find(all, name)) {
		/* GKE's framework: pytorch shard is one worker's file as one
		 * object, hashed alone (BLAKE3, not recomputed here); mtcfs
		 * writes its pytorch-mode backups the same way.  The shard is
		 * there when the object is; its bytes are checked against the
		 * listed size and CRC32C when fetched. */
		snprintf(name, sizeof(name), "%s.data", hex);
		if (bk_objs_find(all, name)) {
			v->file = true;
			v->ok = true;
		} else {
			snprintf(v->why, sizeof(v->why), "no %.16s….manifest", hex);
		}
		return;
	}
	snprintf(path, sizeof(path), "%s/%s/%s.manifest", job, backup, hex);
	rc = bk_read_manifest(b, path, v->hash, &mf);
	if (rc < 0) {
		snprintf(v->why, sizeof(v->why), "manifest %.16s…: %s", hex,
			 rc == -EBADMSG ? "invalid or wrong hash" : strerror(-rc));
		return;
	}
	for (size_t i = 0; i < mf->n; i++) {
		const struct mf_entry *e = &mf->e[i];
		const struct obj *o;

		if (e->type != MF_FILE)
			continue;
		snprintf(name, sizeof(name), "%s.data/%s", hex, e->path);
		o = bk_objs_find(all, name);
		if (!o) {
			snprintf(v->why, sizeof(v->why), "missing data file %s", e->path);
			goto out;
		}
		if (o->size != e->size) {
			snprintf(v->why, sizeof(v->why), "data file %s has %" PRIu64 " bytes, the "
				 "manifest says %" PRIu64, e->path, o->size, e->size);
			goto out;
		}
		if (o->has_crc && o->crc != e->crc32c) {
			snprintf(v->why, sizeof(v->why), "data file %s has crc32c %08x, the manifest "
				 "says %08x", e->path, o->crc, e->crc32c);
			goto out;
		}
	}
	v->ok = true;
out:
	mf_free(mf);
}

static int shard_cmp(const void *pa, const void *pb)
{
	const struct bk_shard *a = pa, *b = pb;

	if (a->node != b->node)
		return a->node < b->node ? -1 : 1;
	if (a->worker != b->worker)
		return a->worker < b->worker ? -1 : 1;
	return a->step < b->step ? -1 : a->step > b->step;
}

static int add_shard(struct bk_backup *out, size_t *cap, const struct bk_shard *s)
{
	struct bk_shard *nv = util_grow(out->shards, out->nshards, cap, sizeof(*nv), 16);

	if (!nv)
		return -ENOMEM;
	out->shards = nv;
	out->shards[out->nshards++] = *s;
	return 0;
}

static void why_once(struct bk_backup *out, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void why_once(struct bk_backup *out, const char *fmt, ...)
{
	va_list ap;

	out->complete = false;
	if (out->why[0])
		return;
	va_start(ap, fmt);
	vsnprintf(out->why, sizeof(out->why), fmt, ap);
	va_end(ap);
}

/* What the .meta names of a backup span. */
struct span {
	bool any;
	uint32_t maxnode, maxworker;
	uint64_t minstep, maxstep;
};

/* Every .meta of the backup (its objects all, under prefix) into out's
 * shards, each judged by its shard hash (judge_hash, once per hash), and
 * the data bytes summed; *sp: what they span. 0 or -errno. */
static int judge_metas(struct bkt *b, const char *job, const char *backup, const char *prefix,
		       const struct objs *all, struct bk_backup *out, size_t *cap, struct span *sp)
{
	char name[PATH_MAX];
	struct verdict *vs = calloc(all->n, sizeof(*vs));
	size_t nv = 0;
	int rc = 0;

	if (!vs)
		return -ENOMEM;
	for (size_t i = 0; i < all->n; i++) {
		const struct obj *o = &all->v[i];
		struct bk_shard s = { 0 };
		size_t k;

		if (strchr(o->name, '/')) {
			if (strstr(o->name, ".data/"))
				out->bytes += o->size;
			continue;
		}
		if (!bk_parse_meta_name(o->name, job, &s.step, &s.node, &s.worker))
			continue;
		sp->any = true;
		if (s.node > sp->maxnode)
			sp->maxnode = s.node;
		if (s.worker > sp->maxworker)
			sp->maxworker = s.worker;
		if (s.step < sp->minstep)
			sp->minstep = s.step;
		if (s.step > sp->maxstep)
			sp->maxstep = s.step;
		snprintf(name, sizeof(name), "%s%s", prefix, o->name);
		rc = bk_read_meta(b, name, s.hash, &s.gke);
		if (rc == -ENOENT || rc == -EBADMSG) {
			snprintf(s.why, sizeof(s.why), "%s: %s", o->name,
				 rc == -ENOENT ? "vanished" : "not a shard hash");
			memset(s.hash, 0, sizeof(s.hash));
			rc = add_shard(out, cap, &s);
			if (rc < 0)
				goto out;
			continue;
		}
		if (rc < 0)
			goto out;
		for (k = 0; k < nv && (memcmp(vs[k].hash, s.hash, 32) || vs[k].gke_dir != s.gke); k++)
			;
		if (k == nv) {
			memcpy(vs[nv].hash, s.hash, 32);
			vs[nv].gke_dir = s.gke;
			judge_hash(b, job, backup, all, &vs[nv]);
			nv++;
		}
		s.complete = vs[k].ok;
		s.file = vs[k].file;
		if (!s.complete)
			snprintf(s.why, sizeof(s.why), "%s", vs[k].why);
		rc = add_shard(out, cap, &s);
		if (rc < 0)
			goto out;
	}
	rc = 0;
out:
	free(vs);
	return rc;
}

/* Coverage: every (node, worker) of nodes x workers exactly once (a
 * missing one added as a shard with no .meta), nothing outside; the first
 * failure in out->why, out->nodes_seen counted. 0 or -errno. */
static int check_coverage(struct bk_backup *out, size_t *cap, uint32_t nodes, uint32_t workers)
{
	size_t n0 = out->nshards, j = 0;
	uint32_t lastnode = UINT32_MAX;
	int rc;

	for (uint32_t nd = 0; nd < nodes; nd++) {
		uint32_t nw = workers;
		size_t a = j, z;

		/* mtcfs before per-worker backups: one w0 shard (with its
		 * manifest) held every worker's file of the node */
		while (a < n0 && out->shards[a].node < nd)
			a++;
		for (z = a; z < n0 && out->shards[z].node == nd; z++)
			;
		if (workers > 1 && z == a + 1 && out->shards[a].worker == 0 &&
		    out->shards[a].complete && !out->shards[a].gke && !out->shards[a].file)
			nw = 1;
		for (uint32_t w = 0; w < nw; w++) {
			size_t cnt = 0;
			while (j < n0 && (out->shards[j].node < nd ||
					  (out->shards[j].node == nd && out->shards[j].worker < w)))
				j++;
			for (size_t q = j; q < n0 && out->shards[q].node == nd &&
			     out->shards[q].worker == w; q++) {
				cnt++;
				if (!out->shards[q].complete)
					why_once(out, "node %u worker %u: %s", nd, w, out->shards[q].why);
			}
			if (cnt > 1)
				why_once(out, "node %u worker %u has %zu .meta", nd, w, cnt);
			if (cnt == 0) {
				struct bk_shard s = { .node = nd, .worker = w };
				snprintf(s.why, sizeof(s.why), "no .meta");
				why_once(out, "node %u worker %u: no .meta", nd, w);
				if ((rc = add_shard(out, cap, &s)) < 0)
					return rc;
			}
		}
	}
	for (size_t q = 0; q < n0; q++) {
		const struct bk_shard *s = &out->shards[q];
		if (s->node != lastnode) {
			out->nodes_seen++;
			lastnode = s->node;
		}
		if (s->node >= nodes || s->worker >= workers)
			why_once(out, "node %u worker %u is outside the job's %u nodes x %u "
				 "workers", s->node, s->worker, nodes, workers);
	}
	if (out->nshards > n0)
		qsort(out->shards, out->nshards, sizeof(*out->shards), shard_cmp);
	return 0;
}

int bk_check_backup(struct bkt *b, const char *job, const char *backup, uint32_t nodes,
		    uint32_t workers, struct bk_backup *out)
{
	char prefix[PATH_MAX];
	struct objs all = { 0 };
	struct span sp = { .minstep = UINT64_MAX };
	size_t cap = 0;
	int rc;

	memset(out, 0, sizeof(*out));
	if ((rc = bk_check_names(job, backup)) < 0)
		return rc;
	snprintf(out->name, sizeof(out->name), "%s", backup);
	snprintf(prefix, sizeof(prefix), "%s/%s/", job, backup);
	rc = bk_list_into(b, prefix, NULL, &all);
	if (rc < 0)
		goto out;
	if (all.n == 0) {
		bkt_set_error("%s/%s: no such backup", bkt_url(b), prefix);
		rc = -ENOENT;
		goto out;
	}
	rc = judge_metas(b, job, backup, prefix, &all, out, &cap, &sp);
	if (rc < 0)
		goto out;
	out->complete = sp.any;
	if (!sp.any)
		why_once(out, "no .meta");
	if (!nodes)
		nodes = sp.any ? sp.maxnode + 1 : 0;
	if (!workers)
		workers = sp.any ? sp.maxworker + 1 : 0;
	out->step = sp.any ? sp.maxstep : 0;
	if (sp.any && sp.minstep != sp.maxstep)
		why_once(out, "mixed steps %" PRIu64 " and %" PRIu64, sp.minstep, sp.maxstep);
	/* coverage: every (node, worker) exactly once; nothing outside */
	if (out->nshards)
		qsort(out->shards, out->nshards, sizeof(*out->shards), shard_cmp);
	rc = check_coverage(out, &cap, nodes, workers);
out:
	bk_objs_free(&all);
	if (rc < 0)
		bk_backup_clear(out);
	return rc;
}

void bk_backup_clear(struct bk_backup *v)
{
	if (!v)
		return;
	free(v->shards);
	v->shards = NULL;
	v->nshards = 0;
}

void bk_backups_free(struct bk_backup *v, size_t n)
{
	for (size_t i = 0; v && i < n; i++)
		bk_backup_clear(&v[i]);
	free(v);
}

int bk_list_backups_until(struct bkt *b, const char *job, uint32_t nodes, uint32_t workers,
			  bool (*enough)(void *arg, const struct bk_backup *v), void *arg,
			  struct bk_backup **outp, size_t *np)
{
	char prefix[PATH_MAX];
	struct objs top = { 0 };
	struct bk_backup *v = NULL;
	size_t n = 0, names = 0;
	int rc;

	*outp = NULL;
	*np = 0;
	if ((rc = bk_check_names(job, NULL)) < 0)
		return rc;
	snprintf(prefix, sizeof(prefix), "%s/", job);
	rc = bk_list_into(b, prefix, "/", &top);
	if (rc < 0)
		goto out;
	v = calloc(top.n ? top.n : 1, sizeof(*v));
	if (!v) {
		rc = -ENOMEM;
		goto out;
	}
	/* the names first, in order: the checks (a listing per backup) can
	 * then stop at the first backup the caller is content with */
	for (size_t i = 0; i < top.n; i++) {
		size_t l = strlen(top.v[i].name);

		if (!top.v[i].is_prefix || l < 2 || l > BK_NAME_MAX)
			continue;
		memcpy(v[names].name, top.v[i].name, l - 1);
		v[names].name[l - 1] = '\0';
		if (bk_backup_name_ok(v[names].name))
			names++;
	}
	if (names > 1)
		qsort(v, names, sizeof(*v), backup_cmp);
	for (size_t i = 0; i < names; i++) {
		char name[BK_NAME_MAX];

		memcpy(name, v[i].name, sizeof(name));
		rc = bk_check_backup(b, job, name, nodes, workers, &v[n]);
		if (rc == -ENOENT)
			continue;           /* emptied since the listing */
		if (rc < 0)
			goto out;
		n++;
		if (enough && enough(arg, &v[n - 1]))
			break;
	}
	rc = 0;
	*outp = v;
	*np = n;
	v = NULL;
out:
	bk_backups_free(v, n);
	bk_objs_free(&top);
	return rc;
}

int bk_list_backups(struct bkt *b, const char *job, uint32_t nodes, uint32_t workers,
		    struct bk_backup **outp, size_t *np)
{
	return bk_list_backups_until(b, job, nodes, workers, NULL, NULL, outp, np);
}
