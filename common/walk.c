#include "common/walk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* One open directory of walk_tree and the length of its path. */
struct walk_frame {
	DIR *d;
	size_t plen;
};

int walk_tree(int rootfd, unsigned max_depth, unsigned flags, walk_fn fn, void *arg)
{
	struct walk_frame *fr = NULL;
	size_t n = 0;
	char *path = NULL;
	int fd, rc = 0;

	if (max_depth == 0)
		return -EINVAL;
	fr = calloc(max_depth, sizeof(*fr));
	path = malloc(PATH_MAX);
	if (!fr || !path) {
		rc = -ENOMEM;
		goto out;
	}
	path[0] = '\0';
	fd = dup(rootfd);
	if (fd < 0) {
		rc = -errno;
		goto out;
	}
	fr[0].d = fdopendir(fd);
	if (!fr[0].d) {
		rc = -errno;
		close(fd);
		goto out;
	}
	rewinddir(fr[0].d);
	n = 1;
	while (n > 0) {
		struct walk_frame *f = &fr[n - 1];
		struct walk_ent e = { 0 };
		struct dirent *de;
		struct stat st;
		int pfd = dirfd(f->d), r;

		errno = 0;
		de = readdir(f->d);
		if (!de) {
			if (errno) {
				rc = -errno;
				goto out;
			}
			closedir(f->d);
			f->d = NULL;
			n--;
			continue;
		}
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (fstatat(pfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			if (errno == ENOENT)
				continue;
			rc = -errno;
			goto out;
		}
		e.dirfd = pfd;
		e.name = de->d_name;
		e.depth = (unsigned)n;
		e.st = &st;
		if (!(flags & WALK_NOPATH)) {
			size_t nl = strlen(de->d_name), sep = f->plen ? 1 : 0;
			if (f->plen + sep + nl >= PATH_MAX) {
				rc = -ENAMETOOLONG;
				goto out;
			}
			path[f->plen] = '/';
			memcpy(path + f->plen + sep, de->d_name, nl + 1);
			e.path = path;
			e.pathlen = f->plen + sep + nl;
		}
		r = fn(arg, &e);
		if (r < 0) {
			rc = r;
			goto out;
		}
		if (!S_ISDIR(st.st_mode) || r == WALK_SKIP)
			continue;
		if (n >= max_depth) {
			rc = -ELOOP;
			goto out;
		}
		fd = openat(pfd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0) {
			if (errno == ENOENT)
				continue;
			rc = -errno;
			goto out;
		}
		fr[n].d = fdopendir(fd);
		if (!fr[n].d) {
			rc = -errno;
			close(fd);
			goto out;
		}
		fr[n].plen = e.pathlen;
		n++;
	}
out:
	for (size_t i = 0; i < n; i++)
		if (fr[i].d)
			closedir(fr[i].d);
	free(fr);
	free(path);
	return rc;
}

int walk_dir_open(struct walk_dir *w, int dirfd)
{
	int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	w->d = NULL;
	w->err = 0;
	if (fd < 0)
		return -errno;
	w->d = fdopendir(fd);
	if (!w->d) {
		int rc = -errno;
		close(fd);
		return rc;
	}
	return 0;
}

const struct dirent *walk_dir_next(struct walk_dir *w)
{
	struct dirent *de;

	if (!w->d || w->err)
		return NULL;
	for (;;) {
		errno = 0;
		de = readdir(w->d);
		if (!de) {
			w->err = errno ? -errno : 0;
			return NULL;
		}
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			return de;
	}
}

int walk_dir_fd(const struct walk_dir *w)
{
	return w->d ? dirfd(w->d) : -1;
}

int walk_dir_close(struct walk_dir *w)
{
	if (w->d)
		closedir(w->d);
	w->d = NULL;
	return w->err;
}
