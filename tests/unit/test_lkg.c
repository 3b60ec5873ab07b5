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

/* lkg_step_covered: per rank, as lkg_plan judges one step (the admin's
 * step table): the same holdings as the D tests above. */
static void test_step_covered(void **s)
{
	struct lkg_hold h[] = { H(0, 0, 9, 0xa), H(2, 2, 9, 0xc), H(1, 1, 9, 0xb), H(3, 3, 9, 0xb),
				H(5, 5, 9, 0xb),
				H(0, 0, 8, 1), H(2, 2, 8, 1), H(1, 1, 8, 2), H(3, 3, 8, 2), H(5, 5, 8, 2),
				H(1, 0, 7, 1) };
	bool live[6] = { true, true, true, true, true, true };
	struct lkg_input in = { .nodes = 6, .dp = 3, .h = h, .nh = 11 };
	bool cov[6];

	/* step 9: node 4 has no shard and its column disagrees */
	assert_int_equal(lkg_step_covered(&in, 9, cov), 0);
	for (uint32_t r = 0; r < 6; r++)
		assert_int_equal(cov[r], r != 4);
	/* step 8: the column agrees, 4 is covered by it */
	assert_int_equal(lkg_step_covered(&in, 8, cov), 0);
	for (uint32_t r = 0; r < 6; r++)
		assert_true(cov[r]);
	/* without D, 4 is not */
	in.dp = 0;
	assert_int_equal(lkg_step_covered(&in, 8, cov), 0);
	for (uint32_t r = 0; r < 6; r++)
		assert_int_equal(cov[r], r != 4);
	/* step 7: only owner 0's shard, held by node 1; node 1 not live */
	assert_int_equal(lkg_step_covered(&in, 7, cov), 0);
	assert_true(cov[0]);
	for (uint32_t r = 1; r < 6; r++)
		assert_false(cov[r]);
	live[1] = false;
	in.live = live;
	assert_int_equal(lkg_step_covered(&in, 7, cov), 0);
	assert_false(cov[0]);
	/* a step nobody holds */
	assert_int_equal(lkg_step_covered(&in, 100, cov), 0);
	for (uint32_t r = 0; r < 6; r++)
		assert_false(cov[r]);
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

/* ---- one shard per worker (framework: pytorch, workers-per-node > 1) ---- */

static struct lkg_hold HW(uint32_t holder, uint32_t owner, uint32_t w, uint64_t step, uint8_t hb)
{
	struct lkg_hold h = H(holder, owner, step, hb);
	h.worker = w;
	return h;
}

static void plan_w(uint32_t nodes, uint32_t dp, uint32_t workers, const struct lkg_hold *h,
		   size_t nh, const bool *live, const struct lkg_hold *bad, size_t nbad,
		   struct lkg_plan *p)
{
	struct lkg_input in = { .nodes = nodes, .dp = dp, .workers = workers, .h = h, .nh = nh,
				.live = live, .bad = bad, .nbad = nbad };
	assert_int_equal(lkg_plan(&in, p), 0);
	assert_int_equal(p->workers, workers);
}

/* 2 nodes x 2 workers: worker 0 of node 0 saved step 20 (and replicated
 * it), worker 1 did not yet: 20 is not the job's step, 10 is; once the
 * fourth shard is in, 20 is. */
static void test_workers_step_needs_every_worker(void **s)
{
	struct lkg_hold h[] = { HW(0, 0, 0, 10, 1), HW(0, 0, 1, 10, 2), HW(1, 1, 0, 10, 3),
				HW(1, 1, 1, 10, 4),
				HW(0, 0, 0, 20, 5), HW(1, 0, 0, 20, 5), HW(1, 1, 0, 20, 6),
				HW(1, 1, 1, 20, 7), HW(0, 1, 0, 20, 6), HW(0, 1, 1, 20, 7),
				HW(0, 0, 1, 20, 8) };
	struct lkg_plan p;
	uint64_t step = 0;

	plan_w(2, 0, 2, h, 10, NULL, NULL, 0, &p);
	assert_true(p.found);
	assert_int_equal(p.step, 10);
	lkg_plan_free(&p);
	assert_true(lkg_newest_complete_w(2, 0, 2, h, 10, &step));
	assert_int_equal(step, 10);
	/* one shard per node would have called 20 complete */
	assert_true(lkg_newest_complete(2, 0, h, 10, &step));
	assert_int_equal(step, 20);

	plan_w(2, 0, 2, h, 11, NULL, NULL, 0, &p);
	assert_true(p.found);
	assert_int_equal(p.step, 20);
	for (uint32_t r = 0; r < 2; r++)
		for (uint32_t w = 0; w < 2; w++) {
			assert_true(p.src[r * 2 + w].found);
			assert_int_equal(p.src[r * 2 + w].holder, r);
			assert_int_equal(p.src[r * 2 + w].owner, r);
			assert_int_equal(p.src[r * 2 + w].worker, w);
		}
	assert_int_equal(p.src[0 * 2 + 1].hash[0], 8);
	lkg_plan_free(&p);
}

/* node 1 wiped: each of its workers' shards comes from the node holding
 * that worker's replica, on its own. */
static void test_workers_wiped_node_per_worker_sources(void **s)
{
	struct lkg_hold h[] = { HW(0, 0, 0, 7, 1), HW(0, 0, 1, 7, 2), HW(2, 2, 0, 7, 3),
				HW(2, 2, 1, 7, 4),
				HW(0, 1, 0, 7, 5),     /* rank 1 worker 0 on node 0 */
				HW(2, 1, 1, 7, 6) };   /* rank 1 worker 1 on node 2 */
	struct lkg_plan p;

	plan_w(3, 0, 2, h, 6, NULL, NULL, 0, &p);
	assert_true(p.found);
	assert_int_equal(p.step, 7);
	assert_int_equal(p.src[1 * 2 + 0].holder, 0);
	assert_int_equal(p.src[1 * 2 + 0].owner, 1);
	assert_int_equal(p.src[1 * 2 + 0].hash[0], 5);
	assert_int_equal(p.src[1 * 2 + 1].holder, 2);
	assert_int_equal(p.src[1 * 2 + 1].worker, 1);
	assert_int_equal(p.src[1 * 2 + 1].hash[0], 6);
	lkg_plan_free(&p);

	/* without worker 1's replica, rank 1 cannot be restored at 7 */
	plan_w(3, 0, 2, h, 5, NULL, NULL, 0, &p);
	assert_false(p.found);
	lkg_plan_free(&p);
}

/* A bad source is one (holder, owner, worker, step): worker 1's failed
 * copy does not rule out worker 0's copy on the same holder. */
static void test_workers_bad_is_per_worker(void **s)
{
	struct lkg_hold h[] = { HW(0, 0, 0, 5, 1), HW(0, 0, 1, 5, 2), HW(0, 1, 0, 5, 3),
				HW(0, 1, 1, 5, 4), HW(2, 1, 1, 5, 4), HW(2, 2, 0, 5, 5),
				HW(2, 2, 1, 5, 6) };
	struct lkg_hold bad[] = { HW(0, 1, 1, 5, 4) };
	struct lkg_plan p;

	plan_w(3, 0, 2, h, 7, NULL, bad, 1, &p);
	assert_true(p.found);
	assert_int_equal(p.src[1 * 2 + 0].holder, 0);
	assert_int_equal(p.src[1 * 2 + 1].holder, 2);
	lkg_plan_free(&p);
}

/* Data parallelism: a column agrees per worker shard. Workers' files of
 * one node differ from each other (w0 != w1) but each equals the column
 * mate's file of the same worker: a node without its shards borrows both. */
static void test_workers_column_agrees_per_worker(void **s)
{
	/* 4 nodes, D=2: columns {0,2} and {1,3}; node 3 lost everything */
	struct lkg_hold h[] = { HW(0, 0, 0, 9, 1), HW(0, 0, 1, 9, 2), HW(2, 2, 0, 9, 1),
				HW(2, 2, 1, 9, 2), HW(1, 1, 0, 9, 3), HW(1, 1, 1, 9, 4) };
	struct lkg_plan p;

	plan_w(4, 2, 2, h, 6, NULL, NULL, 0, &p);
	assert_true(p.found);
	assert_int_equal(p.step, 9);
	assert_int_equal(p.src[3 * 2 + 0].owner, 1);
	assert_int_equal(p.src[3 * 2 + 0].hash[0], 3);
	assert_int_equal(p.src[3 * 2 + 1].owner, 1);
	assert_int_equal(p.src[3 * 2 + 1].worker, 1);
	assert_int_equal(p.src[3 * 2 + 1].hash[0], 4);
	lkg_plan_free(&p);
}

/* ... and a column whose worker-1 shards disagree lends no worker-1 shard,
 * even where its worker-0 shards agree. */
static void test_workers_column_disagrees_on_one_worker(void **s)
{
	/* 6 nodes, D=3: columns {0,2,4}, {1,3,5}; node 5 lost everything */
	struct lkg_hold h[12];
	size_t k = 0;
	struct lkg_plan p;

	for (uint32_t r = 0; r < 5; r++) {
		h[k++] = HW(r, r, 0, 4, (uint8_t)(10 + r % 2));
		/* worker 1: ranks 1 and 3 differ */
		h[k++] = HW(r, r, 1, 4, (uint8_t)(r == 3 ? 30 : 20 + r % 2));
	}
	plan_w(6, 3, 2, h, k, NULL, NULL, 0, &p);
	assert_false(p.found);
	lkg_plan_free(&p);

	h[7] = HW(3, 3, 1, 4, 21);   /* now rank 3's worker 1 agrees with rank 1's */
	plan_w(6, 3, 2, h, k, NULL, NULL, 0, &p);
	assert_true(p.found);
	assert_int_equal(p.src[5 * 2 + 0].hash[0], 11);
	assert_int_equal(p.src[5 * 2 + 1].hash[0], 21);
	assert_true(p.src[5 * 2 + 1].owner == 1 || p.src[5 * 2 + 1].owner == 3);
	lkg_plan_free(&p);
}

/* A shard of a worker the job does not have (workers-per-node lowered)
 * covers nothing, and with workers = 0 or 1 only worker 0 counts. */
static void test_workers_out_of_range(void **s)
{
	struct lkg_hold h[] = { HW(0, 0, 0, 3, 1), HW(0, 0, 2, 3, 2), HW(0, 0, 1, 8, 3) };
	struct lkg_plan p;

	plan_w(1, 0, 2, h, 3, NULL, NULL, 0, &p);
	assert_false(p.found);
	lkg_plan_free(&p);
	plan_w(1, 0, 1, h, 3, NULL, NULL, 0, &p);
	assert_true(p.found);
	assert_int_equal(p.step, 3);
	lkg_plan_free(&p);
}

/* framework: pytorch: a worker's file names its rank, so column mates'
 * shard hashes always differ; their content keys agree when the bytes do.
 * Node 2 (D=3, one column) never saved: it borrows each worker's shard. */
static void test_workers_column_agrees_on_content(void **s)
{
	struct lkg_hold h[4];
	struct lkg_plan p;

	for (uint32_t r = 0; r < 2; r++)
		for (uint32_t w = 0; w < 2; w++) {
			struct lkg_hold *x = &h[r * 2 + w];
			*x = HW(r, r, w, 6, (uint8_t)(10 * r + w + 1));   /* hashes differ */
			x->has_content = true;
			memset(x->content, 0x70 + (int)w, 32);                /* bytes agree */
		}
	plan_w(3, 3, 2, h, 4, NULL, NULL, 0, &p);
	assert_true(p.found);
	assert_int_equal(p.step, 6);
	assert_true(p.src[2 * 2 + 0].owner < 2);
	assert_int_equal(p.src[2 * 2 + 1].worker, 1);
	lkg_plan_free(&p);

	/* without content keys the hashes decide: they differ, no borrowing */
	for (int i = 0; i < 4; i++)
		h[i].has_content = false;
	plan_w(3, 3, 2, h, 4, NULL, NULL, 0, &p);
	assert_false(p.found);
	lkg_plan_free(&p);

	/* worker 1's bytes differ between the mates: worker 1 cannot borrow */
	for (int i = 0; i < 4; i++)
		h[i].has_content = true;
	memset(h[3].content, 0x7f, 32);
	plan_w(3, 3, 2, h, 4, NULL, NULL, 0, &p);
	assert_false(p.found);
	lkg_plan_free(&p);
}

/* A backup as a restore source, judged for the job's ranks only (issue 24
 * item 2): holder == owner == the backup's node. */
static void plan_bk(uint32_t nodes, uint32_t dp, const struct lkg_hold *h, size_t nh,
		    struct lkg_plan *p, struct lkg_gap *g)
{
	struct lkg_input in = { .nodes = nodes, .dp = dp, .h = h, .nh = nh };
	assert_int_equal(lkg_plan_backup(&in, p, g), 0);
}

static void test_backup_of_larger_job(void **s)
{
	/* 4 nodes backed up; a job of 2 restores nodes 0 and 1, ignores 2, 3
	 * (even a node 3 whose shard is missing from the backup) */
	struct lkg_hold h[] = { H(0, 0, 40, 1), H(1, 1, 40, 2), H(2, 2, 40, 3) };
	struct lkg_plan p;
	struct lkg_gap g;
	plan_bk(2, 0, h, 3, &p, &g);
	assert_true(p.found);
	assert_int_equal(p.step, 40);
	assert_int_equal(p.src[0].owner, 0);
	assert_int_equal(p.src[1].owner, 1);
	lkg_plan_free(&p);
	/* and its column mates need not agree: each rank has its own */
	plan_bk(2, 2, h, 3, &p, &g);
	assert_true(p.found);
	assert_int_equal(p.src[1].owner, 1);
	lkg_plan_free(&p);
}

static void test_backup_of_smaller_job_under_dp(void **s)
{
	/* 2 nodes, D = 1, backed up; 4 nodes with D = 2 (columns {0, 2},
	 * {1, 3}): ranks 2 and 3 take nodes 0 and 1's shards */
	struct lkg_hold h[] = { H(0, 0, 40, 1), H(1, 1, 40, 2) };
	struct lkg_plan p;
	struct lkg_gap g;
	plan_bk(4, 2, h, 2, &p, &g);
	assert_true(p.found);
	assert_int_equal(p.src[0].owner, 0);
	assert_int_equal(p.src[1].owner, 1);
	assert_int_equal(p.src[2].owner, 0);
	assert_int_equal(p.src[3].owner, 1);
	assert_memory_equal(p.src[3].hash, h[1].hash, 32);
	lkg_plan_free(&p);
	/* without D nothing says what ranks 2 and 3 held */
	plan_bk(4, 0, h, 2, &p, &g);
	assert_false(p.found);
	assert_int_equal(g.rank, 2);
	assert_false(g.columns);
	lkg_plan_free(&p);
}

static void test_backup_column_disagrees(void **s)
{
	/* 4 nodes, D = 2, whose column mates differ; 6 nodes with D = 3
	 * (columns {0, 2, 4}, {1, 3, 5}): rank 4 cannot tell which to take */
	struct lkg_hold h[] = { H(0, 0, 40, 1), H(1, 1, 40, 2), H(2, 2, 40, 3), H(3, 3, 40, 2) };
	struct lkg_plan p;
	struct lkg_gap g;
	plan_bk(6, 3, h, 4, &p, &g);
	assert_false(p.found);
	assert_int_equal(g.rank, 4);
	assert_true(g.columns);
	assert_true(g.disagree);
	lkg_plan_free(&p);
	/* column 1 agrees: with node 0's shard like node 2's, all found */
	h[0] = H(0, 0, 40, 3);
	plan_bk(6, 3, h, 4, &p, &g);
	assert_true(p.found);
	assert_int_equal(p.src[4].owner, 0);
	assert_int_equal(p.src[5].owner, 1);
	lkg_plan_free(&p);
	/* an empty column */
	struct lkg_hold one[] = { H(0, 0, 40, 1) };
	plan_bk(4, 2, one, 1, &p, &g);
	assert_false(p.found);
	assert_int_equal(g.rank, 1);
	assert_true(g.columns);
	assert_false(g.disagree);
	lkg_plan_free(&p);
}

static void test_backup_mixed_steps_refused(void **s)
{
	struct lkg_hold h[] = { H(0, 0, 40, 1), H(1, 1, 50, 2) };
	struct lkg_input in = { .nodes = 2, .h = h, .nh = 2 };
	struct lkg_plan p;
	struct lkg_gap g;
	assert_int_equal(lkg_plan_backup(&in, &p, &g), -EINVAL);
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
		cmocka_unit_test(test_step_covered),
		cmocka_unit_test(test_load_spread),
		cmocka_unit_test(test_nothing),
		cmocka_unit_test(test_out_of_range_ignored),
		cmocka_unit_test(test_scale_4096),
		cmocka_unit_test(test_workers_step_needs_every_worker),
		cmocka_unit_test(test_workers_wiped_node_per_worker_sources),
		cmocka_unit_test(test_workers_bad_is_per_worker),
		cmocka_unit_test(test_workers_column_agrees_per_worker),
		cmocka_unit_test(test_workers_column_disagrees_on_one_worker),
		cmocka_unit_test(test_workers_out_of_range),
		cmocka_unit_test(test_workers_column_agrees_on_content),
		cmocka_unit_test(test_backup_of_larger_job),
		cmocka_unit_test(test_backup_of_smaller_job_under_dp),
		cmocka_unit_test(test_backup_column_disagrees),
		cmocka_unit_test(test_backup_mixed_steps_refused),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
