/* Unit tests for common/io: whole-buffer writes and reads give back the
 * exact bytes; an early end of file is -EBADMSG for the _full reads and a
 * short count for io_read_upto; a bad descriptor is -EBADF; a pipe write
 * larger than the pipe completes while a reader drains it. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/io.h"

#define BIG (3u << 20)   /* larger than a pipe's buffer */

static char *pattern(size_t n)
{
	char *p = malloc(n);

	assert_non_null(p);
	for (size_t i = 0; i < n; i++)
		p[i] = (char)(i * 131 + (i >> 9));
	return p;
}

static int tmpfile_fd(void)
{
	char path[] = "/tmp/mtcfs-test-io-XXXXXX";
	int fd = mkstemp(path);

	assert_true(fd >= 0);
	unlink(path);
	return fd;
}

static void test_file_roundtrip(void **state)
{
	char *src = pattern(BIG), *dst = malloc(BIG);
	int fd = tmpfile_fd();

	(void)state;
	assert_non_null(dst);
	assert_int_equal(io_write_full(fd, src, BIG), 0);
	assert_int_equal(io_pread_full(fd, dst, BIG, 0), 0);
	assert_memory_equal(src, dst, BIG);
	/* pwrite at an offset, then a plain read from the start */
	assert_int_equal(io_pwrite_full(fd, "abcdef", 6, 1000), 0);
	assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
	memset(dst, 0, BIG);
	assert_int_equal(io_read_full(fd, dst, BIG), 0);
	memcpy(src + 1000, "abcdef", 6);
	assert_memory_equal(src, dst, BIG);
	close(fd);
	free(src);
	free(dst);
}

static void test_early_end(void **state)
{
	char buf[64];
	int fd = tmpfile_fd();

	(void)state;
	assert_int_equal(io_write_full(fd, "0123456789", 10), 0);
	assert_int_equal(io_pread_full(fd, buf, 11, 0), -EBADMSG);
	assert_int_equal(io_pread_full(fd, buf, 4, 6), 0);
	assert_memory_equal(buf, "6789", 4);
	assert_int_equal(io_pread_full(fd, buf, 5, 6), -EBADMSG);
	assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
	assert_int_equal(io_read_full(fd, buf, 20), -EBADMSG);
	assert_int_equal(lseek(fd, 3, SEEK_SET), 3);
	assert_int_equal(io_read_upto(fd, buf, sizeof(buf)), 7);
	assert_memory_equal(buf, "3456789", 7);
	assert_int_equal(io_read_upto(fd, buf, sizeof(buf)), 0);
	/* zero bytes asked is done at once, even at end of file */
	assert_int_equal(io_read_full(fd, buf, 0), 0);
	close(fd);
}

static void test_bad_fd(void **state)
{
	char buf[4] = "abc";

	(void)state;
	assert_int_equal(io_write_full(-1, buf, 3), -EBADF);
	assert_int_equal(io_pwrite_full(-1, buf, 3, 0), -EBADF);
	assert_int_equal(io_read_full(-1, buf, 3), -EBADF);
	assert_int_equal(io_pread_full(-1, buf, 3, 0), -EBADF);
	assert_int_equal(io_read_upto(-1, buf, 3), -EBADF);
}

struct drain {
	int fd;
	char *buf;
	ssize_t got;
};

static void *drain_main(void *arg)
{
	struct drain *d = arg;

	d->got = io_read_upto(d->fd, d->buf, BIG + 1);
	return NULL;
}

static void test_pipe_big(void **state)
{
	char *src = pattern(BIG);
	struct drain d = { .buf = malloc(BIG + 1) };
	pthread_t th;
	int p[2];

	(void)state;
	assert_non_null(d.buf);
	assert_int_equal(pipe(p), 0);
	d.fd = p[0];
	assert_int_equal(pthread_create(&th, NULL, drain_main, &d), 0);
	assert_int_equal(io_write_full(p[1], src, BIG), 0);
	close(p[1]);
	pthread_join(th, NULL);
	assert_int_equal(d.got, BIG);
	assert_memory_equal(src, d.buf, BIG);
	close(p[0]);
	free(src);
	free(d.buf);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_file_roundtrip),
		cmocka_unit_test(test_early_end),
		cmocka_unit_test(test_bad_fd),
		cmocka_unit_test(test_pipe_big),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
