#include "common/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int util_rmtree_at(int dirfd, const char *name, uint64_t *freed)
{
	struct stat st;
	int fd, rc = 0;
	DIR *d;
	struct dirent *de;

	if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISDIR(st.st_mode)) {
		if (unlinkat(dirfd, name, 0) < 0)
			return errno == ENOENT ? 0 : -errno;
		if (freed && st.st_nlink == 1 && S_ISREG(st.st_mode))
			*freed += (uint64_t)st.st_blocks * 512;
		return 0;
	}
	fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	d = fdopendir(fd);
	if (!d) {
		rc = -errno;
		close(fd);
		return rc;
	}
	while ((de = readdir(d)) != NULL) {
		int r;
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		r = util_rmtree_at(fd, de->d_name, freed);
		if (r < 0 && rc == 0)
			rc = r;
	}
	closedir(d);
	if (unlinkat(dirfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT && rc == 0)
		rc = -errno;
	return rc;
}

int util_write_file_atomic(int dirfd, const char *name, const void *buf, size_t len)
{
	char tmp[NAME_MAX + 1];
	const char *p = buf;
	int fd, rc = 0;

	if ((size_t)snprintf(tmp, sizeof(tmp), ".%s.mtcfs-tmp", name) >= sizeof(tmp))
		return -ENAMETOOLONG;
	fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	while (len > 0) {
		ssize_t w = write(fd, p, len);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			rc = -errno;
			break;
		}
		p += w;
		len -= (size_t)w;
	}
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

	fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	buf = malloc(max + 1);
	if (!buf) {
		close(fd);
		return -ENOMEM;
	}
	for (;;) {
		ssize_t r = read(fd, buf + len, max + 1 - len);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			rc = -errno;
			break;
		}
		if (r == 0)
			break;
		len += (size_t)r;
		if (len > max) {
			rc = -EFBIG;
			break;
		}
	}
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

uint64_t util_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}
