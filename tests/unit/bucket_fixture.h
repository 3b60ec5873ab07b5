/* bucket_fixture.h: the local side the bucket test files use (test_bucket.c,
 * test_bucket_conformance.c, test_backup.c): tmproot and tmpfd (where the file helpers work:
 * the root in test_bucket, a directory per case in the suite), file makers and
 * comparers that fail the test through cmocka, and the gs:// test server srv.
 * Header-only, one test program per file; include after <cmocka.h>. */
#ifndef MTCFS_TESTS_UNIT_BUCKET_FIXTURE_H
#define MTCFS_TESTS_UNIT_BUCKET_FIXTURE_H

#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/gcs_server/testsrv.h"
#include "tests/unit/testfill.h"
#include "tiers/manifest.h"

#define KIB 1024u
#define MIB (1024u * 1024u)

static char tmproot[PATH_MAX];
static int tmpfd = -1;          /* where make_file() and friends put files */
static struct tsrv srv;
static bool srv_up;

/* tmproot := a new directory named for the program, in /dev/shm if it can
 * be made there, else in /tmp. 0, or -1 with tmproot empty. */
static inline int tmproot_make(const char *prog)
{
	static const char *const bases[] = { "/dev/shm", "/tmp" };

	for (size_t i = 0; i < sizeof(bases) / sizeof(bases[0]); i++) {
		snprintf(tmproot, sizeof(tmproot), "%s/mtcfs-test-%s-XXXXXX", bases[i], prog);
		if (mkdtemp(tmproot))
			return 0;
	}
	tmproot[0] = '\0';
	return -1;
}

static inline int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)ftw;
	return flag == FTW_DP ? rmdir(p) : unlink(p);
}

/* tmproot and all below it; nftw's result */
static inline int tmproot_remove(void)
{
	return nftw(tmproot, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

/* The gs:// client as the tests want it: retries in milliseconds, no
 * credentials taken from the caller's environment. */
static inline void gs_client_env(void)
{
	setenv("MTCFS_GCS_RETRY", "1,20,5", 1);
	unsetenv("GOOGLE_APPLICATION_CREDENTIALS");
	unsetenv("GCE_METADATA_HOST");
}

/* Starts tests/gcs_server/gcs_server.py and points STORAGE_EMULATOR_HOST
 * at it; 0 or -1. gs_srv_stop() may be called whether it ran or not. */
static inline int gs_srv_start(void)
{
	char emu[64];

	if (tsrv_start(&srv) < 0)
		return -1;
	srv_up = true;
	snprintf(emu, sizeof(emu), "127.0.0.1:%d", srv.port);
	setenv("STORAGE_EMULATOR_HOST", emu, 1);
	return 0;
}

static inline void gs_srv_stop(void)
{
	if (srv_up)
		tsrv_stop(&srv);
	srv_up = false;
	unsetenv("STORAGE_EMULATOR_HOST");
}

/* A file of len pseudo-random bytes (fill(seed)) under tmpfd; returns an
 * O_RDWR fd, the caller closes it. *crc (if crc) := its CRC32C. */
static inline int make_file(const char *name, size_t len, uint32_t seed, uint32_t *crc)
{
	uint8_t *buf = malloc(len ? len : 1);
	int fd;

	assert_non_null(buf);
	fill(buf, len, seed);
	fd = openat(tmpfd, name, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, buf, len), (ssize_t)len);
	if (crc)
		*crc = mf_crc32c(0, buf, len);
	free(buf);
	return fd;
}

/* A sparse file of size bytes under tmpfd: three short runs of data (one not
 * block-aligned, one at the very end), holes elsewhere. Returns an O_RDWR
 * fd; *crc := the CRC32C of its logical bytes, holes included. */
static inline int make_sparse(const char *name, uint64_t size, uint32_t *crc)
{
	static const struct { uint64_t off; size_t len; } runs[] = {
		{ MIB + 100, 5000 }, { 20 * MIB, 4096 }, { 0, 10 } };
	uint8_t buf[5000], *z = calloc(1, MIB);
	uint64_t at = 0;
	uint32_t c = 0;
	int fd = openat(tmpfd, name, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

	assert_true(fd >= 0);
	assert_non_null(z);
	assert_int_equal(ftruncate(fd, (off_t)size), 0);
	for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
		uint64_t off = runs[i].off ? runs[i].off : size - runs[i].len;
		fill(buf, runs[i].len, (uint32_t)i + 40);
		assert_int_equal(pwrite(fd, buf, runs[i].len, (off_t)off), (ssize_t)runs[i].len);
		while (at < off) {
			size_t n = off - at > MIB ? MIB : (size_t)(off - at);
			c = mf_crc32c(c, z, n);
			at += n;
		}
		c = mf_crc32c(c, buf, runs[i].len);
		at += runs[i].len;
	}
	free(z);
	*crc = c;
	return fd;
}

/* An empty file under tmpfd (truncated if it was there); an O_RDWR fd. */
static inline int new_fd(const char *name)
{
	int fd = openat(tmpfd, name, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

	assert_true(fd >= 0);
	return fd;
}

/* Files a and b under tmpfd hold the same bytes, and b is size long. */
static inline void assert_same_file(const char *a, const char *b, uint64_t size)
{
	int fa = openat(tmpfd, a, O_RDONLY | O_CLOEXEC), fb = openat(tmpfd, b, O_RDONLY | O_CLOEXEC);
	uint8_t *x = malloc(MIB), *y = malloc(MIB);
	struct stat st;

	assert_true(fa >= 0 && fb >= 0 && x && y);
	assert_int_equal(fstat(fb, &st), 0);
	assert_int_equal((uint64_t)st.st_size, size);
	for (uint64_t off = 0; off < size; off += MIB) {
		size_t n = size - off > MIB ? MIB : (size_t)(size - off);
		assert_int_equal(pread(fa, x, n, (off_t)off), (ssize_t)n);
		assert_int_equal(pread(fb, y, n, (off_t)off), (ssize_t)n);
		assert_memory_equal(x, y, n);
	}
	free(x);
	free(y);
	close(fa);
	close(fb);
}

/* Bytes the file system allocated for name under dirfd (holes are free). */
static inline uint64_t allocated(int dirfd, const char *name)
{
	struct stat st;

	assert_int_equal(fstatat(dirfd, name, &st, 0), 0);
	return (uint64_t)st.st_blocks * 512;
}

static inline void assert_contains(const char *hay, const char *needle)
{
	if (!strstr(hay, needle)) {
		print_error("\"%s\" does not contain \"%s\"\n", hay, needle);
		fail();
	}
}

/* The read end of a pipe drained into buf, up to cap bytes or EOF: the
 * thread a download into a pipe needs on the other side. The caller joins
 * it before reading got. */
struct piper {
	int fd;
	uint8_t *buf;
	size_t got, cap;
};

static inline void *pipe_reader(void *arg)
{
	struct piper *p = arg;
	ssize_t r;

	while (p->got < p->cap && (r = read(p->fd, p->buf + p->got, p->cap - p->got)) > 0)
		p->got += (size_t)r;
	return NULL;
}

#endif
