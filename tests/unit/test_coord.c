/* Unit tests for the coordinator's safe step (cluster/coord.c,
 * coord_restore.c; DESIGN §5): what a job restart leaves as the safe step
 * (older steps may go below it) and how "replicated" reports move it. A
 * struct cjob of just what those functions read; no server, no nodes.
 * Issue 22: a step restored from the cluster was the safe step at the
 * barrier, so every node dropped the older protected step although the
 * restored one had no replicas or parity on the nodes that existed then. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cluster/coord_i.h"

/* A job of `nodes` nodes (one shard each) whose restore plan restored
 * `step` (from the bucket when bucket). */
static struct cjob *restored_job(uint32_t nodes, uint64_t step, bool bucket)
{
	struct cjob *j = calloc(1, sizeof(*j));

	assert_non_null(j);
	snprintf(j->name, sizeof(j->name), "job");
	j->nodes = nodes;
	j->workers = 1;
	j->n = calloc(nodes, sizeof(*j->n));
	j->plan.src = calloc(nodes, sizeof(*j->plan.src));
	assert_non_null(j->n);
	assert_non_null(j->plan.src);
	j->plan.found = true;
	j->plan.step = step;
	j->plan.nodes = nodes;
	j->plan.workers = 1;
	j->bucket_plan = bucket;
	/* before the restart: step - 1 was safe */
	j->has_lkg = j->has_safe = true;
	j->lkg = j->safe = step - 1;
	return j;
}

static void job_free(struct cjob *j)
{
	free(j->plan.src);
	free(j->n);
	free(j);
}

/* Restored from the cluster: no safe step until every node has said
 * "replicated" of the restored step again; then it is. */
static void test_cluster_restore_not_safe_until_reprotected(void **state)
{
	struct cjob *j = restored_job(3, 2, false);

	(void)state;
	coord_restart_history(j);
	assert_true(j->has_lkg);
	assert_int_equal(j->lkg, 2);
	assert_false(j->has_safe);
	assert_false(coord_replicated(j, &j->n[0], 0, 2));
	assert_false(coord_replicated(j, &j->n[2], 0, 2));
	assert_false(j->has_safe);
	/* the same node again: still two of three */
	assert_false(coord_replicated(j, &j->n[0], 0, 2));
	assert_false(j->has_safe);
	assert_true(coord_replicated(j, &j->n[1], 0, 2));
	assert_true(j->has_safe);
	assert_int_equal(j->safe, 2);
	job_free(j);
}

/* A step of the timeline the restore left (older than the restored one,
 * or never committed since) is no commit the coordinator knows: it moves
 * nothing. */
static void test_left_timeline_reports_ignored(void **state)
{
	struct cjob *j = restored_job(2, 5, false);

	(void)state;
	coord_restart_history(j);
	assert_false(coord_replicated(j, &j->n[0], 0, 4));
	assert_false(coord_replicated(j, &j->n[1], 0, 4));
	assert_false(coord_replicated(j, &j->n[0], 0, 6));
	assert_false(coord_replicated(j, &j->n[1], 0, 6));
	assert_false(j->has_safe);
	job_free(j);
}

/* Restored from the bucket: the bucket holds it, it is safe at once. */
static void test_bucket_restore_safe_at_once(void **state)
{
	struct cjob *j = restored_job(3, 7, true);

	(void)state;
	coord_restart_history(j);
	assert_true(j->has_safe);
	assert_int_equal(j->safe, 7);
	assert_true(j->has_lkg);
	assert_int_equal(j->lkg, 7);
	job_free(j);
}

/* Nothing restored: no LKG, no safe step. */
static void test_nothing_restored(void **state)
{
	struct cjob *j = restored_job(2, 3, false);

	(void)state;
	j->plan.found = false;
	coord_restart_history(j);
	assert_false(j->has_lkg);
	assert_false(j->has_safe);
	job_free(j);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cluster_restore_not_safe_until_reprotected),
		cmocka_unit_test(test_left_timeline_reports_ignored),
		cmocka_unit_test(test_bucket_restore_safe_at_once),
		cmocka_unit_test(test_nothing_restored),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
