/* retain.c: when the retention runs, and from what value. The plan and its
 * execution are below (tiers/lifecycle, tiers/retention); this file only
 * gathers what may go -- the job and rank of this node, the step kept
 * job-wide (the engine), the restored step, the backups' pins -- and
 * answers the two callbacks: release (a dropped own shard leaves the step
 * table, and its step directory goes if it is still the app's view) and
 * forget (the kernel's caches of a name that went). Entry points: the
 * engine's LKG event, the RAM tier's reclaim, a sealed commit and the
 * control thread after a restore. */
#include "fs/fs_i.h"
#include "common/log.h"
#include "tiers/retention.h"

#include <stdio.h>
#include <string.h>

static bool pinned_cb(void *eng, const char *job, uint64_t step)
{
	return eng_pinned(eng, job, step);
}

static bool release_cb(void *arg, const struct shard_key *k, uint64_t ns_ino, char *name,
		       size_t len)
{
	struct fs *fs = arg;
	struct fs_step *s;
	bool in_ns = false;

	name[0] = '\0';
	pthread_mutex_lock(&fs->mu);
	s = fs_step_find_w(fs, k->step, k->worker);
	if (s && !strcmp(s->job, k->job) && s->rank == k->rank) {
		in_ns = s->visible && s->dir_ino == ns_ino && ns_ino != 0;
		if (in_ns)
			snprintf(name, len, "%s", s->name);
		fs_step_remove(fs, k->step, k->worker);
	}
	pthread_mutex_unlock(&fs->mu);
	return in_ns;
}

static void forget_cb(void *arg, const char *name)
{
	struct fs *fs = arg;
	fs->front->forget_name(fs, name);
}

static const struct ret_hooks *hooks(struct fs *fs, struct ret_hooks *h)
{
	*h = (struct ret_hooks){ .release = release_cb, .forget = forget_cb, .arg = fs };
	return h;
}

/* Routine GC (want 0) keeps every step from the one committed and
 * replicated job-wide; under RAM pressure the LKG is enough, and shards of
 * earlier jobs go too (DESIGN §4-5). Returns bytes freed. */
static uint64_t collect(struct fs *fs, uint64_t want)
{
	struct life_in in = { .want = want, .pinned = pinned_cb, .pin_arg = fs->eng };
	struct job_now now;
	struct ret_hooks h;

	fs_identity(fs, &now);
	pthread_mutex_lock(&fs->mu);
	in.restored_step = fs->restored_step;
	in.have_restored = fs->have_restored;
	pthread_mutex_unlock(&fs->mu);
	in.rank = (uint32_t)now.rank;
	in.workers = now.workers;
	in.job = now.job;
	in.cluster = fs->eng != NULL;
	if (in.cluster)
		in.have_step = want ? eng_lkg(fs->eng, now.job, &in.step)
				    : eng_gc_step(fs->eng, now.job, &in.step);
	if (!want && in.cluster && !in.have_step)
		return 0;   /* nothing is known job-wide yet: keep all */
	return ret_collect(fs->ram, &in, hooks(fs, &h));
}

void retain_gc(struct fs *fs)
{
	collect(fs, 0);
}

/* After a restore of `step`, shards of later steps belong to a timeline
 * the job abandoned; keeping them could later combine with new commits of
 * the same step numbers into a mixed checkpoint. Drop them. */
void retain_drop_newer(struct fs *fs, const char *job, uint64_t step)
{
	struct job_now now;
	struct ret_hooks h;

	fs_identity(fs, &now);
	ret_drop_newer(fs->ram, job, (uint32_t)now.rank, step, hooks(fs, &h));
}

static void gc_job(void *arg)
{
	retain_gc(arg);
}

/* The coordinator moved the job-wide LKG: collect on the seal worker. */
void retain_on_lkg(void *arg, const char *job, uint64_t step)
{
	struct fs *fs = arg;
	bool eager;

	(void)job;
	(void)step;
	pthread_mutex_lock(&fs->mu);
	eager = fs->eager_gc;
	pthread_mutex_unlock(&fs->mu);
	if (eager)
		workq_submit(fs->sealq, gc_job, fs);
}

/* ram_reserve()'s reclaim callback: runs under the RAM tier's reclaim_mu
 * (DESIGN.md LOCKING: under it this takes fs->mu, the engine's mu,
 * a RAM key and the catalog, each alone). */
uint64_t retain_reclaim(void *arg, uint64_t want)
{
	struct fs *fs = arg;
	uint64_t freed = collect(fs, want);

	if (freed)
		log_info("ram", "reclaimed %llu bytes for a write of %llu",
			 (unsigned long long)freed, (unsigned long long)want);
	else
		log_warn("ram", "RAM tier full (%llu of %llu bytes) and nothing may be dropped",
			 (unsigned long long)ram_used(fs->ram), (unsigned long long)ram_cap(fs->ram));
	return freed;
}
