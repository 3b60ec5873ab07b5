#include "tiers/restore.h"
#include "tiers/lifecycle.h"
#include "tiers/tier.h"
#include "common/log.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *restore_source_name(enum restore_source s)
{
	switch (s) {
	case RS_LOCAL: return "local";
	case RS_PEER: return "peer";
	case RS_BUCKET: return "bucket";
	default: return "none";
	}
}

/* ---------- the round ---------- */

/* Worker w's shard of plan p made present. *whole: it brought every
 * worker's file (nothing more to obtain). */
static int obtain_worker(const struct restore_planner *pl, const struct restore_plan *p,
			 uint32_t w, bool *whole, char *why, size_t whylen)
{
	struct tier t = { 0 }, *src = &t;
	struct tier_get g = { .ram = pl->ram };
	int rc;

	g.as = p->key;
	g.as.worker = w;
	g.want = g.as;
	rc = pl->source(pl->arg, p, w, &t, &g, why, whylen);
	if (rc == 0)
		rc = tier_obtain(&src, 1, &g, why, whylen);
	*whole = rc == 0 && g.whole;
	tier_close(&t);
	return rc == RESTORE_SKIP ? 0 : rc;
}

int restore_run(const struct restore_planner *pl, struct restore_plan *p)
{
	int rc = pl->plan(pl->arg, p);

	while (rc == 0) {
		char why[512] = "";
		bool whole = false;
		uint32_t w = 0;

		if (pl->prerestore)
			pl->prerestore(pl->pre_arg, p);
		for (; p->found && w < pl->workers && !whole && rc == 0; w++)
			rc = obtain_worker(pl, p, w, &whole, why, sizeof(why));
		if (rc < 0) {
			if (!why[0])
				snprintf(why, sizeof(why), "%s", strerror(-rc));
			rc = pl->failed(pl->arg, p, w - 1, why);
			continue;
		}
		rc = pl->ready(pl->arg, p);
		if (rc != RESTORE_REPLAN)
			return rc;
		rc = 0;
	}
	return rc;
}

/* ---------- a node on its own ---------- */

struct local {
	struct ram_tier *t;
	const char *job;
	uint32_t rank, workers;
	uint64_t below;             /* steps from here up failed this round */
	restore_report_fn report;
	void *arg;
};

/* The record of (rank, w) at recs[b..e) (one step), or NULL. */
static struct shard_rec *rec_of(struct shard_rec *recs, size_t b, size_t e, uint32_t rank,
				uint32_t w)
{
	for (size_t i = b; i < e; i++)
		if (recs[i].key.rank == rank && recs[i].key.worker == w)
			return &recs[i];
	return NULL;
}

static void report_bad(const struct local *l, const struct shard_rec *r)
{
	char line[512];

	snprintf(line, sizeof(line),
		 "job %s step %llu node %u: its files no longer match the manifest (found at start-up); not restoring it",
		 r->key.job, (unsigned long long)r->key.step, r->key.rank);
	if (l->report)
		l->report(l->arg, line);
}

static bool usable(const struct shard_rec *r)
{
	return r && r->state >= SH_COMMITTED && r->state != SH_BAD;
}

/* Whether step recs[b..e) can be this node's plan (see restore_local). */
static bool step_ok(const struct local *l, struct shard_rec *recs, size_t b, size_t e)
{
	struct shard_rec *r0 = rec_of(recs, b, e, l->rank, 0);
	bool others = false;

	if (!r0 || (l->workers > 1 && !(r0->flags & SHF_OWN)))
		return false;
	if (r0->state == SH_BAD) {
		report_bad(l, r0);
		return false;
	}
	if (!usable(r0))
		return false;
	if (l->workers <= 1)
		return true;
	for (uint32_t w = 1; w < l->workers; w++)
		others |= rec_of(recs, b, e, l->rank, w) != NULL;
	if (!others)   /* only worker 0 saved this step (a directory step is
			* worker 0's alone), unless a restore brought them all */
		return (r0->flags & SHF_RESTORED) || r0->ns_ino != 0;
	for (uint32_t w = 1; w < l->workers; w++) {
		struct shard_rec *r = rec_of(recs, b, e, l->rank, w);
		if (!usable(r) || !(r->flags & SHF_OWN))
			return false;
	}
	return true;
}

static int local_plan(void *arg, struct restore_plan *p)
{
	struct local *l = arg;
	struct shard_rec *recs = NULL;
	size_t n = 0, e;
	int rc;

	memset(p, 0, sizeof(*p));
	rc = idx_list_shards(ram_idx(l->t), l->job, &recs, &n);
	if (rc < 0)
		return rc;
	/* recs ascend by step: walk the steps from the newest */
	for (e = n; e > 0 && !p->found;) {
		size_t b = e;

		while (b > 0 && recs[b - 1].key.step == recs[e - 1].key.step)
			b--;
		if (recs[b].key.step < l->below && step_ok(l, recs, b, e)) {
			p->found = true;
			p->step = recs[b].key.step;
			p->key = rec_of(recs, b, e, l->rank, 0)->key;
			p->source = RS_LOCAL;
		}
		e = b;
	}
	idx_recs_free(recs, n);
	return 0;
}

/* Worker w's own shard, in place: the RAM tier verifies it. A worker
 * without a shard of its own has its file in worker 0's (step_ok). */
static int local_source(void *arg, const struct restore_plan *p, uint32_t w, struct tier *t,
			struct tier_get *g, char *why, size_t whylen)
{
	struct local *l = arg;
	struct shard_rec rec = { 0 };
	int rc;

	(void)p;
	(void)why;
	(void)whylen;
	if (w > 0) {
		rc = idx_get_shard(ram_idx(l->t), &g->want, &rec);
		idx_rec_clear(&rec);
		if (rc == -ENOENT)
			return RESTORE_SKIP;
	}
	tier_ram_init(l->t, t);
	return 0;
}

static int local_failed(void *arg, struct restore_plan *p, uint32_t w, const char *why)
{
	struct local *l = arg;
	char line[768], wk[32] = "";

	if (l->workers > 1)
		snprintf(wk, sizeof(wk), " worker %u", w);
	snprintf(line, sizeof(line), "job %s step %llu node %u%s: %s; not restoring it", l->job,
		 (unsigned long long)p->step, l->rank, wk, why);
	log_err("restore", "%s", line);
	if (l->report)
		l->report(l->arg, line);
	l->below = p->step;
	return local_plan(l, p);
}

static int local_ready(void *arg, struct restore_plan *p)
{
	(void)arg;
	(void)p;
	return 0;   /* the job is this node */
}

int restore_local(struct ram_tier *t, const char *job, uint32_t rank, uint32_t workers,
		  restore_report_fn report, void *arg,
		  void (*prerestore)(void *arg, const struct restore_plan *p),
		  struct restore_plan *plan)
{
	struct local l = { .t = t, .job = job, .rank = rank, .workers = workers ? workers : 1,
			   .below = UINT64_MAX, .report = report, .arg = arg };
	struct restore_planner pl = {
		.arg = &l, .ram = t, .workers = l.workers,
		.plan = local_plan, .source = local_source, .failed = local_failed,
		.ready = local_ready, .prerestore = prerestore, .pre_arg = arg,
	};

	return restore_run(&pl, plan);
}
