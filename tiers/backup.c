/* backup: the bucket layout of checkpoints (see backup.h). This file: names,
 * listing into memory, the objects of a backup, naming and discarding an
 * attempt, the restore version. Uploads: backup_put.c; checking and
 * listing backups: backup_check.c; fetching and verifying: backup_get.c;
 * what they share: backup_i.h. */
#include "tiers/backup.h"
#include "tiers/backup_i.h"
#include "common/jobname.h"
#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- names ---- */

static bool component_ok(const char *s, size_t max)
{
	size_t n = s ? strlen(s) : 0;

	if (n == 0 || n > max || !strcmp(s, ".") || !strcmp(s, ".."))
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == '-'))
			return false;
	}
	return true;
}

/* the catalog's job field holds any valid name */
_Static_assert(IDX_JOB_MAX == JOB_NAME_MAX, "catalog and job-name limits differ");
bool bk_job_name_ok(const char *job) { return job_name_ok(job); }
bool bk_backup_name_ok(const char *name) { return component_ok(name, BK_NAME_MAX - 1); }

int bk_check_names(const char *job, const char *backup)
{
	if (!bk_job_name_ok(job)) {
		bkt_set_error("invalid job name \"%s\"", job ? job : "(null)");
		return -EINVAL;
	}
	if (backup && !bk_backup_name_ok(backup)) {
		bkt_set_error("invalid backup name \"%s\"", backup);
		return -EINVAL;
	}
	return 0;
}

int bk_meta_name(char *out, size_t len, const char *job, const struct shard_key *k)
{
	int n = snprintf(out, len, "%s-s%" PRIu64 "-n%" PRIu32 "-w%" PRIu32 ".meta", job, k->step,
			 k->rank, k->worker);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* "<job>-s<step>-n<node>-w<w>.meta" -> the numbers. */
bool bk_parse_meta_name(const char *s, const char *job, uint64_t *step, uint32_t *node,
			uint32_t *worker)
{
	size_t jl = strlen(job);
	const char *p;
	char num[24];
	uint64_t v[3];
	static const char tags[] = "snw";

	if (strncmp(s, job, jl) || s[jl] != '-')
		return false;
	p = s + jl + 1;
	for (int i = 0; i < 3; i++) {
		size_t d = 0;
		if (*p++ != tags[i])
			return false;
		while (p[d] >= '0' && p[d] <= '9')
			d++;
		if (d == 0 || d >= sizeof(num))
			return false;
		memcpy(num, p, d);
		num[d] = '\0';
		if (util_parse_u64(num, i == 0 ? UINT64_MAX : UINT32_MAX, &v[i]) < 0)
			return false;
		p += d;
		if (i < 2 && *p++ != '-')
			return false;
	}
	if (strcmp(p, ".meta"))
		return false;
	*step = v[0];
	*node = (uint32_t)v[1];
	*worker = (uint32_t)v[2];
	return true;
}

int bk_path3(char *out, size_t len, const char *a, const char *b, const char *c)
{
	int n = snprintf(out, len, "%s/%s/%s", a, b, c);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* ---- listing into memory ---- */

static int objs_add(void *arg, const struct bkt_entry *e)
{
	struct objs *o = arg;
	size_t nl = strlen(e->name);

	if (nl < o->skip)
		return 0;
	if (o->n == o->cap) {
		size_t nc = o->cap ? o->cap * 2 : 64;
		struct obj *nv = realloc(o->v, nc * sizeof(*nv));
		if (!nv)
			return -ENOMEM;
		o->v = nv;
		o->cap = nc;
	}
	o->v[o->n].name = strdup(e->name + o->skip);
	if (!o->v[o->n].name)
		return -ENOMEM;
	o->v[o->n].size = e->size;
	o->v[o->n].has_crc = e->has_crc;
	o->v[o->n].crc = e->crc32c;
	o->v[o->n].is_prefix = e->is_prefix;
	o->n++;
	return 0;
}

void bk_objs_free(struct objs *o)
{
	for (size_t i = 0; i < o->n; i++)
		free(o->v[i].name);
	free(o->v);
	memset(o, 0, sizeof(*o));
}

int bk_list_into(struct bkt *b, const char *prefix, const char *delim, struct objs *o)
{
	memset(o, 0, sizeof(*o));
	o->skip = strlen(prefix);
	return bkt_list_ex(b, prefix, delim, objs_add, o);
}

static int obj_cmp_key(const void *key, const void *elem)
{
	return strcmp(key, ((const struct obj *)elem)->name);
}

/* Listings are in bytewise order: binary search. */
const struct obj *bk_objs_find(const struct objs *o, const char *name)
{
	return o->n ? bsearch(name, o->v, o->n, sizeof(*o->v), obj_cmp_key) : NULL;
}

/* A .meta names its shard's data: 64 hex digits (mtcfs's manifest hash;
 * GKE's for a single-file shard), or "D" + 64 hex digits: GKE's replicator
 * for a directory (a BLAKE3 hash over the tree or the TensorStore entries,
 * util.py/merkle.py/framework/orbax.py).  *gke_dir tells which. */
int bk_read_meta(struct bkt *b, const char *name, uint8_t hash[32], bool *gke_dir)
{
	void *buf = NULL;
	size_t len = 0;
	char *s;
	int rc = bkt_get_buf(b, name, META_MAX, &buf, &len);

	*gke_dir = false;
	if (rc < 0)
		return rc;
	s = buf;
	while (len && (s[len - 1] == '\n' || s[len - 1] == '\r' || s[len - 1] == ' '))
		s[--len] = '\0';
	if (len == 65 && s[0] == 'D') {
		*gke_dir = true;
		s++;
		len--;
	}
	if (len != 64 || memchr(s, '\0', len) || mf_hash_parse(s, hash) < 0) {
		bkt_set_error("%s/%s: not a shard hash (64 hex digits, or D and 64 as GKE writes)",
			      bkt_url(b), name);
		rc = -EBADMSG;
	}
	free(buf);
	return rc;
}

/* The name of a shard's data in a backup: "<hex>" or GKE's "D<hex>". */
void bk_data_base(const uint8_t hash[32], bool gke_dir, char out[67])
{
	char hex[65];

	mf_hash_hex(hash, hex);
	snprintf(out, 67, "%s%s", gke_dir ? "D" : "", hex);
}

/* The objects of a GKE shard's "<base>.data/" in a listing of the backup
 * (names relative to JOB/BACKUP/): each a file, or a directory placeholder
 * (name ending in "/", as gcsfuse makes them).  -EBADMSG with words in why
 * for a path that could escape the shard.  The objects are all->v[*first]
 * and the *count after it. */
int bk_gke_objects(const struct objs *all, const char *base, size_t *first, size_t *count,
		   char *why, size_t whylen)
{
	char pfx[80];
	size_t pl, lo = 0, hi = all->n;

	pl = (size_t)snprintf(pfx, sizeof(pfx), "%s.data/", base);
	while (lo < hi) {           /* listings are sorted: the first >= pfx */
		size_t mid = lo + (hi - lo) / 2;
		if (strcmp(all->v[mid].name, pfx) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	*first = lo;
	for (hi = lo; hi < all->n && !strncmp(all->v[hi].name, pfx, pl); hi++) {
		const char *rel = all->v[hi].name + pl;
		size_t rl = strlen(rel);
		if (rl && rel[rl - 1] == '/')
			rl--;
		if (rl == 0)
			continue;           /* the placeholder of <base>.data/ itself */
		if (!util_safe_relpath(rel, rl)) {
			snprintf(why, whylen, "unsafe object name %.80s", all->v[hi].name);
			return -EBADMSG;
		}
	}
	*count = hi - lo;
	return 0;
}

int bk_read_manifest(struct bkt *b, const char *name, const uint8_t want[32],
		     struct manifest **mf)
{
	void *buf = NULL;
	size_t len = 0;
	char why[512];
	int rc = bkt_get_buf(b, name, BK_MANIFEST_MAX, &buf, &len);

	if (rc < 0)
		return rc;
	rc = mf_decode_err(buf, len, mf, why, sizeof(why));
	free(buf);
	if (rc == -EBADMSG) {
		bkt_set_error("%s/%s: not a valid manifest: %s", bkt_url(b), name, why);
		return rc;
	}
	if (rc < 0)
		return rc;
	if (memcmp((*mf)->hash, want, 32)) {
		bkt_set_error("%s/%s: the manifest's hash differs from its name", bkt_url(b), name);
		mf_free(*mf);
		*mf = NULL;
		return -EBADMSG;
	}
	return 0;
}

/* ---- names of new backups ---- */

int bk_new_name(struct bkt *b, const char *job, time_t t, char out[BK_NAME_MAX])
{
	char stamp[32], prefix[PATH_MAX];
	struct objs o = { 0 };
	struct tm tm;
	int rc;

	if ((rc = bk_check_names(job, NULL)) < 0)
		return rc;
	if (!gmtime_r(&t, &tm) || !strftime(stamp, sizeof(stamp), "%Y-%m-%d_%H-%M", &tm) ||
	    strlen(stamp) != 16)
		return -EINVAL;
	/* Exactly the stamp, never a suffix: GKE's listing regex and Orbax's
	 * converter see nothing else.  One object under JOB/STAMP/ is enough
	 * to say the minute is taken. */
	snprintf(prefix, sizeof(prefix), "%s/%s/", job, stamp);
	rc = bk_list_into(b, prefix, "/", &o);
	if (rc < 0)
		goto out;
	if (o.n) {
		bkt_set_error("%s/%s: a backup was already started in this UTC minute; the next "
			      "one waits for the next minute", bkt_url(b), prefix);
		rc = -EAGAIN;
		goto out;
	}
	snprintf(out, BK_NAME_MAX, "%s", stamp);
out:
	bk_objs_free(&o);
	return rc;
}

int bk_discard_attempt(struct bkt *b, const char *job, const char *backup)
{
	char prefix[PATH_MAX], name[PATH_MAX];
	struct objs o = { 0 };
	int rc;

	if ((rc = bk_check_names(job, backup)) < 0)
		return rc;
	snprintf(prefix, sizeof(prefix), "%s/%s/", job, backup);
	rc = bk_list_into(b, prefix, NULL, &o);
	if (rc < 0)
		goto out;
	/* .meta objects first: a reader that lists meanwhile sees a backup
	 * that is missing shards (incomplete), never a .meta without data. */
	for (int pass = 0; pass < 2; pass++) {
		for (size_t i = 0; i < o.n; i++) {
			bool is_meta = !strchr(o.v[i].name, '/') &&
				       strlen(o.v[i].name) > 5 &&
				       !strcmp(o.v[i].name + strlen(o.v[i].name) - 5, ".meta");
			if (is_meta != (pass == 0))
				continue;
			if ((size_t)snprintf(name, sizeof(name), "%s%s", prefix, o.v[i].name) >=
			    sizeof(name)) {
				rc = -ENAMETOOLONG;
				goto out;
			}
			rc = bkt_delete(b, name);
			if (rc == -ENOENT)
				rc = 0;
			if (rc < 0)
				goto out;
		}
	}
	if (o.n)
		log_info(MOD, "%s/%s: failed backup attempt removed (%zu objects)", bkt_url(b),
			 prefix, o.n);
out:
	bk_objs_free(&o);
	return rc;
}

/* ---- restore.version ---- */

int bk_get_restore_version(struct bkt *b, const char *job, char out[BK_NAME_MAX])
{
	char name[PATH_MAX];
	void *buf = NULL;
	size_t len = 0;
	char *s;
	int rc;

	if ((rc = bk_check_names(job, NULL)) < 0)
		return rc;
	snprintf(name, sizeof(name), "%s/%s", job, BK_RESTORE_VERSION);
	rc = bkt_get_buf(b, name, BK_NAME_MAX * 4, &buf, &len);
	if (rc == -EFBIG)
		rc = -EBADMSG;
	if (rc < 0)
		return rc;
	s = buf;
	while (len && (s[len - 1] == '\n' || s[len - 1] == '\r' || s[len - 1] == ' ' ||
		       s[len - 1] == '\t'))
		s[--len] = '\0';
	while (*s == ' ' || *s == '\t')
		s++;
	if (memchr(buf, '\0', len) != NULL || !bk_backup_name_ok(s)) {
		bkt_set_error("%s/%s: does not name a backup", bkt_url(b), name);
		rc = -EBADMSG;
	} else {
		snprintf(out, BK_NAME_MAX, "%s", s);
	}
	free(buf);
	return rc;
}

int bk_set_restore_version(struct bkt *b, const char *job, const char *backup)
{
	char name[PATH_MAX];
	int rc;

	if ((rc = bk_check_names(job, backup)) < 0)
		return rc;
	snprintf(name, sizeof(name), "%s/%s", job, BK_RESTORE_VERSION);
	for (int tries = 0; tries < 3; tries++) {
		rc = bkt_delete(b, name);
		if (rc < 0 && rc != -ENOENT)
			return rc;
		rc = bkt_put_buf(b, name, backup, strlen(backup));
		if (rc != -EEXIST)
			break;              /* else another writer came in between */
	}
	if (rc == 0)
		log_info(MOD, "%s/%s: restore.version = %s", bkt_url(b), job, backup);
	return rc;
}

int bk_clear_restore_version(struct bkt *b, const char *job)
{
	char name[PATH_MAX];
	int rc;

	if ((rc = bk_check_names(job, NULL)) < 0)
		return rc;
	snprintf(name, sizeof(name), "%s/%s", job, BK_RESTORE_VERSION);
	rc = bkt_delete(b, name);
	return rc == -ENOENT ? 0 : rc;
}
