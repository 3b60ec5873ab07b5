#include "tiers/restore.h"
#include "common/log.h"

#include <errno.h>
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
		idx_set_state(ram_idx(t), &r->key, SH_BAD, 0, 0);
	}
	idx_recs_free(recs, n);
	return 0;
}
