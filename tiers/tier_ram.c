/* tier_ram.c — this node's RAM tier as a source (see tier.h). */
#include "tiers/tier.h"
#include "tiers/lifecycle.h"

#include <stdio.h>
#include <string.h>

static int ram_get(void *self, struct tier_get *g, struct ram_stage *st, struct manifest **mf,
		   char *why, size_t whylen)
{
	struct ram_tier *ram = self;
	struct shard_rec rec = { 0 };
	char err[300];
	int rc;

	rc = ram_verify(ram, &g->want, err, sizeof(err));
	if (rc < 0) {
		snprintf(why, whylen, "local copy of node %u's shard fails verification: %.300s",
			 g->want.rank, err);
		life_bad(ram_idx(ram), &g->want);
		return rc;
	}
	if (g->want.rank == g->as.rank) {
		/* the trainer that wrote it reads it back (an older mtcfs's
		 * shard has directories of root's) */
		rc = ram_own(ram, &g->want);
		if (rc < 0) {
			snprintf(why, whylen, "giving node %u's shard its owners: %s", g->want.rank,
				 strerror(-rc));
			return rc;
		}
		return TIER_IN_PLACE;
	}
	/* a column mate's shard held here: same data under our key */
	rc = idx_get_shard(ram_idx(ram), &g->want, &rec);
	if (rc == 0)
		rc = mf_decode(rec.mf, rec.mflen, mf);
	idx_rec_clear(&rec);
	if (rc == 0)
		rc = ram_stage_begin(g->ram, &g->as, st);
	if (rc == 0)
		rc = ram_stage_link(g->ram, st, &g->want);
	if (rc < 0)
		snprintf(why, whylen, "linking node %u's shard: %s", g->want.rank, strerror(-rc));
	return rc;
}

static void ram_got(void *self, const struct tier_get *g, const struct manifest *mf, int rc,
		    char *why, size_t whylen)
{
	if (rc < 0)
		snprintf(why, whylen, "linking node %u's shard: %s", g->want.rank, strerror(-rc));
}

static const struct tier_ops ram_tier_ops = {
	.name = "local",
	.get = ram_get,
	.got = ram_got,
};

void tier_ram_init(struct ram_tier *ram, struct tier *t)
{
	t->ops = &ram_tier_ops;
	t->self = ram;
}
