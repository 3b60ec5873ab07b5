/* tier_fault.h: a tier that wraps another (STYLE: wrap, don't flag) and
 * injects failures: its call number fail_nth (get and put counted
 * together, 1-based; 0 never) fails with fail_rc before the inner tier is
 * asked, every other call is passed through. calls/inner_calls count what
 * happened. Header-only, for unit
 * tests; the wrapper and its inner tier belong to the test. */
#ifndef MTCFS_TESTS_UNIT_TIER_FAULT_H
#define MTCFS_TESTS_UNIT_TIER_FAULT_H

#include <stdio.h>

#include "tiers/tier.h"

struct tier_fault {
	struct tier inner;
	unsigned fail_nth;
	int fail_rc;
	unsigned calls, inner_calls;
};

static int fault_get(void *self, struct tier_get *g, struct ram_stage *st, struct manifest **mf,
		     char *why, size_t whylen)
{
	struct tier_fault *f = self;

	if (++f->calls == f->fail_nth) {
		snprintf(why, whylen, "injected failure of get %u", f->calls);
		return f->fail_rc;
	}
	f->inner_calls++;
	return tier_get(&f->inner, g, st, mf, why, whylen);
}

static void fault_got(void *self, const struct tier_get *g, const struct manifest *mf, int rc,
		      char *why, size_t whylen)
{
	struct tier_fault *f = self;
	tier_got(&f->inner, g, mf, rc, why, whylen);
}

static int fault_put(void *self, struct ram_tier *ram, const struct shard_key *k,
		     const uint8_t *raw, size_t rawlen, const struct manifest *mf)
{
	struct tier_fault *f = self;

	if (++f->calls == f->fail_nth)
		return f->fail_rc;
	f->inner_calls++;
	return tier_put(&f->inner, ram, k, raw, rawlen, mf);
}

static const struct tier_ops tier_fault_ops = {
	.name = "fault",
	.get = fault_get,
	.got = fault_got,
	.put = fault_put,
};

/* t: the wrapper as a tier over f (which holds the inner tier). */
static inline void tier_fault_init(struct tier_fault *f, struct tier *t)
{
	t->ops = &tier_fault_ops;
	t->self = f;
}

#endif
