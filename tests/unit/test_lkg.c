/* lkg: the last-known-good step and the source of each rank's shard. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "cluster/lkg.h"

static struct lkg_hold H(uint32_t holder, uint32_t owner, uint64_t step, uint8_t hb)
{
	struct lkg_hold h = { .holder = holder, .owner = owner, .step = step };
	memset(h.hash, hb, 32);
	return h;
}

static void plan(uint32_t nodes, uint32_t dp, const struct lkg_hold *h, size_t nh,
		 const bool *live, const struct lkg_hold *bad, size_t nbad, struct lkg_plan *p)
{
	struct lkg_input in = { .nodes = nodes, .dp = dp, .h = h, .nh = nh, .live = live,
				.bad = bad, .nbad = nbad };
	assert_int_equal(lkg_plan(&in, p), 0);
}

static void test_all_local(void **s)
{
	struct lkg_hold h[] = { H(0, 0, 10, 1), H(1, 1, 10, 2), H(0, 0, 20, 3), H(1, 1, 20, 4),
				H(1, 0, 20, 3), H(0, 1, 20, 4) };
	struct lkg_plan p;
	plan(2, 0, h, 6, NULL, NULL, 0, &p);
	assert_true(p.found);
	assert_int_equal(p.step, 20);
	assert_int_equal(p.src[0].holder, 0);
	assert_int_equal(p.src[1].holder, 1);
	lkg_plan_free(&p);
}

static void test_newest_incomplete_falls_back(void **s)
{
	/* node 1 died mid-save: step 30 only on node 0 */
	struct lkg_hold h[] = { H(0, 0, 20, 1), H(1, 1, 20, 2), H(0, 0, 30, 5) };
	struct lkg_plan p;
	plan(2, 0, h, 3, NULL, NULL, 0, &p);
	assert_true(p.found);
	assert_int_equal(p.step, 20);
	lkg_plan_free(&p);
}

static void test_lost_node_restores_from_replica(void **s)
{
	/* node 2 has an empty RAMDIR; its shard of step 7 lives on node 3 */
	struct lkg_hold h[] = { H(0, 0, 7, 1), H(1, 1, 7, 2), H(3, 3, 7, 4), H(3, 2, 7, 3),
				H(1, 0, 7, 1), H(0, 3, 7, 4) };
	struct lkg_plan p;
	plan(4, 0, h, 6, NULL, NULL, 0, &p);
	assert_true(p.found);
	assert_int_equal(p.step, 7);
	assert_int_equal(p.src[2].holder, 3);
	assert_int_equal(p.src[2].owner, 2);
	assert_int_equal(p.src[0].holder, 0);
	lkg_plan_free(&p);
}

static void test_dead_holder_and_bad_sources(void **s)
{
	struct lkg_hold h[] = { H(0, 0, 5, 1), H(1, 1, 5, 2), H(0, 1, 5, 2), H(2, 1, 5, 2),
				H(2, 2, 5, 3), H(0, 0, 4, 1), H(1, 1, 4, 2) };
	bool live[3] = { true, false, true };    /* node 1 lost everything */
	struct lkg_hold bad[] = { H(0, 1, 5, 2) };  /* node 0's replica failed CRC */
	struct lkg_plan p;

	plan(3, 0, h, 7, live, bad, 1, &p);
	assert_true(p.found);
	assert_int_equal(p.step, 5);
	assert_int_equal(p.src[1].holder, 2);
	assert_int_equal(p.src[1].owner, 1);
	assert_int_equal(p.src[2].holder, 2);
	lkg_plan_free(&p);

	/* without node 2 as well, no step is complete */
	live[2] = false;
	plan(3, 0, h, 7, live, bad, 1, &p);
	assert_false(p.found);
	lkg_plan_free(&p);
}

static void test_bad_excludes_only_copy(void **s)
{
	struct lkg_hold h[] = { H(0, 0, 5, 1), H(0, 1, 5, 2), H(0, 0, 4, 1), H(0, 1, 4, 2) };
	bool live[2] = { true, false };
	struct lkg_hold bad[] = { H(0, 1, 5, 2) };
	struct lkg_plan p;

	plan(2, 0, h, 4, live, NULL, 0, &p);
	assert_true(p.found);
	assert_int_equal(p.step, 5);
	assert_int_equal(p.src[1].holder, 0);
	lkg_plan_free(&p);
	/* the only copy of (1, 5) is bad: fall back to step 4 */
	plan(2, 0, h, 4, live, bad, 1, &p);
	assert_true(p.found);
	assert_int_equal(p.step, 4);
	assert_int_equal(p.src[1].holder, 0);
	assert_int_equal(p.src[1].owner, 1);
	lkg_plan_free(&p);
}

static void test_data_parallel_column(void **s)
{
	/* 4 nodes, D = 2 -> P = 2: columns {0, 2} and {1, 3} hold the same data */
	struct lkg_hold h[] = { H(0, 0, 9, 0xa), H(1, 1, 9, 0xb), H(3, 3, 9, 0xb) };
	struct lkg_plan p;
	plan(4, 2, h, 3, NULL, NULL, 0, &p);
	assert_true(p.found);
	assert_int_equal(p.step, 9);
	assert_int_equal(p.src[2].holder, 0);
	assert_int_equal(p.src[2].owner, 0);
	assert_int_equal(p.src[3].holder, 3);
	lkg_plan_free(&p);
	/* without D the same holdings are incomplete */
	plan(4, 0, h, 3, NULL, NULL, 0, &p);
	assert_false(p.found);
	lkg_plan_free(&p);
}

static void test_data_parallel_hash_disagreement(void **s)
{
	struct lkg_hold h[] = { H(0, 0, 9, 0xa), H(2, 2, 9, 0xc), H(1, 1, 9, 0xb), H(3, 3, 9, 0xb),
				H(0, 0, 8, 1), H(1, 1, 8, 2), H(2, 2, 8, 1), H(3, 3, 8, 2) };
	struct lkg_plan p;
	plan(4, 2, h, 8, NULL, NULL, 0, &p);
	assert_true(p.found);
	/* column 0 disagrees at step 9, but every rank holds its own shard:
	 * each restores its own (GKE's replicator does the same; Orbax's
	 * processes always write different files) */
	assert_int_equal(p.step, 9);
	for (uint32_t r = 0; r < 4; r++) {
		assert_int_equal(p.src[r].holder, r);
		assert_int_equal(p.src[r].owner, r);
	}
	assert_int_equal(p.src[2].hash[0], 0xc);
	lkg_plan_free(&p);
}

static void test_data_parallel_no_borrow_from_disagreeing_column(void **s)
{
	/* 6 nodes, D = 3 -> P = 2: column 0 is {0, 2, 4}. Node 4 was wiped;
	 * owners 0 and 2 differ at step 9, so nothing says what 4 had: step 9
	 * is not complete. At step 8 the column agrees and 4 borrows. */
	struct lkg_hold h[] = { H(0, 0, 9, 0xa), H(2, 2, 9, 0xc), H(1, 1, 9, 0xb), H(3, 3, 9, 0xb),
				H(5, 5, 9, 0xb),
				H(0, 0, 8, 1), H(2, 2, 8, 1), H(1, 1, 8, 2), H(3, 3, 8, 2), H(5, 5, 8, 2) };
	struct lkg_plan p;
	plan(6, 3, h, 10, NULL, NULL, 0, &p);
	assert_true(p.found);
	assert_int_equal(p.step, 8);
	assert_true(p.src[4].found);
	assert_int_equal(p.src[4].owner % 2, 0);
	assert_int_not_equal(p.src[4].holder, 4);
	assert_int_equal(p.src[4].hash[0], 1);
	lkg_plan_free(&p);
}

static void test_load_spread(void **s)
{
	/* ranks 1 and 2 both lost their data; both shards are on nodes 0 and 3 */
	struct lkg_hold h[] = { H(0, 0, 3, 1), H(3, 3, 3, 4), H(0, 1, 3, 2), H(3, 1, 3, 2),
				H(0, 2, 3, 3), H(3, 2, 3, 3) };
	struct lkg_plan p;
	plan(4, 0, h, 6, NULL, NULL, 0, &p);
	assert_true(p.found);
	assert_int_not_equal(p.src[1].holder, p.src[2].holder);
	lkg_plan_free(&p);
}

static void test_nothing(void **s)
{
	struct lkg_plan p;
	uint64_t st;
	plan(3, 0, NULL, 0, NULL, NULL, 0, &p);
	assert_false(p.found);
	lkg_plan_free(&p);
	assert_false(lkg_newest_complete(3, 0, NULL, 0, &st));
	struct lkg_input in = { .nodes = 0 };
	assert_int_equal(lkg_plan(&in, &p), -EINVAL);
}

static void test_out_of_range_ignored(void **s)
{
	struct lkg_hold h[] = { H(0, 0, 3, 1), H(7, 1, 3, 2), H(0, 9, 3, 2) };
	struct lkg_plan p;
	plan(2, 0, h, 3, NULL, NULL, 0, &p);
	assert_false(p.found);
	lkg_plan_free(&p);
}

static void test_scale_4096(void **s)
{
	const uint32_t n = 4096;
	struct lkg_hold *h = calloc(n * 6, sizeof(*h));
	size_t k = 0;
	struct lkg_plan p;

	for (uint32_t r = 0; r < n; r++) {
		for (uint64_t step = 100; step <= 200; step += 100) {
			h[k++] = H(r, r, step, (uint8_t)r);
			h[k++] = H((r ^ 1) % n, r, step, (uint8_t)r);
		}
	}
	/* the newest step is missing on one rank and its replica */
	h[k++] = H(5, 5, 300, 5);
	plan(n, 0, h, k, NULL, NULL, 0, &p);
	assert_true(p.found);
	assert_int_equal(p.step, 200);
	for (uint32_t r = 0; r < n; r++)
		assert_int_equal(p.src[r].holder, r);
	lkg_plan_free(&p);
	free(h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_all_local),
		cmocka_unit_test(test_newest_incomplete_falls_back),
		cmocka_unit_test(test_lost_node_restores_from_replica),
		cmocka_unit_test(test_dead_holder_and_bad_sources),
		cmocka_unit_test(test_bad_excludes_only_copy),
		cmocka_unit_test(test_data_parallel_column),
		cmocka_unit_test(test_data_parallel_no_borrow_from_disagreeing_column),
		cmocka_unit_test(test_data_parallel_hash_disagreement),
		cmocka_unit_test(test_load_spread),
		cmocka_unit_test(test_nothing),
		cmocka_unit_test(test_out_of_range_ignored),
		cmocka_unit_test(test_scale_4096),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
