/* backup: uploads of one shard or one file into a backup (see backup.h,
 * backup_i.h). */
#include "tiers/backup.h"
#include "tiers/backup_i.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* The .meta of shard k (its 64 hex digits): what makes the upload visible,
 * so written last. what ("shard", "file") names it in the -EEXIST message
 * when the backup already records other content for k. */
static int put_meta(struct bkt *b, const char *job, const char *backup,
		    const struct shard_key *k, const char *hex, const char *what)
{
	char meta[NAME_MAX + 1], name[PATH_MAX];
	int rc;

	if ((rc = bk_meta_name(meta, sizeof(meta), job, k)) < 0 ||
	    (rc = bk_path3(name, sizeof(name), job, backup, meta)) < 0)
		return rc;
	rc = put_small_once(b, name, hex, 64);
	if (rc == -EEXIST)
		bkt_set_error("%s/%s: this backup already records another %s for job %s "
			      "step %" PRIu64 " node %u worker %u", bkt_url(b), name, what, job,
			      k->step, k->rank, k->worker);
	return rc;
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

	if ((rc = bk_check_names(job, backup)) < 0)
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
		rc = bk_list_into(b, data, NULL, &have);
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
			o = bk_objs_find(&have, e->path);
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
	rc = put_meta(b, job, backup, k, hex, "shard");
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
	bk_objs_free(&have);
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
	char hex[65], name[PATH_MAX];
	uint8_t hash[32];
	int rc;

	if ((rc = bk_check_names(job, backup)) < 0)
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
	rc = put_meta(b, job, backup, k, hex, "file");
	if (rc == 0)
		log_info(MOD, "%s/%s/%s: worker %u's file of step %" PRIu64 " node %u uploaded "
			 "(%s.data, %" PRIu64 " bytes%s)", bkt_url(b), job, backup, k->worker, k->step,
			 k->rank, hex, e->size, upload_data ? "" : ", data by a peer");
	return rc;
}
