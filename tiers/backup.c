/* backup: the bucket layout of checkpoints (see backup.h). */
#include "tiers/backup.h"
#include "common/jobname.h"
#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MOD "backup"
#define META_MAX 256                  /* a .meta holds 64 hex digits */
#define SUFFIX_MAX 9999u              /* "-N" of colliding backup names */

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

static int check_names(const char *job, const char *backup)
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

static int meta_name(char *out, size_t len, const char *job, const struct shard_key *k)
{
	int n = snprintf(out, len, "%s-s%" PRIu64 "-n%" PRIu32 "-w%" PRIu32 ".meta", job, k->step,
			 k->rank, k->worker);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* "<job>-s<step>-n<node>-w<w>.meta" -> the numbers. */
static bool parse_meta_name(const char *s, const char *job, uint64_t *step, uint32_t *node,
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

static int path3(char *out, size_t len, const char *a, const char *b, const char *c)
{
	int n = snprintf(out, len, "%s/%s/%s", a, b, c);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* ---- listing into memory ---- */

struct obj {
	char *name;
	uint64_t size;
	bool has_crc, is_prefix;
	uint32_t crc;
};

struct objs {
	struct obj *v;
	size_t n, cap;
	size_t skip;                /* bytes of the listed prefix to drop from names */
};

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

static void objs_free(struct objs *o)
{
	for (size_t i = 0; i < o->n; i++)
		free(o->v[i].name);
	free(o->v);
	memset(o, 0, sizeof(*o));
}

static int list_into(struct bkt *b, const char *prefix, const char *delim, struct objs *o)
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
static const struct obj *objs_find(const struct objs *o, const char *name)
{
	return o->n ? bsearch(name, o->v, o->n, sizeof(*o->v), obj_cmp_key) : NULL;
}

/* ---- small objects ---- */

/* Put a small object; if it exists, it must hold exactly these bytes. */
static int put_small_once(struct bkt *b, const char *name, const void *buf, size_t len)
{
	void *old = NULL;
	size_t olen = 0;
	int rc = bkt_put_buf(b, name, buf, len);

	if (rc != -EEXIST)
		return rc;
	rc = bkt_get_buf(b, name, len + 1, &old, &olen);
	if (rc == 0 && (olen != len || memcmp(old, buf, len))) {
		bkt_set_error("%s/%s: already there with other content", bkt_url(b), name);
		rc = -EEXIST;
	} else if (rc == -EFBIG) {
		bkt_set_error("%s/%s: already there with other content", bkt_url(b), name);
		rc = -EEXIST;
	}
	free(old);
	return rc;
}

/* A .meta names its shard's data: 64 hex digits (mtcfs's manifest hash;
 * GKE's for a single-file shard), or "D" + 64 hex digits: GKE's replicator
 * for a directory (a BLAKE3 hash over the tree or the TensorStore entries,
 * util.py/merkle.py/framework/orbax.py).  *gke_dir tells which. */
static int read_meta(struct bkt *b, const char *name, uint8_t hash[32], bool *gke_dir)
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
static void data_base(const uint8_t hash[32], bool gke_dir, char out[67])
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
static int gke_objects(const struct objs *all, const char *base, size_t *first, size_t *count,
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

static int read_manifest(struct bkt *b, const char *name, const uint8_t want[32],
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

/* ---- upload ---- */

int bk_upload_shard(struct bkt *b, const char *job, const char *backup,
		    const struct shard_key *k, int dirfd, const struct manifest *mf,
		    bool upload_data)
{
	char hex[65], base[PATH_MAX], name[PATH_MAX], data[PATH_MAX];
	struct objs have = { 0 };
	struct bkt_xfer *x = NULL;
	char **names = NULL;
	uint8_t *enc = NULL;
	size_t enclen = 0, nx = 0;
	int rc;

	if ((rc = check_names(job, backup)) < 0)
		return rc;
	if (k->job[0] && strcmp(k->job, job)) {
		bkt_set_error("shard of job %s uploaded as job %s", k->job, job);
		return -EINVAL;
	}
	mf_hash_hex(mf->hash, hex);
	snprintf(base, sizeof(base), "%s/%s", job, backup);
	if (upload_data && mf->nfiles) {
		/* what a previous run (or another node of the column) left */
		if ((size_t)snprintf(data, sizeof(data), "%s/%s.data/", base, hex) >= sizeof(data))
			return -ENAMETOOLONG;
		rc = list_into(b, data, NULL, &have);
		if (rc < 0)
			goto out;
		x = calloc(mf->nfiles, sizeof(*x));
		names = calloc(mf->nfiles, sizeof(*names));
		if (!x || !names) {
			rc = -ENOMEM;
			goto out;
		}
		for (size_t i = 0; i < mf->n; i++) {
			const struct mf_entry *e = &mf->e[i];
			const struct obj *o;
			uint32_t crc;

			if (e->type != MF_FILE)
				continue;
			o = objs_find(&have, e->path);
			if (o) {
				bool same = o->size == e->size;
				if (same && o->has_crc)
					same = o->crc == e->crc32c;
				else if (same) {
					snprintf(name, sizeof(name), "%s%s", data, e->path);
					rc = bkt_stat(b, name, NULL, &crc);
					if (rc < 0)
						goto out;
					same = crc == e->crc32c;
				}
				if (!same) {
					bkt_set_error("%s/%s%s: already there with other content", bkt_url(b),
						      data, e->path);
					rc = -EEXIST;
					goto out;
				}
				continue;   /* uploaded before: checked, not rewritten */
			}
			if ((size_t)snprintf(name, sizeof(name), "%s%s", data, e->path) >= sizeof(name)) {
				rc = -ENAMETOOLONG;
				goto out;
			}
			names[nx] = strdup(name);
			if (!names[nx]) {
				rc = -ENOMEM;
				goto out;
			}
			x[nx] = (struct bkt_xfer){ .name = names[nx], .fd = -1, .dirfd = dirfd,
						   .path = e->path, .size = e->size,
						   .crc32c = e->crc32c };
			nx++;
		}
		log_dbg(MOD, "%s/%s: %zu of %u files to upload", bkt_url(b), data, nx, mf->nfiles);
		rc = bkt_put_files(b, x, nx);
		if (rc < 0) {
			/* another uploader of the same hash may have won a race */
			char first[1024];
			snprintf(first, sizeof(first), "%s", bkt_last_error());
			rc = 0;
			for (size_t i = 0; i < nx && rc == 0; i++) {
				uint64_t sz;
				uint32_t crc;
				if (x[i].rc == 0)
					continue;
				if (x[i].rc != -EEXIST) {
					rc = x[i].rc;
					bkt_set_error("%s", first);
					break;
				}
				rc = bkt_stat(b, x[i].name, &sz, &crc);
				if (rc == 0 && (sz != x[i].size || crc != x[i].crc32c)) {
					bkt_set_error("%s/%s: already there with other content", bkt_url(b),
						      x[i].name);
					rc = -EEXIST;
				}
			}
			if (rc < 0)
				goto out;
		}
	}
	rc = mf_encode(mf, &enc, &enclen);
	if (rc < 0)
		goto out;
	if ((size_t)snprintf(name, sizeof(name), "%s/%s.manifest", base, hex) >= sizeof(name)) {
		rc = -ENAMETOOLONG;
		goto out;
	}
	rc = put_small_once(b, name, enc, enclen);
	if (rc < 0)
		goto out;
	{
		char meta[NAME_MAX + 1];
		if ((rc = meta_name(meta, sizeof(meta), job, k)) < 0 ||
		    (rc = path3(name, sizeof(name), job, backup, meta)) < 0)
			goto out;
		rc = put_small_once(b, name, hex, 64);
		if (rc == -EEXIST)
			bkt_set_error("%s/%s: this backup already records another shard for job %s "
				      "step %" PRIu64 " node %u worker %u", bkt_url(b), name, job,
				      k->step, k->rank, k->worker);
	}
	if (rc == 0)
		log_info(MOD, "%s/%s: shard of step %" PRIu64 " node %u worker %u uploaded (%s, "
			 "%u files, %" PRIu64 " bytes%s)", bkt_url(b), base, k->step, k->rank,
			 k->worker, hex, mf->nfiles, mf->total, upload_data ? "" : ", data by a peer");
out:
	for (size_t i = 0; names && i < nx; i++)
		free(names[i]);
	free(names);
	free(x);
	free(enc);
	objs_free(&have);
	return rc;
}

/* SHA-256 of the file path in dirfd, read in 1 MiB pieces. */
static int file_sha256(int dirfd, const char *path, uint8_t out[32])
{
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	unsigned int hl = 0;
	uint8_t *buf = malloc(1u << 20);
	int fd = -1, rc = 0;

	if (!ctx || !buf) {
		rc = -ENOMEM;
		goto out;
	}
	fd = openat(dirfd, path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		goto out;
	}
	if (!EVP_DigestInit_ex(ctx, EVP_sha256(), NULL)) {
		rc = -EIO;
		goto out;
	}
	for (;;) {
		ssize_t n = read(fd, buf, 1u << 20);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = -errno;
			goto out;
		}
		if (n == 0)
			break;
		if (!EVP_DigestUpdate(ctx, buf, (size_t)n)) {
			rc = -EIO;
			goto out;
		}
	}
	if (!EVP_DigestFinal_ex(ctx, out, &hl) || hl != 32)
		rc = -EIO;
out:
	if (fd >= 0)
		close(fd);
	free(buf);
	EVP_MD_CTX_free(ctx);
	return rc;
}

int bk_upload_file(struct bkt *b, const char *job, const char *backup,
		   const struct shard_key *k, int dirfd, const struct mf_entry *e,
		   bool upload_data)
{
	char hex[65], name[PATH_MAX], meta[NAME_MAX + 1];
	uint8_t hash[32];
	int rc;

	if ((rc = check_names(job, backup)) < 0)
		return rc;
	if (e->type != MF_FILE)
		return -EINVAL;
	if ((rc = file_sha256(dirfd, e->path, hash)) < 0) {
		bkt_set_error("reading %s: %s", e->path, strerror(-rc));
		return rc;
	}
	mf_hash_hex(hash, hex);
	if ((size_t)snprintf(name, sizeof(name), "%s/%s/%s.data", job, backup, hex) >= sizeof(name))
		return -ENAMETOOLONG;
	if (upload_data) {
		struct bkt_xfer x = { .name = name, .fd = -1, .dirfd = dirfd, .path = e->path,
				      .size = e->size, .crc32c = e->crc32c };
		rc = bkt_put_files(b, &x, 1);
		if (rc == -EEXIST || x.rc == -EEXIST) {
			/* a previous attempt, or a worker with the same bytes:
			 * the same name must hold the same bytes */
			uint64_t sz;
			uint32_t crc;
			rc = bkt_stat(b, name, &sz, &crc);
			if (rc == 0 && (sz != e->size || crc != e->crc32c)) {
				bkt_set_error("%s/%s: already there with other content", bkt_url(b), name);
				rc = -EEXIST;
			}
		}
		if (rc < 0)
			return rc;
	}
	/* the .meta last: a reader never sees it before its data */
	if ((rc = meta_name(meta, sizeof(meta), job, k)) < 0 ||
	    (rc = path3(name, sizeof(name), job, backup, meta)) < 0)
		return rc;
	rc = put_small_once(b, name, hex, 64);
	if (rc == -EEXIST)
		bkt_set_error("%s/%s: this backup already records another file for job %s "
			      "step %" PRIu64 " node %u worker %u", bkt_url(b), name, job,
			      k->step, k->rank, k->worker);
	if (rc == 0)
		log_info(MOD, "%s/%s/%s: worker %u's file of step %" PRIu64 " node %u uploaded "
			 "(%s.data, %" PRIu64 " bytes%s)", bkt_url(b), job, backup, k->worker, k->step,
			 k->rank, hex, e->size, upload_data ? "" : ", data by a peer");
	return rc;
}

/* ---- names of new backups ---- */

int bk_new_name(struct bkt *b, const char *job, time_t t, char out[BK_NAME_MAX])
{
	char stamp[32], prefix[PATH_MAX];
	struct objs o = { 0 };
	struct tm tm;
	int rc;

	if ((rc = check_names(job, NULL)) < 0)
		return rc;
	if (!gmtime_r(&t, &tm) || !strftime(stamp, sizeof(stamp), "%Y-%m-%d_%H-%M", &tm) ||
	    strlen(stamp) != 16)
		return -EINVAL;
	/* Exactly the stamp, never a suffix: GKE's listing regex and Orbax's
	 * converter see nothing else.  One object under JOB/STAMP/ is enough
	 * to say the minute is taken. */
	snprintf(prefix, sizeof(prefix), "%s/%s/", job, stamp);
	rc = list_into(b, prefix, "/", &o);
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
	objs_free(&o);
	return rc;
}

int bk_discard_attempt(struct bkt *b, const char *job, const char *backup)
{
	char prefix[PATH_MAX], name[PATH_MAX];
	struct objs o = { 0 };
	int rc;

	if ((rc = check_names(job, backup)) < 0)
		return rc;
	snprintf(prefix, sizeof(prefix), "%s/%s/", job, backup);
	rc = list_into(b, prefix, NULL, &o);
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
	objs_free(&o);
	return rc;
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
		data_base(v->hash, true, base);
		if (gke_objects(all, base, &first, &count, v->why, sizeof(v->why)) < 0)
			return;
		if (count == 0) {
			snprintf(v->why, sizeof(v->why), "no D%.16s….data/", hex);
			return;
		}
		v->ok = true;
		return;
	}
	snprintf(name, sizeof(name), "%s.manifest", hex);
	if (!objs_find(all, name)) {
		/* GKE's framework: pytorch shard is one worker's file as one
		 * object, hashed alone (BLAKE3, not recomputed here); mtcfs
		 * writes its pytorch-mode backups the same way.  The shard is
		 * there when the object is; its bytes are checked against the
		 * listed size and CRC32C when fetched. */
		snprintf(name, sizeof(name), "%s.data", hex);
		if (objs_find(all, name)) {
			v->file = true;
			v->ok = true;
		} else {
			snprintf(v->why, sizeof(v->why), "no %.16s….manifest", hex);
		}
		return;
	}
	snprintf(path, sizeof(path), "%s/%s/%s.manifest", job, backup, hex);
	rc = read_manifest(b, path, v->hash, &mf);
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
		o = objs_find(all, name);
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
	if (out->nshards == *cap) {
		size_t nc = *cap ? *cap * 2 : 16;
		struct bk_shard *nv = realloc(out->shards, nc * sizeof(*nv));
		if (!nv)
			return -ENOMEM;
		out->shards = nv;
		*cap = nc;
	}
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

int bk_check_backup(struct bkt *b, const char *job, const char *backup, uint32_t nodes,
		    uint32_t workers, struct bk_backup *out)
{
	char prefix[PATH_MAX], name[PATH_MAX];
	struct objs all = { 0 };
	struct verdict *vs = NULL;
	size_t nv = 0, cap = 0;
	uint32_t maxnode = 0, maxworker = 0;
	uint64_t minstep = UINT64_MAX, maxstep = 0;
	bool any = false;
	int rc;

	memset(out, 0, sizeof(*out));
	if ((rc = check_names(job, backup)) < 0)
		return rc;
	snprintf(out->name, sizeof(out->name), "%s", backup);
	snprintf(prefix, sizeof(prefix), "%s/%s/", job, backup);
	rc = list_into(b, prefix, NULL, &all);
	if (rc < 0)
		goto out;
	if (all.n == 0) {
		bkt_set_error("%s/%s: no such backup", bkt_url(b), prefix);
		rc = -ENOENT;
		goto out;
	}
	vs = calloc(all.n, sizeof(*vs));
	if (!vs) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < all.n; i++) {
		const struct obj *o = &all.v[i];
		struct bk_shard s = { 0 };
		size_t k;

		if (strchr(o->name, '/')) {
			if (strstr(o->name, ".data/"))
				out->bytes += o->size;
			continue;
		}
		if (!parse_meta_name(o->name, job, &s.step, &s.node, &s.worker))
			continue;
		any = true;
		if (s.node > maxnode)
			maxnode = s.node;
		if (s.worker > maxworker)
			maxworker = s.worker;
		if (s.step < minstep)
			minstep = s.step;
		if (s.step > maxstep)
			maxstep = s.step;
		snprintf(name, sizeof(name), "%s%s", prefix, o->name);
		rc = read_meta(b, name, s.hash, &s.gke);
		if (rc == -ENOENT || rc == -EBADMSG) {
			snprintf(s.why, sizeof(s.why), "%s: %s", o->name,
				 rc == -ENOENT ? "vanished" : "not a shard hash");
			memset(s.hash, 0, sizeof(s.hash));
			rc = add_shard(out, &cap, &s);
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
			judge_hash(b, job, backup, &all, &vs[nv]);
			nv++;
		}
		s.complete = vs[k].ok;
		s.file = vs[k].file;
		if (!s.complete)
			snprintf(s.why, sizeof(s.why), "%s", vs[k].why);
		rc = add_shard(out, &cap, &s);
		if (rc < 0)
			goto out;
	}
	rc = 0;
	out->complete = any;
	if (!any)
		why_once(out, "no .meta");
	if (!nodes)
		nodes = any ? maxnode + 1 : 0;
	if (!workers)
		workers = any ? maxworker + 1 : 0;
	out->step = any ? maxstep : 0;
	if (any && minstep != maxstep)
		why_once(out, "mixed steps %" PRIu64 " and %" PRIu64, minstep, maxstep);
	/* coverage: every (node, worker) exactly once; nothing outside */
	if (out->nshards)
		qsort(out->shards, out->nshards, sizeof(*out->shards), shard_cmp);
	{
		size_t n0 = out->nshards, j = 0;
		uint32_t lastnode = UINT32_MAX;
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
					if ((rc = add_shard(out, &cap, &s)) < 0)
						goto out;
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
	}
out:
	free(vs);
	objs_free(&all);
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
	if ((rc = check_names(job, NULL)) < 0)
		return rc;
	snprintf(prefix, sizeof(prefix), "%s/", job);
	rc = list_into(b, prefix, "/", &top);
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
	objs_free(&top);
	return rc;
}

int bk_list_backups(struct bkt *b, const char *job, uint32_t nodes, uint32_t workers,
		    struct bk_backup **outp, size_t *np)
{
	return bk_list_backups_until(b, job, nodes, workers, NULL, NULL, outp, np);
}

/* ---- fetch ---- */

static int find_meta(struct bkt *b, const char *job, const char *backup, uint32_t node,
		     uint32_t worker, char *meta, size_t mlen)
{
	char prefix[PATH_MAX];
	struct objs o = { 0 };
	int found = 0, rc;

	if ((size_t)snprintf(prefix, sizeof(prefix), "%s/%s/%s-s", job, backup, job) >= sizeof(prefix))
		return -ENAMETOOLONG;
	rc = list_into(b, prefix, "/", &o);
	if (rc < 0)
		goto out;
	for (size_t i = 0; i < o.n; i++) {
		char nm[NAME_MAX + 1];
		uint64_t st;
		uint32_t nd, w;

		if ((size_t)snprintf(nm, sizeof(nm), "%s-s%s", job, o.v[i].name) >= sizeof(nm))
			continue;
		if (o.v[i].is_prefix || !parse_meta_name(nm, job, &st, &nd, &w) || nd != node ||
		    w != worker)
			continue;
		if (found++)
			continue;
		if ((size_t)snprintf(meta, mlen, "%s/%s/%s", job, backup, nm) >= mlen)
			rc = -ENAMETOOLONG;
	}
	if (found == 0) {
		bkt_set_error("%s/%s/%s: no .meta for node %u worker %u", bkt_url(b), job, backup,
			      node, worker);
		rc = -ENOENT;
	} else if (found > 1) {
		bkt_set_error("%s/%s/%s: %d .meta for node %u worker %u", bkt_url(b), job, backup,
			      found, node, worker);
		rc = -EBADMSG;
	}
out:
	objs_free(&o);
	return rc;
}

/* Download the shard GKE's replicator wrote as D<hash>.data/ into dirfd
 * (dirfd < 0: read every object and discard it, to verify).  Each object is
 * checked against the CRC32C and size the listing gives (gs://; file://
 * lists neither CRC nor anything else to check against).  Directories are
 * made from the files' paths (an empty one, known only by a gcsfuse
 * placeholder, which listings hide, is not made); files get mode 0644
 * (GKE keeps no modes).  Then the manifest is built from what is on
 * disk: its CRC32Cs are of the bytes received. */
static int gke_get(struct bkt *b, const char *job, const char *backup, const uint8_t hash[32],
		   int dirfd, struct manifest **mfp)
{
	char prefix[PATH_MAX], base[67], why[160] = "";
	struct objs all = { 0 };
	struct bkt_xfer *x = NULL;
	char **names = NULL;
	uint64_t *want = NULL;         /* each transfer's size as listed */
	size_t first = 0, count = 0, nx = 0, pl;
	int devnull = -1, rc;

	if (mfp)
		*mfp = NULL;
	data_base(hash, true, base);
	snprintf(prefix, sizeof(prefix), "%s/%s/", job, backup);
	if ((rc = list_into(b, prefix, NULL, &all)) < 0)
		goto out;
	if ((rc = gke_objects(&all, base, &first, &count, why, sizeof(why))) < 0) {
		bkt_set_error("%s/%s: %s", bkt_url(b), prefix, why);
		goto out;
	}
	if (count == 0) {
		bkt_set_error("%s/%s%s.data/: no objects", bkt_url(b), prefix, base);
		rc = -ENOENT;
		goto out;
	}
	pl = strlen(base) + strlen(".data/");
	if (dirfd < 0 && (devnull = open("/dev/null", O_WRONLY | O_CLOEXEC)) < 0) {
		rc = -errno;
		goto out;
	}
	x = calloc(count, sizeof(*x));
	names = calloc(count, sizeof(*names));
	want = calloc(count, sizeof(*want));
	if (!x || !names || !want) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = first; i < first + count; i++) {
		const struct obj *o = &all.v[i];
		const char *rel = o->name + pl;
		size_t rl = strlen(rel);

		if (rl == 0)
			continue;
		if (rel[rl - 1] == '/')
			continue;   /* a directory placeholder (listings hide them) */
		if ((size_t)snprintf(prefix, sizeof(prefix), "%s/%s/%s", job, backup, o->name) >=
		    sizeof(prefix) || !(names[nx] = strdup(prefix))) {
			rc = -ENOMEM;
			goto out;
		}
		x[nx] = (struct bkt_xfer){ .name = names[nx], .fd = devnull, .dirfd = dirfd,
					   .path = rel, .mode = 0644, .has_crc = o->has_crc,
					   .crc32c = o->crc, .size = 0 };
		want[nx++] = o->size;
	}
	rc = bkt_get_files(b, x, nx);
	if (rc < 0) {
		if (rc == -EBADMSG)
			log_err(MOD, "backup %s of job %s: %s", backup, job, bkt_last_error());
		goto out;
	}
	for (size_t i = 0; i < nx; i++) {
		if (x[i].size != want[i]) {
			bkt_set_error("%s/%s: %" PRIu64 " bytes, the listing says %" PRIu64,
				      bkt_url(b), x[i].name, x[i].size, want[i]);
			log_err(MOD, "%s", bkt_last_error());
			rc = -EBADMSG;
			goto out;
		}
	}
	if (mfp)
		rc = mf_build(dirfd, mfp);
out:
	for (size_t i = 0; names && i < nx; i++)
		free(names[i]);
	free(names);
	free(x);
	free(want);
	if (devnull >= 0)
		close(devnull);
	objs_free(&all);
	return rc;
}

/* The single object <hex>.data of JOB/BACKUP into dirfd as fname (dirfd < 0:
 * read it and discard it, to verify).  -EMEDIUMTYPE when <hex> names a
 * manifest: a directory shard. */
static int file_get(struct bkt *b, const char *job, const char *backup, const uint8_t hash[32],
		    int dirfd, const char *fname)
{
	char hex[65], prefix[PATH_MAX], name[PATH_MAX];
	const struct obj *o;
	struct objs all = { 0 };
	struct bkt_xfer x;
	int devnull = -1, rc;

	mf_hash_hex(hash, hex);
	if ((size_t)snprintf(prefix, sizeof(prefix), "%s/%s/%s.", job, backup, hex) >= sizeof(prefix))
		return -ENAMETOOLONG;
	if ((rc = list_into(b, prefix, "/", &all)) < 0)
		goto out;
	/* a short listing, objects and prefixes perhaps not merged in order:
	 * looked through, not searched */
	o = NULL;
	for (size_t i = 0; i < all.n; i++) {
		if (!all.v[i].is_prefix && !strcmp(all.v[i].name, "manifest")) {
			rc = -EMEDIUMTYPE;
			goto out;
		}
		if (!all.v[i].is_prefix && !strcmp(all.v[i].name, "data"))
			o = &all.v[i];
	}
	if (!o) {
		bkt_set_error("%s/%sdata: no such object", bkt_url(b), prefix);
		rc = -ENOENT;
		goto out;
	}
	if ((size_t)snprintf(name, sizeof(name), "%sdata", prefix) >= sizeof(name)) {
		rc = -ENAMETOOLONG;
		goto out;
	}
	if (dirfd < 0 && (devnull = open("/dev/null", O_WRONLY | O_CLOEXEC)) < 0) {
		rc = -errno;
		goto out;
	}
	x = (struct bkt_xfer){ .name = name, .fd = devnull, .dirfd = dirfd, .path = fname,
			       .mode = 0644, .has_crc = o->has_crc, .crc32c = o->crc };
	rc = bkt_get_files(b, &x, 1);
	if (rc < 0) {
		if (rc == -EBADMSG)
			log_err(MOD, "backup %s of job %s: %s", backup, job, bkt_last_error());
		goto out;
	}
	if (x.size != o->size) {
		bkt_set_error("%s/%s: %" PRIu64 " bytes, the listing says %" PRIu64, bkt_url(b),
			      name, x.size, o->size);
		log_err(MOD, "%s", bkt_last_error());
		rc = -EBADMSG;
	}
out:
	if (devnull >= 0)
		close(devnull);
	objs_free(&all);
	return rc;
}

int bk_fetch_file(struct bkt *b, const char *job, const char *backup, uint32_t node,
		  uint32_t worker, int dirfd, const char *fname)
{
	char meta[PATH_MAX];
	uint8_t hash[32];
	bool gke_dir;
	int rc;

	if ((rc = check_names(job, backup)) < 0)
		return rc;
	if (!fname || !util_safe_relpath(fname, strlen(fname)) || strchr(fname, '/'))
		return -EINVAL;
	if ((rc = find_meta(b, job, backup, node, worker, meta, sizeof(meta))) < 0 ||
	    (rc = read_meta(b, meta, hash, &gke_dir)) < 0)
		return rc;
	if (gke_dir)
		return -EMEDIUMTYPE;
	return file_get(b, job, backup, hash, dirfd, fname);
}

int bk_fetch_shard(struct bkt *b, const char *job, const char *backup, uint32_t node,
		   uint32_t worker, int dirfd, struct manifest **mfp)
{
	char meta[PATH_MAX], name[PATH_MAX], hex[65];
	struct manifest *mf = NULL;
	struct bkt_xfer *x = NULL;
	char **names = NULL;
	uint8_t hash[32];
	size_t nx = 0, nnames = 0;
	bool gke;
	int rc;

	*mfp = NULL;
	if ((rc = check_names(job, backup)) < 0)
		return rc;
	if ((rc = find_meta(b, job, backup, node, worker, meta, sizeof(meta))) < 0 ||
	    (rc = read_meta(b, meta, hash, &gke)) < 0)
		goto out;
	if (gke) {
		rc = gke_get(b, job, backup, hash, dirfd, mfp);
		goto out;
	}
	mf_hash_hex(hash, hex);
	snprintf(name, sizeof(name), "%s/%s/%s.manifest", job, backup, hex);
	if ((rc = read_manifest(b, name, hash, &mf)) < 0)
		goto out;
	/* read_manifest's mf_decode applied mf_validate, the rule every peer
	 * and every seal applies too: each entry's parent is a directory of
	 * the shard and symlinks point inside it */
	for (size_t i = 0; i < mf->n; i++) {
		struct stat st;
		if (mf->e[i].type != MF_DIR || mkdirat(dirfd, mf->e[i].path, 0700) == 0)
			continue;
		/* only a real directory may already be there: never write through a link */
		if (errno != EEXIST || fstatat(dirfd, mf->e[i].path, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
		    !S_ISDIR(st.st_mode)) {
			rc = errno == EEXIST ? -EEXIST : -errno;
			bkt_set_error("mkdir %s: %s", mf->e[i].path, strerror(-rc));
			goto out;
		}
	}
	x = calloc(mf->nfiles ? mf->nfiles : 1, sizeof(*x));
	names = calloc(mf->nfiles ? mf->nfiles : 1, sizeof(*names));
	if (!x || !names) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < mf->n; i++) {
		const struct mf_entry *e = &mf->e[i];
		if (e->type != MF_FILE)
			continue;
		snprintf(name, sizeof(name), "%s/%s/%s.data/%s", job, backup, hex, e->path);
		if (!(names[nx] = strdup(name))) {
			rc = -ENOMEM;
			goto out;
		}
		nnames++;
		x[nx] = (struct bkt_xfer){ .name = names[nx], .fd = -1, .dirfd = dirfd,
					   .path = e->path, .mode = 0600, .has_crc = true,
					   .crc32c = e->crc32c };
		nx++;
	}
	rc = bkt_get_files(b, x, nx);
	if (rc < 0) {
		if (rc == -EBADMSG)
			log_err(MOD, "backup %s of job %s, node %u worker %u: %s", backup, job, node,
				worker, bkt_last_error());
		goto out;
	}
	nx = 0;
	for (size_t i = 0; i < mf->n && rc == 0; i++) {
		const struct mf_entry *e = &mf->e[i];
		if (e->type == MF_FILE) {
			if (x[nx].size != e->size) {
				bkt_set_error("%s/%s: %" PRIu64 " bytes, the manifest says %" PRIu64,
					      bkt_url(b), x[nx].name, x[nx].size, e->size);
				log_err(MOD, "%s", bkt_last_error());
				rc = -EBADMSG;
			} else if (fchmodat(dirfd, e->path, e->mode, 0) < 0) {
				rc = -errno;
			}
			nx++;
		} else if (e->type == MF_SYMLINK) {
			unlinkat(dirfd, e->path, 0);
			if (symlinkat(e->target, dirfd, e->path) < 0)
				rc = -errno;
		} else if (e->type == MF_FIFO) {
			/* no data object: the manifest's mode is all of it */
			unlinkat(dirfd, e->path, 0);
			if (mkfifoat(dirfd, e->path, 0600) < 0 ||
			    fchmodat(dirfd, e->path, e->mode & 0777, 0) < 0)
				rc = -errno;
		}
	}
	/* directory modes last: a read-only directory must not block its files */
	for (size_t i = mf->n; rc == 0 && i-- > 0;)
		if (mf->e[i].type == MF_DIR && fchmodat(dirfd, mf->e[i].path, mf->e[i].mode, 0) < 0)
			rc = -errno;
	if (rc < 0)
		goto out;
	*mfp = mf;
	mf = NULL;
out:
	for (size_t i = 0; names && i < nnames; i++)
		free(names[i]);
	free(names);
	free(x);
	mf_free(mf);
	return rc;
}

/* ---- full verification ---- */

int bk_verify_backup(struct bkt *b, const char *job, const char *backup, uint32_t nodes,
		     uint32_t workers, struct bk_backup *out)
{
	char name[PATH_MAX], hex[65];
	int devnull = -1, rc;

	rc = bk_check_backup(b, job, backup, nodes, workers, out);
	if (rc < 0)
		return rc;
	devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
	if (devnull < 0)
		return -errno;
	for (size_t i = 0; i < out->nshards && rc == 0; i++) {
		const struct bk_shard *s = &out->shards[i];
		struct manifest *mf = NULL;
		struct bkt_xfer *x;
		char **names;
		size_t nx = 0;
		bool dup = false;

		if (!s->complete)
			continue;
		for (size_t j = 0; j < i; j++)
			dup |= out->shards[j].complete && !memcmp(out->shards[j].hash, s->hash, 32);
		if (dup)
			continue;           /* same data as a shard already read */
		if (s->gke || s->file) {
			rc = s->gke ? gke_get(b, job, backup, s->hash, -1, NULL) :
				      file_get(b, job, backup, s->hash, -1, NULL);
			if (rc == -EBADMSG) {
				out->complete = false;
				snprintf(out->why, sizeof(out->why), "%s", bkt_last_error());
			}
			continue;
		}
		mf_hash_hex(s->hash, hex);
		snprintf(name, sizeof(name), "%s/%s/%s.manifest", job, backup, hex);
		if ((rc = read_manifest(b, name, s->hash, &mf)) < 0)
			break;
		x = calloc(mf->nfiles ? mf->nfiles : 1, sizeof(*x));
		names = calloc(mf->nfiles ? mf->nfiles : 1, sizeof(*names));
		for (size_t k = 0; x && names && k < mf->n; k++) {
			if (mf->e[k].type != MF_FILE)
				continue;
			snprintf(name, sizeof(name), "%s/%s/%s.data/%s", job, backup, hex, mf->e[k].path);
			if (!(names[nx] = strdup(name)))
				break;
			x[nx] = (struct bkt_xfer){ .name = names[nx], .fd = devnull, .has_crc = true,
						   .crc32c = mf->e[k].crc32c };
			nx++;
		}
		if (!x || !names || nx != mf->nfiles)
			rc = -ENOMEM;
		else
			rc = bkt_get_files(b, x, nx);
		if (rc == -EBADMSG) {
			out->complete = false;
			snprintf(out->why, sizeof(out->why), "%s", bkt_last_error());
			log_err(MOD, "backup %s of job %s: %s", backup, job, bkt_last_error());
		}
		for (size_t k = 0; names && k < nx; k++)
			free(names[k]);
		free(names);
		free(x);
		mf_free(mf);
	}
	close(devnull);
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

	if ((rc = check_names(job, NULL)) < 0)
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

	if ((rc = check_names(job, backup)) < 0)
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

	if ((rc = check_names(job, NULL)) < 0)
		return rc;
	snprintf(name, sizeof(name), "%s/%s", job, BK_RESTORE_VERSION);
	rc = bkt_delete(b, name);
	return rc == -ENOENT ? 0 : rc;
}
