/* ec_store.c — what a step's erasure-code holding keeps (see ec.h, "what
 * a RAMDIR stores of the code"): one walk for the RAM tier's start-up scan
 * and mtcfs-admin verify. */
#include "tiers/ec.h"
#include "common/jobname.h"
#include "common/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static enum ec_stored_kind kind_of(const char *name, int *owner)
{
	size_t n = strlen(name);
	int len = 0;

	if ((n > 4 && !strcmp(name + n - 4, ".tmp")) ||
	    (n > 10 && !strcmp(name + n - 10, ".mtcfs-tmp")))
		return ECS_TMP;     /* ecx_tmpfile, a parity slot, util_write_file_atomic */
	if (n > 5 && !strcmp(name + n - 5, ".frag"))
		return ECS_FRAG;
	if (sscanf(name, "m%d.mf%n", owner, &len) == 1 && *owner >= 0 && (size_t)len == n)
		return ECS_META;
	if (!strcmp(name, "sent") || !strcmp(name, "protected"))
		return ECS_MARK;
	return ECS_OTHER;
}

static void check(int stepfd, struct ec_stored *s, enum ec_check how)
{
	char *buf = NULL;
	size_t len = 0;
	int fd, rc;

	s->verdict = 0;
	s->why[0] = '\0';
	if (s->kind == ECS_FRAG) {
		fd = openat(stepfd, s->name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0) {
			s->verdict = -errno;
			snprintf(s->why, sizeof(s->why), "cannot open: %s", strerror(errno));
			return;
		}
		s->verdict = how == EC_CHECK_ALL ? ec_frag_verify(fd, NULL, NULL, s->why, sizeof(s->why))
						 : ec_frag_info(fd, NULL, NULL, s->why, sizeof(s->why));
		close(fd);
	} else if (s->kind == ECS_META) {
		struct manifest *mf = NULL;
		rc = util_read_file_at(stepfd, s->name, EC_STORED_META_MAX, &buf, &len);
		if (rc == 0)
			rc = mf_decode_err((const uint8_t *)buf, len, &mf, s->why, sizeof(s->why));
		else
			snprintf(s->why, sizeof(s->why), "cannot read: %s", strerror(-rc));
		s->verdict = rc;
		mf_free(mf);
		free(buf);
	}
}

/* Every entry of one step directory. */
static int walk_step(int stepfd, struct ec_stored *s, enum ec_check how, ec_stored_fn fn,
		     void *arg)
{
	DIR *d = fdopendir(dup(stepfd));
	int rc = 0;

	if (!d)
		return -errno;
	for (struct dirent *de; rc == 0 && (de = readdir(d));) {
		struct stat st;
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		s->name = de->d_name;
		s->owner = -1;
		s->kind = kind_of(de->d_name, &s->owner);
		if (s->kind != ECS_META)
			s->owner = -1;
		s->bytes = fstatat(stepfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
				   S_ISREG(st.st_mode) ? (uint64_t)st.st_blocks * 512 : 0;
		s->verdict = 0;
		s->why[0] = '\0';
		if (how != EC_CHECK_NONE)
			check(stepfd, s, how);
		rc = fn(arg, stepfd, s);
	}
	closedir(d);
	return rc;
}

int ec_stored_walk_dir(int stepfd, const char *job, uint64_t step, enum ec_check how,
		       ec_stored_fn fn, void *arg)
{
	struct ec_stored s;

	memset(&s, 0, sizeof(s));
	s.job = job;
	s.step = step;
	return walk_step(stepfd, &s, how, fn, arg);
}
