/* bucket_file: the file:// backend. An object is a regular file under the
 * root directory; its name is its relative path. Writes go to a temporary
 * name in the target directory (fsync'd), then linkat() to the final name,
 * which fails with EEXIST instead of replacing: write-once and atomic, and
 * no O_TMPFILE so it works on NFS. Where hard links are refused (gcsfuse),
 * renameat2(RENAME_NOREPLACE), else a check-then-rename (racy; logged once).
 * Stateless apart from the root fd: every call is thread-safe. */
#include "tiers/bucket.h"
#include "common/io.h"
#include "common/log.h"
#include "common/util.h"
#include "common/walk.h"
#include "tiers/manifest.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MOD "bucket"
#define TMP_PREFIX ".bkt-tmp-"
#define COPY_BUF (1u << 20)

struct fbk {
	int rootfd;
	char *root;
};

static atomic_uint tmp_seq;
static atomic_bool warned_norename;

static int fbk_open(struct bkt *b, const char *loc, void **priv)
{
	struct fbk *f;
	int rc;

	if (loc[0] != '/') {
		bkt_set_error("%s: a file URL needs an absolute path: file:///abs/path", bkt_url(b));
		return -EINVAL;
	}
	rc = util_mkdirs_at(AT_FDCWD, loc, 0755);
	if (rc < 0) {
		bkt_set_error("%s: cannot create %s: %s", bkt_url(b), loc, strerror(-rc));
		return rc;
	}
	f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	f->root = strdup(loc);
	f->rootfd = open(loc, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (!f->root || f->rootfd < 0) {
		rc = f->root ? -errno : -ENOMEM;
		bkt_set_error("%s: cannot open %s: %s", bkt_url(b), loc, strerror(-rc));
		free(f->root);
		free(f);
		return rc;
	}
	*priv = f;
	return 0;
}

static void fbk_close(void *priv)
{
	struct fbk *f = priv;

	close(f->rootfd);
	free(f->root);
	free(f);
}

static struct fbk *F(struct bkt *b) { return bkt_priv(b); }

/* Split "a/b/c" into its directory "a/b" (or ".") and base "c". */
static int split(const char *name, char *dir, size_t dlen, const char **base)
{
	const char *s = strrchr(name, '/');

	if (!s) {
		snprintf(dir, dlen, ".");
		*base = name;
		return 0;
	}
	if ((size_t)(s - name) >= dlen)
		return -ENAMETOOLONG;
	memcpy(dir, name, (size_t)(s - name));
	dir[s - name] = '\0';
	*base = s + 1;
	return 0;
}

/* mkdir -p under the root, fsync'ing the parent of each directory made so
 * the new names survive a crash. */
static int mkdirs_durable(int rootfd, const char *rel)
{
	char buf[PATH_MAX];
	size_t n = strlen(rel);

	if (n >= sizeof(buf))
		return -ENAMETOOLONG;
	memcpy(buf, rel, n + 1);
	for (size_t i = 1; i <= n; i++) {
		if (buf[i] != '/' && buf[i] != '\0')
			continue;
		char c = buf[i];
		buf[i] = '\0';
		if (mkdirat(rootfd, buf, 0755) == 0) {
			char *s = strrchr(buf, '/');
			int pfd;
			if (s) {
				*s = '\0';
				pfd = openat(rootfd, buf, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
				*s = '/';
			} else {
				pfd = dup(rootfd);
			}
			if (pfd >= 0) {
				fsync(pfd);
				close(pfd);
			}
		} else if (errno != EEXIST) {
			return -errno;
		}
		buf[i] = c;
	}
	return 0;
}

/* Copy the source into tfd, computing its CRC32C as it goes. */
static int copy_src(struct bkt *b, const char *name, const struct bkt_src *src, int tfd)
{
	uint32_t crc = 0;
	char *buf = NULL;
	uint64_t off = 0;
	int rc = 0;

	if (src->fd < 0) {
		crc = mf_crc32c(0, src->buf, src->size);
		rc = io_write_full(tfd, src->buf, src->size);
		goto out;
	}
	buf = malloc(COPY_BUF);
	if (!buf)
		return -ENOMEM;
	while (off < src->size) {
		size_t want = src->size - off > COPY_BUF ? COPY_BUF : (size_t)(src->size - off);
		ssize_t r = pread(src->fd, buf, want, (off_t)off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			rc = r < 0 ? -errno : -EIO;
			bkt_set_error("%s/%s: reading the local data at %llu: %s", bkt_url(b), name,
				      (unsigned long long)off, r < 0 ? strerror(-rc) : "file is shorter than its size");
			goto out;
		}
		crc = mf_crc32c(crc, buf, (size_t)r);
		/* tfd is new and empty: zero blocks stay holes in the object */
		rc = bkt_pwrite_sparse(tfd, buf, (size_t)r, off);
		if (rc < 0)
			goto out;
		off += (uint64_t)r;
	}
	if (ftruncate(tfd, (off_t)off) < 0)
		rc = -errno;
out:
	free(buf);
	if (rc == 0 && crc != src->crc32c) {
		bkt_set_error("%s/%s: the local data has crc32c %08x, not the %08x given", bkt_url(b),
			      name, crc, src->crc32c);
		rc = -EBADMSG;
	}
	if (rc < 0 && !bkt_has_error())
		bkt_set_error("%s/%s: writing: %s", bkt_url(b), name, strerror(-rc));
	return rc;
}

/* What occupies base: -EEXIST for an object, -EISDIR for a "directory"
 * (a file:// bucket cannot hold both "a" and "a/b", a gs:// one can). */
static int occupied(int dfd, const char *base)
{
	struct stat st;

	if (fstatat(dfd, base, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return 0;
	return S_ISDIR(st.st_mode) ? -EISDIR : -EEXIST;
}

/* Move tmp to base without ever replacing an existing base. */
static int publish(int dfd, const char *tmp, const char *base)
{
	if (linkat(dfd, tmp, dfd, base, 0) == 0) {
		unlinkat(dfd, tmp, 0);
		return 0;
	}
	if (errno == EEXIST)
		return -EEXIST;
	if (errno != EPERM && errno != EOPNOTSUPP && errno != ENOSYS && errno != EMLINK)
		return -errno;
	if (renameat2(dfd, tmp, dfd, base, RENAME_NOREPLACE) == 0)
		return 0;
	if (errno == EEXIST)
		return -EEXIST;
	if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)
		return -errno;
	if (!atomic_exchange(&warned_norename, true))
		log_warn(MOD, "this filesystem has neither hard links nor RENAME_NOREPLACE: "
			 "write-once is checked, then renamed (racy between writers)");
	if (faccessat(dfd, base, F_OK, AT_SYMLINK_NOFOLLOW) == 0)
		return -EEXIST;
	return renameat(dfd, tmp, dfd, base) < 0 ? -errno : 0;
}

static int fbk_put(struct bkt *b, const char *name, const struct bkt_src *src)
{
	struct fbk *f = F(b);
	char dir[PATH_MAX], tmp[96];
	const char *base;
	int dfd = -1, tfd = -1, rc, tries = 0;
	bool tmp_made = false;

	rc = split(name, dir, sizeof(dir), &base);
	if (rc < 0)
		return rc;
	snprintf(tmp, sizeof(tmp), TMP_PREFIX "%d-%u-%08x", (int)getpid(),
		 atomic_fetch_add(&tmp_seq, 1), (unsigned)(util_now_ns() & 0xffffffffu));
	/* a concurrent delete may remove an emptied directory under us: redo */
	for (;;) {
		if (strcmp(dir, ".") && (rc = mkdirs_durable(f->rootfd, dir)) < 0)
			goto out;
		dfd = openat(f->rootfd, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd >= 0 && (rc = occupied(dfd, base)) < 0)
			goto out;
		if (dfd >= 0)
			tfd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		if (dfd >= 0 && tfd >= 0)
			break;
		rc = -errno;
		if (dfd >= 0)
			close(dfd);
		dfd = -1;
		if (rc != -ENOENT || ++tries == 5)
			goto out;
	}
	tmp_made = true;
	rc = copy_src(b, name, src, tfd);
	if (rc < 0)
		goto out;
	if (fsync(tfd) < 0 || close(tfd) < 0) {
		tfd = -1;
		rc = -errno;
		goto out;
	}
	tfd = -1;
	rc = publish(dfd, tmp, base);
	if (rc == -EEXIST)
		rc = occupied(dfd, base) ? occupied(dfd, base) : rc;
	if (rc < 0)
		goto out;
	tmp_made = false;
	if (fsync(dfd) < 0)
		rc = -errno;
out:
	if (tfd >= 0)
		close(tfd);
	if (tmp_made)
		unlinkat(dfd, tmp, 0);
	if (dfd >= 0)
		close(dfd);
	if (rc == -EEXIST)
		bkt_set_error("%s/%s: already exists (objects are write-once)", bkt_url(b), name);
	else if (rc == -EISDIR || rc == -ENOTDIR)
		bkt_set_error("%s/%s: a file:// bucket cannot hold an object and a \"directory\" "
			      "of the same name", bkt_url(b), name);
	return rc;
}

/* Open an object for reading: regular files only (a directory is not an object). */
static int open_obj(struct bkt *b, const char *name, struct stat *st)
{
	int fd = openat(F(b)->rootfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

	if (fd < 0) {
		int rc = errno == ELOOP ? -ENOENT : -errno;
		if (rc == -ENOENT || rc == -ENOTDIR)
			bkt_set_error("%s/%s: no such object", bkt_url(b), name);
		return rc == -ENOTDIR ? -ENOENT : rc;
	}
	if (fstat(fd, st) < 0 || !S_ISREG(st->st_mode)) {
		close(fd);
		bkt_set_error("%s/%s: no such object", bkt_url(b), name);
		return -ENOENT;
	}
	return fd;
}

static int fbk_get_file(struct bkt *b, const char *name, int fd, unsigned ranges,
			uint64_t *size, uint32_t *crcp)
{
	struct stat st, dst;
	char *buf = NULL;
	uint64_t off = 0;
	uint32_t crc = 0;
	bool seekable;
	int sfd, rc = 0;

	sfd = open_obj(b, name, &st);
	if (sfd < 0)
		return sfd;
	seekable = fstat(fd, &dst) == 0 && S_ISREG(dst.st_mode);
	/* zeros are skipped, not written (holes stay holes): what was there must go */
	if (seekable && ftruncate(fd, 0) < 0) {
		rc = -errno;
		bkt_set_error("%s/%s: truncating the local file: %s", bkt_url(b), name, strerror(-rc));
		goto out;
	}
	buf = malloc(COPY_BUF);
	if (!buf) {
		rc = -ENOMEM;
		goto out;
	}
	for (;;) {
		ssize_t r = read(sfd, buf, COPY_BUF);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rc = -errno;
			bkt_set_error("%s/%s: read: %s", bkt_url(b), name, strerror(-rc));
			goto out;
		}
		if (r == 0)
			break;
		crc = mf_crc32c(crc, buf, (size_t)r);
		rc = seekable ? bkt_pwrite_sparse(fd, buf, (size_t)r, off)
			      : io_write_full(fd, buf, (size_t)r);
		if (rc < 0) {
			bkt_set_error("%s/%s: writing the local file: %s", bkt_url(b), name, strerror(-rc));
			goto out;
		}
		off += (uint64_t)r;
	}
	if (off != (uint64_t)st.st_size) {
		bkt_set_error("%s/%s: size changed while reading (%llu of %lld)", bkt_url(b), name,
			      (unsigned long long)off, (long long)st.st_size);
		rc = -EIO;
		goto out;
	}
	if (seekable && ftruncate(fd, (off_t)off) < 0) {
		rc = -errno;
		goto out;
	}
	*size = off;
	*crcp = crc;
out:
	free(buf);
	close(sfd);
	return rc;
}

static int fbk_get_buf(struct bkt *b, const char *name, size_t max, void **bufp, size_t *lenp)
{
	struct stat st;
	char *buf = NULL;
	size_t got;
	ssize_t r;
	int fd, rc = 0;

	fd = open_obj(b, name, &st);
	if (fd < 0)
		return fd;
	if ((uint64_t)st.st_size > max) {
		bkt_set_error("%s/%s: %lld bytes, more than the %zu allowed", bkt_url(b), name,
			      (long long)st.st_size, max);
		rc = -EFBIG;
		goto out;
	}
	buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		rc = -ENOMEM;
		goto out;
	}
	r = io_read_upto(fd, buf, (size_t)st.st_size);
	if (r < (ssize_t)st.st_size) {
		rc = r < 0 ? (int)r : -EIO;   /* shorter than its size: changed meanwhile */
		goto out;
	}
	got = (size_t)r;
	buf[got] = '\0';
	*bufp = buf;
	*lenp = got;
	buf = NULL;
out:
	free(buf);
	close(fd);
	return rc;
}

static int fbk_stat(struct bkt *b, const char *name, uint64_t *size, uint32_t *crcp)
{
	struct stat st;
	uint64_t sz;
	int fd, rc = 0;

	fd = open_obj(b, name, &st);
	if (fd < 0)
		return fd;
	if (size)
		*size = (uint64_t)st.st_size;
	if (crcp)
		rc = mf_crc32c_fd(fd, crcp, &sz);
	close(fd);
	return rc;
}

/* ---- listing: a depth-first walk in bytewise order of the full names ---- */

struct dent {
	char *name;
	char *key;                  /* name, plus '/' for directories: sorts like the full names */
	bool dir;
	uint64_t size;
};

static int dent_cmp(const void *a, const void *b)
{
	return strcmp(((const struct dent *)a)->key, ((const struct dent *)b)->key);
}

static bool is_tmp(const char *n)
{
	return !strncmp(n, TMP_PREFIX, sizeof(TMP_PREFIX) - 1);
}

#define HAS_OBJECTS_DEPTH 64   /* directories deeper than this count as empty */

static int has_objects_cb(void *arg, const struct walk_ent *e)
{
	(void)arg;
	if (is_tmp(e->name))
		return WALK_SKIP;
	if (S_ISREG(e->st->st_mode))
		return -EEXIST;   /* found one: stop */
	if (S_ISDIR(e->st->st_mode) && e->depth > HAS_OBJECTS_DEPTH)
		return WALK_SKIP;
	return 0;
}

/* Does pfd/name hold at least one object (at any depth)? */
static bool has_objects(int pfd, const char *name)
{
	int fd = openat(pfd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
	int rc;

	if (fd < 0)
		return false;
	rc = walk_tree(fd, HAS_OBJECTS_DEPTH + 1, WALK_NOPATH, has_objects_cb, NULL);
	close(fd);
	return rc == -EEXIST;
}

static void dents_free(struct dent *v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(v[i].name);
		free(v[i].key);
	}
	free(v);
}

/* Sorted entries of dirfd whose names start with filter. */
static int read_dir(int dirfd, const char *filter, struct dent **out, size_t *nout)
{
	struct dent *v = NULL;
	size_t n = 0, cap = 0, fl = strlen(filter);
	const struct dirent *de;
	struct walk_dir d;
	int rc = walk_dir_open(&d, dirfd);

	if (rc < 0)
		return rc;
	while ((de = walk_dir_next(&d)) != NULL) {
		struct stat st;
		struct dent e = { 0 }, *nv;
		size_t nl;

		if (is_tmp(de->d_name) || strncmp(de->d_name, filter, fl))
			continue;
		if (fstatat(dirfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			if (errno == ENOENT)
				continue;   /* deleted while we list */
			rc = -errno;
			break;
		}
		if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
			continue;
		e.dir = S_ISDIR(st.st_mode);
		e.size = e.dir ? 0 : (uint64_t)st.st_size;
		nl = strlen(de->d_name);
		e.name = strdup(de->d_name);
		e.key = malloc(nl + 2);
		if (!e.name || !e.key) {
			free(e.name);
			free(e.key);
			rc = -ENOMEM;
			break;
		}
		memcpy(e.key, de->d_name, nl);
		e.key[nl] = e.dir ? '/' : '\0';
		e.key[nl + 1] = '\0';
		nv = util_grow(v, n, &cap, sizeof(*nv), 32);
		if (!nv) {
			free(e.name);
			free(e.key);
			rc = -ENOMEM;
			break;
		}
		v = nv;
		v[n++] = e;
	}
	walk_dir_close(&d);
	if (rc < 0) {
		dents_free(v, n);
		return rc;
	}
	if (n)
		qsort(v, n, sizeof(*v), dent_cmp);
	*out = v;
	*nout = n;
	return 0;
}

static int walk(int dirfd, const char *relpfx, const char *filter, bool delim, int depth,
		int (*cb)(void *arg, const struct bkt_entry *e), void *arg)
{
	struct dent *v = NULL;
	size_t n = 0;
	char path[PATH_MAX];
	int rc;

	if (depth > 64)
		return -ELOOP;
	rc = read_dir(dirfd, filter, &v, &n);
	if (rc < 0)
		return rc;
	for (size_t i = 0; i < n && rc == 0; i++) {
		struct bkt_entry e = { 0 };

		if ((size_t)snprintf(path, sizeof(path), "%s%s%s", relpfx, v[i].name,
				     v[i].dir ? "/" : "") >= sizeof(path)) {
			rc = -ENAMETOOLONG;
			break;
		}
		e.name = path;
		if (!v[i].dir) {
			e.size = v[i].size;
			rc = cb(arg, &e);
		} else if (delim) {
			if (!has_objects(dirfd, v[i].name))
				continue;
			e.is_prefix = true;
			rc = cb(arg, &e);
		} else {
			int sub = openat(dirfd, v[i].name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
			if (sub < 0) {
				if (errno == ENOENT)
					continue;
				rc = -errno;
				break;
			}
			rc = walk(sub, path, "", false, depth + 1, cb, arg);
			close(sub);
		}
	}
	dents_free(v, n);
	return rc;
}

static int fbk_list(struct bkt *b, const char *prefix, const char *delim,
		    int (*cb)(void *arg, const struct bkt_entry *e), void *arg)
{
	char dir[PATH_MAX];
	const char *slash = strrchr(prefix, '/');
	const char *filter = slash ? slash + 1 : prefix;
	size_t dl = slash ? (size_t)(slash - prefix) + 1 : 0;
	int dfd, rc;

	if (dl >= sizeof(dir))
		return -ENAMETOOLONG;
	memcpy(dir, prefix, dl);
	dir[dl] = '\0';
	dfd = openat(F(b)->rootfd, dl ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
	if (dfd < 0)
		return errno == ENOENT || errno == ENOTDIR ? 0 : -errno;
	rc = walk(dfd, dir, filter, delim != NULL, 0, cb, arg);
	close(dfd);
	return rc;
}

static int fbk_del(struct bkt *b, const char *name)
{
	struct fbk *f = F(b);
	char dir[PATH_MAX];
	struct stat st;
	char *s;

	if (fstatat(f->rootfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode)) {
		bkt_set_error("%s/%s: no such object", bkt_url(b), name);
		return -ENOENT;
	}
	if (unlinkat(f->rootfd, name, 0) < 0) {
		if (errno == ENOENT)
			bkt_set_error("%s/%s: no such object", bkt_url(b), name);
		return -errno;
	}
	/* there are no directories in an object store: drop the emptied ones */
	snprintf(dir, sizeof(dir), "%s", name);
	while ((s = strrchr(dir, '/')) != NULL) {
		*s = '\0';
		if (unlinkat(f->rootfd, dir, AT_REMOVEDIR) < 0)
			break;
	}
	if (snprintf(dir, sizeof(dir), "%s", name) > 0 && (s = strrchr(dir, '/')) != NULL) {
		int dfd;
		*s = '\0';
		dfd = openat(f->rootfd, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd < 0)
			dfd = dup(f->rootfd);
		if (dfd >= 0) {
			fsync(dfd);
			close(dfd);
		}
	} else {
		fsync(f->rootfd);
	}
	return 0;
}

const struct bkt_ops bkt_file_ops = {
	.scheme   = "file",
	.open     = fbk_open,
	.close    = fbk_close,
	.put      = fbk_put,
	.get_file = fbk_get_file,
	.get_buf  = fbk_get_buf,
	.stat     = fbk_stat,
	.list     = fbk_list,
	.del      = fbk_del,
};
