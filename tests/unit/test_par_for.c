/* Unit tests for common/par_for: every item runs exactly once; the rc and
 * index reported are those of the lowest failed item, whatever thread
 * failed first; without PAR_FOR_STOP every item still runs after a
 * failure, with it items not yet started are not run; the fail callback
 * sees the lowest failure last; more threads than items, and zero items. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/par_for.h"

#define N 1000

struct job {
	atomic_int runs[N];
	atomic_size_t nrun;
	int fail_at[N];          /* rc of item i, 0 to succeed */
	size_t fail_seen;        /* last index given to the fail callback */
	int fail_rc;
	pthread_t seen[16];
	atomic_size_t nseen;
	pthread_mutex_t mu;
};

static int run(void *arg, size_t i)
{
	struct job *j = arg;
	pthread_t self = pthread_self();
	bool known = false;

	atomic_fetch_add(&j->runs[i], 1);
	atomic_fetch_add(&j->nrun, 1);
	pthread_mutex_lock(&j->mu);
	for (size_t k = 0; k < atomic_load(&j->nseen); k++)
		known |= pthread_equal(j->seen[k], self) != 0;
	if (!known && atomic_load(&j->nseen) < 16)
		j->seen[atomic_fetch_add(&j->nseen, 1)] = self;
	pthread_mutex_unlock(&j->mu);
	return j->fail_at[i];
}

static void on_fail(void *arg, size_t i, int rc)
{
	struct job *j = arg;

	j->fail_seen = i;
	j->fail_rc = rc;
}

static struct job *job_new(void)
{
	struct job *j = calloc(1, sizeof(*j));

	assert_non_null(j);
	pthread_mutex_init(&j->mu, NULL);
	j->fail_seen = SIZE_MAX;
	return j;
}

static void job_free(struct job *j)
{
	pthread_mutex_destroy(&j->mu);
	free(j);
}

static void test_all_once(void **state)
{
	struct job *j = job_new();
	size_t first = 7;

	(void)state;
	assert_int_equal(par_for(N, 4, 0, run, on_fail, j, &first), 0);
	assert_int_equal(first, N);
	for (size_t i = 0; i < N; i++)
		assert_int_equal(atomic_load(&j->runs[i]), 1);
	assert_int_equal(j->fail_seen, SIZE_MAX);
	assert_true(atomic_load(&j->nseen) >= 1 && atomic_load(&j->nseen) <= 4);
	job_free(j);
}

static void test_lowest_failure_wins_all_run(void **state)
{
	struct job *j = job_new();
	size_t first = 0;

	(void)state;
	j->fail_at[900] = -EIO;
	j->fail_at[300] = -ENOSPC;
	j->fail_at[301] = -EPERM;
	assert_int_equal(par_for(N, 8, 0, run, on_fail, j, &first), -ENOSPC);
	assert_int_equal(first, 300);
	assert_int_equal(j->fail_seen, 300);
	assert_int_equal(j->fail_rc, -ENOSPC);
	/* without PAR_FOR_STOP every item ran, the failed ones too */
	for (size_t i = 0; i < N; i++)
		assert_int_equal(atomic_load(&j->runs[i]), 1);
	job_free(j);
}

static void test_stop_one_thread(void **state)
{
	struct job *j = job_new();
	size_t first = 0;

	(void)state;
	j->fail_at[10] = -ECONNRESET;
	j->fail_at[20] = -EIO;
	/* one thread runs in order: nothing after item 10 starts */
	assert_int_equal(par_for(N, 1, PAR_FOR_STOP, run, NULL, j, &first), -ECONNRESET);
	assert_int_equal(first, 10);
	assert_int_equal(atomic_load(&j->nrun), 11);
	assert_int_equal(atomic_load(&j->runs[11]), 0);
	job_free(j);
}

static void test_stop_threads(void **state)
{
	struct job *j = job_new();

	(void)state;
	j->fail_at[0] = -EBADMSG;
	assert_int_equal(par_for(N, 4, PAR_FOR_STOP, run, on_fail, j, NULL), -EBADMSG);
	assert_int_equal(j->fail_seen, 0);
	/* the others stop early: at most one item per thread after the failure */
	assert_true(atomic_load(&j->nrun) < N);
	for (size_t i = 0; i < N; i++)
		assert_true(atomic_load(&j->runs[i]) <= 1);
	job_free(j);
}

static void test_few_items_zero_items(void **state)
{
	struct job *j = job_new();
	size_t first = 5;

	(void)state;
	assert_int_equal(par_for(3, 64, 0, run, NULL, j, &first), 0);
	assert_int_equal(first, 3);
	assert_int_equal(atomic_load(&j->nrun), 3);
	assert_true(atomic_load(&j->nseen) <= 3);
	assert_int_equal(par_for(0, 4, 0, run, NULL, j, &first), 0);
	assert_int_equal(first, 0);
	/* zero threads still runs everything, on the caller's thread */
	assert_int_equal(par_for(5, 0, 0, run, NULL, j, NULL), 0);
	assert_int_equal(atomic_load(&j->nrun), 8);
	job_free(j);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_all_once),
		cmocka_unit_test(test_lowest_failure_wins_all_run),
		cmocka_unit_test(test_stop_one_thread),
		cmocka_unit_test(test_stop_threads),
		cmocka_unit_test(test_few_items_zero_items),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
