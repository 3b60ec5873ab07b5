/* Unit tests for common/walk's one-level walk_dir: every entry once, "."
 * and ".." never, the caller's descriptor keeps its own offset and stays
 * open, an unopenable directory is -errno, entries removed during the walk
 * do no harm. (walk_tree's tests are in test_util.c, where it was born.) */
#include <errno.h>
#include <fcntl.h>
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

#include "common/walk.h"
#define TESTTMP_NAME "walk"
#include "testtmp.h"

#define NENT 300

static void make_tree(int root)
{
	char n[32];

	for (int i = 0; i < NENT; i++) {
		snprintf(n, sizeof(n), i % 3 ? "f%03d" : "d%03d", i);
		if (i % 3) {
			int fd = openat(root, n, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
			assert_true(fd >= 0);
			close(fd);
		} else {
			assert_int_equal(mkdirat(root, n, 0755), 0);
		}
	}
	assert_int_equal(mkdirat(root, "d000/inner", 0755), 0);
}

static void test_every_entry_once(void **state)
{
	int root = ((struct tmp *)*state)->fd;
	unsigned char seen[NENT] = { 0 };
	const struct dirent *de;
	struct walk_dir w;
	int total = 0;

	assert_true(root >= 0);
	make_tree(root);
	assert_int_equal(walk_dir_open(&w, root), 0);
	/* walk_dir_fd is the directory itself, not the caller's descriptor */
	assert_true(walk_dir_fd(&w) >= 0 && walk_dir_fd(&w) != root);
	assert_int_equal(faccessat(walk_dir_fd(&w), "d000/inner", F_OK, 0), 0);
	while ((de = walk_dir_next(&w)) != NULL) {
		int i = atoi(de->d_name + 1);
		assert_true(de->d_name[0] == 'd' || de->d_name[0] == 'f');
		assert_true(i >= 0 && i < NENT);
		assert_int_equal(de->d_name[0], i % 3 ? 'f' : 'd');
		seen[i]++;
		total++;
		/* removing entries while the walk goes does not disturb it */
		if (de->d_name[0] == 'f')
			assert_int_equal(unlinkat(root, de->d_name, 0), 0);
	}
	assert_int_equal(walk_dir_close(&w), 0);
	assert_int_equal(total, NENT);   /* one level: "inner" is not an entry */
	for (int i = 0; i < NENT; i++)
		assert_int_equal(seen[i], 1);
	/* the caller's descriptor is still open and usable */
	assert_int_equal(faccessat(root, "d003", F_OK, 0), 0);
	/* a second walk sees what is left, from the start */
	total = 0;
	assert_int_equal(walk_dir_open(&w, root), 0);
	while ((de = walk_dir_next(&w)) != NULL)
		total++;
	assert_int_equal(walk_dir_close(&w), 0);
	assert_int_equal(total, NENT / 3);
}

static void test_errors(void **state)
{
	struct walk_dir w;
	int root = ((struct tmp *)*state)->fd, fd;

	assert_true(root >= 0);
	assert_int_equal(walk_dir_open(&w, -1), -EBADF);
	assert_int_equal(walk_dir_fd(&w), -1);
	assert_null(walk_dir_next(&w));
	assert_int_equal(walk_dir_close(&w), 0);
	fd = openat(root, "file", O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
	assert_true(fd >= 0);
	assert_int_equal(walk_dir_open(&w, fd), -ENOTDIR);
	close(fd);
	/* an empty directory: no entries, no error */
	assert_int_equal(mkdirat(root, "empty", 0755), 0);
	fd = openat(root, "empty", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(walk_dir_open(&w, fd), 0);
	assert_null(walk_dir_next(&w));
	assert_null(walk_dir_next(&w));
	assert_int_equal(walk_dir_close(&w), 0);
	close(fd);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_every_entry_once, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(test_errors, tmp_setup, tmp_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
