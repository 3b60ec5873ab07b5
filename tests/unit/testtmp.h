/* testtmp.h: a private temporary directory per cmocka test (setup and
 * teardown functions), removed without the code under test. Define
 * TESTTMP_NAME (e.g. "util") before including it. Header-only: each test
 * executable is one translation unit. */
#ifndef MTCFS_TESTS_UNIT_TESTTMP_H
#define MTCFS_TESTS_UNIT_TESTTMP_H

#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

struct tmp {
	char path[PATH_MAX];
	int fd;
};

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)ftw;
	return flag == FTW_DP ? rmdir(p) : unlink(p);
}

static int tmp_setup(void **state)
{
	static const char *const bases[] = { "/dev/shm", "/tmp" };
	struct tmp *t = calloc(1, sizeof(*t));

	if (!t)
		return -1;
	for (size_t i = 0; i < sizeof(bases) / sizeof(bases[0]); i++) {
		snprintf(t->path, sizeof(t->path), "%s/mtcfs-test-" TESTTMP_NAME "-XXXXXX", bases[i]);
		if (mkdtemp(t->path))
			break;
		t->path[0] = '\0';
	}
	if (!t->path[0]) {
		free(t);
		return -1;
	}
	t->fd = open(t->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (t->fd < 0) {
		rmdir(t->path);
		free(t);
		return -1;
	}
	*state = t;
	return 0;
}

static int tmp_teardown(void **state)
{
	struct tmp *t = *state;
	int rc;

	if (!t)
		return 0;
	close(t->fd);
	rc = nftw(t->path, rm_cb, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
	free(t);
	return rc;
}

#endif
