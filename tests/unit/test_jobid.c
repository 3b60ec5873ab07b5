/* Unit tests for tiers/jobid: a new record names no job and no rank; a
 * snapshot is the record as set; a rank alone changes nothing else; and
 * rcfg_job_now, the one place a replicator.yaml becomes an identity,
 * gives shards per worker only with framework: pytorch (the engine and
 * the front once each normalized workers-per-node, differently). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "cluster/rcfg.h"
#include "tiers/jobid.h"

static void test_new(void **state)
{
	struct jobid *j = NULL;
	struct job_now now;

	(void)state;
	assert_int_equal(jobid_new(&j), 0);
	jobid_get(j, &now);
	assert_false(now.set);
	assert_string_equal(now.job, "");
	assert_int_equal(now.rank, -1);
	assert_int_equal(jobid_rank(j), -1);
	assert_int_equal(now.nodes, 0);
	assert_int_equal(now.dp, 0);
	assert_int_equal(now.workers, 1);
	assert_false(now.save_files);
	jobid_free(j);
	jobid_free(NULL);
}

static void test_set_get(void **state)
{
	struct job_now in = { .set = true, .job = "train-1", .rank = 3, .nodes = 8, .dp = 2,
			      .workers = 4, .save_files = true };
	struct jobid *j = NULL;
	struct job_now now;

	(void)state;
	assert_int_equal(jobid_new(&j), 0);
	jobid_set_rank(j, 5);   /* the engine's options, before any yaml */
	jobid_get(j, &now);
	assert_false(now.set);
	assert_int_equal(now.rank, 5);
	assert_int_equal(now.workers, 1);

	jobid_set(j, &in);
	jobid_get(j, &now);
	assert_memory_equal(&now, &in, sizeof(now));

	jobid_set_rank(j, 6);
	jobid_get(j, &now);
	assert_int_equal(now.rank, 6);
	assert_string_equal(now.job, "train-1");
	assert_int_equal(now.nodes, 8);

	in.workers = 0;   /* taken as one shard per step */
	jobid_set(j, &in);
	jobid_get(j, &now);
	assert_int_equal(now.workers, 1);
	jobid_free(j);
}

static void test_from_rcfg(void **state)
{
	struct rcfg c = { .job = "j", .framework = RCFG_FW_PYTORCH, .node_rank = 2, .nodes = 4,
			  .assume_dp = 2, .workers_per_node = 4 };
	struct job_now now;

	(void)state;
	rcfg_job_now(&c, &now);
	assert_true(now.set);
	assert_string_equal(now.job, "j");
	assert_int_equal(now.rank, 2);
	assert_int_equal(now.nodes, 4);
	assert_int_equal(now.dp, 2);
	assert_int_equal(now.workers, 4);
	assert_true(now.save_files);

	c.workers_per_node = 1;
	rcfg_job_now(&c, &now);
	assert_int_equal(now.workers, 1);
	assert_true(now.save_files);

	/* other frameworks: one shard per node whatever workers-per-node says */
	c.framework = RCFG_FW_ORBAX;
	c.workers_per_node = 4;
	rcfg_job_now(&c, &now);
	assert_int_equal(now.workers, 1);
	assert_false(now.save_files);
	c.framework = RCFG_FW_PYTORCH_DISTRIBUTED;
	rcfg_job_now(&c, &now);
	assert_int_equal(now.workers, 1);
	assert_false(now.save_files);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_new),
		cmocka_unit_test(test_set_get),
		cmocka_unit_test(test_from_rcfg),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
