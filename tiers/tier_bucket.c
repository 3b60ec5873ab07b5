/* tier_bucket.c — a backup in the bucket as a source, and as a place to
 * put shards (see tier.h; the layout is backup.h's). */
#include "tiers/tier.h"
#include "tiers/backup.h"
#include "common/log.h"
#include "common/metrics.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* The most a backup's files may claim (their sizes as the manifest or the
 * listing gives them), checked before a byte is read: a manifest naming a
 * 1 TiB file was read for 413 s before its CRC refused it. A file with
 * holes may be larger than ram_size (tiers count blocks; test_backup_restore
 * 2c: 256 MiB with 8 KiB of data in a 64 MiB tier), so the bound is the
 * larger of ram_size and the file system holding RAMDIR: a checkpoint
 * larger than the node's whole tmpfs is no checkpoint of this node. */
static uint64_t fetch_bound(const struct tier_get *g, int dirfd)
{
	uint64_t cap = ram_cap(g->ram);
	struct statvfs sv;

	if (fstatvfs(dirfd, &sv) == 0 && (uint64_t)sv.f_blocks * sv.f_frsize > cap)
		cap = (uint64_t)sv.f_blocks * sv.f_frsize;
	return cap;
}

/* This node's shard of backup g->backup into dirfd.  framework: pytorch
 * backups hold one file per worker (GKE's layout, which mtcfs writes too):
 * each comes back under the worker's .save name, so the node's shard is
 * what its workers saved; a backup of the older mtcfs layout (one shard
 * holding every worker's file, with a manifest) is read whole. */
static int fetch_backup(struct bkt *b, const struct tier_get *g, int dirfd, struct manifest **mf)
{
	/* the backup's node g->want.rank (a column mate's under D when the
	 * backup is of a smaller job), saved under this node's names */
	uint32_t rank = g->as.rank, node = g->want.rank;
	int rc = -EMEDIUMTYPE;

	if (g->save_files) {
		/* with one shard per worker, fetch_backup_w() */
		for (uint32_t w = 0; w < g->workers_per_node; w++) {
			char fn[NAME_MAX + 1];
			if ((size_t)snprintf(fn, sizeof(fn), "%s-s%llu-n%u-w%u.save", g->as.job,
					     (unsigned long long)g->as.step, rank, w) >= sizeof(fn))
				return -ENAMETOOLONG;
			rc = bk_fetch_file(b, g->as.job, g->backup, node, w, dirfd, fn, fetch_bound(g, dirfd));
			if (rc == -EMEDIUMTYPE && w == 0)
				break;
			if (rc < 0)
				return rc;
		}
		if (rc == 0)
			return mf_build_ownerless(dirfd, mf);   /* GKE's layout: no owners */
	}
	return bk_fetch_shard(b, g->as.job, g->backup, node, 0, dirfd, mf, fetch_bound(g, dirfd));
}

/* Worker w's file of backup g->backup into dirfd, as that worker's own
 * shard (one shard per worker). *whole: the backup is of the older mtcfs
 * layout (one shard holding every worker's file): it was fetched whole
 * into dirfd, as worker 0's shard. */
static int fetch_backup_w(struct bkt *b, const struct tier_get *g, uint32_t w, int dirfd,
			  struct manifest **mf, bool *whole)
{
	uint32_t rank = g->as.rank, node = g->want.rank;
	char fn[NAME_MAX + 1];
	int rc;

	*whole = false;
	if ((size_t)snprintf(fn, sizeof(fn), "%s-s%llu-n%u-w%u.save", g->as.job,
			     (unsigned long long)g->as.step, rank, w) >= sizeof(fn))
		return -ENAMETOOLONG;
	rc = bk_fetch_file(b, g->as.job, g->backup, node, w, dirfd, fn, fetch_bound(g, dirfd));
	if (rc == 0)
		return mf_build_ownerless(dirfd, mf);   /* GKE's layout: no owners */
	if (rc != -EMEDIUMTYPE || w != 0)
		return rc;
	*whole = true;
	return bk_fetch_shard(b, g->as.job, g->backup, node, 0, dirfd, mf, fetch_bound(g, dirfd));
}

static int bucket_get(void *self, struct tier_get *g, struct ram_stage *st, struct manifest **mf,
		      char *why, size_t whylen)
{
	struct bkt *b = self;
	int rc;

	rc = ram_stage_begin(g->ram, &g->as, st);
	if (rc == 0)
		rc = g->save_files && g->workers_per_node > 1 ?
		     fetch_backup_w(b, g, g->as.worker, st->fd, mf, &g->whole) :
		     fetch_backup(b, g, st->fd, mf);
	if (rc < 0)
		snprintf(why, whylen, "backup %s: %s", g->backup, bkt_last_error());
	return rc;
}

static void bucket_got(void *self, const struct tier_get *g, const struct manifest *mf, int rc,
		       char *why, size_t whylen)
{
	if (rc < 0)
		return;
	ram_recount(g->ram);
	metrics_add(MC_RESTORE_BYTES, mf->total);
	log_info("engine", "restored job=%s step=%llu from backup %s bytes=%llu worker=%u",
		 g->as.job, (unsigned long long)g->as.step, g->backup,
		 (unsigned long long)mf->total, g->as.worker);
}

static const struct tier_ops bucket_tier_ops = {
	.name = "bucket",
	.get = bucket_get,
	.got = bucket_got,
};

void tier_bucket_init(struct bkt *b, struct tier *t)
{
	t->ops = &bucket_tier_ops;
	t->self = b;
}

/* A backup as a place to put shards into. */
struct bucket_backup {
	struct bkt *b;
	char job[IDX_JOB_MAX + 1];
	char backup[BK_NAME_MAX];
	bool upload_data;
};

static int backup_put(void *self, struct ram_tier *ram, const struct shard_key *k,
		      const uint8_t *raw, size_t rawlen, const struct manifest *mf)
{
	struct bucket_backup *bb = self;
	int dfd = ram_shard_open(ram, k), rc;

	if (dfd < 0)
		return dfd;
	rc = bk_upload_shard(bb->b, bb->job, bb->backup, k, dfd, mf, bb->upload_data);
	close(dfd);
	return rc;
}

static void backup_close(void *self)
{
	free(self);
}

static const struct tier_ops bucket_backup_ops = {
	.name = "bucket",
	.put = backup_put,
	.close = backup_close,
};

int tier_bucket_backup_open(struct bkt *b, const char *job, const char *backup, bool upload_data,
			    struct tier *t)
{
	struct bucket_backup *bb = calloc(1, sizeof(*bb));

	if (!bb)
		return -ENOMEM;
	bb->b = b;
	snprintf(bb->job, sizeof(bb->job), "%s", job);
	snprintf(bb->backup, sizeof(bb->backup), "%s", backup);
	bb->upload_data = upload_data;
	t->ops = &bucket_backup_ops;
	t->self = bb;
	return 0;
}
