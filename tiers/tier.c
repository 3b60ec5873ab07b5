/* tier.c — see tier.h: what every tier shares. */
#include "tiers/tier.h"
#include "tiers/lifecycle.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

void tier_close(struct tier *t)
{
	if (t->ops && t->ops->close)
		t->ops->close(t->self);
	t->ops = NULL;
	t->self = NULL;
}

/* One source: stage -> get -> rename -> publish -> got; the stage aborted
 * unless published. */
static int obtain_one(struct tier *t, struct tier_get *g, char *why, size_t whylen)
{
	struct ram_stage st = { .fd = -1 };
	struct manifest *mf = NULL;
	int rc;

	rc = tier_get(t, g, &st, &mf, why, whylen);
	if (rc == TIER_IN_PLACE) {
		rc = life_adopt(ram_idx(g->ram), &g->as);
		goto out;
	}
	if (rc < 0)
		goto out;
	if (g->rename && (rc = g->rename(g->rename_arg, st.fd, &mf)) < 0)
		snprintf(why, whylen, "renaming node %u's files as this node's: %s", g->want.rank,
			 strerror(-rc));
	if (rc == 0)
		rc = ram_stage_publish(g->ram, &st, mf, SHF_OWN | SHF_RESTORED);
	tier_got(t, g, mf, rc, why, whylen);
out:
	if (st.fd >= 0 || st.rel[0])
		ram_stage_abort(g->ram, &st);
	mf_free(mf);
	return rc;
}

int tier_obtain(struct tier *const *src, size_t n, struct tier_get *g, char *why, size_t whylen)
{
	int rc = -ENOENT;

	for (size_t i = 0; i < n; i++) {
		g->whole = false;
		rc = obtain_one(src[i], g, why, whylen);
		if (rc >= 0)
			return 0;
	}
	return rc;
}
