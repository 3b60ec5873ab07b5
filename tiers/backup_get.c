/* backup: fetching a shard or file of a backup, and verifying a backup's
 * bytes (see backup.h, backup_i.h). */
#include "tiers/backup.h"
#include "tiers/backup_i.h"
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
#include <unistd.h>

/* ---- fetch ---- */

static int find_meta(struct bkt *b, const char *job, const char *backup, uint32_t node,
		     uint32_t worker, char *meta, size_t mlen)
{
	char prefix[PATH_MAX];
	struct objs o = { 0 };
	int found = 0, rc;

	if ((size_t)snprintf(prefix, sizeof(prefix), "%s/%s/%s-s", job, backup, job) >= sizeof(prefix))
		return -ENAMETOOLONG;
	rc = bk_list_into(b, prefix, "/", &o);
	if (rc < 0)
		goto out;
	for (size_t i = 0; i < o.n; i++) {
		char nm[NAME_MAX + 1];
		uint64_t st;
		uint32_t nd, w;

		if ((size_t)snprintf(nm, sizeof(nm), "%s-s%s", job, o.v[i].name) >= sizeof(nm))
			continue;
		if (o.v[i].is_prefix || !bk_parse_meta_name(nm, job, &st, &nd, &w) || nd != node ||
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
	bk_objs_free(&o);
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
	bk_data_base(hash, true, base);
	snprintf(prefix, sizeof(prefix), "%s/%s/", job, backup);
	if ((rc = bk_list_into(b, prefix, NULL, &all)) < 0)
		goto out;
	if ((rc = bk_gke_objects(&all, base, &first, &count, why, sizeof(why))) < 0) {
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
	/* GKE keeps no owners: the copy's are the publisher's rule */
	if (mfp)
		rc = mf_build_ownerless(dirfd, mfp);
out:
	for (size_t i = 0; names && i < nx; i++)
		free(names[i]);
	free(names);
	free(x);
	free(want);
	if (devnull >= 0)
		close(devnull);
	bk_objs_free(&all);
	return rc;
}

/* The single object <hex>.data of JOB/BACKUP into dirfd as fname (dirfd < 0:
 * read it and discard it, to verify).  -EMEDIUMTYPE when <hex> names a
 * manifest: a directory shard. */
static int file_get(struct bkt *b, const char *job, const char *backup, const uint8_t hash[32],
		    int dirfd, const char *fname, uint64_t max_bytes)
{
	char hex[65], prefix[PATH_MAX], name[PATH_MAX];
	const struct obj *o;
	struct objs all = { 0 };
	struct bkt_xfer x;
	int devnull = -1, rc;

	mf_hash_hex(hash, hex);
	if ((size_t)snprintf(prefix, sizeof(prefix), "%s/%s/%s.", job, backup, hex) >= sizeof(prefix))
		return -ENAMETOOLONG;
	if ((rc = bk_list_into(b, prefix, "/", &all)) < 0)
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
	if (max_bytes && o->size > max_bytes) {
		bkt_set_error("%s/%s: %" PRIu64 " bytes, more than this node can hold (%" PRIu64 ")",
			      bkt_url(b), name, o->size, max_bytes);
		log_err(MOD, "backup %s of job %s: %s", backup, job, bkt_last_error());
		rc = -EFBIG;
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
	bk_objs_free(&all);
	return rc;
}

int bk_fetch_file(struct bkt *b, const char *job, const char *backup, uint32_t node,
		  uint32_t worker, int dirfd, const char *fname, uint64_t max_bytes)
{
	char meta[PATH_MAX];
	uint8_t hash[32];
	bool gke_dir;
	int rc;

	if ((rc = bk_check_names(job, backup)) < 0)
		return rc;
	if (!fname || !util_safe_relpath(fname, strlen(fname)) || strchr(fname, '/'))
		return -EINVAL;
	if ((rc = find_meta(b, job, backup, node, worker, meta, sizeof(meta))) < 0 ||
	    (rc = bk_read_meta(b, meta, hash, &gke_dir)) < 0)
		return rc;
	if (gke_dir)
		return -EMEDIUMTYPE;
	return file_get(b, job, backup, hash, dirfd, fname, max_bytes);
}

/* Before a byte of data: the manifest's files fit in max_bytes (0: no
 * bound; the caller's: ram_size or more, see tier_bucket.c), and each is an object of the size the manifest says. A manifest
 * claiming a 1 TiB file was read for 413 s before the CRC refused it.
 * One listing of <hex>.data/ (pages of 1000 on gs://). 0, -EFBIG, -EBADMSG
 * or -errno, the error set. */
static int sizes_check(struct bkt *b, const char *job, const char *backup, const char *hex,
		       const struct manifest *mf, uint64_t max_bytes)
{
	char prefix[PATH_MAX];
	struct objs all = { 0 };
	uint64_t total = 0;
	int rc = 0;

	for (size_t i = 0; i < mf->n; i++) {
		if (mf->e[i].type != MF_FILE)
			continue;
		if (mf->e[i].size > UINT64_MAX - total)
			total = UINT64_MAX;
		else
			total += mf->e[i].size;
	}
	if (max_bytes && total > max_bytes) {
		bkt_set_error("%s/%s/%s/%s.manifest: its files hold %" PRIu64 " bytes, more than "
			      "this node can hold (%" PRIu64 ")", bkt_url(b), job, backup, hex,
			      total, max_bytes);
		return -EFBIG;
	}
	if ((size_t)snprintf(prefix, sizeof(prefix), "%s/%s/%s.data/", job, backup, hex) >=
	    sizeof(prefix))
		return -ENAMETOOLONG;
	if ((rc = bk_list_into(b, prefix, NULL, &all)) < 0)
		goto out;
	for (size_t i = 0; i < mf->n; i++) {
		const struct mf_entry *e = &mf->e[i];
		const struct obj *o;
		if (e->type != MF_FILE)
			continue;
		o = bk_objs_find(&all, e->path);
		if (!o) {
			bkt_set_error("%s/%s%s: no such object", bkt_url(b), prefix, e->path);
			rc = -ENOENT;
			goto out;
		}
		if (o->size != e->size) {
			bkt_set_error("%s/%s%s: %" PRIu64 " bytes, the manifest says %" PRIu64,
				      bkt_url(b), prefix, e->path, o->size, e->size);
			rc = -EBADMSG;
			goto out;
		}
	}
out:
	bk_objs_free(&all);
	return rc;
}

int bk_fetch_shard(struct bkt *b, const char *job, const char *backup, uint32_t node,
		   uint32_t worker, int dirfd, struct manifest **mfp, uint64_t max_bytes)
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
	if ((rc = bk_check_names(job, backup)) < 0)
		return rc;
	if ((rc = find_meta(b, job, backup, node, worker, meta, sizeof(meta))) < 0 ||
	    (rc = bk_read_meta(b, meta, hash, &gke)) < 0)
		goto out;
	if (gke) {
		rc = gke_get(b, job, backup, hash, dirfd, mfp);
		goto out;
	}
	mf_hash_hex(hash, hex);
	snprintf(name, sizeof(name), "%s/%s/%s.manifest", job, backup, hex);
	if ((rc = bk_read_manifest(b, name, hash, &mf)) < 0)
		goto out;
	if ((rc = sizes_check(b, job, backup, hex, mf, max_bytes)) < 0) {
		if (rc == -EBADMSG || rc == -EFBIG)
			log_err(MOD, "backup %s of job %s, node %u worker %u: %s", backup, job, node,
				worker, bkt_last_error());
		goto out;
	}
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
			} else if (fchmodat(dirfd, e->path, mf_restore_mode(e), 0) < 0) {
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
			    fchmodat(dirfd, e->path, mf_restore_mode(e), 0) < 0)
				rc = -errno;
		}
	}
	/* directory modes last: a read-only directory must not block its files */
	for (size_t i = mf->n; rc == 0 && i-- > 0;)
		if (mf->e[i].type == MF_DIR && fchmodat(dirfd, mf->e[i].path, mf_restore_mode(&mf->e[i]), 0) < 0)
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
				      file_get(b, job, backup, s->hash, -1, NULL, 0);
			if (rc == -EBADMSG) {
				out->complete = false;
				snprintf(out->why, sizeof(out->why), "%s", bkt_last_error());
			}
			continue;
		}
		mf_hash_hex(s->hash, hex);
		snprintf(name, sizeof(name), "%s/%s/%s.manifest", job, backup, hex);
		if ((rc = bk_read_manifest(b, name, s->hash, &mf)) < 0)
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
