/* Unit tests for the per-worker parts of tiers/backup (framework: pytorch),
 * on file://: one worker's file uploaded as <hash>.data (one object) with
 * its .meta, checked complete for nodes x workers, fetched back byte for
 * byte under the name asked for; a missing worker's .meta makes the backup
 * incomplete naming it; workers with the same bytes share one object; a
 * .meta cannot be rewritten to other bytes; the older mtcfs layout (one w0
 * shard with a manifest holding every worker's file) is complete for any
 * worker count and bk_fetch_file says -EMEDIUMTYPE for it. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#define TESTTMP_NAME "bkworkers"
#include "tests/unit/testfill.h"
#include "tests/unit/testtmp.h"
#include "tiers/backup.h"
#include "tiers/bucket.h"
#include "tiers/manifest.h"

#define JOB "pt"
#define BK "2026-01-02_03-04"
#define STEP 5u

static size_t body_len(uint32_t seed) { return 3000 + seed * 7; }

/* node n's files of STEP in a new directory n<n>: worker w's bytes come
 * from seeds[w]. Returns the directory's fd. */
static int node_dir(struct tmp *t, uint32_t n, const uint32_t *seeds, uint32_t workers,
		    struct manifest **mf)
{
	char d[32];
	int fd;

	snprintf(d, sizeof(d), "n%u", n);
	assert_int_equal(mkdirat(t->fd, d, 0755), 0);
	fd = openat(t->fd, d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(fd >= 0);
	for (uint32_t w = 0; w < workers; w++) {
		char fn[64];
		size_t len = body_len(seeds[w]);
		uint8_t *buf = malloc(len);
		int f;
		snprintf(fn, sizeof(fn), JOB "-s%u-n%u-w%u.save", STEP, n, w);
		assert_non_null(buf);
		fill(buf, len, seeds[w]);
		f = openat(fd, fn, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		assert_true(f >= 0);
		assert_int_equal(write(f, buf, len), (ssize_t)len);
		close(f);
		free(buf);
	}
	assert_int_equal(mf_build(fd, mf), 0);
	return fd;
}

static struct bkt *open_bucket(struct tmp *t)
{
	char url[PATH_MAX + 16];
	struct bkt_opts o = { 0 };
	struct bkt *b = NULL;

	snprintf(url, sizeof(url), "file://%s/bucket", t->path);
	assert_int_equal(bkt_open(url, &o, &b), 0);
	return b;
}

static struct shard_key key(uint32_t n, uint32_t w)
{
	struct shard_key k = { .step = STEP, .rank = n, .worker = w };
	snprintf(k.job, sizeof(k.job), "%s", JOB);
	return k;
}

/* Upload node n's files per worker. */
static void upload_workers(struct bkt *b, int fd, const struct manifest *mf, uint32_t n,
			   bool data)
{
	for (size_t i = 0; i < mf->n; i++) {
		struct shard_key k;
		unsigned w;
		if (sscanf(mf->e[i].path, JOB "-s%*u-n%*u-w%u.save", &w) != 1)
			continue;
		k = key(n, w);
		assert_int_equal(bk_upload_file(b, JOB, BK, &k, fd, &mf->e[i], data), 0);
	}
}

static void assert_fetched(struct bkt *b, struct tmp *t, uint32_t n, uint32_t w, uint32_t seed)
{
	char dir[32], fn[64];
	size_t len = body_len(seed);
	uint8_t *want = malloc(len), *got = malloc(len + 1);
	struct stat st;
	int dfd, f;

	snprintf(dir, sizeof(dir), "get-n%u-w%u", n, w);
	assert_int_equal(mkdirat(t->fd, dir, 0755), 0);
	dfd = openat(t->fd, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(dfd >= 0);
	snprintf(fn, sizeof(fn), JOB "-s%u-n%u-w%u.save", STEP, n, w);
	assert_int_equal(bk_fetch_file(b, JOB, BK, n, w, dfd, fn, 0), 0);
	f = openat(dfd, fn, O_RDONLY | O_CLOEXEC);
	assert_true(f >= 0);
	assert_int_equal(fstat(f, &st), 0);
	assert_int_equal(st.st_size, (off_t)len);
	assert_int_equal(st.st_mode & 0777, 0644);
	assert_int_equal(read(f, got, len + 1), (ssize_t)len);
	fill(want, len, seed);
	assert_memory_equal(got, want, len);
	close(f);
	close(dfd);
	free(want);
	free(got);
}

static size_t count_data_objects(struct tmp *t)
{
	char p[PATH_MAX + 64];
	size_t n = 0;
	struct dirent *de;
	DIR *d;

	snprintf(p, sizeof(p), "%s/bucket/" JOB "/" BK, t->path);
	d = opendir(p);
	assert_non_null(d);
	while ((de = readdir(d)) != NULL) {
		size_t l = strlen(de->d_name);
		if (l > 5 && !strcmp(de->d_name + l - 5, ".data"))
			n++;
	}
	closedir(d);
	return n;
}

/* Two nodes' files of STEP (node n: workers[n] files from seeds[n]) and
 * a file:// bucket: what every test starts from. */
struct nodes2 {
	struct bkt *b;
	int fd[2];
	struct manifest *m[2];
};

static void nodes2_open(struct tmp *t, struct nodes2 *x, const uint32_t *s0, uint32_t w0,
			const uint32_t *s1, uint32_t w1)
{
	x->b = open_bucket(t);
	x->m[0] = x->m[1] = NULL;
	x->fd[0] = node_dir(t, 0, s0, w0, &x->m[0]);
	x->fd[1] = node_dir(t, 1, s1, w1, &x->m[1]);
}

static void nodes2_close(struct nodes2 *x)
{
	for (int n = 0; n < 2; n++) {
		close(x->fd[n]);
		mf_free(x->m[n]);
	}
	bkt_close(x->b);
}

static void test_per_worker_roundtrip(void **state)
{
	struct tmp *t = *state;
	/* node 1's two workers saved the same bytes: one object for both */
	const uint32_t s0[] = { 1, 2 }, s1[] = { 3, 3 };
	struct nodes2 x;
	struct bk_backup v;

	nodes2_open(t, &x, s0, 2, s1, 2);
	upload_workers(x.b, x.fd[0], x.m[0], 0, true);
	upload_workers(x.b, x.fd[1], x.m[1], 1, true);
	assert_int_equal(count_data_objects(t), 3);
	assert_int_equal(bk_check_backup(x.b, JOB, BK, 2, 2, &v), 0);
	assert_true(v.complete);
	assert_int_equal(v.step, STEP);
	assert_int_equal(v.nshards, 4);
	for (size_t i = 0; i < v.nshards; i++) {
		assert_true(v.shards[i].file);
		assert_false(v.shards[i].gke);
		assert_int_equal(v.shards[i].node, i / 2);
		assert_int_equal(v.shards[i].worker, i % 2);
	}
	assert_memory_equal(v.shards[2].hash, v.shards[3].hash, 32);
	bk_backup_clear(&v);
	/* inferred worker count (mtcfs-admin) */
	assert_int_equal(bk_check_backup(x.b, JOB, BK, 0, 0, &v), 0);
	assert_true(v.complete);
	bk_backup_clear(&v);
	/* verify reads every object */
	assert_int_equal(bk_verify_backup(x.b, JOB, BK, 2, 2, &v), 0);
	assert_true(v.complete);
	bk_backup_clear(&v);
	assert_fetched(x.b, t, 0, 0, 1);
	assert_fetched(x.b, t, 0, 1, 2);
	assert_fetched(x.b, t, 1, 0, 3);
	assert_fetched(x.b, t, 1, 1, 3);
	/* a re-run of the same upload is a no-op; other bytes for a .meta are refused */
	upload_workers(x.b, x.fd[0], x.m[0], 0, true);
	{
		struct shard_key k = key(0, 0);
		assert_int_equal(bk_upload_file(x.b, JOB, BK, &k, x.fd[1], &x.m[1]->e[0], true), -EEXIST);
	}
	nodes2_close(&x);
}

static void test_missing_worker_is_incomplete(void **state)
{
	struct tmp *t = *state;
	const uint32_t s0[] = { 1, 2 }, s1[] = { 3, 4 };
	struct nodes2 x;
	struct bk_backup v;
	char dir[32];
	int dfd;

	nodes2_open(t, &x, s0, 2, s1, 1);
	upload_workers(x.b, x.fd[0], x.m[0], 0, true);
	upload_workers(x.b, x.fd[1], x.m[1], 1, true);   /* node 1: worker 0 only */
	assert_int_equal(bk_check_backup(x.b, JOB, BK, 2, 2, &v), 0);
	assert_false(v.complete);
	assert_string_equal(v.why, "node 1 worker 1: no .meta");
	bk_backup_clear(&v);
	snprintf(dir, sizeof(dir), "get");
	assert_int_equal(mkdirat(t->fd, dir, 0755), 0);
	dfd = openat(t->fd, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_int_equal(bk_fetch_file(x.b, JOB, BK, 1, 1, dfd, "x.save", 0), -ENOENT);
	/* names are file names, nothing else */
	assert_int_equal(bk_fetch_file(x.b, JOB, BK, 0, 0, dfd, "../x", 0), -EINVAL);
	assert_int_equal(bk_fetch_file(x.b, JOB, BK, 0, 0, dfd, "a/x", 0), -EINVAL);
	close(dfd);
	nodes2_close(&x);
}

static void test_data_parallel_meta_only(void **state)
{
	struct tmp *t = *state;
	/* one column: the same bytes on both nodes; node 0 uploads .meta only */
	const uint32_t s[] = { 7, 8 };
	struct nodes2 x;
	struct bk_backup v;

	nodes2_open(t, &x, s, 2, s, 2);
	upload_workers(x.b, x.fd[0], x.m[0], 0, false);
	assert_int_equal(bk_check_backup(x.b, JOB, BK, 2, 2, &v), 0);
	assert_false(v.complete);   /* no data yet */
	bk_backup_clear(&v);
	upload_workers(x.b, x.fd[1], x.m[1], 1, true);
	assert_int_equal(count_data_objects(t), 2);
	assert_int_equal(bk_check_backup(x.b, JOB, BK, 2, 2, &v), 0);
	assert_true(v.complete);
	bk_backup_clear(&v);
	assert_fetched(x.b, t, 0, 1, 8);
	nodes2_close(&x);
}

static void test_older_node_layout_still_complete(void **state)
{
	struct tmp *t = *state;
	const uint32_t s0[] = { 1, 2 }, s1[] = { 3, 4 };
	struct manifest *got = NULL;
	struct nodes2 x;
	int dfd;
	struct shard_key k0 = key(0, 0);
	struct bk_backup v;

	nodes2_open(t, &x, s0, 2, s1, 2);
	/* node 0 as mtcfs wrote it before: one w0 shard holding both files;
	 * node 1 per worker */
	assert_int_equal(bk_upload_shard(x.b, JOB, BK, &k0, x.fd[0], x.m[0], true), 0);
	upload_workers(x.b, x.fd[1], x.m[1], 1, true);
	assert_int_equal(bk_check_backup(x.b, JOB, BK, 2, 2, &v), 0);
	assert_true(v.complete);
	bk_backup_clear(&v);
	assert_int_equal(mkdirat(t->fd, "old", 0755), 0);
	dfd = openat(t->fd, "old", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_int_equal(bk_fetch_file(x.b, JOB, BK, 0, 0, dfd, "x.save", 0), -EMEDIUMTYPE);
	assert_int_equal(bk_fetch_shard(x.b, JOB, BK, 0, 0, dfd, &got, 0), 0);
	assert_memory_equal(got->hash, x.m[0]->hash, 32);
	assert_int_equal(got->nfiles, 2);
	mf_free(got);
	close(dfd);
	nodes2_close(&x);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_per_worker_roundtrip, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_missing_worker_is_incomplete, tmp_setup,
						tmp_teardown),
		cmocka_unit_test_setup_teardown(test_data_parallel_meta_only, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_older_node_layout_still_complete, tmp_setup,
						tmp_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
