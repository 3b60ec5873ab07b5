#include "common/util.h"
#include "common/io.h"
#include "common/walk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int util_parse_u64(const char *s, uint64_t max, uint64_t *out)
{
	uint64_t v = 0;

	if (!s || !*s)
		return -EINVAL;
	for (; *s; s++) {
		uint64_t d;
		if (*s < '0' || *s > '9')
			return -EINVAL;
		d = (uint64_t)(*s - '0');
		if (v > (UINT64_MAX - d) / 10)
			return -EINVAL;
		v = v * 10 + d;
	}
	if (v > max)
		return -EINVAL;
	*out = v;
	return 0;
}

int util_parse_size(const char *s, uint64_t *out)
{
	uint64_t whole = 0, frac = 0, fdiv = 1, mul = 1;
	const char *p = s;

	if (!s || !*s)
		return -EINVAL;
	if (*p < '0' || *p > '9')
		return -EINVAL;
	for (; *p >= '0' && *p <= '9'; p++) {
		uint64_t d = (uint64_t)(*p - '0');
		if (whole > (UINT64_MAX - d) / 10)
			return -EINVAL;
		whole = whole * 10 + d;
	}
	if (*p == '.') {
		p++;
		if (*p < '0' || *p > '9')
			return -EINVAL;
		for (; *p >= '0' && *p <= '9'; p++) {
			if (fdiv < 1000000000ULL) {
				frac = frac * 10 + (uint64_t)(*p - '0');
				fdiv *= 10;
			}
		}
	}
	switch (*p) {
	case '\0': break;
	case 'k': case 'K': mul = 1ULL << 10; p++; break;
	case 'm': case 'M': mul = 1ULL << 20; p++; break;
	case 'g': case 'G': mul = 1ULL << 30; p++; break;
	case 't': case 'T': mul = 1ULL << 40; p++; break;
	default: return -EINVAL;
	}
	if (mul > 1 && *p == 'i')
		p++;
	if (mul > 1 && (*p == 'B' || *p == 'b'))
		p++;
	if (*p)
		return -EINVAL;
	{
		/* 128-bit: a long fraction times TiB does not fit 64 bits */
		unsigned __int128 v = (unsigned __int128)whole * mul +
				      ((unsigned __int128)frac * mul) / fdiv;
		if (v > UINT64_MAX)
			return -EINVAL;
		*out = (uint64_t)v;
	}
	return 0;
}

bool util_is_step_name(const char *name, uint64_t *step)
{
	uint64_t v;
	size_t n = strlen(name);

	/* Leading zeros are allowed (Orbax's step_format_fixed_length writes
	 * "00000100"); the value must fit a signed 64-bit integer, because
	 * steps travel as JSON integers and Python ints between the nodes. */
	if (n == 0 || n > UTIL_STEP_NAME_MAX)
		return false;
	if (util_parse_u64(name, INT64_MAX, &v) < 0)
		return false;
	if (step)
		*step = v;
	return true;
}

bool util_safe_relpath(const char *p, size_t len)
{
	size_t i, start = 0;

	if (len == 0 || len > PATH_MAX - 1 || p[0] == '/')
		return false;
	for (i = 0; i <= len; i++) {
		if (i < len && p[i] == '\0')
			return false;
		if (i == len || p[i] == '/') {
			size_t cl = i - start;
			if (cl == 0 || cl > NAME_MAX)
				return false;
			if (cl == 1 && p[start] == '.')
				return false;
			if (cl == 2 && p[start] == '.' && p[start + 1] == '.')
				return false;
			start = i + 1;
		}
	}
	return true;
}

int util_mkdirs_at(int dirfd, const char *rel, unsigned mode)
{
	char buf[PATH_MAX];
	size_t n = strlen(rel), i;

	if (n >= sizeof(buf))
		return -ENAMETOOLONG;
	memcpy(buf, rel, n + 1);
	for (i = 1; i <= n; i++) {
		if (buf[i] == '/' || buf[i] == '\0') {
			char c = buf[i];
			buf[i] = '\0';
			if (mkdirat(dirfd, buf, mode) < 0) {
				struct stat st;
				if (errno != EEXIST)
					return -errno;
				if (fstatat(dirfd, buf, &st, 0) < 0)
					return -errno;
				if (!S_ISDIR(st.st_mode))
					return -ENOTDIR;
			}
			buf[i] = c;
		}
	}
	return 0;
}

/* One directory on the way down of util_rmtree_at: its name in its parent,
 * its identity (to check the way up through ".."), and the subdirectories
 * found in it that are still to go. */
struct rm_level {
	char *name;
	dev_t dev;
	ino_t ino;
	char **sub;
	size_t nsub, capsub;
	int rescans;
};

/* Remove the non-directories of dirfd, collect its subdirectories into lv. */
static int rm_scan(int dirfd, struct rm_level *lv, uint64_t *freed)
{
	const struct dirent *de;
	struct walk_dir d;
	int rc = walk_dir_open(&d, dirfd);

	if (rc < 0)
		return rc;
	while ((de = walk_dir_next(&d)) != NULL) {
		struct stat st;
		if (fstatat(dirfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			if (errno == ENOENT)
				continue;
			rc = -errno;
			break;
		}
		if (S_ISDIR(st.st_mode)) {
			char *n, **ns = util_grow(lv->sub, lv->nsub, &lv->capsub, sizeof(*ns), 8);
			if (!ns) {
				rc = -ENOMEM;
				break;
			}
			lv->sub = ns;
			n = strdup(de->d_name);
			if (!n) {
				rc = -ENOMEM;
				break;
			}
			lv->sub[lv->nsub++] = n;
			continue;
		}
		if (unlinkat(dirfd, de->d_name, 0) < 0) {
			if (errno == ENOENT)
				continue;
			rc = -errno;
			break;
		}
		if (freed && st.st_nlink == 1 && S_ISREG(st.st_mode))
			*freed += (uint64_t)st.st_blocks * 512;
	}
	walk_dir_close(&d);
	return rc;
}

static void rm_level_free(struct rm_level *lv)
{
	free(lv->name);
	for (size_t i = 0; i < lv->nsub; i++)
		free(lv->sub[i]);
	free(lv->sub);
	memset(lv, 0, sizeof(*lv));
}

int util_rmtree_at(int dirfd, const char *name, uint64_t *freed)
{
	struct rm_level *lv = NULL;
	size_t n = 0, cap = 0;
	struct stat st;
	int cur = -1, up = -1, rc = 0;
	bool scan = true;

	if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISDIR(st.st_mode)) {
		if (unlinkat(dirfd, name, 0) < 0)
			return errno == ENOENT ? 0 : -errno;
		if (freed && st.st_nlink == 1 && S_ISREG(st.st_mode))
			*freed += (uint64_t)st.st_blocks * 512;
		return 0;
	}
	cur = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (cur < 0)
		return errno == ENOENT ? 0 : -errno;
	lv = calloc(8, sizeof(*lv));
	if (!lv || !(lv[0].name = strdup(name))) {
		rc = -ENOMEM;
		goto out;
	}
	cap = 8;
	n = 1;
	lv[0].dev = st.st_dev;
	lv[0].ino = st.st_ino;
	while (n > 0) {
		struct rm_level *l = &lv[n - 1];
		int parent;

		if (scan) {
			rc = rm_scan(cur, l, freed);
			if (rc < 0)
				goto out;
			scan = false;
		}
		if (l->nsub) {
			char *sub = l->sub[--l->nsub];
			int fd = openat(cur, sub, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (fd < 0 || fstat(fd, &st) < 0) {
				rc = errno == ENOENT ? 0 : -errno;
				if (fd >= 0)
					close(fd);
				free(sub);
				if (rc < 0)
					goto out;
				continue;   /* gone meanwhile */
			}
			if (n == cap) {
				struct rm_level *nl = realloc(lv, cap * 2 * sizeof(*nl));
				if (!nl) {
					close(fd);
					free(sub);
					rc = -ENOMEM;
					goto out;
				}
				lv = nl;
				cap *= 2;
			}
			memset(&lv[n], 0, sizeof(lv[n]));
			lv[n].name = sub;
			lv[n].dev = st.st_dev;
			lv[n].ino = st.st_ino;
			n++;
			close(cur);
			cur = fd;
			scan = true;
			continue;
		}
		/* this directory is empty now: up one level and remove it */
		if (n == 1) {
			parent = dirfd;
		} else {
			up = openat(cur, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
			if (up < 0 || fstat(up, &st) < 0) {
				rc = -errno;
				goto out;
			}
			if (st.st_dev != lv[n - 2].dev || st.st_ino != lv[n - 2].ino) {
				rc = -ESTALE;   /* moved under us: do not remove elsewhere */
				goto out;
			}
			parent = up;
		}
		close(cur);
		cur = -1;
		if (unlinkat(parent, l->name, AT_REMOVEDIR) < 0 && errno != ENOENT) {
			/* something was created meanwhile: look again, a few times */
			if (errno != ENOTEMPTY || l->rescans++ >= 3) {
				rc = -errno;
				goto out;
			}
			cur = openat(parent, l->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (cur < 0) {
				rc = -errno;
				goto out;
			}
			if (up >= 0)
				close(up);
			up = -1;
			scan = true;
			continue;
		}
		rm_level_free(l);
		n--;
		cur = up;   /* -1 once the top is gone */
		up = -1;
	}
out:
	if (cur >= 0)
		close(cur);
	if (up >= 0)
		close(up);
	for (size_t i = 0; i < n; i++)
		rm_level_free(&lv[i]);
	free(lv);
	return rc;
}

int util_write_file_atomic(int dirfd, const char *name, const void *buf, size_t len)
{
	char tmp[NAME_MAX + 1];
	int fd, rc;

	if ((size_t)snprintf(tmp, sizeof(tmp), ".%s.mtcfs-tmp", name) >= sizeof(tmp))
		return -ENAMETOOLONG;
	fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	rc = io_write_full(fd, buf, len);
	if (close(fd) < 0 && rc == 0)
		rc = -errno;
	if (rc == 0 && renameat(dirfd, tmp, dirfd, name) < 0)
		rc = -errno;
	if (rc < 0)
		unlinkat(dirfd, tmp, 0);
	return rc;
}

int util_read_file_at(int dirfd, const char *name, size_t max, char **bufp, size_t *lenp)
{
	int fd, rc = 0;
	char *buf = NULL;
	size_t len = 0;
	ssize_t got;

	fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	buf = malloc(max + 1);
	if (!buf) {
		close(fd);
		return -ENOMEM;
	}
	/* one byte more than max tells a file that is too big */
	got = io_read_upto(fd, buf, max + 1);
	if (got < 0)
		rc = (int)got;
	else if ((size_t)got > max)
		rc = -EFBIG;
	else
		len = (size_t)got;
	close(fd);
	if (rc < 0) {
		free(buf);
		return rc;
	}
	buf[len] = '\0';
	*bufp = buf;
	*lenp = len;
	return 0;
}

void *util_grow(void *v, size_t n, size_t *cap, size_t elem, size_t first)
{
	size_t nc;
	void *p;

	if (n < *cap)
		return v;
	nc = *cap ? *cap * 2 : first;
	if (nc <= n || elem == 0 || nc > SIZE_MAX / elem)
		return NULL;
	p = realloc(v, nc * elem);
	if (p)
		*cap = nc;
	return p;
}

uint64_t util_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

void util_cond_init_monotonic(pthread_cond_t *cv)
{
	pthread_condattr_t ca;

	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(cv, &ca);
	pthread_condattr_destroy(&ca);
}

uint64_t util_nofile_raise(int *raise_rc)
{
	struct rlimit rl;

	if (raise_rc)
		*raise_rc = 0;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return 0;
	if (rl.rlim_cur < rl.rlim_max) {
		rlim_t cur = rl.rlim_cur;
		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl) < 0) {
			if (raise_rc)
				*raise_rc = -errno;
			rl.rlim_cur = cur;
		}
	}
	return rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur;
}
