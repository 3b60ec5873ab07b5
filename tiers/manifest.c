#include "tiers/manifest.h"
#include "common/par_for.h"
#include "common/util.h"
#include "common/walk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#define MF_MAGIC   0x4d43544du   /* "MTCM" little-endian */
#define MF_VERSION 1u    /* no owners: what an mtcfs before owners wrote */
#define MF_VERSION_OWNERS 2u   /* + the shard's and every entry's owner */

/* ---- building ---- */

struct mf_builder {
	struct mf_entry *e;
	size_t n, cap;
};

static int add_entry(struct mf_builder *b, struct mf_entry *ent)
{
	struct mf_entry *ne;

	if (b->n == MF_MAX_ENTRIES)
		return -EFBIG;
	ne = util_grow(b->e, b->n, &b->cap, sizeof(*ne), 64);
	if (!ne)
		return -ENOMEM;
	b->e = ne;
	b->e[b->n++] = *ent;
	return 0;
}

/* One entry of the tree being built (walk_tree callback). */
static int build_cb(void *arg, const struct walk_ent *w)
{
	struct mf_builder *b = arg;
	struct mf_entry ent = { 0 };
	const struct stat *st = w->st;
	int rc = 0;   /* set by add_entry; GCC -O2 with ASan cannot see the short circuit */

	ent.mode = st->st_mode & 07777;
	ent.uid = (uint32_t)st->st_uid;
	ent.gid = (uint32_t)st->st_gid;
	if (S_ISREG(st->st_mode)) {
		/* its CRC32C comes later (crc_files), perhaps on two threads */
		ent.type = MF_FILE;
		ent.size = (uint64_t)st->st_size;
	} else if (S_ISDIR(st->st_mode)) {
		ent.type = MF_DIR;
	} else if (S_ISLNK(st->st_mode)) {
		char tgt[PATH_MAX];
		ssize_t l = readlinkat(w->dirfd, w->name, tgt, sizeof(tgt) - 1);
		if (l < 0)
			return -errno;
		tgt[l] = '\0';
		ent.type = MF_SYMLINK;
		ent.target = strdup(tgt);
		if (!ent.target)
			return -ENOMEM;
	} else if (S_ISFIFO(st->st_mode)) {
		ent.type = MF_FIFO;   /* its mode is all there is to keep */
	} else {
		return 0;   /* sockets and devices are not checkpoint data */
	}
	ent.path = strdup(w->path);
	if (!ent.path || (rc = add_entry(b, &ent)) < 0) {
		free(ent.path);
		free(ent.target);
		return ent.path ? rc : -ENOMEM;
	}
	return 0;
}

int mf_refusal(int rc, char *err, size_t errlen)
{
	switch (rc) {
	case -ELOOP:
		snprintf(err, errlen, "the tree is more than %u levels deep", MF_MAX_DEPTH);
		return -EBADMSG;
	case -ENAMETOOLONG:
		snprintf(err, errlen, "a path in the tree is %d bytes or longer", PATH_MAX);
		return -EBADMSG;
	case -EFBIG:
		snprintf(err, errlen, "the tree has more than %u entries", MF_MAX_ENTRIES);
		return -EBADMSG;
	default:
		return rc;
	}
}

/* Components of a relative path ("a/b/c" is 3). */
static unsigned path_depth(const char *p)
{
	unsigned d = 1;
	for (; *p; p++)
		d += *p == '/';
	return d;
}

/* Why a symlink at `path` with `target` cannot be in a shard, or NULL.
 * The target must be relative and stay inside the shard wherever the
 * shard is put (a peer's store, a restore): only leading ".." may climb,
 * no further than the link's own directory's depth, and a ".." after a
 * name is refused because the kernel resolves "name/.." through what name
 * points to, not lexically. With every link of a shard held to this, any
 * chain of them resolves inside the shard. */
static const char *symlink_refusal(const char *path, const char *target)
{
	unsigned up = 0, dir_depth = path_depth(path) - 1;
	bool named = false;
	const char *c = target;

	if (!*target)
		return "the target is empty";
	if (strlen(target) >= PATH_MAX)
		return "the target is too long";
	if (target[0] == '/')
		return "the target is absolute";
	while (*c) {
		const char *e = strchr(c, '/');
		size_t l = e ? (size_t)(e - c) : strlen(c);
		if (l == 2 && c[0] == '.' && c[1] == '.') {
			if (named)
				return "'..' after a name in the target";
			if (++up > dir_depth)
				return "the target leaves the shard";
		} else if (l && !(l == 1 && c[0] == '.')) {
			named = true;
		}
		c += l;
		if (*c == '/')
			c++;
	}
	return NULL;
}

static int entry_cmp_key(const void *key, const void *elem)
{
	return strcmp(key, ((const struct mf_entry *)elem)->path);
}

int mf_validate(const struct manifest *m, char *err, size_t errlen)
{
	char parent[PATH_MAX];
	char dummy[1];

	if (!err) {
		err = dummy;
		errlen = sizeof(dummy);
	}
	for (size_t i = 0; i < m->n; i++) {
		const struct mf_entry *e = &m->e[i];
		const char *slash = strrchr(e->path, '/');
		size_t pl = strlen(e->path);

		if (!util_safe_relpath(e->path, pl)) {
			snprintf(err, errlen, "unsafe path %.200s", e->path);
			return -EBADMSG;
		}
		if (i > 0 && strcmp(m->e[i - 1].path, e->path) >= 0) {
			snprintf(err, errlen, "%.200s: entries unsorted or repeated", e->path);
			return -EBADMSG;
		}
		if (path_depth(e->path) > MF_MAX_DEPTH) {
			snprintf(err, errlen, "%.200s...: more than %u levels deep", e->path,
				 MF_MAX_DEPTH);
			return -EBADMSG;
		}
		if (e->type < MF_FILE || e->type > MF_FIFO || (e->mode & ~07777u) ||
		    (e->type == MF_SYMLINK) != (e->target != NULL)) {
			snprintf(err, errlen, "%.200s: bad entry type or mode", e->path);
			return -EBADMSG;
		}
		/* every entry's parent is a directory of the shard: nothing is
		 * ever written through a symlink or below a file */
		if (slash) {
			const struct mf_entry *p;
			size_t l = (size_t)(slash - e->path);
			memcpy(parent, e->path, l);
			parent[l] = '\0';
			p = bsearch(parent, m->e, m->n, sizeof(*m->e), entry_cmp_key);
			if (!p || p->type != MF_DIR) {
				snprintf(err, errlen, "%.200s: its parent is not a directory of the shard",
					 e->path);
				return -EBADMSG;
			}
		}
		if (e->type == MF_SYMLINK) {
			const char *why = symlink_refusal(e->path, e->target);
			if (why) {
				snprintf(err, errlen, "symlink %.200s -> %.200s: %s (a shard's symlinks must point inside it)",
					 e->path, e->target, why);
				return -EBADMSG;
			}
		}
	}
	return 0;
}

static int cmp_entry(const void *a, const void *b)
{
	return strcmp(((const struct mf_entry *)a)->path, ((const struct mf_entry *)b)->path);
}

/* Canonical bytes of the entries; the hash covers exactly these. */
static int encode_entries(const struct manifest *m, uint8_t **bufp, size_t *lenp);

static int compute_hash(struct manifest *m)
{
	uint8_t *buf = NULL;
	size_t len = 0;
	unsigned int hl = 0;
	int rc = encode_entries(m, &buf, &len);

	if (rc < 0)
		return rc;
	if (!EVP_Digest(buf, len, m->hash, &hl, EVP_sha256(), NULL) || hl != 32)
		rc = -EIO;
	free(buf);
	return rc;
}

static void finish_totals(struct manifest *m)
{
	size_t i;
	m->total = 0;
	m->nfiles = 0;
	for (i = 0; i < m->n; i++) {
		if (m->e[i].type == MF_FILE) {
			m->total += m->e[i].size;
			m->nfiles++;
		}
	}
}

/* CRC32C of the files of a built entry list, largest first, shared by the
 * caller and (for big shards) one more thread. */
struct crc_work {
	int dirfd;
	struct mf_entry **files;   /* largest first */
	size_t n;
};

static int crc_one(void *arg, size_t i)
{
	struct crc_work *w = arg;
	struct mf_entry *e = w->files[i];
	uint64_t size;
	int fd, rc;

	fd = openat(w->dirfd, e->path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	rc = mf_crc32c_fd(fd, &e->crc32c, &size);
	close(fd);
	if (rc == 0)
		e->size = size;
	return rc;
}

static int cmp_size_desc(const void *a, const void *b)
{
	uint64_t x = (*(struct mf_entry *const *)a)->size, y = (*(struct mf_entry *const *)b)->size;
	return x < y ? 1 : x > y ? -1 : 0;
}

#define CRC_PARALLEL_MIN (32ull << 20)   /* below this one thread is as fast */

static int crc_files(int dirfd, struct mf_entry *e, size_t n)
{
	struct crc_work w = { .dirfd = dirfd };
	uint64_t total = 0;
	size_t threads = 1;
	int rc;

	w.files = malloc((n ? n : 1) * sizeof(*w.files));
	if (!w.files)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		if (e[i].type == MF_FILE) {
			w.files[w.n++] = &e[i];
			total += e[i].size;
		}
	qsort(w.files, w.n, sizeof(*w.files), cmp_size_desc);
	/* a second core shortens the seal, and with it the time to redundancy */
	if (w.n > 1 && total >= CRC_PARALLEL_MIN)
		threads = 2;
	rc = par_for(w.n, threads, PAR_FOR_STOP, crc_one, NULL, &w, NULL);
	free(w.files);
	return rc;
}

static int build(int dirfd, bool owners, struct manifest **out, char *err, size_t errlen)
{
	struct mf_builder b = { 0 };
	struct manifest *m;
	struct stat root;
	char dummy[1];
	int rc;

	if (!err) {
		err = dummy;
		errlen = sizeof(dummy);
	}
	err[0] = '\0';
	if (fstat(dirfd, &root) < 0)
		return -errno;
	rc = walk_tree(dirfd, MF_MAX_DEPTH, 0, build_cb, &b);
	if (rc < 0) {
		rc = mf_refusal(rc, err, errlen);
		goto fail;
	}
	rc = crc_files(dirfd, b.e, b.n);
	if (rc < 0)
		goto fail;
	m = calloc(1, sizeof(*m));
	if (!m) {
		rc = -ENOMEM;
		goto fail;
	}
	if (b.n)
		qsort(b.e, b.n, sizeof(*b.e), cmp_entry);
	m->e = b.e;
	m->n = b.n;
	m->owners = owners;
	if (owners) {
		m->root_mode = root.st_mode & 07777;
		m->root_uid = (uint32_t)root.st_uid;
		m->root_gid = (uint32_t)root.st_gid;
	} else {
		for (size_t i = 0; i < m->n; i++)
			m->e[i].uid = m->e[i].gid = 0;
	}
	finish_totals(m);
	rc = mf_validate(m, err, errlen);
	if (rc == 0)
		rc = compute_hash(m);
	if (rc < 0) {
		mf_free(m);
		return rc;
	}
	*out = m;
	return 0;
fail:
	for (size_t i = 0; i < b.n; i++) {
		free(b.e[i].path);
		free(b.e[i].target);
	}
	free(b.e);
	return rc;
}

int mf_build_err(int dirfd, struct manifest **out, char *err, size_t errlen)
{
	return build(dirfd, true, out, err, errlen);
}

int mf_build(int dirfd, struct manifest **out)
{
	return build(dirfd, true, out, NULL, 0);
}

int mf_build_ownerless(int dirfd, struct manifest **out)
{
	return build(dirfd, false, out, NULL, 0);
}

/* One entry (path "" with AT_EMPTY_PATH: dirfd itself) to owner u:g and
 * mode (ignored for a symlink), each only if it differs: the files of a
 * stage may be hard links of another shard's, which must not change. */
static int own_one(int dirfd, const char *path, int flags, bool link, uid_t u, gid_t g,
		   mode_t mode)
{
	struct stat st;

	if (fstatat(dirfd, path, &st, flags | AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	if (st.st_uid != u || st.st_gid != g) {
		if (fchownat(dirfd, path, u, g, flags | AT_SYMLINK_NOFOLLOW) < 0)
			return -errno;
		/* the chown cleared set-id bits of a file */
		if (!link && fstatat(dirfd, path, &st, flags | AT_SYMLINK_NOFOLLOW) < 0)
			return -errno;
	}
	if (link)
		return 0;
	if ((st.st_mode & 07777) != mode) {
		int rc = flags ? fchmod(dirfd, mode) : fchmodat(dirfd, path, mode, 0);
		if (rc < 0)
			return -errno;
	}
	return 0;
}

int mf_apply_owners(int dirfd, const struct manifest *m, const struct mf_owner *dflt,
		    unsigned flags, char *err, size_t errlen)
{
	const struct mf_owner none = { 0, 0, 0 };
	const mode_t setid = S_ISUID | S_ISGID;
	mode_t drop;
	uid_t uid;
	gid_t gid;
	struct stat root;
	int rc;

	if (geteuid() != 0)
		return 0;   /* a daemon that is not root owns everything it makes */
	if (m->owners || !dflt)
		dflt = &none;
	uid = (uid_t)dflt->uid;
	gid = (gid_t)dflt->gid;
	drop = setid | ((mode_t)dflt->umask & 077);
	/* deepest first (the entries are sorted: "a/b" after "a"), so that a
	 * directory's own mode comes after what is in it */
	for (size_t i = m->n; i-- > 0;) {
		const struct mf_entry *e = &m->e[i];
		if (e->type == MF_FILE && (flags & MF_OWN_NOT_FILES))
			continue;
		/* sticky means nothing on a file: as xfer.c, never from a peer */
		rc = own_one(dirfd, e->path, 0, e->type == MF_SYMLINK,
			     m->owners ? (uid_t)e->uid : uid, m->owners ? (gid_t)e->gid : gid,
			     (mode_t)e->mode & ~drop & ~(e->type == MF_DIR ? 0 : S_ISVTX));
		if (rc < 0) {
			if (err && errlen)
				snprintf(err, errlen, "%.200s: owner or mode: %s", e->path, strerror(-rc));
			return rc;
		}
	}
	if (fstat(dirfd, &root) < 0)
		return -errno;
	rc = own_one(dirfd, "", AT_EMPTY_PATH, false,
		     m->owners ? (uid_t)m->root_uid : uid, m->owners ? (gid_t)m->root_gid : gid,
		     (m->owners ? (mode_t)m->root_mode : root.st_mode & 07777) & ~drop);
	if (rc < 0 && err && errlen)
		snprintf(err, errlen, "the shard directory's owner or mode: %s", strerror(-rc));
	return rc;
}

void mf_free(struct manifest *m)
{
	if (!m)
		return;
	for (size_t i = 0; i < m->n; i++) {
		free(m->e[i].path);
		free(m->e[i].target);
	}
	free(m->e);
	free(m);
}

/* One file's CRC32C against its entry (the precise message on failure). */
static int verify_file(int dirfd, const struct mf_entry *e, char *err, size_t errlen)
{
	uint32_t crc;
	uint64_t size;
	int fd, rc;

	fd = openat(dirfd, e->path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		snprintf(err, errlen, "%s: %s", e->path, strerror(errno));
		return -EBADMSG;
	}
	rc = mf_crc32c_fd(fd, &crc, &size);
	close(fd);
	if (rc < 0) {
		snprintf(err, errlen, "%s: read failed: %s", e->path, strerror(-rc));
		return rc;
	}
	if (crc != e->crc32c || size != e->size) {
		snprintf(err, errlen, "%s: crc32c %08x, manifest says %08x", e->path, crc, e->crc32c);
		return -EBADMSG;
	}
	return 0;
}

int mf_verify(int dirfd, const struct manifest *m, char *err, size_t errlen)
{
	struct mf_entry *cp;
	size_t ncp = 0;
	int rc;

	/* the tree first: types, sizes, symlink targets */
	for (size_t i = 0; i < m->n; i++) {
		const struct mf_entry *e = &m->e[i];
		struct stat st;

		if (fstatat(dirfd, e->path, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			snprintf(err, errlen, "%s: missing (%s)", e->path, strerror(errno));
			return -EBADMSG;
		}
		if (e->type == MF_DIR && !S_ISDIR(st.st_mode)) {
			snprintf(err, errlen, "%s: not a directory", e->path);
			return -EBADMSG;
		}
		if (e->type == MF_FIFO && !S_ISFIFO(st.st_mode)) {
			snprintf(err, errlen, "%s: not a FIFO", e->path);
			return -EBADMSG;
		}
		if (e->type == MF_SYMLINK) {
			char tgt[PATH_MAX];
			ssize_t l;
			if (!S_ISLNK(st.st_mode)) {
				snprintf(err, errlen, "%s: not a symlink", e->path);
				return -EBADMSG;
			}
			l = readlinkat(dirfd, e->path, tgt, sizeof(tgt) - 1);
			if (l < 0 || (tgt[l] = '\0', strcmp(tgt, e->target))) {
				snprintf(err, errlen, "%s: symlink target changed", e->path);
				return -EBADMSG;
			}
		}
		if (e->type == MF_FILE && (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != e->size)) {
			snprintf(err, errlen, "%s: size %lld, manifest says %llu", e->path,
				 (long long)st.st_size, (unsigned long long)e->size);
			return -EBADMSG;
		}
	}
	/* then every byte, on two threads for a big shard (as when sealing),
	 * into copies of the entries; compared in manifest order */
	cp = malloc((m->n ? m->n : 1) * sizeof(*cp));
	if (!cp)
		return -ENOMEM;
	for (size_t i = 0; i < m->n; i++)
		if (m->e[i].type == MF_FILE)
			cp[ncp++] = m->e[i];
	rc = crc_files(dirfd, cp, ncp);
	for (size_t i = 0, k = 0; rc == 0 && i < m->n; i++) {
		const struct mf_entry *e = &m->e[i];
		if (e->type != MF_FILE)
			continue;
		if (cp[k].crc32c != e->crc32c || cp[k].size != e->size) {
			snprintf(err, errlen, "%s: crc32c %08x, manifest says %08x", e->path,
				 cp[k].crc32c, e->crc32c);
			rc = -EBADMSG;
		}
		k++;
	}
	free(cp);
	if (rc == -EBADMSG || rc == 0)
		return rc;
	/* a file could not be read: find which, with its message */
	for (size_t i = 0; i < m->n; i++)
		if (m->e[i].type == MF_FILE && (rc = verify_file(dirfd, &m->e[i], err, errlen)) < 0)
			return rc;
	return 0;
}

/* ---- encoding: little-endian, length-prefixed ---- */

struct wbuf { uint8_t *p; size_t n, cap; int err; };

static void wput(struct wbuf *w, const void *src, size_t len)
{
	if (w->err)
		return;
	if (w->n + len > w->cap) {
		size_t ncap = w->cap ? w->cap : 256;
		while (ncap < w->n + len)
			ncap *= 2;
		uint8_t *np = realloc(w->p, ncap);
		if (!np) {
			w->err = -ENOMEM;
			return;
		}
		w->p = np;
		w->cap = ncap;
	}
	memcpy(w->p + w->n, src, len);
	w->n += len;
}

static void wu8(struct wbuf *w, uint8_t v) { wput(w, &v, 1); }
static void wu16(struct wbuf *w, uint16_t v) { uint8_t b[2] = { v, v >> 8 }; wput(w, b, 2); }
static void wu32(struct wbuf *w, uint32_t v)
{
	uint8_t b[4] = { v, v >> 8, v >> 16, v >> 24 };
	wput(w, b, 4);
}
static void wu64(struct wbuf *w, uint64_t v) { wu32(w, (uint32_t)v); wu32(w, (uint32_t)(v >> 32)); }

static void put_entries(struct wbuf *w, const struct manifest *m)
{
	for (size_t i = 0; i < m->n; i++) {
		const struct mf_entry *e = &m->e[i];
		size_t pl = strlen(e->path), tl = e->target ? strlen(e->target) : 0;
		wu8(w, e->type);
		wu32(w, e->mode);
		if (m->owners) {
			wu32(w, e->uid);
			wu32(w, e->gid);
		}
		wu64(w, e->size);
		wu32(w, e->crc32c);
		wu16(w, (uint16_t)pl);
		wput(w, e->path, pl);
		wu16(w, (uint16_t)tl);
		wput(w, e->target ? e->target : "", tl);
	}
}

/* Hand the encoded bytes to the caller, or free them on an earlier error. */
static int wbuf_take(struct wbuf *w, uint8_t **bufp, size_t *lenp)
{
	if (w->err) {
		free(w->p);
		return w->err;
	}
	*bufp = w->p;
	*lenp = w->n;
	return 0;
}

/* The shard directory's mode and owner, in version 2 only. */
static void put_root(struct wbuf *w, const struct manifest *m)
{
	if (!m->owners)
		return;
	wu32(w, m->root_mode);
	wu32(w, m->root_uid);
	wu32(w, m->root_gid);
}

static int encode_entries(const struct manifest *m, uint8_t **bufp, size_t *lenp)
{
	struct wbuf w = { 0 };
	put_root(&w, m);
	wu32(&w, (uint32_t)m->n);
	put_entries(&w, m);
	return wbuf_take(&w, bufp, lenp);
}

int mf_encode(const struct manifest *m, uint8_t **bufp, size_t *lenp)
{
	struct wbuf w = { 0 };
	wu32(&w, MF_MAGIC);
	wu32(&w, m->owners ? MF_VERSION_OWNERS : MF_VERSION);
	wput(&w, m->hash, 32);
	put_root(&w, m);
	wu32(&w, (uint32_t)m->n);
	put_entries(&w, m);
	return wbuf_take(&w, bufp, lenp);
}

struct rbuf { const uint8_t *p; size_t n, off; };

static bool rget(struct rbuf *r, void *dst, size_t len)
{
	if (r->n - r->off < len)
		return false;
	memcpy(dst, r->p + r->off, len);
	r->off += len;
	return true;
}
static bool ru8(struct rbuf *r, uint8_t *v) { return rget(r, v, 1); }
static bool ru16(struct rbuf *r, uint16_t *v)
{
	uint8_t b[2];
	if (!rget(r, b, 2))
		return false;
	*v = (uint16_t)(b[0] | b[1] << 8);
	return true;
}
static bool ru32(struct rbuf *r, uint32_t *v)
{
	uint8_t b[4];
	if (!rget(r, b, 4))
		return false;
	*v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
	return true;
}
static bool ru64(struct rbuf *r, uint64_t *v)
{
	uint32_t lo, hi;
	if (!ru32(r, &lo) || !ru32(r, &hi))
		return false;
	*v = (uint64_t)hi << 32 | lo;
	return true;
}

static char *rstr(struct rbuf *r, size_t len)
{
	char *s;
	if (r->n - r->off < len)
		return NULL;
	s = malloc(len + 1);
	if (!s)
		return NULL;
	memcpy(s, r->p + r->off, len);
	s[len] = '\0';
	r->off += len;
	return s;
}

int mf_decode(const uint8_t *buf, size_t len, struct manifest **out)
{
	return mf_decode_err(buf, len, out, NULL, 0);
}

int mf_decode_err(const uint8_t *buf, size_t len, struct manifest **out, char *err,
		  size_t errlen)
{
	struct rbuf r = { buf, len, 0 };
	struct manifest *m;
	uint32_t magic, ver, n, root[3] = { 0, 0, 0 };
	uint8_t want[32];
	size_t min_entry;
	int rc = -EBADMSG;

	if (err && errlen)
		snprintf(err, errlen, "malformed manifest");

	if (!ru32(&r, &magic) || magic != MF_MAGIC || !ru32(&r, &ver) ||
	    (ver != MF_VERSION && ver != MF_VERSION_OWNERS) || !rget(&r, want, 32))
		return -EBADMSG;
	if (ver == MF_VERSION_OWNERS &&
	    (!ru32(&r, &root[0]) || !ru32(&r, &root[1]) || !ru32(&r, &root[2]) ||
	     (root[0] & ~07777u)))
		return -EBADMSG;
	if (!ru32(&r, &n) || n > MF_MAX_ENTRIES)
		return -EBADMSG;
	/* every entry takes at least 22 bytes (30 with owners): refuse counts
	 * the input cannot hold */
	min_entry = ver == MF_VERSION_OWNERS ? 30 : 22;
	if ((uint64_t)n * min_entry > len - r.off)
		return -EBADMSG;
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->owners = ver == MF_VERSION_OWNERS;
	m->root_mode = root[0];
	m->root_uid = root[1];
	m->root_gid = root[2];
	m->e = n ? calloc(n, sizeof(*m->e)) : NULL;
	if (n && !m->e) {
		free(m);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < n; i++) {
		struct mf_entry *e = &m->e[i];
		uint16_t pl, tl;
		m->n = i + 1;
		if (!ru8(&r, &e->type) || !ru32(&r, &e->mode) ||
		    (m->owners && (!ru32(&r, &e->uid) || !ru32(&r, &e->gid))) ||
		    !ru64(&r, &e->size) || !ru32(&r, &e->crc32c) || !ru16(&r, &pl))
			goto out;
		if (e->type < MF_FILE || e->type > MF_FIFO || (e->mode & ~07777u) ||
		    e->size > MF_MAX_FILE_SIZE || pl == 0)
			goto out;
		if (e->type != MF_FILE && (e->size || e->crc32c))
			goto out;
		e->path = rstr(&r, pl);
		if (!e->path || !util_safe_relpath(e->path, pl) || !ru16(&r, &tl))
			goto out;
		if ((tl != 0) != (e->type == MF_SYMLINK))
			goto out;
		if (tl) {
			e->target = rstr(&r, tl);
			if (!e->target || memchr(e->target, '\0', tl))
				goto out;
		}
		if (i > 0 && strcmp(m->e[i - 1].path, e->path) >= 0)
			goto out;   /* unsorted or duplicate */
	}
	if (r.off != len)
		goto out;
	finish_totals(m);
	/* the same rules as when this node seals a tree of its own */
	rc = mf_validate(m, err, errlen);
	if (rc < 0)
		goto out;
	rc = compute_hash(m);
	if (rc < 0)
		goto out;
	if (memcmp(m->hash, want, 32)) {
		rc = -EBADMSG;
		goto out;
	}
	*out = m;
	return 0;
out:
	mf_free(m);
	return rc;
}

void mf_hash_hex(const uint8_t hash[32], char out[65])
{
	static const char hx[] = "0123456789abcdef";
	for (int i = 0; i < 32; i++) {
		out[2 * i] = hx[hash[i] >> 4];
		out[2 * i + 1] = hx[hash[i] & 15];
	}
	out[64] = '\0';
}

int mf_hash_parse(const char *hex, uint8_t hash[32])
{
	for (int i = 0; i < 64; i++) {
		char c = hex[i];
		int v = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
		if (v < 0)
			return -EINVAL;
		if (i & 1)
			hash[i / 2] = (uint8_t)(hash[i / 2] | v);
		else
			hash[i / 2] = (uint8_t)(v << 4);
	}
	return hex[64] == '\0' ? 0 : -EINVAL;
}
