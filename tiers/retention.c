/* retention.c: the retention plan carried out on the RAM tier (see
 * retention.h). Moved from the FUSE front, which now only hears of the
 * drops through ret_hooks. */
#include "tiers/retention.h"
#include "tiers/catalog.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "common/walk.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void forget(const struct ret_hooks *h, const char *name)
{
	if (h && h->forget)
		h->forget(h->arg, name);
}

/* Top-level symlinks into a shard's store directory (a renamed .restore
 * marker: Orbax's <step>, PyTorch's step=<N>) would dangle once the shard
 * goes: remove them with it. */
static void unlink_views(struct ram_tier *ram, const struct shard_key *k)
{
	char rel[512], target[600], buf[600];
	int nsfd = ram_ns_fd(ram);
	const struct dirent *de;
	struct walk_dir d;
	size_t tl;

	if (ram_shard_relpath(k, rel, sizeof(rel)) < 0)
		return;
	snprintf(target, sizeof(target), ".mtcfs/%s", rel);
	tl = strlen(target);
	if (walk_dir_open(&d, nsfd) < 0)
		return;
	while ((de = walk_dir_next(&d)) != NULL) {
		ssize_t l;
		if (de->d_type != DT_LNK)
			continue;
		l = readlinkat(nsfd, de->d_name, buf, sizeof(buf) - 1);
		if (l <= 0)
			continue;
		buf[l] = '\0';
		if (!strncmp(buf, target, tl) && (buf[tl] == '\0' || buf[tl] == '/'))
			unlinkat(nsfd, de->d_name, 0);
	}
	walk_dir_close(&d);
}

/* A framework: pytorch shard's files are also top-level .save names of
 * the app's view: those that are still the shard's own inodes go with it. */
static void unlink_file_views(struct ram_tier *ram, const struct shard_key *k,
			      const struct ret_hooks *h)
{
	int nsfd = ram_ns_fd(ram), sfd;
	const struct dirent *de;
	struct walk_dir d;

	if (ram_shard_walk(ram, k, &d) < 0)
		return;
	sfd = walk_dir_fd(&d);
	while ((de = walk_dir_next(&d)) != NULL) {
		struct stat a, b;
		size_t l = strlen(de->d_name);
		if (l < 6 || strcmp(de->d_name + l - 5, ".save"))
			continue;
		if (fstatat(sfd, de->d_name, &a, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(a.st_mode) &&
		    fstatat(nsfd, de->d_name, &b, AT_SYMLINK_NOFOLLOW) == 0 && a.st_ino == b.st_ino &&
		    unlinkat(nsfd, de->d_name, 0) == 0)
			forget(h, de->d_name);
	}
	walk_dir_close(&d);
}

/* Drop one own shard: its namespace view (when the front says it is still
 * the shard's), its store copy and its record. */
static uint64_t drop_own(struct ram_tier *ram, const struct shard_key *k, uint64_t ns_ino,
			 const struct ret_hooks *h)
{
	char name[NAME_MAX + 1] = "";
	uint64_t freed = 0;
	struct stat st;
	bool in_ns = h && h->release && h->release(h->arg, k, ns_ino, name, sizeof(name));

	in_ns = in_ns && name[0] && ns_ino != 0;
	if (in_ns && fstatat(ram_ns_fd(ram), name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
	    st.st_ino == ns_ino) {
		util_rmtree_at(ram_ns_fd(ram), name, &freed);
		ram_adjust(ram, -(int64_t)freed);   /* ram_drop accounts its own */
	}
	unlink_views(ram, k);
	unlink_file_views(ram, k, h);
	life_name_forget(ram_idx(ram), k);
	ram_drop(ram, k, &freed);
	metrics_add(MC_GC_DROPPED, 1);
	if (in_ns)
		forget(h, name);
	forget(h, ".mtcfs");
	log_info("gc", "dropped job=%s step=%llu rank=%u freed=%llu worker=%u", k->job,
		 (unsigned long long)k->step, k->rank, (unsigned long long)freed, k->worker);
	return freed;
}

/* Drop one replica (a shard of another node held here), or a step's
 * parity holding (rs:K+M: it goes as the step's replicas do). */
static uint64_t drop_replica(struct ram_tier *ram, const struct shard_key *k,
			     const struct ret_hooks *h)
{
	uint64_t freed = 0;

	ram_drop(ram, k, &freed);
	metrics_add(MC_GC_DROPPED, 1);
	forget(h, ".mtcfs");
	if (life_is_parity(k)) {
		log_info("gc", "ec: job=%s step=%llu fragments dropped bytes=%llu", k->job,
			 (unsigned long long)k->step, (unsigned long long)freed);
		return freed;
	}
	log_info("gc", "dropped replica job=%s step=%llu node=%u freed=%llu worker=%u", k->job,
		 (unsigned long long)k->step, k->rank, (unsigned long long)freed, k->worker);
	return freed;
}

static uint64_t drop(struct ram_tier *ram, const struct life_drop *d, const struct ret_hooks *h)
{
	const struct shard_rec *r = d->rec;
	return d->own ? drop_own(ram, &r->key, r->ns_ino, h) : drop_replica(ram, &r->key, h);
}

uint64_t ret_collect(struct ram_tier *ram, const struct life_in *in, const struct ret_hooks *h)
{
	struct shard_rec *recs = NULL;
	struct life_drop *d = NULL;
	size_t n = 0, nd = 0;
	uint64_t freed = 0;

	if (idx_list_records(ram_idx(ram), in->want ? NULL : in->job, &recs, &n) < 0)
		return 0;
	d = calloc(n ? n : 1, sizeof(*d));
	if (d && life_plan_gc(in, recs, n, d, &nd) == 0) {
		for (size_t i = 0; i < nd && (!in->want || freed < in->want); i++) {
			const struct shard_rec *r = d[i].rec;
			/* a backup may have pinned it since the plan was made */
			if (in->pinned && in->pinned(in->pin_arg, r->key.job, r->key.step))
				continue;
			freed += drop(ram, &d[i], h);
			if (d[i].why == LIFE_OTHER_JOB && !life_is_parity(&r->key))
				log_warn("gc", "RAM tier full: job %s is not the current job (%s): step %llu node %u dropped for room",
					 r->key.job, in->job, (unsigned long long)r->key.step, r->key.rank);
		}
	}
	free(d);
	idx_recs_free(recs, n);
	return freed;
}

void ret_drop_newer(struct ram_tier *ram, const char *job, uint32_t rank, uint64_t step,
		    const struct ret_hooks *h)
{
	struct shard_rec *recs = NULL;
	struct life_drop *d = NULL;
	size_t n = 0, nd = 0;

	if (idx_list_records(ram_idx(ram), job, &recs, &n) < 0)
		return;
	d = calloc(n ? n : 1, sizeof(*d));
	if (d && life_plan_newer(job, rank, step, recs, n, d, &nd) == 0) {
		for (size_t i = 0; i < nd; i++) {
			const struct shard_rec *r = d[i].rec;
			if (life_is_parity(&r->key))
				log_info("gc", "job %s step %llu's parity is newer than the restored step %llu: dropped",
					 job, (unsigned long long)r->key.step, (unsigned long long)step);
			else
				log_info("gc", "job %s step %llu node %u is newer than the restored step %llu: dropped",
					 job, (unsigned long long)r->key.step, r->key.rank,
					 (unsigned long long)step);
			drop(ram, &d[i], h);
		}
	}
	free(d);
	idx_recs_free(recs, n);
}
