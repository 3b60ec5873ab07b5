/* Unit tests for tiers/ramtier: sealing a step into the shard store and
 * dropping it again (files, catalog record, tidy of empty STEP and JOB
 * directories), staged shards (publish, abort), and the race between a seal
 * and a stage that is begun and aborted under the same STEP directory — the
 * abort's tidy may remove a directory the seal has just made. Each test runs
 * in a private RAMDIR under /dev/shm (or /tmp). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "tiers/catalog.h"
#include "tiers/manifest.h"
#include "tiers/ramtier.h"

#define TESTTMP_NAME "ramtier"
#include "tests/unit/testtmp.h"

static void put_file(int dirfd, const char *name, const char *text)
{
	int fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	size_t len = strlen(text);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, len), (ssize_t)len);
	assert_int_equal(close(fd), 0);
}

static void key_of(struct shard_key *k, const char *job, uint64_t step, uint32_t rank)
{
	memset(k, 0, sizeof(*k));
	snprintf(k->job, sizeof(k->job), "%s", job);
	k->step = step;
	k->rank = rank;
}

/* RAMDIR/ns/<name>/{a,sub/b}: a committed step as the namespace holds it. */
static int make_step_dir(struct ram_tier *t, const char *name)
{
	int ns = ram_ns_fd(t), fd, sub;

	assert_int_equal(mkdirat(ns, name, 0755), 0);
	fd = openat(ns, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(fd >= 0);
	put_file(fd, "a", "alpha");
	assert_int_equal(mkdirat(fd, "sub", 0755), 0);
	sub = openat(fd, "sub", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(sub >= 0);
	put_file(sub, "b", "bravo-bravo");
	close(sub);
	return fd;
}

static bool shard_path_exists(struct ram_tier *t, const char *rel)
{
	struct stat st;
	char path[PATH_MAX];

	snprintf(path, sizeof(path), "%s/shards/%s", ram_path(t), rel);
	return stat(path, &st) == 0;
}

static void test_seal_verify_drop(void **state)
{
	struct tmp *tmp = *state;
	struct ram_tier *t = NULL;
	struct manifest *mf = NULL;
	struct shard_rec rec = { 0 };
	struct shard_key k;
	char err[256] = "";
	uint64_t freed = 0;
	int src;

	assert_int_equal(ram_open(tmp->path, 64 << 20, &t), 0);
	src = make_step_dir(t, "7");
	key_of(&k, "job", 7, 0);
	assert_int_equal(ram_seal(t, &k, src, 42, SHF_OWN, &mf), 0);
	assert_int_equal(mf->nfiles, 2);
	assert_int_equal(mf->total, strlen("alpha") + strlen("bravo-bravo"));
	assert_true(shard_path_exists(t, "job/7/n0-w0/sub/b"));
	assert_int_equal(idx_get_shard(ram_idx(t), &k, &rec), 0);
	assert_int_equal(rec.state, SH_COMMITTED);
	assert_int_equal(rec.ns_ino, 42);
	assert_memory_equal(rec.hash, mf->hash, 32);
	idx_rec_clear(&rec);
	assert_int_equal(ram_verify(t, &k, err, sizeof(err)), 0);

	/* a changed byte in the store is found */
	{
		char path[PATH_MAX];
		int fd;
		snprintf(path, sizeof(path), "%s/shards/job/7/n0-w0/a", ram_path(t));
		fd = open(path, O_WRONLY | O_CLOEXEC);
		assert_true(fd >= 0);
		assert_int_equal(pwrite(fd, "A", 1, 0), 1);
		close(fd);
	}
	assert_int_equal(ram_verify(t, &k, err, sizeof(err)), -EBADMSG);
	assert_non_null(strstr(err, "a"));

	assert_int_equal(ram_drop(t, &k, &freed), 0);
	assert_int_equal(idx_get_shard(ram_idx(t), &k, &rec), -ENOENT);
	/* the empty STEP and JOB directories went with it */
	assert_false(shard_path_exists(t, "job/7"));
	assert_false(shard_path_exists(t, "job"));
	assert_int_equal(ram_verify(t, &k, err, sizeof(err)), -ENOENT);
	mf_free(mf);
	close(src);
	ram_close(t);
}

static void test_stage_publish_and_abort(void **state)
{
	struct tmp *tmp = *state;
	struct ram_tier *t = NULL;
	struct manifest *mf = NULL;
	struct ram_stage st;
	struct shard_key own, rep, other;
	int src;

	assert_int_equal(ram_open(tmp->path, 64 << 20, &t), 0);
	src = make_step_dir(t, "3");
	key_of(&own, "job", 3, 0);
	assert_int_equal(ram_seal(t, &own, src, 1, SHF_OWN, &mf), 0);

	/* a replica of rank 1 with the same content: linked, published */
	key_of(&rep, "job", 3, 1);
	assert_int_equal(ram_stage_begin(t, &rep, &st), 0);
	assert_int_equal(ram_stage_link(t, &st, &own), 0);
	assert_int_equal(ram_stage_publish(t, &st, mf, 0), 0);
	assert_true(shard_path_exists(t, "job/3/n1-w0/sub/b"));
	{
		struct shard_key found;
		assert_int_equal(ram_find_hash(t, mf->hash, &found), 0);
		assert_string_equal(found.job, "job");
	}

	/* a stage that is given up leaves nothing, and tidies what it made */
	key_of(&other, "other", 9, 2);
	assert_int_equal(ram_stage_begin(t, &other, &st), 0);
	put_file(st.fd, "partial", "xx");
	ram_stage_abort(t, &st);
	assert_false(shard_path_exists(t, "other"));

	/* a stage missing a file of its manifest is refused */
	assert_int_equal(ram_stage_begin(t, &other, &st), 0);
	put_file(st.fd, "a", "alpha");
	assert_int_equal(ram_stage_publish(t, &st, mf, 0), -EBADMSG);
	ram_stage_abort(t, &st);
	assert_false(shard_path_exists(t, "other"));

	mf_free(mf);
	close(src);
	ram_close(t);
}

/* A replica arriving on the engine thread begins and aborts stages under
 * job/STEP while the seal worker seals this node's own shard of the same
 * STEP: the abort's tidy removes job/STEP (and job) whenever they are empty
 * for an instant, which must never fail the seal. */
struct racer {
	struct ram_tier *t;
	int rounds;
	int rc;
};

static void *stage_churn(void *arg)
{
	struct racer *r = arg;
	for (int i = 0; i < r->rounds && r->rc == 0; i++) {
		struct ram_stage st;
		struct shard_key k;
		key_of(&k, "job", (uint64_t)(i % 4), 1);
		r->rc = ram_stage_begin(r->t, &k, &st);
		if (r->rc == 0)
			ram_stage_abort(r->t, &st);
	}
	return NULL;
}

static void test_seal_races_stage_tidy(void **state)
{
	struct tmp *tmp = *state;
	struct ram_tier *t = NULL;
	struct racer churn = { 0 };
	pthread_t th;
	int src, rounds = 3000;

	assert_int_equal(ram_open(tmp->path, 256 << 20, &t), 0);
	src = make_step_dir(t, "0");
	churn.t = t;
	churn.rounds = rounds * 4;
	assert_int_equal(pthread_create(&th, NULL, stage_churn, &churn), 0);
	for (int i = 0; i < rounds; i++) {
		struct shard_key k;
		uint64_t freed = 0;
		int rc;
		key_of(&k, "job", (uint64_t)(i % 4), 0);
		rc = ram_seal(t, &k, src, 1, SHF_OWN, NULL);
		if (rc != 0)
			fail_msg("seal %d of step %d failed: %s", i, i % 4, strerror(-rc));
		assert_int_equal(ram_drop(t, &k, &freed), 0);
	}
	assert_int_equal(pthread_join(th, NULL), 0);
	assert_int_equal(churn.rc, 0);
	close(src);
	ram_close(t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_seal_verify_drop, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_stage_publish_and_abort, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_seal_races_stage_tidy, tmp_setup, tmp_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
