/* ec_store.c — what a RAMDIR holds of the erasure code (see ec.h, "stored
 * in a RAMDIR"): one walk for the daemon's start-up scan and mtcfs-admin
 * verify. */
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

int ec_stored_walk(int rootfd, const char *job, enum ec_check how, ec_stored_fn fn, void *arg)
{
	struct ec_stored s;
	DIR *fd_jobs = NULL;
	int frags, rc = 0;

	frags = openat(rootfd, "frags", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (frags < 0)
		return errno == ENOENT ? 0 : -errno;
	fd_jobs = fdopendir(frags);
	if (!fd_jobs) {
		close(frags);
		return -errno;
	}
	for (struct dirent *je; rc == 0 && (je = readdir(fd_jobs));) {
		DIR *steps;
		int jfd;
		if (!job_name_ok(je->d_name) || (job && strcmp(job, je->d_name)))
			continue;
		jfd = openat(dirfd(fd_jobs), je->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (jfd < 0 || !(steps = fdopendir(jfd))) {
			if (jfd >= 0)
				close(jfd);
			continue;
		}
		for (struct dirent *se; rc == 0 && (se = readdir(steps));) {
			int sfd;
			memset(&s, 0, sizeof(s));
			if (!util_is_step_name(se->d_name, &s.step))
				continue;
			sfd = openat(dirfd(steps), se->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (sfd < 0)
				continue;
			s.job = je->d_name;
			rc = walk_step(sfd, &s, how, fn, arg);
			close(sfd);
		}
		closedir(steps);
	}
	closedir(fd_jobs);
	return rc;
}
