/* Unit tests for common/util: size and integer parsing (every accepted form
 * and the rejections), step names, relative-path safety, mkdir -p, rm -rf
 * with freed-byte accounting, and the atomic write / bounded read pair.
 * Filesystem tests run in a private directory under /dev/shm (or /tmp)
 * that the teardown removes. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/util.h"
#include "common/walk.h"

#define SENTINEL 0x5a5a5a5a5a5a5a5aULL

#define TESTTMP_NAME "util"
#include "tests/unit/testtmp.h"

static void put_file(int dirfd, const char *name, const void *data, size_t len)
{
	int fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, data, len), (ssize_t)len);
	assert_int_equal(close(fd), 0);
}

static bool exists(int dirfd, const char *name)
{
	struct stat st;
	return fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0;
}

/* Number of entries in dirfd/name other than "." and "..". */
static int count_entries(int dirfd, const char *name)
{
	int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d;
	struct dirent *de;
	int n = 0;

	assert_true(fd >= 0);
	d = fdopendir(fd);
	assert_non_null(d);
	while ((de = readdir(d)) != NULL)
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			n++;
	closedir(d);
	return n;
}

/* ---- util_parse_size ---- */

static void size_ok(const char *s, uint64_t want)
{
	uint64_t v = SENTINEL;
	int rc = util_parse_size(s, &v);

	if (rc != 0 || v != want) {
		print_error("util_parse_size(\"%s\") = %d, %llu; want 0, %llu\n", s, rc,
			    (unsigned long long)v, (unsigned long long)want);
		fail();
	}
}

static void size_bad(const char *s)
{
	uint64_t v = SENTINEL;
	int rc = util_parse_size(s, &v);

	if (rc != -EINVAL || v != SENTINEL) {
		print_error("util_parse_size(\"%s\") = %d, %llu; want -EINVAL, output untouched\n",
			    s ? s : "(null)", rc, (unsigned long long)v);
		fail();
	}
}

static void test_parse_size_accepts(void **state)
{
	(void)state;
	size_ok("0", 0);
	size_ok("1", 1);
	size_ok("1048576", 1048576);
	size_ok("512M", 512ULL << 20);
	size_ok("4G", 4ULL << 30);
	size_ok("4g", 4ULL << 30);
	size_ok("4GB", 4ULL << 30);
	size_ok("4Gb", 4ULL << 30);
	size_ok("4GiB", 4ULL << 30);
	size_ok("200Gi", 200ULL << 30);
	size_ok("1k", 1024);
	size_ok("1K", 1024);
	size_ok("1Ki", 1024);
	size_ok("2T", 2ULL << 40);
	size_ok("0G", 0);
	size_ok("007M", 7ULL << 20);
	size_ok("1.5G", 3ULL << 29);
	size_ok("1.5T", 3ULL << 39);
	size_ok("0.5K", 512);
	size_ok("0.25M", 1ULL << 18);
	size_ok("2.75Gi", 11ULL << 28);
	/* a fraction rounds down to a whole byte */
	size_ok("1.5", 1);
	size_ok("0.3K", 307);          /* 0.3 * 1024 = 307.2 */
	/* digits past the ninth are ignored */
	size_ok("1.0000000001G", 1ULL << 30);
	/* the largest whole count of GiB that fits in 64 bits */
	size_ok("17179869183G", ((1ULL << 34) - 1) << 30);
	size_ok("16777215T", ((1ULL << 24) - 1) << 40);
}

static void test_parse_size_rejects(void **state)
{
	(void)state;
	size_bad(NULL);
	size_bad("");
	size_bad("G");
	size_bad("-1");
	size_bad("+1");
	size_bad("1X");
	size_bad("1P");
	size_bad("1B");            /* no unit, so no B either */
	size_bad("1i");
	size_bad("1iB");
	size_bad(" 4G");
	size_bad("4G ");
	size_bad("4 G");
	size_bad("4GiBx");
	size_bad("4GBi");
	size_bad("4Gii");
	size_bad(".5G");
	size_bad("1.G");
	size_bad("1.");
	size_bad("1..5G");
	size_bad("1.5.2G");
	size_bad("0x10");
	size_bad("1e6");
	size_bad("99999999999999999999");
	size_bad("99999999999999999999G");
	size_bad("17179869184G");  /* 2^64 */
	size_bad("16777216T");     /* 2^64 */
	size_bad("18446744073709551616");
}

/* A fraction of a TiB with eight or more digits: frac * 2^40 exceeds 64 bits
 * in util_parse_size's (frac * mul) / fdiv and the result wraps. */
static void test_parse_size_tib_fraction_precision(void **state)
{
	static const char *const cases[] = { "1.99999999T", "1.123456789T", "0.5000000001T",
					     "3.87654321Ti" };
	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const char *s = cases[i];
		const char *dot = strchr(s, '.');
		uint64_t whole = 0, frac = 0, fdiv = 1, v = SENTINEL;
		unsigned __int128 want;
		int rc;

		for (const char *p = s; p < dot; p++)
			whole = whole * 10 + (uint64_t)(*p - '0');
		for (const char *p = dot + 1; *p >= '0' && *p <= '9' && fdiv < 1000000000ULL; p++) {
			frac = frac * 10 + (uint64_t)(*p - '0');
			fdiv *= 10;
		}
		want = ((unsigned __int128)whole << 40) +
		       (((unsigned __int128)frac << 40) / fdiv);
		rc = util_parse_size(s, &v);
		if (rc != 0 || v != (uint64_t)want) {
			print_error("util_parse_size(\"%s\") = %d, %llu; want 0, %llu\n", s, rc,
				    (unsigned long long)v, (unsigned long long)want);
			fail();
		}
	}
}

/* ---- util_parse_u64 ---- */

static void u64_ok(const char *s, uint64_t max, uint64_t want)
{
	uint64_t v = SENTINEL;
	int rc = util_parse_u64(s, max, &v);

	if (rc != 0 || v != want) {
		print_error("util_parse_u64(\"%s\", %llu) = %d, %llu; want 0, %llu\n", s,
			    (unsigned long long)max, rc, (unsigned long long)v,
			    (unsigned long long)want);
		fail();
	}
}

static void u64_bad(const char *s, uint64_t max)
{
	uint64_t v = SENTINEL;
	int rc = util_parse_u64(s, max, &v);

	if (rc != -EINVAL || v != SENTINEL) {
		print_error("util_parse_u64(\"%s\", %llu) = %d, %llu; want -EINVAL, untouched\n",
			    s ? s : "(null)", (unsigned long long)max, rc, (unsigned long long)v);
		fail();
	}
}

static void test_parse_u64(void **state)
{
	(void)state;
	u64_ok("0", UINT64_MAX, 0);
	u64_ok("42", UINT64_MAX, 42);
	u64_ok("007", UINT64_MAX, 7);
	u64_ok("10", 10, 10);
	u64_ok("0", 0, 0);
	u64_ok("18446744073709551609", UINT64_MAX, 18446744073709551609ULL);
	u64_ok("4294967296", UINT64_MAX, 4294967296ULL);

	u64_bad(NULL, UINT64_MAX);
	u64_bad("", UINT64_MAX);
	u64_bad("11", 10);
	u64_bad("1", 0);
	u64_bad("-1", UINT64_MAX);
	u64_bad("+1", UINT64_MAX);
	u64_bad(" 1", UINT64_MAX);
	u64_bad("1 ", UINT64_MAX);
	u64_bad("1a", UINT64_MAX);
	u64_bad("0x10", UINT64_MAX);
	u64_bad("1.0", UINT64_MAX);
	u64_bad("18446744073709551616", UINT64_MAX);      /* 2^64 */
	u64_bad("99999999999999999999", UINT64_MAX);
	u64_bad("184467440737095516150", UINT64_MAX);
}

/* "<= max" must hold up to max itself: UINT64_MAX and its neighbours are
 * valid inputs, but the overflow guard (v > (UINT64_MAX - 9) / 10) rejects
 * every value from 18446744073709551610 up. */
static void test_parse_u64_near_uint64_max(void **state)
{
	(void)state;
	u64_ok("18446744073709551610", UINT64_MAX, 18446744073709551610ULL);
	u64_ok("18446744073709551615", UINT64_MAX, UINT64_MAX);
}

/* ---- util_is_step_name ---- */

static void step_ok(const char *s, uint64_t want)
{
	uint64_t v = SENTINEL;

	if (!util_is_step_name(s, &v) || v != want) {
		print_error("util_is_step_name(\"%s\") should be step %llu (got %llu)\n", s,
			    (unsigned long long)want, (unsigned long long)v);
		fail();
	}
	assert_true(util_is_step_name(s, NULL));
}

static void step_bad(const char *s)
{
	uint64_t v = SENTINEL;

	if (util_is_step_name(s, &v) || v != SENTINEL) {
		print_error("util_is_step_name(\"%s\") should be false, output untouched\n", s);
		fail();
	}
}

static void test_is_step_name(void **state)
{
	(void)state;
	step_ok("5", 5);
	step_ok("0", 0);
	step_ok("1000", 1000);
	step_ok("4294967296", 4294967296ULL);
	step_ok("9223372036854775807", 9223372036854775807ULL);   /* INT64_MAX */
	/* leading zeros (Orbax's step_format_fixed_length) name the value */
	step_ok("05", 5);
	step_ok("00000100", 100);
	step_ok("0000000000000000001", 1);
	step_ok("00000000000000000000", 0);   /* 20 digits, small value */
	step_ok("0000000000000000000000000000000000000000000000000000000000000007", 7);   /* 64 */

	step_bad("");
	step_bad("9223372036854775808");    /* INT64_MAX + 1 */
	step_bad("9999999999999999999");    /* 19 digits, above INT64_MAX */
	step_bad("12345678901234567890");   /* 20 digits */
	step_bad("99999999999999999999");
	step_bad("00000000000000000000000000000000000000000000000000000000000000007");   /* 65 */
	step_bad("5.orbax-checkpoint-tmp-1");
	step_bad("step=5");
	step_bad("step_5");
	step_bad("-5");
	step_bad("+5");
	step_bad(" 5");
	step_bad("5 ");
	step_bad("5a");
	step_bad("0x5");
	step_bad(".5");
}

/* ---- util_safe_relpath ---- */

static void rel_ok(const char *p)
{
	if (!util_safe_relpath(p, strlen(p))) {
		print_error("util_safe_relpath(\"%s\") should accept\n", p);
		fail();
	}
}

static void rel_bad(const char *p)
{
	if (util_safe_relpath(p, strlen(p))) {
		print_error("util_safe_relpath(\"%s\") should reject\n", p);
		fail();
	}
}

static void test_safe_relpath(void **state)
{
	char comp[NAME_MAX + 8];
	char *longp;
	(void)state;

	rel_ok("a");
	rel_ok("a/b/c");
	rel_ok(".hidden");
	rel_ok("..x");
	rel_ok("x..");
	rel_ok("...");
	rel_ok("a/.b/..c");
	rel_ok("a b/c");

	rel_bad("");
	rel_bad("/abs");
	rel_bad("/");
	rel_bad("//a");
	rel_bad(".");
	rel_bad("..");
	rel_bad("./a");
	rel_bad("../a");
	rel_bad("a/.");
	rel_bad("a/..");
	rel_bad("a/../b");
	rel_bad("a/./b");
	rel_bad("a//b");
	rel_bad("a/");
	rel_bad("a/b/");

	/* embedded NUL, seen through the explicit length */
	assert_false(util_safe_relpath("a\0b", 3));
	assert_false(util_safe_relpath("a\0", 2));
	assert_false(util_safe_relpath("a/\0/b", 5));
	/* the length bounds the check: only the first len bytes count */
	assert_true(util_safe_relpath("a/../b", 1));
	assert_true(util_safe_relpath("abc/", 3));
	assert_false(util_safe_relpath("abc/", 4));

	/* component length: NAME_MAX is fine, NAME_MAX + 1 is not */
	memset(comp, 'x', sizeof(comp));
	assert_true(util_safe_relpath(comp, NAME_MAX));
	assert_false(util_safe_relpath(comp, NAME_MAX + 1));
	comp[0] = 'd';
	comp[1] = '/';
	assert_true(util_safe_relpath(comp, 2 + NAME_MAX));
	assert_false(util_safe_relpath(comp, 2 + NAME_MAX + 1));

	/* total length: PATH_MAX - 1 is fine, PATH_MAX is not */
	longp = malloc(PATH_MAX + 1);
	assert_non_null(longp);
	for (size_t i = 0; i < PATH_MAX + 1; i++)
		longp[i] = (i % 200 == 199) ? '/' : 'p';
	assert_int_not_equal(longp[PATH_MAX - 2], '/');
	assert_int_not_equal(longp[PATH_MAX - 1], '/');
	assert_true(util_safe_relpath(longp, PATH_MAX - 1));
	assert_false(util_safe_relpath(longp, PATH_MAX));
	free(longp);
}

/* ---- util_mkdirs_at ---- */

static void assert_dir_mode(int dirfd, const char *p, mode_t mode)
{
	struct stat st;

	assert_int_equal(fstatat(dirfd, p, &st, AT_SYMLINK_NOFOLLOW), 0);
	assert_true(S_ISDIR(st.st_mode));
	assert_int_equal(st.st_mode & 07777, mode);
}

static void test_mkdirs_at(void **state)
{
	struct tmp *t = *state;
	char longp[PATH_MAX + 16];
	mode_t old = umask(0);

	assert_int_equal(util_mkdirs_at(t->fd, "a/b/c", 0750), 0);
	assert_dir_mode(t->fd, "a", 0750);
	assert_dir_mode(t->fd, "a/b", 0750);
	assert_dir_mode(t->fd, "a/b/c", 0750);
	/* idempotent; existing parents are left alone */
	assert_int_equal(util_mkdirs_at(t->fd, "a/b/c", 0700), 0);
	assert_dir_mode(t->fd, "a/b/c", 0750);
	assert_int_equal(util_mkdirs_at(t->fd, "a/b/d", 0700), 0);
	assert_dir_mode(t->fd, "a/b", 0750);
	assert_dir_mode(t->fd, "a/b/d", 0700);
	/* single component, trailing slash */
	assert_int_equal(util_mkdirs_at(t->fd, "single", 0755), 0);
	assert_dir_mode(t->fd, "single", 0755);
	assert_int_equal(util_mkdirs_at(t->fd, "x/y/", 0755), 0);
	assert_dir_mode(t->fd, "x/y", 0755);
	umask(old);

	/* a regular file in the middle of the path */
	put_file(t->fd, "f", "x", 1);
	assert_int_equal(util_mkdirs_at(t->fd, "f/g", 0755), -ENOTDIR);
	assert_int_equal(util_mkdirs_at(t->fd, "a/f/g", 0755), 0);
	assert_dir_mode(t->fd, "a/f/g", 0755 & ~old);

	/* too long for the internal buffer */
	memset(longp, 'q', sizeof(longp) - 1);
	longp[sizeof(longp) - 1] = '\0';
	assert_int_equal(util_mkdirs_at(t->fd, longp, 0755), -ENAMETOOLONG);
}

/* "mkdir -p" of a path that exists as a regular file must fail (mkdir -p
 * says "File exists"); util_mkdirs_at ignores EEXIST on the last component
 * without checking that it is a directory and returns 0. */
static void test_mkdirs_at_existing_file(void **state)
{
	struct tmp *t = *state;
	int rc;

	put_file(t->fd, "file", "x", 1);
	rc = util_mkdirs_at(t->fd, "file", 0755);
	if (rc != -EEXIST && rc != -ENOTDIR) {
		print_error("util_mkdirs_at(\"file\") on a regular file = %d, want -EEXIST/-ENOTDIR\n",
			    rc);
		fail();
	}
	assert_int_equal(util_mkdirs_at(t->fd, "d", 0755), 0);
	put_file(t->fd, "d/leaf", "x", 1);
	rc = util_mkdirs_at(t->fd, "d/leaf", 0755);
	if (rc != -EEXIST && rc != -ENOTDIR) {
		print_error("util_mkdirs_at(\"d/leaf\") on a regular file = %d, want -EEXIST/-ENOTDIR\n",
			    rc);
		fail();
	}
}

/* ---- util_rmtree_at ---- */

static uint64_t blocks_of(int dirfd, const char *p)
{
	struct stat st;

	assert_int_equal(fstatat(dirfd, p, &st, AT_SYMLINK_NOFOLLOW), 0);
	return (uint64_t)st.st_blocks * 512;
}

static void test_rmtree_at(void **state)
{
	struct tmp *t = *state;
	static char big[20000];
	uint64_t freed, want = 0;

	memset(big, 'b', sizeof(big));
	assert_int_equal(util_mkdirs_at(t->fd, "tree/d1/d2/d3", 0755), 0);
	assert_int_equal(util_mkdirs_at(t->fd, "tree/empty", 0755), 0);
	assert_int_equal(util_mkdirs_at(t->fd, "outside/keepdir", 0755), 0);
	put_file(t->fd, "tree/big", big, sizeof(big));
	put_file(t->fd, "tree/d1/d2/d3/small", "hello", 5);
	put_file(t->fd, "tree/zero", "", 0);
	put_file(t->fd, "tree/d1/twice", big, 9000);
	put_file(t->fd, "tree/d1/shared", big, 7000);
	put_file(t->fd, "outside/keepdir/file", "keep", 4);
	/* both links of "twice" are inside: its blocks count once */
	assert_int_equal(linkat(t->fd, "tree/d1/twice", t->fd, "tree/d1/d2/twice2", 0), 0);
	/* "shared" keeps a link outside the tree: nothing freed for it */
	assert_int_equal(linkat(t->fd, "tree/d1/shared", t->fd, "outside/shared", 0), 0);
	/* symlinks are removed, never followed */
	assert_int_equal(symlinkat("../outside/keepdir", t->fd, "tree/link_to_dir"), 0);
	assert_int_equal(symlinkat("../outside/keepdir/file", t->fd, "tree/d1/link_to_file"), 0);
	assert_int_equal(symlinkat("nowhere", t->fd, "tree/dangling"), 0);
	assert_int_equal(mkfifoat(t->fd, "tree/d1/fifo", 0600), 0);

	want += blocks_of(t->fd, "tree/big");
	want += blocks_of(t->fd, "tree/d1/d2/d3/small");
	want += blocks_of(t->fd, "tree/d1/twice");
	assert_true(want > 0);

	freed = 1000;   /* added to, not reset */
	assert_int_equal(util_rmtree_at(t->fd, "tree", &freed), 0);
	assert_int_equal(freed, 1000 + want);
	assert_false(exists(t->fd, "tree"));
	assert_true(exists(t->fd, "outside/keepdir/file"));
	assert_true(exists(t->fd, "outside/shared"));
	assert_int_equal(count_entries(t->fd, "outside/keepdir"), 1);

	/* missing is not an error and frees nothing */
	freed = 7;
	assert_int_equal(util_rmtree_at(t->fd, "tree", &freed), 0);
	assert_int_equal(freed, 7);

	/* a single file, with and without a counter */
	put_file(t->fd, "lone", big, 4096);
	want = blocks_of(t->fd, "lone");
	freed = 0;
	assert_int_equal(util_rmtree_at(t->fd, "lone", &freed), 0);
	assert_int_equal(freed, want);
	assert_false(exists(t->fd, "lone"));
	put_file(t->fd, "lone", big, 10);
	assert_int_equal(util_rmtree_at(t->fd, "lone", NULL), 0);
	assert_false(exists(t->fd, "lone"));

	/* the last link of "shared" now goes: it counts */
	want = blocks_of(t->fd, "outside/shared") + blocks_of(t->fd, "outside/keepdir/file");
	freed = 0;
	assert_int_equal(util_rmtree_at(t->fd, "outside", &freed), 0);
	assert_int_equal(freed, want);
	assert_int_equal(count_entries(t->fd, "."), 0);
}

/* ---- util_write_file_atomic / util_read_file_at ---- */

static void read_back(int dirfd, const char *name, size_t max, const void *want, size_t wantlen)
{
	char *buf = NULL;
	size_t len = SIZE_MAX;

	assert_int_equal(util_read_file_at(dirfd, name, max, &buf, &len), 0);
	assert_non_null(buf);
	assert_int_equal(len, wantlen);
	if (wantlen)
		assert_memory_equal(buf, want, wantlen);
	assert_int_equal(buf[len], '\0');
	free(buf);
}

static void test_write_read_file(void **state)
{
	struct tmp *t = *state;
	static const char bin[] = { 'a', '\0', 'b', '\n', '\0' };
	size_t bigsz = 1u << 20;
	char *big = malloc(bigsz);

	assert_non_null(big);
	for (size_t i = 0; i < bigsz; i++)
		big[i] = (char)(i * 131 + 7);

	assert_int_equal(util_write_file_atomic(t->fd, "f", "hello", 5), 0);
	read_back(t->fd, "f", 100, "hello", 5);
	/* replace with longer, then shorter content: no stale tail */
	assert_int_equal(util_write_file_atomic(t->fd, "f", "hello, world", 12), 0);
	read_back(t->fd, "f", 100, "hello, world", 12);
	assert_int_equal(util_write_file_atomic(t->fd, "f", "hi", 2), 0);
	read_back(t->fd, "f", 100, "hi", 2);
	/* binary content with NULs, empty content */
	assert_int_equal(util_write_file_atomic(t->fd, "bin", bin, sizeof(bin)), 0);
	read_back(t->fd, "bin", sizeof(bin), bin, sizeof(bin));
	assert_int_equal(util_write_file_atomic(t->fd, "empty", "", 0), 0);
	read_back(t->fd, "empty", 0, "", 0);
	read_back(t->fd, "empty", 10, "", 0);
	/* a large buffer */
	assert_int_equal(util_write_file_atomic(t->fd, "big", big, bigsz), 0);
	read_back(t->fd, "big", bigsz, big, bigsz);
	/* no temporary file is left behind */
	assert_int_equal(count_entries(t->fd, "."), 4);
	free(big);
}

static void test_read_file_limits(void **state)
{
	struct tmp *t = *state;
	char *buf = (char *)&buf;   /* sentinel: must stay untouched on error */
	size_t len = 12345;

	put_file(t->fd, "ten", "0123456789", 10);
	read_back(t->fd, "ten", 10, "0123456789", 10);    /* exactly max */
	read_back(t->fd, "ten", 11, "0123456789", 10);
	assert_int_equal(util_read_file_at(t->fd, "ten", 9, &buf, &len), -EFBIG);
	assert_int_equal(util_read_file_at(t->fd, "ten", 0, &buf, &len), -EFBIG);
	assert_ptr_equal(buf, (char *)&buf);
	assert_int_equal(len, 12345);
	assert_int_equal(util_read_file_at(t->fd, "missing", 10, &buf, &len), -ENOENT);
	assert_ptr_equal(buf, (char *)&buf);
	assert_int_equal(util_read_file_at(t->fd, ".", 10, &buf, &len), -EISDIR);
	assert_ptr_equal(buf, (char *)&buf);
}

static void test_write_file_errors(void **state)
{
	struct tmp *t = *state;
	char name[NAME_MAX + 1];

	/* renaming over a directory fails; the temporary is removed */
	assert_int_equal(mkdirat(t->fd, "dir", 0755), 0);
	assert_int_equal(util_write_file_atomic(t->fd, "dir", "x", 1), -EISDIR);
	assert_int_equal(count_entries(t->fd, "."), 1);
	/* missing parent */
	assert_int_equal(util_write_file_atomic(t->fd, "nodir/f", "x", 1), -ENOENT);
	/* a name too long for the temporary's name */
	memset(name, 'n', NAME_MAX);
	name[NAME_MAX] = '\0';
	assert_int_equal(util_write_file_atomic(t->fd, name, "x", 1), -ENAMETOOLONG);
	assert_int_equal(count_entries(t->fd, "."), 1);
}

static void test_now_ns(void **state)
{
	uint64_t a, b;
	(void)state;

	a = util_now_ns();
	b = util_now_ns();
	assert_true(a > 0);
	assert_true(b >= a);
}

/* A chain of `depth` directories "d/d/d/..." under dirfd/top, built with
 * one descriptor at a time (no path is longer than one name). */
static void make_deep(int dirfd, const char *top, int depth)
{
	int fd;

	assert_int_equal(mkdirat(dirfd, top, 0755), 0);
	fd = openat(dirfd, top, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(fd >= 0);
	for (int i = 1; i < depth; i++) {
		int sub;
		assert_int_equal(mkdirat(fd, "d", 0755), 0);
		sub = openat(fd, "d", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		assert_true(sub >= 0);
		if (i % 100 == 0)
			put_file(sub, "f", "x", 1);
		close(fd);
		fd = sub;
	}
	put_file(fd, "leaf", "leaf", 4);
	close(fd);
}

/* rm -rf of a tree far deeper than PATH_MAX allows to name and than a
 * recursive walk's descriptor table would hold (issue 13 item 3): 25000
 * levels, above the 20000 descriptors a test process gets here. */
static void test_rmtree_deep(void **state)
{
	struct tmp *t = *state;
	uint64_t freed = 0;

	make_deep(t->fd, "deep", 25000);
	put_file(t->fd, "keep", "k", 1);
	assert_int_equal(util_rmtree_at(t->fd, "deep", &freed), 0);
	assert_false(exists(t->fd, "deep"));
	assert_true(exists(t->fd, "keep"));
	assert_true(freed >= 250 * 512);   /* 249 "f" files and the leaf, a block each */
	/* many siblings at one level go in one pass each, and empty ones too */
	assert_int_equal(mkdirat(t->fd, "wide", 0755), 0);
	for (int i = 0; i < 300; i++) {
		char n[32];
		snprintf(n, sizeof(n), "wide/s%d/x", i);
		assert_int_equal(util_mkdirs_at(t->fd, n, 0755), 0);
	}
	assert_int_equal(util_rmtree_at(t->fd, "wide", NULL), 0);
	assert_false(exists(t->fd, "wide"));
}

struct seen {
	char paths[64][64];
	unsigned depth[64];
	int n;
	int skip_dir;   /* return WALK_SKIP for the directory named "skip" */
	int fail_at;    /* return -EIO at this entry (0: never) */
};

static int seen_cb(void *arg, const struct walk_ent *e)
{
	struct seen *s = arg;

	assert_true(s->n < 64);
	if (e->path) {
		assert_int_equal(strlen(e->path), e->pathlen);
		snprintf(s->paths[s->n], sizeof(s->paths[0]), "%s", e->path);
	}
	s->depth[s->n] = e->depth;
	s->n++;
	if (s->fail_at && s->n == s->fail_at)
		return -EIO;
	if (s->skip_dir && !strcmp(e->name, "skip"))
		return WALK_SKIP;
	return 0;
}

static int seen_index(const struct seen *s, const char *p)
{
	for (int i = 0; i < s->n; i++)
		if (!strcmp(s->paths[i], p))
			return i;
	return -1;
}

static void test_walk(void **state)
{
	struct tmp *t = *state;
	struct seen s = { 0 };
	int root;

	assert_int_equal(util_mkdirs_at(t->fd, "r/a/b", 0755), 0);
	assert_int_equal(util_mkdirs_at(t->fd, "r/skip/inner", 0755), 0);
	put_file(t->fd, "r/top", "1", 1);
	put_file(t->fd, "r/a/b/f", "2", 1);
	assert_int_equal(symlinkat("a", t->fd, "r/ln"), 0);
	root = openat(t->fd, "r", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(root >= 0);

	/* every entry once, parents first, exact paths and depths; symlinks
	 * are entries, never followed */
	assert_int_equal(walk_tree(root, 8, 0, seen_cb, &s), 0);
	assert_int_equal(s.n, 7);
	assert_true(seen_index(&s, "a") >= 0 && seen_index(&s, "a") < seen_index(&s, "a/b"));
	assert_true(seen_index(&s, "a/b") < seen_index(&s, "a/b/f"));
	assert_true(seen_index(&s, "skip/inner") > seen_index(&s, "skip"));
	assert_int_equal(s.depth[seen_index(&s, "top")], 1);
	assert_int_equal(s.depth[seen_index(&s, "a/b/f")], 3);
	assert_true(seen_index(&s, "ln") >= 0);

	/* WALK_SKIP: the directory is an entry, its contents are not visited */
	memset(&s, 0, sizeof(s));
	s.skip_dir = 1;
	assert_int_equal(walk_tree(root, 8, 0, seen_cb, &s), 0);
	assert_int_equal(s.n, 6);
	assert_int_equal(seen_index(&s, "skip/inner"), -1);

	/* depth bound: entries up to max_depth are fine, entering below fails */
	memset(&s, 0, sizeof(s));
	assert_int_equal(walk_tree(root, 3, 0, seen_cb, &s), 0);
	memset(&s, 0, sizeof(s));
	assert_int_equal(walk_tree(root, 2, 0, seen_cb, &s), -ELOOP);

	/* a callback error stops the walk with it */
	memset(&s, 0, sizeof(s));
	s.fail_at = 2;
	assert_int_equal(walk_tree(root, 8, 0, seen_cb, &s), -EIO);
	assert_int_equal(s.n, 2);
	assert_int_equal(walk_tree(root, 0, 0, seen_cb, &s), -EINVAL);
	close(root);
}

static int count_cb(void *arg, const struct walk_ent *e)
{
	(void)e;
	(*(int *)arg)++;
	return 0;
}

/* A 5000-deep tree: the walk stops at its bound with -ELOOP (bounded stack
 * and descriptors), paths that cannot be named fail with -ENAMETOOLONG, and
 * nothing is leaked either way. */
static void test_walk_deep(void **state)
{
	struct tmp *t = *state;
	int root, n = 0, fd_before, fd_after;

	make_deep(t->fd, "deep", 5000);
	root = openat(t->fd, "deep", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(root >= 0);
	fd_before = dup(0);
	close(fd_before);
	assert_int_equal(walk_tree(root, 64, 0, count_cb, &n), -ELOOP);
	assert_int_equal(n, 64);
	n = 0;
	assert_int_equal(walk_tree(root, 4000, 0, count_cb, &n), -ENAMETOOLONG);
	assert_true(n > 1000 && n < 2100);   /* "d/" per level: 2 bytes of PATH_MAX */
	n = 0;
	assert_int_equal(walk_tree(root, 100000, WALK_NOPATH, count_cb, &n), 0);
	assert_int_equal(n, 4999 + 49 + 1);
	fd_after = dup(0);
	close(fd_after);
	assert_int_equal(fd_after, fd_before);
	close(root);
	assert_int_equal(util_rmtree_at(t->fd, "deep", NULL), 0);
}

/* ---- common/log: the text line and the JSON line (-o log_format=json) ---- */

#include <jansson.h>
#include "common/log.h"
#include "common/metrics.h"

/* 2026-01-02T03:04:05.678Z */
#define T_SEC 1767323045LL
#define T_NSEC 678901234L

static json_t *json_line(const char *msg, enum log_level lvl, size_t cap, char *buf)
{
	json_error_t err;
	size_t n = log_format_line(buf, cap, LOG_FMT_JSON, lvl, "engine", msg, T_SEC, T_NSEC);
	json_t *j;

	assert_true(n > 2 && n <= cap);
	assert_int_equal(buf[n - 1], '\n');
	assert_null(memchr(buf, '\n', n - 1));            /* one object, one line */
	j = json_loadb(buf, n, 0, &err);
	if (!j)
		fail_msg("not JSON (%s): %.*s", err.text, (int)n, buf);
	assert_true(json_is_object(j));
	return j;
}

static void test_log_text_line_unchanged(void **s)
{
	char buf[2048];
	size_t n = log_format_line(buf, sizeof(buf), LOG_FMT_TEXT, LOG_WARN, "ctl", "a b=1",
				   T_SEC, T_NSEC);
	assert_int_equal(n, strlen("2026-01-02T03:04:05.678Z WARN ctl: a b=1\n"));
	assert_memory_equal(buf, "2026-01-02T03:04:05.678Z WARN ctl: a b=1\n", n);
}

static void test_log_json_line(void **s)
{
	char buf[8192];
	json_t *j = json_line("restore job=j1 step=20 source=peer ready_ms=1.5 message=x job=dup",
			      LOG_INFO, sizeof(buf), buf);

	assert_string_equal(json_string_value(json_object_get(j, "time")), "2026-01-02T03:04:05.678Z");
	assert_string_equal(json_string_value(json_object_get(j, "severity")), "INFO");
	assert_string_equal(json_string_value(json_object_get(j, "component")), "engine");
	assert_string_equal(json_string_value(json_object_get(j, "message")),
			    "restore job=j1 step=20 source=peer ready_ms=1.5 message=x job=dup");
	/* key=value words as fields; the first of a key wins, reserved keys stay */
	assert_string_equal(json_string_value(json_object_get(j, "job")), "j1");
	assert_string_equal(json_string_value(json_object_get(j, "step")), "20");
	assert_string_equal(json_string_value(json_object_get(j, "source")), "peer");
	assert_string_equal(json_string_value(json_object_get(j, "ready_ms")), "1.5");
	assert_int_equal(json_object_size(j), 8);
	json_decref(j);
	/* Cloud Logging's severity names */
	j = json_line("x", LOG_WARN, sizeof(buf), buf);
	assert_string_equal(json_string_value(json_object_get(j, "severity")), "WARNING");
	json_decref(j);
	j = json_line("x", LOG_ERROR, sizeof(buf), buf);
	assert_string_equal(json_string_value(json_object_get(j, "severity")), "ERROR");
	json_decref(j);
	j = json_line("x", LOG_DEBUG, sizeof(buf), buf);
	assert_string_equal(json_string_value(json_object_get(j, "severity")), "DEBUG");
	json_decref(j);
}

static void test_log_json_escapes(void **s)
{
	char buf[8192];
	/* quotes, backslash, control bytes, valid UTF-8, and bytes that are not
	 * UTF-8 (a file name may be anything): still one valid JSON line */
	json_t *j = json_line("name=\"a\\b\"\n\t\x01 caf\xc3\xa9 bad=\xff\xc3(", LOG_INFO,
			      sizeof(buf), buf);

	assert_string_equal(json_string_value(json_object_get(j, "message")),
			    "name=\"a\\b\"\n\t\x01 caf\xc3\xa9 bad=\xef\xbf\xbd\xef\xbf\xbd(");
	assert_string_equal(json_string_value(json_object_get(j, "bad")), "\xef\xbf\xbd\xef\xbf\xbd(");
	json_decref(j);
}

static void test_log_json_truncated_stays_valid(void **s)
{
	char msg[2048], buf[512];
	json_t *j;

	/* every character escapes to 2 or 6 bytes: the line fills up mid-message */
	for (size_t i = 0; i < sizeof(msg) - 1; i++)
		msg[i] = i % 2 ? '"' : '\x02';
	msg[sizeof(msg) - 1] = '\0';
	j = json_line(msg, LOG_ERROR, sizeof(buf), buf);
	assert_true(strlen(json_string_value(json_object_get(j, "message"))) > 50);
	json_decref(j);
	/* fields that do not fit are left out whole */
	memset(msg, 'x', 400);
	memcpy(msg + 400, " k=", 3);
	memset(msg + 403, 'v', 200);
	msg[603] = '\0';
	j = json_line(msg, LOG_INFO, sizeof(buf), buf);
	assert_null(json_object_get(j, "k"));
	json_decref(j);
}

static void test_log_format_names(void **s)
{
	assert_int_equal(log_set_format_name("json"), 0);
	assert_int_equal(log_set_format_name("text"), 0);
	assert_int_equal(log_set_format_name(NULL), 0);
	assert_int_equal(log_set_format_name("xml"), -EINVAL);
	assert_int_equal(log_set_format_name("JSON"), -EINVAL);
}

/* ---- common/metrics: the exposition text ---- */

/* Not inlined: GCC 12 at -O3 then takes the returned text for a pointer to
 * the local `buf` (-Wdangling-pointer, a false positive that fails a
 * Release build with -Werror). */
__attribute__((noinline)) static char *render(void)
{
	struct metrics_gauges g = { .peers_total = -1, .lkg_step = -1, .last_commit_step = -1 };
	char *buf = NULL;
	size_t len = 0;

	assert_int_equal(metrics_render(&g, &buf, &len), 0);
	assert_int_equal(strlen(buf), len);
	return buf;
}

static void test_metrics_families(void **s)
{
	char *t = render();
	char want[128];

	snprintf(want, sizeof(want), "\nmtcfs_build_info{version=\"%s\"} 1\n", MTCFS_VERSION);
	assert_non_null(strstr(t, want));
	assert_non_null(strstr(t, "# TYPE mtcfs_restores_total counter\n"));
	assert_non_null(strstr(t, "\nmtcfs_last_backup_success_timestamp_seconds 0\n"));
	assert_non_null(strstr(t, "\nmtcfs_backup_seconds_bucket{le=\"3600\"} 0\n"));
	assert_non_null(strstr(t, "\nmtcfs_restore_seconds_bucket{le=\"600\"} 0\n"));
	assert_null(strstr(t, "mtcfs_restores_peer_total"));
	free(t);

	metrics_add(MC_RESTORES_PEER, 1);
	metrics_add(MC_RESTORES_NONE, 2);
	metrics_observe(MH_BACKUP_SECONDS, 900);           /* 15 min: in le=1200, not +Inf only */
	metrics_add(MC_BACKUPS, 1);
	t = render();
	assert_non_null(strstr(t, "\nmtcfs_restores_total{source=\"peer\"} 1\n"));
	assert_non_null(strstr(t, "\nmtcfs_restores_total{source=\"none\"} 2\n"));
	assert_non_null(strstr(t, "\nmtcfs_restores_total{source=\"local\"} 0\n"));
	assert_non_null(strstr(t, "\nmtcfs_restores_total{source=\"bucket\"} 0\n"));
	assert_non_null(strstr(t, "\nmtcfs_backup_seconds_bucket{le=\"600\"} 0\n"));
	assert_non_null(strstr(t, "\nmtcfs_backup_seconds_bucket{le=\"1200\"} 1\n"));
	{
		const char *p = strstr(t, "\nmtcfs_last_backup_success_timestamp_seconds ");
		long long v;
		assert_non_null(p);
		v = strtoll(p + strlen("\nmtcfs_last_backup_success_timestamp_seconds "), NULL, 10);
		assert_true(v >= (long long)time(NULL) - 60 && v <= (long long)time(NULL));
	}
	free(t);
}

/* util_grow: the same array until it is full, then twice the room with
 * the elements kept; first room on the first call; an impossible size is
 * NULL with the array and its capacity untouched. */
static void test_grow(void **state)
{
	uint32_t *v = NULL, *nv;
	size_t cap = 0, n = 0;

	(void)state;
	for (uint32_t i = 0; i < 1000; i++) {
		nv = util_grow(v, n, &cap, sizeof(*v), 4);
		assert_non_null(nv);
		if (n < 4)
			assert_int_equal(cap, 4);
		v = nv;
		v[n++] = i * 7;
		assert_true(n <= cap);
	}
	assert_int_equal(cap, 1024);
	for (uint32_t i = 0; i < 1000; i++)
		assert_int_equal(v[i], i * 7);
	nv = util_grow(v, 999, &cap, sizeof(*v), 4);
	assert_ptr_equal(nv, v);   /* room left: no realloc */
	assert_int_equal(cap, 1024);
	nv = util_grow(v, cap, &cap, SIZE_MAX / 1024, 4);
	assert_null(nv);
	assert_int_equal(cap, 1024);
	assert_int_equal(v[999], 999 * 7);
	free(v);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_size_accepts),
		cmocka_unit_test(test_parse_size_rejects),
		cmocka_unit_test(test_parse_size_tib_fraction_precision),
		cmocka_unit_test(test_parse_u64),
		cmocka_unit_test(test_parse_u64_near_uint64_max),
		cmocka_unit_test(test_is_step_name),
		cmocka_unit_test(test_safe_relpath),
		cmocka_unit_test_setup_teardown(test_mkdirs_at, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_mkdirs_at_existing_file, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_rmtree_at, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_rmtree_deep, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_walk, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_walk_deep, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_write_read_file, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_read_file_limits, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_write_file_errors, tmp_setup, tmp_teardown),
		cmocka_unit_test(test_now_ns),
		cmocka_unit_test(test_log_text_line_unchanged),
		cmocka_unit_test(test_log_json_line),
		cmocka_unit_test(test_log_json_escapes),
		cmocka_unit_test(test_log_json_truncated_stays_valid),
		cmocka_unit_test(test_log_format_names),
		cmocka_unit_test(test_metrics_families),
		cmocka_unit_test(test_grow),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
