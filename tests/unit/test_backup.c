/* Unit tests for tiers/backup, each run on file:// and on gs:// (against
 * tests/gcs_server/gcs_server.py): a shard built with mf_build over a temp
 * tree is uploaded, listed with its completeness, fetched back byte for
 * byte (modes, empty directories, symlinks); every kind of incompleteness
 * (no .meta, no manifest, a missing or resized data file, a bad .meta,
 * mixed steps, a node outside the job) is reported with its reason; a
 * corrupted data object makes fetch and verify fail with -EBADMSG naming
 * it; bk_new_name's collision rule and the newest-first order; the
 * restore.version life cycle; an interrupted upload completed by a re-run
 * that uploads only what is missing; data parallelism (.meta only). */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <openssl/evp.h>

#include "common/util.h"
#include "tests/unit/bucket_fixture.h"
#include "tiers/backup.h"
#include "tiers/bucket.h"
#include "tiers/manifest.h"

#define JOB "job-a"

struct env {
	bool gs;
	char url[PATH_MAX + 32];
	struct bkt *b;
};

static int seq;

static void put_file(int dirfd, const char *name, size_t len, uint32_t seed, mode_t mode)
{
	uint8_t *buf = malloc(len + 1);
	int fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

	assert_true(fd >= 0);
	fill(buf, len, seed);
	assert_int_equal(write(fd, buf, len), (ssize_t)len);
	assert_int_equal(fchmod(fd, mode), 0);
	close(fd);
	free(buf);
}

/* A shard tree in a new directory; returns its fd and the manifest. */
static int make_shard(const char *name, uint32_t seed, struct manifest **mf)
{
	int fd;

	assert_int_equal(mkdirat(tmpfd, name, 0755), 0);
	fd = openat(tmpfd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(mkdirat(fd, "state", 0750), 0);
	assert_int_equal(mkdirat(fd, "state/deep", 0700), 0);
	assert_int_equal(mkdirat(fd, "empty", 0755), 0);
	put_file(fd, "_METADATA", 300, seed, 0644);
	put_file(fd, "state/big.bin", 700 * KIB + seed, seed + 1, 0640);
	put_file(fd, "state/deep/x.bin", 90 * KIB, seed + 2, 0444);
	put_file(fd, "zero", 0, seed + 3, 0600);
	for (int i = 0; i < 6; i++) {
		char n[32];
		snprintf(n, sizeof(n), "state/s%d", i);
		put_file(fd, n, (size_t)(i * 1000 + (int)seed), seed + 10 + (uint32_t)i, 0644);
	}
	assert_int_equal(symlinkat("state/big.bin", fd, "link"), 0);
	assert_int_equal(mf_build(fd, mf), 0);
	return fd;
}

static struct shard_key key(uint64_t step, uint32_t node, uint32_t worker)
{
	struct shard_key k = { .step = step, .rank = node, .worker = worker };
	snprintf(k.job, sizeof(k.job), "%s", JOB);
	return k;
}

static int group_setup(void **state)
{
	(void)state;
	if (tmproot_make("backup") < 0)
		return -1;
	tmpfd = open(tmproot, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	gs_client_env();
	return tmpfd < 0 || gs_srv_start() < 0 ? -1 : 0;
}

static int group_teardown(void **state)
{
	(void)state;
	gs_srv_stop();
	close(tmpfd);
	return tmproot_remove();
}

static int setup(void **state)
{
	struct env *e = *state;
	struct bkt_opts o = { .parallelism = 4, .simple_max = 64 * KIB, .chunk = 256 * KIB,
			      .part = 256 * KIB, .list_page = 3 };

	seq++;
	if (e->gs) {
		if (!tsrv_reset(&srv, true))
			return -1;
		snprintf(e->url, sizeof(e->url), "gs://bkt/root%d", seq);
	} else {
		snprintf(e->url, sizeof(e->url), "file://%s/bucket%d", tmproot, seq);
	}
	return bkt_open(e->url, &o, &e->b) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
	struct env *e = *state;

	bkt_close(e->b);
	e->b = NULL;
	return 0;
}

/* Damage one stored object, behind the store's back. */
static void corrupt(struct env *e, const char *obj, bool truncate)
{
	if (e->gs) {
		char body[1024];
		snprintf(body, sizeof(body), "{\"bucket\": \"bkt\", \"name\": \"root%d/%s\", \"kind\": \"%s\", "
			 "\"offset\": 100}", seq, obj, truncate ? "truncate" : "flip");
		assert_true(tsrv_post(&srv, "/_corrupt", body));
	} else {
		char path[PATH_MAX * 2];
		int fd;
		snprintf(path, sizeof(path), "%s/bucket%d/%s", tmproot, seq, obj);
		fd = open(path, O_WRONLY);
		assert_true(fd >= 0);
		if (truncate)
			assert_int_equal(ftruncate(fd, 100), 0);
		else
			assert_int_equal(pwrite(fd, "\xff\x00\xff", 3, 100), 3);
		close(fd);
	}
}

static void shard_obj(char *out, size_t len, const char *backup, const struct manifest *mf,
		      const char *path)
{
	char hex[65];
	mf_hash_hex(mf->hash, hex);
	snprintf(out, len, "%s/%s/%s.data/%s", JOB, backup, hex, path);
}

static const struct bk_shard *find_shard(const struct bk_backup *v, uint32_t node, uint32_t w)
{
	for (size_t i = 0; i < v->nshards; i++)
		if (v->shards[i].node == node && v->shards[i].worker == w)
			return &v->shards[i];
	return NULL;
}

static void compare_trees(int a, int b, const struct manifest *mf)
{
	char err[512];

	assert_int_equal(mf_verify(b, mf, err, sizeof(err)), 0);
	for (size_t i = 0; i < mf->n; i++) {
		struct stat sa, sb;
		assert_int_equal(fstatat(a, mf->e[i].path, &sa, AT_SYMLINK_NOFOLLOW), 0);
		assert_int_equal(fstatat(b, mf->e[i].path, &sb, AT_SYMLINK_NOFOLLOW), 0);
		assert_int_equal(sa.st_mode, sb.st_mode);
		assert_int_equal(sa.st_size, sb.st_size);
	}
}

/* ---- tests ---- */

static void test_upload_list_fetch(void **state)
{
	struct env *e = *state;
	struct manifest *m0 = NULL, *m1 = NULL, *got = NULL;
	struct shard_key k0 = key(100, 0, 0), k1 = key(100, 1, 0);
	struct bk_backup *v = NULL;
	char name[BK_NAME_MAX], dir[64];
	int s0, s1, out;
	size_t n = 0;

	snprintf(dir, sizeof(dir), "ulf%d-n0", seq);
	s0 = make_shard(dir, 1, &m0);
	snprintf(dir, sizeof(dir), "ulf%d-n1", seq);
	s1 = make_shard(dir, 2, &m1);
	assert_int_equal(bk_new_name(e->b, JOB, 1709622540, name), 0);   /* 2024-03-05 07:09 UTC */
	assert_string_equal(name, "2024-03-05_07-09");
	assert_int_equal(bk_upload_shard(e->b, JOB, name, &k0, s0, m0, true), 0);
	assert_int_equal(bk_upload_shard(e->b, JOB, name, &k1, s1, m1, true), 0);

	assert_int_equal(bk_list_backups(e->b, JOB, 2, 1, &v, &n), 0);
	assert_int_equal(n, 1);
	assert_string_equal(v[0].name, name);
	if (!v[0].complete)
		print_error("why: %s\n", v[0].why);
	assert_true(v[0].complete);
	assert_int_equal(v[0].step, 100);
	assert_int_equal(v[0].nodes_seen, 2);
	assert_int_equal(v[0].nshards, 2);
	assert_int_equal(v[0].bytes, m0->total + m1->total);
	assert_memory_equal(v[0].shards[1].hash, m1->hash, 32);
	assert_true(v[0].shards[0].complete && v[0].shards[1].complete);
	bk_backups_free(v, n);
	/* the job size inferred from the .meta names */
	{
		struct bk_backup one;
		assert_int_equal(bk_check_backup(e->b, JOB, name, 0, 0, &one), 0);
		assert_true(one.complete);
		bk_backup_clear(&one);
		/* a job of 3 nodes: node 2 is missing */
		assert_int_equal(bk_check_backup(e->b, JOB, name, 3, 1, &one), 0);
		assert_false(one.complete);
		assert_contains(one.why, "node 2 worker 0: no .meta");
		assert_int_equal(one.nshards, 3);
		assert_string_equal(find_shard(&one, 2, 0)->why, "no .meta");
		bk_backup_clear(&one);
		assert_int_equal(bk_verify_backup(e->b, JOB, name, 2, 1, &one), 0);
		assert_true(one.complete);
		bk_backup_clear(&one);
		assert_int_equal(bk_check_backup(e->b, JOB, "1999-01-01_00-00", 2, 1, &one), -ENOENT);
	}

	snprintf(dir, sizeof(dir), "ulf%d-out", seq);
	assert_int_equal(mkdirat(tmpfd, dir, 0755), 0);
	out = openat(tmpfd, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_int_equal(bk_fetch_shard(e->b, JOB, name, 1, 0, out, &got, 0), 0);
	assert_memory_equal(got->hash, m1->hash, 32);
	compare_trees(s1, out, m1);
	mf_free(got);
	assert_int_equal(bk_fetch_shard(e->b, JOB, name, 5, 0, out, &got, 0), -ENOENT);
	assert_null(got);
	close(out);
	close(s0);
	close(s1);
	mf_free(m0);
	mf_free(m1);
}

static bool first_complete(void *arg, const struct bk_backup *v)
{
	(*(int *)arg)++;
	return v->complete;
}

static void test_incomplete(void **state)
{
	struct env *e = *state;
	struct manifest *m0 = NULL, *m1 = NULL;
	struct bk_backup one;
	char dir[64], obj[PATH_MAX], hex[65];
	const char *b1 = "2024-01-01_00-00", *b2 = "2024-01-01_00-01", *b3 = "2024-01-01_00-02";
	struct shard_key k0 = key(7, 0, 0), k1 = key(7, 1, 0), k1s8 = key(8, 1, 0);
	int s0, s1;

	snprintf(dir, sizeof(dir), "inc%d-n0", seq);
	s0 = make_shard(dir, 3, &m0);
	snprintf(dir, sizeof(dir), "inc%d-n1", seq);
	s1 = make_shard(dir, 4, &m1);

	/* b1: node 1's .meta never written */
	assert_int_equal(bk_upload_shard(e->b, JOB, b1, &k0, s0, m0, true), 0);
	assert_int_equal(bk_check_backup(e->b, JOB, b1, 2, 1, &one), 0);
	assert_false(one.complete);
	assert_contains(one.why, "node 1 worker 0: no .meta");
	bk_backup_clear(&one);
	/* ... and a node outside a 1-node job */
	assert_int_equal(bk_upload_shard(e->b, JOB, b1, &k1, s1, m1, true), 0);
	assert_int_equal(bk_check_backup(e->b, JOB, b1, 1, 1, &one), 0);
	assert_false(one.complete);
	assert_contains(one.why, "outside the job's 1 nodes");
	bk_backup_clear(&one);
	assert_int_equal(bk_check_backup(e->b, JOB, b1, 2, 1, &one), 0);
	assert_true(one.complete);
	bk_backup_clear(&one);
	/* a data file missing */
	shard_obj(obj, sizeof(obj), b1, m1, "state/s3");
	assert_int_equal(bkt_delete(e->b, obj), 0);
	assert_int_equal(bk_check_backup(e->b, JOB, b1, 2, 1, &one), 0);
	assert_false(one.complete);
	assert_contains(one.why, "node 1 worker 0: missing data file state/s3");
	assert_true(find_shard(&one, 0, 0)->complete);
	assert_false(find_shard(&one, 1, 0)->complete);
	bk_backup_clear(&one);
	/* a data file of the wrong size */
	shard_obj(obj, sizeof(obj), b1, m0, "state/deep/x.bin");
	corrupt(e, obj, true);
	assert_int_equal(bk_check_backup(e->b, JOB, b1, 2, 1, &one), 0);
	assert_false(one.complete);
	assert_contains(find_shard(&one, 0, 0)->why, "data file state/deep/x.bin has 100 bytes");
	bk_backup_clear(&one);

	/* b2: mixed steps */
	assert_int_equal(bk_upload_shard(e->b, JOB, b2, &k0, s0, m0, true), 0);
	assert_int_equal(bk_upload_shard(e->b, JOB, b2, &k1s8, s1, m1, true), 0);
	assert_int_equal(bk_check_backup(e->b, JOB, b2, 2, 1, &one), 0);
	assert_false(one.complete);
	assert_contains(one.why, "mixed steps 7 and 8");
	assert_int_equal(one.step, 8);
	bk_backup_clear(&one);

	/* b3: no manifest; then a .meta that is not a hash */
	assert_int_equal(bk_upload_shard(e->b, JOB, b3, &k0, s0, m0, true), 0);
	assert_int_equal(bk_upload_shard(e->b, JOB, b3, &k1, s1, m1, true), 0);
	mf_hash_hex(m1->hash, hex);
	snprintf(obj, sizeof(obj), "%s/%s/%s.manifest", JOB, b3, hex);
	assert_int_equal(bkt_delete(e->b, obj), 0);
	assert_int_equal(bk_check_backup(e->b, JOB, b3, 2, 1, &one), 0);
	assert_false(one.complete);
	assert_contains(find_shard(&one, 1, 0)->why, ".manifest");
	bk_backup_clear(&one);
	snprintf(obj, sizeof(obj), "%s/%s/%s-s7-n0-w0.meta", JOB, b3, JOB);
	assert_int_equal(bkt_delete(e->b, obj), 0);
	assert_int_equal(bkt_put_buf(e->b, obj, "not-a-hash", 10), 0);
	assert_int_equal(bk_check_backup(e->b, JOB, b3, 2, 1, &one), 0);
	assert_contains(find_shard(&one, 0, 0)->why, "not a shard hash");
	bk_backup_clear(&one);
	{
		struct manifest *got = NULL;
		assert_int_equal(bk_fetch_shard(e->b, JOB, b3, 0, 0, tmpfd, &got, 0), -EBADMSG);
	}

	/* newest first */
	{
		struct bk_backup *v = NULL;
		size_t n = 0;
		assert_int_equal(bk_list_backups(e->b, JOB, 2, 1, &v, &n), 0);
		assert_int_equal(n, 3);
		assert_string_equal(v[0].name, b3);
		assert_string_equal(v[1].name, b2);
		assert_string_equal(v[2].name, b1);
		bk_backups_free(v, n);
	}
	/* a restore checks newest first and stops at the first complete one */
	{
		const char *b0 = "2023-12-31_23-59", *b4 = "2024-01-01_00-03";
		struct bk_backup *v = NULL;
		size_t n = 0;
		int calls = 0;
		assert_int_equal(bk_upload_shard(e->b, JOB, b0, &k0, s0, m0, true), 0);
		assert_int_equal(bk_upload_shard(e->b, JOB, b0, &k1, s1, m1, true), 0);
		/* the three incomplete ones are passed on the way to b0 */
		assert_int_equal(bk_list_backups_until(e->b, JOB, 2, 1, first_complete, &calls,
						       &v, &n), 0);
		assert_int_equal(n, 4);
		assert_int_equal(calls, 4);
		assert_string_equal(v[0].name, b3);
		assert_false(v[0].complete);
		assert_string_equal(v[3].name, b0);
		assert_true(v[3].complete);
		bk_backups_free(v, n);
		/* a newer complete one: only it is checked */
		assert_int_equal(bk_upload_shard(e->b, JOB, b4, &k0, s0, m0, true), 0);
		assert_int_equal(bk_upload_shard(e->b, JOB, b4, &k1, s1, m1, true), 0);
		calls = 0;
		assert_int_equal(bk_list_backups_until(e->b, JOB, 2, 1, first_complete, &calls,
						       &v, &n), 0);
		assert_int_equal(n, 1);
		assert_int_equal(calls, 1);
		assert_string_equal(v[0].name, b4);
		assert_true(v[0].complete);
		bk_backups_free(v, n);
		/* the full listing still has all five */
		assert_int_equal(bk_list_backups(e->b, JOB, 2, 1, &v, &n), 0);
		assert_int_equal(n, 5);
		bk_backups_free(v, n);
	}
	close(s0);
	close(s1);
	mf_free(m0);
	mf_free(m1);
}

static void test_corrupt_object(void **state)
{
	struct env *e = *state;
	struct manifest *m = NULL, *got = NULL;
	struct shard_key k = key(3, 0, 0);
	struct bk_backup one;
	const char *bn = "2024-06-01_12-00";
	char dir[64], obj[PATH_MAX];
	int s, out;

	snprintf(dir, sizeof(dir), "cor%d", seq);
	s = make_shard(dir, 5, &m);
	assert_int_equal(bk_upload_shard(e->b, JOB, bn, &k, s, m, true), 0);
	shard_obj(obj, sizeof(obj), bn, m, "state/big.bin");
	corrupt(e, obj, false);
	/* the size is right, so the listing judges it complete ... */
	assert_int_equal(bk_check_backup(e->b, JOB, bn, 1, 1, &one), 0);
	assert_true(one.complete);
	bk_backup_clear(&one);
	/* ... but reading it back does not */
	snprintf(dir, sizeof(dir), "cor%d-out", seq);
	assert_int_equal(mkdirat(tmpfd, dir, 0755), 0);
	out = openat(tmpfd, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_int_equal(bk_fetch_shard(e->b, JOB, bn, 0, 0, out, &got, 0), -EBADMSG);
	assert_null(got);
	assert_contains(bkt_last_error(), "state/big.bin");
	assert_int_equal(bk_verify_backup(e->b, JOB, bn, 1, 1, &one), -EBADMSG);
	assert_false(one.complete);
	assert_contains(one.why, "state/big.bin");
	bk_backup_clear(&one);
	close(out);
	close(s);
	mf_free(m);
}

/* A backup as GKE's replicator writes it (sync.py, merkle.py): every
 * node's .meta holds "D" + the BLAKE3 hex of its shard, the data is in
 * D<hash>.data/ (one per distinct hash: under data parallelism the .meta of
 * every node of a column names the same one), no manifest; gcsfuse adds
 * placeholder objects for directories. */
#define GKE_H0 "D1f0e3dad99908345f7439f8ffabdffc4a13a6d1f60a2f1c2b7a5d0f7a8f3c2e1"
#define GKE_H1 "Dae2a7b9c0d1e2f30415263748596a7b8c9d0e1f2a3b4c5d6e7f8091a2b3c4d5e"
static void put_obj(struct env *e, const char *bn, const char *rel, const void *buf, size_t len)
{
	char obj[PATH_MAX + 128];

	snprintf(obj, sizeof(obj), "%s/%s/%s", JOB, bn, rel);
	assert_int_equal(bkt_put_buf(e->b, obj, buf, len), 0);
}

/* An object written straight to the test server; relenc is URL-encoded. */
static void raw_put(const char *bn, const char *relenc, const char *body)
{
	char path[200];

	assert_true((size_t)snprintf(path, sizeof(path), "/upload/storage/v1/b/bkt/o?uploadType="
				     "media&name=root%d%%2F%s%%2F%s%%2F%s", seq, JOB, bn, relenc) <
		    sizeof(path));
	assert_true(tsrv_post(&srv, path, body));
}

static void test_gke_written_backup(void **state)
{
	struct env *e = *state;
	const char *bn = "2025-06-30_14-30";
	static const char *files[] = { "manifest.ocdbt", "d/array", "d/zero", "_CHECKPOINT_METADATA" };
	static const size_t sizes[] = { 300, 90 * KIB + 7, 0, 1234 };
	uint8_t *bufs[4];
	struct manifest *got = NULL;
	struct bk_backup one;
	char dir[64], rel[PATH_MAX];
	int out;

	for (int n = 0; n < 2; n++) {
		snprintf(rel, sizeof(rel), "%s-s7-n%d-w0.meta", JOB, n);
		put_obj(e, bn, rel, GKE_H0, strlen(GKE_H0));
	}
	if (e->gs) {
		/* gcsfuse's directory placeholders (names ending in "/", which
		 * mtcfs's own client refuses to write: straight to the server) */
		raw_put(bn, GKE_H0 ".data%2F", "");
		raw_put(bn, GKE_H0 ".data%2Fd%2F", "");
		raw_put(bn, GKE_H0 ".data%2Fempty%2F", "");
	}
	for (int i = 0; i < 4; i++) {
		bufs[i] = malloc(sizes[i] + 1);
		fill(bufs[i], sizes[i], 40u + (uint32_t)i);
		snprintf(rel, sizeof(rel), GKE_H0 ".data/%s", files[i]);
		put_obj(e, bn, rel, bufs[i], sizes[i]);
	}
	assert_int_equal(bk_check_backup(e->b, JOB, bn, 2, 1, &one), 0);
	if (!one.complete)
		print_error("why: %s\n", one.why);
	assert_true(one.complete);
	assert_int_equal(one.step, 7);
	assert_int_equal(one.nshards, 2);
	assert_true(one.shards[0].gke && one.shards[1].gke);
	bk_backup_clear(&one);
	/* node 1 (whose data node 0's .data holds) fetches it byte for byte;
	 * its manifest is built from the bytes received */
	snprintf(dir, sizeof(dir), "gke%d-out", seq);
	assert_int_equal(mkdirat(tmpfd, dir, 0755), 0);
	out = openat(tmpfd, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_int_equal(bk_fetch_shard(e->b, JOB, bn, 1, 0, out, &got, 0), 0);
	assert_int_equal(got->nfiles, 4);
	assert_int_equal(got->total, sizes[0] + sizes[1] + sizes[2] + sizes[3]);
	for (int i = 0; i < 4; i++) {
		uint8_t *b = malloc(sizes[i] + 1);
		int fd = openat(out, files[i], O_RDONLY | O_CLOEXEC);
		struct stat st;
		assert_true(fd >= 0);
		assert_int_equal(fstat(fd, &st), 0);
		assert_int_equal(st.st_size, (off_t)sizes[i]);
		assert_int_equal(read(fd, b, sizes[i] + 1), (ssize_t)sizes[i]);
		assert_memory_equal(b, bufs[i], sizes[i]);
		close(fd);
		free(b);
	}
	mf_free(got);
	got = NULL;
	assert_int_equal(bk_verify_backup(e->b, JOB, bn, 2, 1, &one), 0);
	assert_true(one.complete);
	bk_backup_clear(&one);
	/* A flipped byte: gs lists each object's CRC32C, so fetch and verify
	 * fail naming it; file:// has nothing to check against (no manifest,
	 * no CRC, BLAKE3 not recomputed) and restores the bytes as they are. */
	snprintf(rel, sizeof(rel), "%s/%s/" GKE_H0 ".data/d/array", JOB, bn);
	corrupt(e, rel, false);
	snprintf(dir, sizeof(dir), "gke%d-out2", seq);
	assert_int_equal(mkdirat(tmpfd, dir, 0755), 0);
	close(out);
	out = openat(tmpfd, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (e->gs) {
		assert_int_equal(bk_fetch_shard(e->b, JOB, bn, 0, 0, out, &got, 0), -EBADMSG);
		assert_null(got);
		assert_contains(bkt_last_error(), "d/array");
		assert_int_equal(bk_verify_backup(e->b, JOB, bn, 2, 1, &one), -EBADMSG);
		assert_false(one.complete);
		bk_backup_clear(&one);
	} else {
		assert_int_equal(bk_fetch_shard(e->b, JOB, bn, 0, 0, out, &got, 0), 0);
		mf_free(got);
		got = NULL;
	}
	close(out);
	/* no .data for a .meta: incomplete, named */
	snprintf(rel, sizeof(rel), "%s-s7-n0-w0.meta", JOB);
	put_obj(e, "2025-06-30_14-31", rel, GKE_H1, strlen(GKE_H1));
	assert_int_equal(bk_check_backup(e->b, JOB, "2025-06-30_14-31", 1, 1, &one), 0);
	assert_false(one.complete);
	assert_contains(one.why, ".data/");
	bk_backup_clear(&one);
	/* an object name that would leave the shard makes it incomplete */
	if (e->gs) {
		raw_put("2025-06-30_14-31", GKE_H1 ".data%2F..%2F..%2Fescape", "x");
		assert_int_equal(bk_check_backup(e->b, JOB, "2025-06-30_14-31", 1, 1, &one), 0);
		assert_false(one.complete);
		assert_contains(one.why, "unsafe");
		bk_backup_clear(&one);
	}
	for (int i = 0; i < 4; i++)
		free(bufs[i]);
}

static void test_new_name(void **state)
{
	struct env *e = *state;
	char name[BK_NAME_MAX], obj[PATH_MAX];
	const time_t t = 1709622540;   /* 2024-03-05 07:09 UTC */
	struct bk_backup *v = NULL;
	size_t n = 0;

	assert_int_equal(bk_new_name(e->b, JOB, t, name), 0);
	assert_string_equal(name, "2024-03-05_07-09");
	/* an unrelated object with the same start does not count */
	snprintf(obj, sizeof(obj), "%s/2024-03-05_07-09x", JOB);
	assert_int_equal(bkt_put_buf(e->b, obj, "x", 1), 0);
	assert_int_equal(bk_new_name(e->b, JOB, t + 50, name), 0);
	assert_string_equal(name, "2024-03-05_07-09");
	/* The minute is taken: no "-2" (GKE and Orbax list only the bare
	 * stamp); the caller waits for the next minute. */
	snprintf(obj, sizeof(obj), "%s/2024-03-05_07-09/something", JOB);
	assert_int_equal(bkt_put_buf(e->b, obj, "x", 1), 0);
	memset(name, 0, sizeof(name));
	assert_int_equal(bk_new_name(e->b, JOB, t, name), -EAGAIN);
	assert_int_equal(bk_new_name(e->b, JOB, t + 59 - (t % 60), name), -EAGAIN);
	assert_non_null(strstr(bkt_last_error(), "next minute"));
	assert_int_equal(bk_new_name(e->b, JOB, t + 60 - (t % 60), name), 0);
	assert_string_equal(name, "2024-03-05_07-10");
	/* Names older mtcfs wrote ("-N") are still listed, in order: -10 after
	 * -9 numerically, newest first, a minute earlier last. */
	for (int i = 2; i <= 10; i++) {
		snprintf(obj, sizeof(obj), "%s/2024-03-05_07-09-%d/something", JOB, i);
		assert_int_equal(bkt_put_buf(e->b, obj, "x", 1), 0);
	}
	snprintf(obj, sizeof(obj), "%s/2024-03-05_07-08/something", JOB);
	assert_int_equal(bkt_put_buf(e->b, obj, "x", 1), 0);
	snprintf(obj, sizeof(obj), "%s/manual-copy/something", JOB);
	assert_int_equal(bkt_put_buf(e->b, obj, "x", 1), 0);
	assert_int_equal(bk_list_backups(e->b, JOB, 1, 1, &v, &n), 0);
	assert_int_equal(n, 12);     /* STAMP, -2 .. -10, the minute before, manual-copy */
	assert_string_equal(v[0].name, "2024-03-05_07-09-10");
	assert_string_equal(v[1].name, "2024-03-05_07-09-9");
	assert_string_equal(v[8].name, "2024-03-05_07-09-2");
	assert_string_equal(v[9].name, "2024-03-05_07-09");
	assert_string_equal(v[10].name, "2024-03-05_07-08");
	assert_string_equal(v[11].name, "manual-copy");
	for (size_t i = 0; i < n; i++) {
		assert_false(v[i].complete);
		assert_string_equal(v[i].why, "no .meta");
	}
	bk_backups_free(v, n);
	assert_int_equal(bk_new_name(e->b, "bad/job", t, name), -EINVAL);
}

/* A failed attempt that will not be resumed goes away whole, so the next
 * attempt never leaves a second partial directory. */
static void test_discard_attempt(void **state)
{
	struct env *e = *state;
	char obj[PATH_MAX], name[BK_NAME_MAX];
	const char *bk = "2024-03-05_07-09";
	const char *objs[] = { "j-s1-n0-w0.meta", "aa.manifest", "aa.data/x", "aa.data/d/y" };
	uint64_t size;
	uint32_t crc;

	for (size_t i = 0; i < sizeof(objs) / sizeof(objs[0]); i++) {
		snprintf(obj, sizeof(obj), "%s/%s/%s", JOB, bk, objs[i]);
		assert_int_equal(bkt_put_buf(e->b, obj, "x", 1), 0);
	}
	snprintf(obj, sizeof(obj), "%s/2024-03-05_07-08/keep", JOB);
	assert_int_equal(bkt_put_buf(e->b, obj, "k", 1), 0);
	assert_int_equal(bk_discard_attempt(e->b, JOB, bk), 0);
	for (size_t i = 0; i < sizeof(objs) / sizeof(objs[0]); i++) {
		snprintf(obj, sizeof(obj), "%s/%s/%s", JOB, bk, objs[i]);
		assert_int_equal(bkt_stat(e->b, obj, &size, &crc), -ENOENT);
	}
	snprintf(obj, sizeof(obj), "%s/2024-03-05_07-08/keep", JOB);
	assert_int_equal(bkt_stat(e->b, obj, &size, &crc), 0);
	/* the minute is free again; nothing there is fine too */
	assert_int_equal(bk_new_name(e->b, JOB, 1709622540, name), 0);
	assert_string_equal(name, bk);
	assert_int_equal(bk_discard_attempt(e->b, JOB, bk), 0);
	assert_int_equal(bk_discard_attempt(e->b, JOB, "../x"), -EINVAL);
}

static void test_restore_version(void **state)
{
	struct env *e = *state;
	char name[BK_NAME_MAX], obj[PATH_MAX];

	assert_int_equal(bk_get_restore_version(e->b, JOB, name), -ENOENT);
	assert_int_equal(bk_clear_restore_version(e->b, JOB), 0);
	assert_int_equal(bk_set_restore_version(e->b, JOB, "2024-01-01_00-00"), 0);
	assert_int_equal(bk_get_restore_version(e->b, JOB, name), 0);
	assert_string_equal(name, "2024-01-01_00-00");
	assert_int_equal(bk_set_restore_version(e->b, JOB, "2024-02-02_00-00-2"), 0);
	assert_int_equal(bk_get_restore_version(e->b, JOB, name), 0);
	assert_string_equal(name, "2024-02-02_00-00-2");
	assert_int_equal(bk_clear_restore_version(e->b, JOB), 0);
	assert_int_equal(bk_get_restore_version(e->b, JOB, name), -ENOENT);
	assert_int_equal(bk_set_restore_version(e->b, JOB, "../escape"), -EINVAL);
	/* written by someone else: a trailing newline is fine, a path is not */
	snprintf(obj, sizeof(obj), "%s/%s", JOB, BK_RESTORE_VERSION);
	assert_int_equal(bkt_put_buf(e->b, obj, "2024-03-03_03-03\n", 17), 0);
	assert_int_equal(bk_get_restore_version(e->b, JOB, name), 0);
	assert_string_equal(name, "2024-03-03_03-03");
	assert_int_equal(bkt_delete(e->b, obj), 0);
	assert_int_equal(bkt_put_buf(e->b, obj, "../../etc", 9), 0);
	assert_int_equal(bk_get_restore_version(e->b, JOB, name), -EBADMSG);
	/* restore.version is not a backup */
	{
		struct bk_backup *v = NULL;
		size_t n = 0;
		assert_int_equal(bk_list_backups(e->b, JOB, 1, 1, &v, &n), 0);
		assert_int_equal(n, 0);
		bk_backups_free(v, n);
	}
}

static size_t uploads(void)
{
	json_t *l = tsrv_log_class(&srv, "upload"), *x;
	size_t i, n = 0;

	json_array_foreach(l, i, x) {
		/* count objects created: media/multipart POSTs and resumable starts */
		if (!strcmp(json_string_value(json_object_get(x, "method")), "POST"))
			n++;
	}
	json_decref(l);
	return n;
}

static void test_idempotent_reupload(void **state)
{
	struct env *e = *state;
	struct manifest *m = NULL, *m2 = NULL, *got = NULL;
	struct shard_key k = key(9, 0, 0), k1 = key(9, 1, 0), kx = key(9, 0, 0);
	struct bk_backup one;
	const char *bn = "2024-07-07_07-07";
	char dir[64], obj[PATH_MAX];
	size_t done = 0;
	int s, s2, out;

	snprintf(dir, sizeof(dir), "idem%d", seq);
	s = make_shard(dir, 6, &m);
	/* a crash after some data files: upload three of them by hand */
	for (size_t i = 0; i < m->n && done < 3; i++) {
		int fd;
		if (m->e[i].type != MF_FILE)
			continue;
		shard_obj(obj, sizeof(obj), bn, m, m->e[i].path);
		fd = openat(s, m->e[i].path, O_RDONLY);
		assert_int_equal(bkt_put_file(e->b, obj, fd, m->e[i].size, m->e[i].crc32c), 0);
		close(fd);
		done++;
	}
	assert_int_equal(bk_check_backup(e->b, JOB, bn, 1, 1, &one), 0);
	assert_false(one.complete);
	bk_backup_clear(&one);
	if (e->gs)
		assert_true(tsrv_reset(&srv, false));
	assert_int_equal(bk_upload_shard(e->b, JOB, bn, &k, s, m, true), 0);
	if (e->gs)   /* only what was missing: the other files, the manifest, the .meta */
		assert_int_equal(uploads(), m->nfiles - 3 + 2);
	assert_int_equal(bk_check_backup(e->b, JOB, bn, 1, 1, &one), 0);
	assert_true(one.complete);
	bk_backup_clear(&one);
	/* a whole re-run: nothing rewritten, all checked */
	if (e->gs)
		assert_true(tsrv_reset(&srv, false));
	assert_int_equal(bk_upload_shard(e->b, JOB, bn, &k, s, m, true), 0);
	if (e->gs) {
		json_t *l = tsrv_log_class(&srv, "upload"), *x;
		size_t i;
		assert_int_equal(json_array_size(l), 2);       /* manifest and .meta: 412 */
		json_array_foreach(l, i, x)
			assert_int_equal(tsrv_status(x), 412);
		json_decref(l);
	}
	/* data parallelism: node 1 of the same column, same content: .meta only */
	snprintf(dir, sizeof(dir), "idem%d-twin", seq);
	s2 = make_shard(dir, 6, &m2);
	assert_memory_equal(m2->hash, m->hash, 32);
	if (e->gs)
		assert_true(tsrv_reset(&srv, false));
	assert_int_equal(bk_upload_shard(e->b, JOB, bn, &k1, s2, m2, false), 0);
	if (e->gs)
		assert_int_equal(uploads(), 2);                /* manifest (412) + .meta */
	assert_int_equal(bk_check_backup(e->b, JOB, bn, 2, 1, &one), 0);
	assert_true(one.complete);
	bk_backup_clear(&one);
	snprintf(dir, sizeof(dir), "idem%d-out", seq);
	assert_int_equal(mkdirat(tmpfd, dir, 0755), 0);
	out = openat(tmpfd, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_int_equal(bk_fetch_shard(e->b, JOB, bn, 1, 0, out, &got, 0), 0);
	compare_trees(s, out, m);
	mf_free(got);
	close(out);
	/* another shard for the same key in the same backup: refused */
	mf_free(m2);
	close(s2);
	snprintf(dir, sizeof(dir), "idem%d-other", seq);
	s2 = make_shard(dir, 77, &m2);
	assert_int_equal(bk_upload_shard(e->b, JOB, bn, &kx, s2, m2, true), -EEXIST);
	assert_contains(bkt_last_error(), "already records another shard");
	/* a local file that no longer matches its manifest */
	{
		struct shard_key k2 = key(9, 2, 0);
		put_file(s2, "state/s1", 1000 + 77, 12345, 0644);    /* same size, other bytes */
		assert_int_equal(bk_upload_shard(e->b, JOB, "2024-07-07_07-08", &k2, s2, m2, true),
				 -EBADMSG);
	}
	close(s2);
	mf_free(m2);
	close(s);
	mf_free(m);
}

static void test_fetch_refuses_unsafe_trees(void **state)
{
	struct env *e = *state;
	struct manifest m = { 0 }, *got = NULL;
	struct mf_entry ent[2] = {
		{ .path = "a", .target = "/etc", .type = MF_SYMLINK, .mode = 0777 },
		{ .path = "a/passwd", .type = MF_FILE, .mode = 0644, .size = 1,
		  .crc32c = 0 },
	};
	const char *bn = "2024-08-08_08-08";
	uint8_t *enc = NULL;
	size_t len = 0;
	char hex[65], obj[PATH_MAX];
	struct manifest *dec = NULL;

	/* a manifest writing through a symlink, built by hand: the hash
	 * covers the encoding after magic, version and hash (bytes 40..) */
	ent[1].crc32c = mf_crc32c(0, "x", 1);
	m.e = ent;
	m.n = 2;
	assert_int_equal(mf_encode(&m, &enc, &len), 0);
	{
		unsigned int hl = 0;
		assert_int_equal(EVP_Digest(enc + 40, len - 40, enc + 8, &hl, EVP_sha256(), NULL), 1);
	}
	/* well-formed, but unsafe: mf_decode refuses it as peers do */
	assert_int_equal(mf_decode(enc, len, &dec), -EBADMSG);
	mf_hash_hex(enc + 8, hex);
	snprintf(obj, sizeof(obj), "%s/%s/%s.manifest", JOB, bn, hex);
	assert_int_equal(bkt_put_buf(e->b, obj, enc, len), 0);
	snprintf(obj, sizeof(obj), "%s/%s/%s.data/a/passwd", JOB, bn, hex);
	assert_int_equal(bkt_put_buf(e->b, obj, "x", 1), 0);
	snprintf(obj, sizeof(obj), "%s/%s/%s-s1-n0-w0.meta", JOB, bn, JOB);
	assert_int_equal(bkt_put_buf(e->b, obj, hex, 64), 0);
	assert_int_equal(bk_fetch_shard(e->b, JOB, bn, 0, 0, tmpfd, &got, 0), -EBADMSG);
	assert_contains(bkt_last_error(), "symlink a -> /etc: the target is absolute");
	free(enc);
	mf_free(dec);
}


/* A hostile bucket: a consistent manifest (hash, .meta) naming a 1 TiB
 * file, its object a sparse 1 TiB file. Unchanged, bk_fetch_shard read the
 * whole TiB of zeros (413 s) before the CRC refused it; now the RAM tier's
 * size refuses it before a byte is read (-EFBIG), and an object whose
 * listed size is not the manifest's is refused the same way (-EBADMSG). */
static void put_hostile(struct env *e, const char *bn, uint64_t claim, uint64_t real)
{
	struct manifest m = { 0 };
	struct mf_entry ent = { .path = "w", .type = MF_FILE, .mode = 0644, .size = claim,
				.crc32c = 0 };
	uint8_t *enc = NULL;
	size_t len = 0;
	unsigned int hl = 0;
	char hex[65], obj[PATH_MAX], path[PATH_MAX * 3];
	int fd;

	m.e = &ent;
	m.n = 1;
	assert_int_equal(mf_encode(&m, &enc, &len), 0);
	assert_int_equal(EVP_Digest(enc + 40, len - 40, enc + 8, &hl, EVP_sha256(), NULL), 1);
	mf_hash_hex(enc + 8, hex);
	snprintf(obj, sizeof(obj), "%s/%s/%s.manifest", JOB, bn, hex);
	assert_int_equal(bkt_put_buf(e->b, obj, enc, len), 0);
	snprintf(obj, sizeof(obj), "%s/%s/%s.data/w", JOB, bn, hex);
	assert_int_equal(bkt_put_buf(e->b, obj, "x", 1), 0);
	snprintf(path, sizeof(path), "%s/bucket%d/%s", tmproot, seq, obj);
	fd = open(path, O_WRONLY);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)real), 0);
	close(fd);
	snprintf(obj, sizeof(obj), "%s/%s/%s-s1-n0-w0.meta", JOB, bn, JOB);
	assert_int_equal(bkt_put_buf(e->b, obj, hex, 64), 0);
	free(enc);
}

static void test_fetch_checks_sizes_first(void **state)
{
	struct env *e = *state;
	struct manifest *got = NULL;
	const uint64_t tib = 1ull << 40;
	char dir[64];
	struct timespec t0, t1;
	int out;

	snprintf(dir, sizeof(dir), "big%d-out", seq);
	assert_int_equal(mkdirat(tmpfd, dir, 0755), 0);
	out = openat(tmpfd, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(out >= 0);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	put_hostile(e, "2024-09-09_09-09", tib, tib);
	assert_int_equal(bk_fetch_shard(e->b, JOB, "2024-09-09_09-09", 0, 0, out, &got, 1ull << 30),
			 -EFBIG);
	assert_null(got);
	assert_contains(bkt_last_error(), "more than this node can hold");
	/* the manifest says 10 bytes, the object is a TiB: no bound given */
	put_hostile(e, "2024-09-10_09-09", 10, tib);
	assert_int_equal(bk_fetch_shard(e->b, JOB, "2024-09-10_09-09", 0, 0, out, &got, 0),
			 -EBADMSG);
	assert_contains(bkt_last_error(), "the manifest says 10");
	clock_gettime(CLOCK_MONOTONIC, &t1);
	/* neither read the TiB (at ~2.6 GB/s that is 400 s) */
	assert_true(t1.tv_sec - t0.tv_sec < 20);
	close(out);
}

int main(void)
{
	static struct env file_env = { .gs = false }, gs_env = { .gs = true };
#define BOTH(t) \
	cmocka_unit_test_prestate_setup_teardown(t, setup, teardown, &file_env), \
	cmocka_unit_test_prestate_setup_teardown(t, setup, teardown, &gs_env)
	const struct CMUnitTest tests[] = {
		BOTH(test_upload_list_fetch),
		BOTH(test_incomplete),
		BOTH(test_corrupt_object),
		BOTH(test_new_name),
		BOTH(test_discard_attempt),
		BOTH(test_gke_written_backup),
		BOTH(test_restore_version),
		BOTH(test_idempotent_reupload),
		cmocka_unit_test_prestate_setup_teardown(test_fetch_refuses_unsafe_trees, setup,
							 teardown, &file_env),
		cmocka_unit_test_prestate_setup_teardown(test_fetch_checks_sizes_first, setup,
							 teardown, &file_env),
	};
	int rc;

	curl_global_init(CURL_GLOBAL_DEFAULT);
	rc = cmocka_run_group_tests_name("backup", tests, group_setup, group_teardown);
	curl_global_cleanup();
	return rc;
}
