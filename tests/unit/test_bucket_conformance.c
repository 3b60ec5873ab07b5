/* One conformance suite for every bucket backend (tiers/bucket.h): the same
 * cases run against file:// (tiers/bucket_file.c), gs:// (tiers/bucket_gcs*.c
 * against tests/gcs_server/gcs_server.py started here) and the unit tests'
 * in-memory bucket (tests/unit/mem_bucket.h), each case on a fresh, empty
 * bucket, named "BACKEND.CASE". The cases are the contract the callers
 * (tiers/backup*.c, tiers/tier_bucket.c) rely on: bytes back as put (empty,
 * small, several MiB, sparse, into a pipe), write-once (also racing),
 * nothing published by a refused put, -ENOENT for what is absent, listing
 * order and "/" roll-up, delete, CRC32C checks on read, refused names, the
 * parallel transfers. What a backend cannot do by design is skipped for it
 * with the reason, never silently. Wire-level gs:// tests (which requests
 * are sent) and file://'s on-disk details stay in test_bucket.c. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
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

#include "common/util.h"
#include "tests/unit/bucket_fixture.h"
#include "tests/unit/bucket_listing.h"
#include "tests/unit/mem_bucket.h"
#include "tiers/bucket.h"
#include "tiers/manifest.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ---- backends ---- */

struct backend {
	const char *name;
	int  (*group_setup)(void);
	void (*group_teardown)(void);
	/* a fresh, empty bucket; *b owned by the caller */
	int  (*open)(struct bkt **b);
	/* flip the stored byte at off of an object, behind the backend's back */
	void (*damage)(struct bkt *b, const char *name, size_t off);
	/* the backend keeps a CRC32C per object and checks what it delivers
	 * against it, without the caller's expected CRC */
	bool stored_crc;
	/* "x" and "x/y" may both be objects */
	bool name_is_prefix;
	/* bytes the backend puts before every name (gs://bkt/pfx: "pfx/"),
	 * which count against the 1024 of a name */
	size_t name_prefix;
};

static unsigned opened;          /* file:// buckets made so far: one directory each */

/* file:// */

static int file_open(struct bkt **b)
{
	char url[PATH_MAX + 32];

	snprintf(url, sizeof(url), "file://%s/bkt%u", tmproot, ++opened);
	return bkt_open(url, NULL, b);
}

static void file_damage(struct bkt *b, const char *name, size_t off)
{
	char path[PATH_MAX * 2];
	unsigned char c;
	int fd;

	snprintf(path, sizeof(path), "%s/%s", bkt_url(b) + strlen("file://"), name);
	fd = open(path, O_RDWR | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &c, 1, (off_t)off), 1);
	c ^= 0x55;
	assert_int_equal(pwrite(fd, &c, 1, (off_t)off), 1);
	close(fd);
}

/* gs://: the test server, emptied before each case; small chunks and parts
 * so that resumable uploads and ranged downloads are what the cases use */

static int gs_open(struct bkt **b)
{
	const struct bkt_opts o = { .parallelism = 4, .simple_max = 256 * KIB,
				    .chunk = 256 * KIB, .part = 256 * KIB, .list_page = 3 };

	if (!tsrv_reset(&srv, true))
		return -1;
	return bkt_open("gs://bkt/pfx", &o, b);
}

static void gs_damage(struct bkt *b, const char *name, size_t off)
{
	char body[1400];

	(void)b;
	snprintf(body, sizeof(body), "{\"bucket\": \"bkt\", \"name\": \"pfx/%s\", \"kind\": \"flip\", "
		 "\"offset\": %zu}", name, off);
	assert_true(tsrv_post(&srv, "/_corrupt", body));
}

/* mem:// */

static int mem_group_setup(void)
{
	mem_bucket_install();
	return 0;
}

static void mem_group_teardown(void)
{
	mem_bucket_clear();
}

static int mem_open_fresh(struct bkt **b)
{
	mem_bucket_clear();
	return bkt_open("mem://conformance", NULL, b);
}

static void mem_damage(struct bkt *b, const char *name, size_t off)
{
	(void)b;
	assert_int_equal(mem_bucket_corrupt(name, off), 1);
}

static const struct backend backends[] = {
	{ .name = "file", .open = file_open, .damage = file_damage,
	  /* file:// keeps no CRC beside the file: damage on disk is caught only
	   * against the caller's expected CRC */
	  .stored_crc = false,
	  /* a name is a file or a directory, not both: -EISDIR / -ENOTDIR */
	  .name_is_prefix = false },
	{ .name = "gs", .group_setup = gs_srv_start, .group_teardown = gs_srv_stop,
	  .open = gs_open, .damage = gs_damage, .stored_crc = true, .name_is_prefix = true,
	  .name_prefix = 4 },
	{ .name = "mem", .group_setup = mem_group_setup, .group_teardown = mem_group_teardown,
	  .open = mem_open_fresh, .damage = mem_damage, .stored_crc = true, .name_is_prefix = true },
};

/* ---- helpers ---- */

static void skip_because(const struct backend *be, const char *why)
{
	print_message("[  SKIPPED ] %s: %s\n", be->name, why);
	skip();
}

static void expect_bytes(struct bkt *b, const char *name, const void *want, size_t len)
{
	void *buf = NULL;
	size_t got = 1;

	assert_int_equal(bkt_get_buf(b, name, len, &buf, &got), 0);
	assert_int_equal(got, len);
	assert_memory_equal(buf, want, len);
	assert_int_equal(((char *)buf)[len], '\0');
	free(buf);
}

/* ---- cases ---- */

static void c_small(struct bkt *b, const struct backend *be)
{
	uint64_t size = 0;
	uint32_t crc = 0;
	void *buf = NULL;
	size_t len;

	(void)be;
	assert_int_equal(bkt_put_buf(b, "small/meta", "hello", 5), 0);
	assert_string_equal(bkt_last_error(), "");
	expect_bytes(b, "small/meta", "hello", 5);
	assert_int_equal(bkt_get_buf(b, "small/meta", 4, &buf, &len), -EFBIG);
	assert_null(buf);
	assert_true(bkt_last_error()[0]);
	assert_int_equal(bkt_stat(b, "small/meta", &size, &crc), 0);
	assert_int_equal(size, 5);
	assert_int_equal(crc, mf_crc32c(0, "hello", 5));
	assert_int_equal(bkt_stat(b, "small/meta", NULL, NULL), 0);
}

static void c_empty(struct bkt *b, const struct backend *be)
{
	uint64_t size = 1;
	uint32_t crc = 1;
	int out;

	(void)be;
	assert_int_equal(bkt_put_buf(b, "empty", "", 0), 0);
	assert_int_equal(bkt_put_buf(b, "empty-null", NULL, 0), 0);
	expect_bytes(b, "empty", "", 0);
	expect_bytes(b, "empty-null", "", 0);
	assert_int_equal(bkt_stat(b, "empty", &size, &crc), 0);
	assert_int_equal(size, 0);
	assert_int_equal(crc, 0);
	out = new_fd("empty.dst");
	assert_int_equal(write(out, "stale", 5), 5);
	size = 1;
	assert_int_equal(bkt_get_file(b, "empty", out, &size, true, 0), 0);
	assert_int_equal(size, 0);
	assert_int_equal(lseek(out, 0, SEEK_END), 0);   /* truncated to the object's size */
	close(out);
}

static void c_large(struct bkt *b, const struct backend *be)
{
	const uint64_t n = 3 * MIB + 17;
	uint64_t size = 0;
	uint32_t crc, got_crc = 0;
	int fd, out;

	(void)be;
	fd = make_file("large.src", n, 1, &crc);
	assert_int_equal(lseek(fd, 5, SEEK_SET), 5);
	assert_int_equal(bkt_put_file(b, "d/e/large.bin", fd, n, crc), 0);
	assert_int_equal(lseek(fd, 0, SEEK_CUR), 5);       /* pread: the offset untouched */
	close(fd);
	assert_int_equal(bkt_stat(b, "d/e/large.bin", &size, &got_crc), 0);
	assert_int_equal(size, n);
	assert_int_equal(got_crc, crc);
	/* into a longer file: truncated to the object's size */
	out = new_fd("large.dst");
	assert_int_equal(ftruncate(out, (off_t)(n + MIB)), 0);
	/* and its offset moved: a regular file is written with pwrite from 0 */
	assert_int_equal(write(out, "stale stale stale", 17), 17);
	size = 0;
	assert_int_equal(bkt_get_file(b, "d/e/large.bin", out, &size, true, crc), 0);
	assert_int_equal(size, n);
	close(out);
	assert_same_file("large.src", "large.dst", n);
	/* without an expected CRC, and without asking for the size */
	out = new_fd("large.dst2");
	assert_int_equal(bkt_get_file(b, "d/e/large.bin", out, NULL, false, 0), 0);
	close(out);
	assert_same_file("large.src", "large.dst2", n);
}

/* bkt_get_file into something that is not a regular file: plain writes, in order */
static void c_pipe(struct bkt *b, const struct backend *be)
{
	const size_t n = MIB + 7;
	struct piper pr = { .cap = n + 1 };
	uint8_t *want = malloc(n);
	uint64_t size = 0;
	pthread_t th;
	int p[2], rc;

	(void)be;
	assert_non_null(want);
	fill(want, n, 2);
	assert_int_equal(bkt_put_buf(b, "piped", want, n), 0);
	assert_int_equal(pipe(p), 0);
	pr.fd = p[0];
	pr.buf = malloc(pr.cap);
	assert_non_null(pr.buf);
	assert_int_equal(pthread_create(&th, NULL, pipe_reader, &pr), 0);
	/* the reader is joined before any assertion can leave the function */
	rc = bkt_get_file(b, "piped", p[1], &size, true, mf_crc32c(0, want, n));
	close(p[1]);
	pthread_join(th, NULL);
	close(p[0]);
	assert_int_equal(rc, 0);
	assert_int_equal(size, n);
	assert_int_equal(pr.got, n);
	assert_memory_equal(pr.buf, want, n);
	free(pr.buf);
	free(want);
}

/* Downloads keep holes (bucket.h, bkt_pwrite_sparse): a restore of a mostly
 * empty file does not allocate it; what the target held before is gone. */
static void c_sparse(struct bkt *b, const struct backend *be)
{
	const uint64_t size = 32ull * MIB;
	uint64_t got = 0;
	uint32_t crc;
	int fd, out;

	(void)be;
	fd = make_sparse("sp.src", size, &crc);
	assert_int_equal(bkt_put_file(b, "s/sparse.bin", fd, size, crc), 0);
	close(fd);
	out = new_fd("sp.dst");
	assert_int_equal(pwrite(out, "stale", 5, 30 * MIB), 5);  /* where the object has a hole */
	assert_int_equal(bkt_get_file(b, "s/sparse.bin", out, &got, true, crc), 0);
	close(out);
	assert_int_equal(got, size);
	assert_true(allocated(tmpfd, "sp.dst") <= 64 * KIB);
	assert_same_file("sp.src", "sp.dst", size);
	/* the CRC covers the logical bytes, holes included */
	out = new_fd("sp.dst2");
	assert_int_equal(bkt_get_file(b, "s/sparse.bin", out, &got, true, crc ^ 1), -EBADMSG);
	close(out);
}

static void c_write_once(struct bkt *b, const struct backend *be)
{
	uint64_t size = 0;
	uint32_t crc, got_crc = 0;
	int fd;

	(void)be;
	assert_int_equal(bkt_put_buf(b, "x/obj", "first", 5), 0);
	assert_int_equal(bkt_put_buf(b, "x/obj", "second", 6), -EEXIST);
	assert_contains(bkt_last_error(), "x/obj");
	assert_int_equal(bkt_put_buf(b, "x/obj", "first", 5), -EEXIST);   /* even the same bytes */
	fd = make_file("wo.src", 300 * KIB, 3, &crc);
	assert_int_equal(bkt_put_file(b, "x/obj", fd, 300 * KIB, crc), -EEXIST);
	close(fd);
	expect_bytes(b, "x/obj", "first", 5);
	assert_int_equal(bkt_stat(b, "x/obj", &size, &got_crc), 0);
	assert_int_equal(size, 5);
	assert_int_equal(got_crc, mf_crc32c(0, "first", 5));
}

/* A put whose data does not match its CRC, or whose file is shorter than
 * the size given, is refused and publishes nothing. */
static void c_refused_put(struct bkt *b, const struct backend *be)
{
	uint32_t crc;
	int fd;

	(void)be;
	fd = make_file("bad.src", 1000, 4, &crc);
	assert_int_equal(bkt_put_file(b, "x/bad", fd, 1000, crc ^ 1), -EBADMSG);
	assert_true(bkt_last_error()[0]);
	assert_int_equal(bkt_stat(b, "x/bad", NULL, NULL), -ENOENT);
	assert_int_equal(bkt_put_file(b, "x/short", fd, 2000, crc), -EIO);
	assert_true(bkt_last_error()[0]);
	assert_int_equal(bkt_stat(b, "x/short", NULL, NULL), -ENOENT);
	assert_int_equal(bkt_put_file(b, "x/nofd", -1, 10, 0), -EBADF);
	/* the name is still free */
	assert_int_equal(bkt_put_file(b, "x/bad", fd, 1000, crc), 0);
	close(fd);
}

struct racer {
	struct bkt *b;
	int id;
	int rc;
};

static void *race(void *arg)
{
	struct racer *r = arg;
	char data[64 * 1024];

	memset(data, 'a' + r->id, sizeof(data));
	r->rc = bkt_put_buf(r->b, "race/obj", data, sizeof(data));
	return NULL;
}

/* One handle, eight threads putting one name: one wins, whole. */
static void c_concurrent_writers(struct bkt *b, const struct backend *be)
{
	struct racer r[8];
	pthread_t th[8];
	int winners = 0;
	void *buf = NULL;
	size_t len;

	(void)be;
	for (int i = 0; i < 8; i++) {
		r[i] = (struct racer){ .b = b, .id = i };
		assert_int_equal(pthread_create(&th[i], NULL, race, &r[i]), 0);
	}
	for (int i = 0; i < 8; i++) {
		pthread_join(th[i], NULL);
		if (r[i].rc == 0)
			winners++;
		else
			assert_int_equal(r[i].rc, -EEXIST);
	}
	assert_int_equal(winners, 1);
	assert_int_equal(bkt_get_buf(b, "race/obj", MIB, &buf, &len), 0);
	assert_int_equal(len, 64 * 1024);
	for (size_t i = 1; i < len; i++)
		assert_int_equal(((char *)buf)[i], ((char *)buf)[0]);   /* one writer's bytes only */
	free(buf);
}

static void c_missing(struct bkt *b, const struct backend *be)
{
	uint64_t size = 7;
	void *buf = (void *)1;
	size_t len = 7;
	int out = new_fd("missing.dst");

	(void)be;
	assert_int_equal(bkt_put_buf(b, "s/f", "x", 1), 0);
	assert_int_equal(bkt_get_file(b, "s/none", out, &size, false, 0), -ENOENT);
	assert_true(bkt_last_error()[0]);
	assert_int_equal(bkt_get_file(b, "s/none", out, &size, true, 0), -ENOENT);
	close(out);
	assert_int_equal(bkt_get_buf(b, "s/none", 100, &buf, &len), -ENOENT);
	assert_null(buf);
	assert_int_equal(len, 0);
	assert_true(bkt_last_error()[0]);
	assert_int_equal(bkt_stat(b, "s/none", &size, NULL), -ENOENT);
	assert_true(bkt_last_error()[0]);
	assert_int_equal(bkt_delete(b, "s/none"), -ENOENT);
	assert_true(bkt_last_error()[0]);
	/* a "directory" is no object */
	assert_int_equal(bkt_stat(b, "s", &size, NULL), -ENOENT);
	assert_int_equal(bkt_get_buf(b, "s", 100, &buf, &len), -ENOENT);
	assert_int_equal(bkt_delete(b, "s"), -ENOENT);
	/* below an object */
	assert_int_equal(bkt_stat(b, "s/f/g", &size, NULL), -ENOENT);
	assert_int_equal(bkt_get_buf(b, "s/f/g", 100, &buf, &len), -ENOENT);
}

/* ---- listings ---- */

static void populate(struct bkt *b, const char *const *names, size_t n)
{
	for (size_t i = 0; i < n; i++)
		assert_int_equal(bkt_put_buf(b, names[i], names[i], strlen(names[i])), 0);
}

static const char *const b_all[] = { "b/c/d", "b/e" };
static const char *const pa_all[] = { "a.txt", "a/1", "a/2", "a0" };
static const char *const exact[] = { "a.txt" };

static void c_list_empty(struct bkt *b, const struct backend *be)
{
	(void)be;
	expect_list(b, "", NULL, NULL, 0);
	expect_list(b, "", "/", NULL, 0);
	expect_list(b, "a/", "/", NULL, 0);
}

static void c_list(struct bkt *b, const struct backend *be)
{
	struct seen s;

	(void)be;
	populate_listing(b);
	check_listings(b);   /* "a" with "/" is mid-component */
	expect_list(b, "b/", NULL, b_all, ARRAY_LEN(b_all));
	expect_list(b, "a", NULL, pa_all, ARRAY_LEN(pa_all));
	expect_list(b, "a.txt", "/", exact, 1);
	expect_list(b, "nothing", NULL, NULL, 0);
	expect_list(b, "z/", NULL, NULL, 0);                            /* below an object */
	s = (struct seen){ .stop_after = 1 };
	assert_int_equal(bkt_list(b, "", "/", collect, &s), 42);
	assert_int_equal(s.n, 1);
}

/* Bytewise order: upper case before lower, '-' before '/', UTF-8 last. */
static void c_list_order(struct bkt *b, const struct backend *be)
{
	static const char *const in[] = { "k/b", "k/a-1", "k/a/x", "k/\xc3\xa9", "k/B", "k/a~",
					  "k/a.z", "k/0" };
	static const char *const all[] = { "k/0", "k/B", "k/a-1", "k/a.z", "k/a/x", "k/a~", "k/b",
					   "k/\xc3\xa9" };
	static const char *const dl[] = { "k/0", "k/B", "k/a-1", "k/a.z", "k/a/", "k/a~", "k/b",
					  "k/\xc3\xa9" };

	(void)be;
	populate(b, in, ARRAY_LEN(in));
	expect_list(b, "k/", NULL, all, ARRAY_LEN(all));
	expect_list(b, "k/", "/", dl, ARRAY_LEN(dl));
	expect_list(b, "", NULL, all, ARRAY_LEN(all));
}

static void c_list_ex(struct bkt *b, const struct backend *be)
{
	struct seen s = { 0 };

	(void)be;
	populate_listing(b);
	assert_int_equal(bkt_list_ex(b, "", NULL, collect_ex, &s), 0);
	assert_int_equal(s.n, ARRAY_LEN(all_sorted));
	for (int k = 0; k < s.n; k++) {
		assert_string_equal(s.names[k], all_sorted[k]);
		assert_int_equal(s.size[k], strlen(all_sorted[k]));
	}
	s = (struct seen){ 0 };
	assert_int_equal(bkt_list_ex(b, "", "/", collect_ex, &s), 0);
	assert_int_equal(s.n, ARRAY_LEN(top_delim));
}

/* The callback may use the bucket: read each object, delete some (prune
 * lists then deletes; restore reads what it lists). */
struct reentry {
	struct bkt *b;
	int n;
};

static int read_and_delete(void *arg, const char *name, bool is_prefix, uint64_t size)
{
	struct reentry *r = arg;

	assert_false(is_prefix);
	expect_bytes(r->b, name, name, (size_t)size);
	if (r->n++ % 2 == 0)
		assert_int_equal(bkt_delete(r->b, name), 0);
	return 0;
}

static void c_list_reentrant(struct bkt *b, const struct backend *be)
{
	static const char *const left[] = { "a/1", "a0", "b/e" };
	struct reentry r = { .b = b };

	(void)be;
	populate_listing(b);
	assert_int_equal(bkt_list(b, "", NULL, read_and_delete, &r), 0);
	assert_int_equal(r.n, ARRAY_LEN(all_sorted));
	expect_list(b, "", NULL, left, ARRAY_LEN(left));
}

static void c_delete(struct bkt *b, const struct backend *be)
{
	static const char *const after[] = { "a.txt", "a0", "b/c/d", "b/e" };
	static const char *const after_delim[] = { "a.txt", "a0", "b/" };
	uint64_t size = 0;

	(void)be;
	populate_listing(b);
	assert_int_equal(bkt_delete(b, "z"), 0);
	assert_string_equal(bkt_last_error(), "");
	assert_int_equal(bkt_delete(b, "z"), -ENOENT);
	assert_int_equal(bkt_stat(b, "z", NULL, NULL), -ENOENT);
	/* the last object under a/: the prefix is gone from the listing too */
	assert_int_equal(bkt_delete(b, "a/1"), 0);
	assert_int_equal(bkt_delete(b, "a/2"), 0);
	expect_list(b, "", NULL, after, ARRAY_LEN(after));
	expect_list(b, "", "/", after_delim, ARRAY_LEN(after_delim));
	expect_list(b, "a/", "/", NULL, 0);
	/* write-once keeps no tombstone: a deleted name is free again */
	assert_int_equal(bkt_put_buf(b, "z", "again", 5), 0);
	expect_bytes(b, "z", "again", 5);
	assert_int_equal(bkt_put_buf(b, "a/1", "back", 4), 0);
	assert_int_equal(bkt_stat(b, "a/1", &size, NULL), 0);
	assert_int_equal(size, 4);
}

/* "x" and "x/y" both objects: listed as "x" then "x/". */
static void c_name_is_prefix(struct bkt *b, const struct backend *be)
{
	static const char *const all[] = { "x", "x/y" };
	static const char *const dl[] = { "x", "x/" };

	if (!be->name_is_prefix) {
		/* by design: file:// names are paths, a name is a file or a
		 * directory; the refusal is a clean errno, nothing half made */
		assert_int_equal(bkt_put_buf(b, "x/y", "x/y", 3), 0);
		assert_int_equal(bkt_put_buf(b, "x", "x", 1), -EISDIR);
		assert_int_equal(bkt_put_buf(b, "x/y/z", "x", 1), -ENOTDIR);
		expect_list(b, "", NULL, all + 1, 1);
		skip_because(be, "an object name cannot also be a prefix (a file is not a directory)");
		return;
	}
	assert_int_equal(bkt_put_buf(b, "x/y", "x/y", 3), 0);
	assert_int_equal(bkt_put_buf(b, "x", "x", 1), 0);
	expect_list(b, "", NULL, all, ARRAY_LEN(all));
	expect_list(b, "", "/", dl, ARRAY_LEN(dl));
	expect_bytes(b, "x", "x", 1);
	assert_int_equal(bkt_delete(b, "x"), 0);
	expect_bytes(b, "x/y", "x/y", 3);
}

/* ---- CRC32C on read ---- */

static void c_crc_expected(struct bkt *b, const struct backend *be)
{
	uint32_t crc;
	uint64_t size = 0;
	int fd, out;

	(void)be;
	fd = make_file("crc.src", 700 * KIB, 9, &crc);
	assert_int_equal(bkt_put_file(b, "s/f.bin", fd, 700 * KIB, crc), 0);
	close(fd);
	out = new_fd("crc.dst");
	assert_int_equal(bkt_get_file(b, "s/f.bin", out, &size, true, crc), 0);
	assert_int_equal(size, 700 * KIB);
	assert_int_equal(bkt_get_file(b, "s/f.bin", out, &size, true, crc + 1), -EBADMSG);
	assert_contains(bkt_last_error(), "s/f.bin");
	assert_contains(bkt_last_error(), "crc32c");
	assert_int_equal(bkt_get_file(b, "s/f.bin", out, &size, false, 0), 0);
	close(out);
	assert_same_file("crc.src", "crc.dst", 700 * KIB);
}

/* A stored byte flipped behind the backend's back. */
static void c_crc_damaged(struct bkt *b, const struct backend *be)
{
	uint32_t crc;
	uint64_t size;
	void *buf = NULL;
	size_t len;
	int fd, out;

	fd = make_file("dmg.src", 100 * KIB, 10, &crc);
	assert_int_equal(bkt_put_file(b, "s/f.bin", fd, 100 * KIB, crc), 0);
	close(fd);
	be->damage(b, "s/f.bin", 5000);
	out = new_fd("dmg.dst");
	assert_int_equal(bkt_get_file(b, "s/f.bin", out, &size, true, crc), -EBADMSG);
	assert_contains(bkt_last_error(), "crc32c");
	if (!be->stored_crc) {
		close(out);
		skip_because(be, "no CRC32C is stored with an object: damage is found only "
				 "against the caller's expected CRC");
		return;
	}
	assert_int_equal(bkt_get_file(b, "s/f.bin", out, &size, false, 0), -EBADMSG);
	assert_true(bkt_last_error()[0]);
	close(out);
	assert_int_equal(bkt_get_buf(b, "s/f.bin", MIB, &buf, &len), -EBADMSG);
	assert_null(buf);
}

/* ---- names ---- */

static void c_bad_names(struct bkt *b, const struct backend *be)
{
	static const char *const bad[] = {
		"", "/abs", "a//b", "a/./b", "../x", "a/..", "a/", ".", "..", ".bkt-tmp-1",
		"d/.bkt-tmp-x/y", "new\nline", "tab\tx", "del\x7f", NULL,
	};
	char long_name[1100];
	uint64_t size;
	void *buf = NULL;
	size_t len;
	int fd = new_fd("names.src"), out = new_fd("names.dst");

	(void)be;
	for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
		assert_int_equal(bkt_put_buf(b, bad[i], "x", 1), -EINVAL);
		assert_contains(bkt_last_error(), "invalid object name");
		assert_int_equal(bkt_put_file(b, bad[i], fd, 0, 0), -EINVAL);
		assert_int_equal(bkt_get_buf(b, bad[i], 10, &buf, &len), -EINVAL);
		assert_contains(bkt_last_error(), "invalid object name");
		assert_int_equal(bkt_get_file(b, bad[i], out, &size, false, 0), -EINVAL);
		assert_int_equal(bkt_stat(b, bad[i], &size, NULL), -EINVAL);
		assert_int_equal(bkt_delete(b, bad[i]), -EINVAL);
		assert_contains(bkt_last_error(), "invalid object name");
	}
	/* over 1024 bytes (components short enough for any file system) */
	for (size_t i = 0; i < 1025; i++)
		long_name[i] = i % 100 == 99 ? '/' : 'n';
	long_name[1025] = '\0';
	assert_int_equal(bkt_put_buf(b, long_name, "x", 1), -EINVAL);
	assert_int_equal(bkt_stat(b, long_name, NULL, NULL), -EINVAL);
	assert_int_equal(bkt_list(b, "../", "/", collect, NULL), -EINVAL);
	assert_int_equal(bkt_list(b, "a//", NULL, collect, NULL), -EINVAL);
	assert_int_equal(bkt_list_ex(b, "", "|", collect_ex, NULL), -EINVAL);
	assert_int_equal(bkt_list_ex(b, "", "", collect_ex, NULL), -EINVAL);
	/* nothing reached the bucket */
	expect_list(b, "", NULL, NULL, 0);
	close(fd);
	close(out);
}

/* The longest name a backend takes: 1024 bytes with its own prefix (gs://'s
 * "pfx/" leaves 1020); one byte more is refused, as too long, before any
 * request. */
static void c_long_names(struct bkt *b, const struct backend *be)
{
	char name[1100];
	size_t room = 1024 - be->name_prefix;
	uint64_t size = 0;

	for (size_t i = 0; i <= room; i++)
		name[i] = i % 100 == 99 ? '/' : 'n';
	name[room] = '\0';
	assert_int_equal(bkt_put_buf(b, name, "x", 1), 0);
	assert_int_equal(bkt_stat(b, name, &size, NULL), 0);
	assert_int_equal(size, 1);
	expect_bytes(b, name, "x", 1);
	assert_int_equal(bkt_delete(b, name), 0);
	assert_int_equal(bkt_stat(b, name, &size, NULL), -ENOENT);
	name[room] = 'n';
	name[room + 1] = '\0';
	if (be->name_prefix) {
		assert_int_equal(bkt_put_buf(b, name, "x", 1), -ENAMETOOLONG);
		assert_contains(bkt_last_error(), "with the bucket's prefix");
		assert_int_equal(bkt_stat(b, name, &size, NULL), -ENAMETOOLONG);
	} else {
		assert_int_equal(bkt_put_buf(b, name, "x", 1), -EINVAL);
	}
	expect_list(b, "", NULL, NULL, 0);
}

/* Names the interface accepts, with characters URLs and shells care about. */
static void c_odd_names(struct bkt *b, const struct backend *be)
{
	static const char *const odd[] = {
		"sp ace/f ile", "pct/%2F%00", "q/a?b=c&d#e", "plus/a+b", "u/\xc3\xa9t\xc3\xa9",
		"dots/...", "dots/.hidden", "dots/a..b", "star/*", "quote/\"'`", "colon/a:b;c",
	};
	static const char *const sorted[] = {
		"colon/a:b;c", "dots/...", "dots/.hidden", "dots/a..b", "pct/%2F%00", "plus/a+b",
		"q/a?b=c&d#e", "quote/\"'`", "sp ace/f ile", "star/*", "u/\xc3\xa9t\xc3\xa9",
	};
	uint64_t size = 0;

	(void)be;
	populate(b, odd, ARRAY_LEN(odd));
	for (size_t i = 0; i < ARRAY_LEN(odd); i++) {
		expect_bytes(b, odd[i], odd[i], strlen(odd[i]));
		assert_int_equal(bkt_stat(b, odd[i], &size, NULL), 0);
		assert_int_equal(size, strlen(odd[i]));
		assert_int_equal(bkt_put_buf(b, odd[i], "x", 1), -EEXIST);
	}
	expect_list(b, "", NULL, sorted, ARRAY_LEN(sorted));
	expect_list(b, "q/a?", NULL, sorted + 6, 1);
	for (size_t i = 0; i < ARRAY_LEN(odd); i++)
		assert_int_equal(bkt_delete(b, odd[i]), 0);
	expect_list(b, "", NULL, NULL, 0);
}

/* ---- parallel transfers ---- */

static void c_xfers(struct bkt *b, const struct backend *be)
{
	enum { N = 40 };
	struct bkt_xfer x[N];
	char names[N][64], paths[N][32];
	int sfd, dfd;

	(void)be;
	assert_int_equal(mkdirat(tmpfd, "xf.src", 0755), 0);
	assert_int_equal(mkdirat(tmpfd, "xf.dst", 0755), 0);
	sfd = openat(tmpfd, "xf.src", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	dfd = openat(tmpfd, "xf.dst", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(sfd >= 0 && dfd >= 0);
	assert_int_equal(mkdirat(sfd, "sub", 0755), 0);
	for (int i = 0; i < N; i++) {
		size_t len = (size_t)(i * 7919) % (300 * KIB);
		uint8_t *buf = malloc(len + 1);
		int fd;

		assert_non_null(buf);
		fill(buf, len, (uint32_t)i);
		snprintf(paths[i], sizeof(paths[i]), "%sf%03d", i % 3 ? "sub/" : "", i);
		fd = openat(sfd, paths[i], O_RDWR | O_CREAT | O_CLOEXEC, 0644);
		assert_int_equal(write(fd, buf, len), (ssize_t)len);
		snprintf(names[i], sizeof(names[i]), "xf/%s", paths[i]);
		/* every other one by fd, the rest by path */
		x[i] = (struct bkt_xfer){ .name = names[i], .fd = i % 2 ? -1 : fd, .dirfd = sfd,
					  .path = paths[i], .size = len,
					  .crc32c = mf_crc32c(0, buf, len) };
		if (i % 2)
			close(fd);
		free(buf);
	}
	assert_int_equal(bkt_put_files(b, x, N), 0);
	for (int i = 0; i < N; i++) {
		assert_int_equal(x[i].rc, 0);
		if (x[i].fd >= 0)
			close(x[i].fd);
		x[i].fd = -1;
		x[i].dirfd = dfd;
		x[i].has_crc = true;
		x[i].mode = 0640;
		x[i].size = 0;
	}
	assert_int_equal(bkt_get_files(b, x, N), 0);
	for (int i = 0; i < N; i++) {
		char *a = NULL, *c = NULL;
		size_t la, lb;
		struct stat st;

		assert_int_equal(util_read_file_at(sfd, paths[i], MIB, &a, &la), 0);
		assert_int_equal(util_read_file_at(dfd, paths[i], MIB, &c, &lb), 0);
		assert_int_equal(la, lb);
		assert_int_equal(x[i].size, la);
		assert_memory_equal(a, c, la);
		assert_int_equal(fstatat(dfd, paths[i], &st, 0), 0);
		assert_int_equal(st.st_mode & 0777, 0640);
		free(a);
		free(c);
	}
	/* a second put of the same names: every one -EEXIST, the first reported */
	for (int i = 0; i < N; i++)
		x[i].dirfd = sfd;
	assert_int_equal(bkt_put_files(b, x, N), -EEXIST);
	for (int i = 0; i < N; i++)
		assert_int_equal(x[i].rc, -EEXIST);
	assert_contains(bkt_last_error(), names[0]);
	/* every transfer is attempted: a missing one and a bad CRC among good ones */
	for (int i = 0; i < N; i++)
		x[i].dirfd = dfd;
	x[3].name = "xf/none";
	x[5].crc32c ^= 1;
	assert_int_equal(bkt_get_files(b, x, N), -ENOENT);
	assert_contains(bkt_last_error(), "xf/none");
	for (int i = 0; i < N; i++)
		assert_int_equal(x[i].rc, i == 3 ? -ENOENT : i == 5 ? -EBADMSG : 0);
	assert_int_equal(bkt_get_files(b, x, 0), 0);
	close(sfd);
	close(dfd);
}

/* ---- the table, run once per backend ---- */

struct conf_case {
	const char *name;
	void (*fn)(struct bkt *b, const struct backend *be);
};

static const struct conf_case cases[] = {
	{ "small", c_small },
	{ "empty", c_empty },
	{ "large", c_large },
	{ "pipe", c_pipe },
	{ "sparse", c_sparse },
	{ "write_once", c_write_once },
	{ "refused_put", c_refused_put },
	{ "concurrent_writers", c_concurrent_writers },
	{ "missing", c_missing },
	{ "list_empty", c_list_empty },
	{ "list", c_list },
	{ "list_order", c_list_order },
	{ "list_ex", c_list_ex },
	{ "list_reentrant", c_list_reentrant },
	{ "delete", c_delete },
	{ "name_is_prefix", c_name_is_prefix },
	{ "crc_expected", c_crc_expected },
	{ "crc_damaged", c_crc_damaged },
	{ "bad_names", c_bad_names },
	{ "long_names", c_long_names },
	{ "odd_names", c_odd_names },
	{ "xfers", c_xfers },
};

#define NCASES ARRAY_LEN(cases)

struct run {
	const struct backend *be;
	const struct conf_case *c;
	char name[64];              /* "BACKEND.CASE": cmocka's test name */
	struct bkt *b;              /* fresh per case */
};

static struct run runs[ARRAY_LEN(backends)][NCASES];

/* A private local directory per case (sources and targets of transfers). */
static int case_setup(void **state)
{
	struct run *r = *state;
	char dir[PATH_MAX + 80];

	snprintf(dir, sizeof(dir), "%s/local-%s", tmproot, r->name);
	if (mkdir(dir, 0755) < 0)
		return -1;
	tmpfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (tmpfd < 0)
		return -1;
	r->b = NULL;
	return r->be->open(&r->b) == 0 ? 0 : -1;
}

static int case_teardown(void **state)
{
	struct run *r = *state;

	bkt_close(r->b);
	r->b = NULL;
	close(tmpfd);
	tmpfd = -1;
	return 0;
}

static void run_case(void **state)
{
	struct run *r = *state;

	r->c->fn(r->b, r->be);
}

static const struct backend *group_be;

static int group_setup(void **state)
{
	(void)state;
	return group_be->group_setup ? group_be->group_setup() : 0;
}

static int group_teardown(void **state)
{
	(void)state;
	if (group_be->group_teardown)
		group_be->group_teardown();
	return 0;
}

int main(void)
{
	struct CMUnitTest tests[NCASES];
	char group[64];
	int rc = 0;

	signal(SIGPIPE, SIG_DFL);   /* the code under test must not need SIG_IGN */
	gs_client_env();
	if (tmproot_make("bucket-conf") < 0)
		return 1;
	curl_global_init(CURL_GLOBAL_DEFAULT);
	for (size_t k = 0; k < ARRAY_LEN(backends); k++) {
		for (size_t i = 0; i < NCASES; i++) {
			struct run *r = &runs[k][i];
			r->be = &backends[k];
			r->c = &cases[i];
			snprintf(r->name, sizeof(r->name), "%s.%s", backends[k].name, cases[i].name);
			tests[i] = (struct CMUnitTest){ .name = r->name, .test_func = run_case,
						       .setup_func = case_setup,
						       .teardown_func = case_teardown,
						       .initial_state = r };
		}
		snprintf(group, sizeof(group), "bucket_conformance.%s", backends[k].name);
		group_be = &backends[k];
		rc |= _cmocka_run_group_tests(group, tests, NCASES, group_setup, group_teardown);
	}
	curl_global_cleanup();
	if (tmproot_remove() < 0)
		rc |= 1;
	return rc;
}
