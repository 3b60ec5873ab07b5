#include "tiers/restore.h"
#include "tiers/lifecycle.h"
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

int restore_plan_local(struct ram_tier *t, const char *job, uint32_t rank,
		       restore_report_fn report, void *arg, struct restore_plan *plan)
{
	struct shard_rec *recs = NULL;
	size_t n = 0;
	int rc;

	memset(plan, 0, sizeof(*plan));
	rc = idx_list_shards(ram_idx(t), job, &recs, &n);
	if (rc < 0)
		return rc;
	/* recs ascend by step: walk from the newest */
	for (size_t i = n; i-- > 0;) {
		struct shard_rec *r = &recs[i];
		char err[512], line[768];

		if (r->key.rank != rank || r->key.worker != 0)
			continue;
		if (r->state == SH_BAD) {
			snprintf(line, sizeof(line),
				 "job %s step %llu node %u: its files no longer match the manifest (found at start-up); not restoring it",
				 r->key.job, (unsigned long long)r->key.step, r->key.rank);
			if (report)
				report(arg, line);
			continue;
		}
		if (r->state < SH_COMMITTED)
			continue;
		rc = ram_verify(t, &r->key, err, sizeof(err));
		if (rc == 0) {
			plan->found = true;
			plan->step = r->key.step;
			plan->key = r->key;
			plan->source = RS_LOCAL;
			break;
		}
		snprintf(line, sizeof(line),
			 "job %s step %llu node %u: local copy fails verification (%s); not restoring it",
			 r->key.job, (unsigned long long)r->key.step, r->key.rank, err);
		log_err("restore", "%s", line);
		if (report)
			report(arg, line);
		life_bad(ram_idx(t), &r->key);
	}
	idx_recs_free(recs, n);
	return 0;
}

/* The record of (rank, w) at recs[b..e) (one step), or NULL. */
static struct shard_rec *rec_of(struct shard_rec *recs, size_t b, size_t e, uint32_t rank,
				uint32_t w)
{
	for (size_t i = b; i < e; i++)
		if (recs[i].key.rank == rank && recs[i].key.worker == w)
			return &recs[i];
	return NULL;
}

static bool usable_rec(struct ram_tier *t, struct shard_rec *r, restore_report_fn report,
		       void *arg)
{
	char err[512], line[768];
	int rc;

	if (r->state == SH_BAD || r->state < SH_COMMITTED)
		return false;
	rc = ram_verify(t, &r->key, err, sizeof(err));
	if (rc == 0)
		return true;
	snprintf(line, sizeof(line),
		 "job %s step %llu node %u worker %u: local copy fails verification (%s); not restoring it",
		 r->key.job, (unsigned long long)r->key.step, r->key.rank, r->key.worker, err);
	log_err("restore", "%s", line);
	if (report)
		report(arg, line);
	life_bad(ram_idx(t), &r->key);
	r->state = SH_BAD;
	return false;
}

int restore_plan_local_w(struct ram_tier *t, const char *job, uint32_t rank, uint32_t workers,
			 restore_report_fn report, void *arg, struct restore_plan *plan)
{
	struct shard_rec *recs = NULL;
	size_t n = 0, e;
	int rc;

	if (workers <= 1)
		return restore_plan_local(t, job, rank, report, arg, plan);
	memset(plan, 0, sizeof(*plan));
	rc = idx_list_shards(ram_idx(t), job, &recs, &n);
	if (rc < 0)
		return rc;
	/* recs ascend by step: walk the steps from the newest */
	for (e = n; e > 0 && !plan->found;) {
		size_t b = e;
		struct shard_rec *r0;
		bool ok = true, others = false;

		while (b > 0 && recs[b - 1].key.step == recs[e - 1].key.step)
			b--;
		r0 = rec_of(recs, b, e, rank, 0);
		for (uint32_t w = 1; w < workers; w++)
			others |= rec_of(recs, b, e, rank, w) != NULL;
		if (!r0 || !(r0->flags & SHF_OWN))
			ok = false;
		if (ok && r0->state == SH_BAD) {
			char line[512];
			snprintf(line, sizeof(line),
				 "job %s step %llu node %u: its files no longer match the manifest (found at start-up); not restoring it",
				 r0->key.job, (unsigned long long)r0->key.step, r0->key.rank);
			if (report)
				report(arg, line);
			ok = false;
		}
		if (ok && !others && !(r0->flags & SHF_RESTORED) && r0->ns_ino == 0)
			ok = false;   /* only worker 0 saved this step (a directory
				       * step is worker 0's alone) */
		for (uint32_t w = 1; ok && others && w < workers; w++) {
			struct shard_rec *r = rec_of(recs, b, e, rank, w);
			ok = r && (r->flags & SHF_OWN) && usable_rec(t, r, report, arg);
		}
		if (ok && usable_rec(t, r0, report, arg)) {
			plan->found = true;
			plan->step = r0->key.step;
			plan->key = r0->key;
			plan->source = RS_LOCAL;
		}
		e = b;
	}
	idx_recs_free(recs, n);
	return 0;
}
