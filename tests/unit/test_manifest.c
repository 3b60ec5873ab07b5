/* Unit tests for tiers/manifest: CRC32C check values and the mmap window of
 * mf_crc32c_fd, mf_build over a real tree, mf_verify on every kind of
 * damage, the exact encoding (pinned against a hand-written encoder), and
 * mf_decode on untrusted bytes: every truncation, every flipped byte, every
 * malformed field, each next to a valid twin so the field is what fails.
 * Filesystem tests run in a private directory under /dev/shm (or /tmp). */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <openssl/evp.h>

#include "common/util.h"
#include "tiers/manifest.h"

/* The encoding, as mf_encode writes it (little-endian):
 *   u32 magic "MTCM", u32 version 1, u8[32] SHA-256, u32 count,
 *   count x { u8 type, u32 mode, u64 size, u32 crc32c,
 *             u16 pathlen, path, u16 targetlen, target }
 * and the hash covers count + entries. Version 2 (a manifest with owners)
 * puts u32 root mode, u32 root uid, u32 root gid before the count and
 * u32 uid, u32 gid after each entry's mode; its hash covers root fields +
 * count + entries. Version 1 is what an mtcfs before owners wrote, and
 * what mf_build_ownerless makes: it must stay readable, byte for byte. */
#define MAGIC   0x4d43544du
#define VERSION 1u
#define VERSION_OWNERS 2u
#define HDR_LEN 44u
#define HDR_LEN_OWNERS 56u

#define TESTTMP_NAME "manifest"
#include "tests/unit/testtmp.h"

static void put_file(int dirfd, const char *name, const void *data, size_t len, mode_t mode)
{
	int fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, data, len), (ssize_t)len);
	assert_int_equal(fchmod(fd, mode), 0);
	assert_int_equal(close(fd), 0);
}

static void put_dir(int dirfd, const char *name, mode_t mode)
{
	assert_int_equal(mkdirat(dirfd, name, mode), 0);
	assert_int_equal(fchmodat(dirfd, name, mode, 0), 0);
}

static int open_dir(int dirfd, const char *name)
{
	int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	assert_true(fd >= 0);
	return fd;
}

/* ---- the sample tree ---- */

struct want {
	const char *path;
	uint8_t type;
	uint32_t mode;
	const char *data;    /* file content, symlink target */
	size_t len;
};

/* In the bytewise order mf_build must produce ('.' < '/'). */
static const struct want sample[] = {
	{ "a", MF_DIR, 0755, NULL, 0 },
	{ "a.txt", MF_FILE, 0644, "A", 1 },
	{ "a/sub", MF_DIR, 0700, NULL, 0 },
	{ "a/sub/deep.txt", MF_FILE, 0600, "deep content\n", 13 },
	{ "a/x.bin", MF_FILE, 0644, "\0\1\2", 3 },
	{ "b.txt", MF_FILE, 0640, "hello", 5 },
	{ "empty_dir", MF_DIR, 0750, NULL, 0 },
	{ "fifo", MF_FIFO, 0640, NULL, 0 },
	{ "link", MF_SYMLINK, 0777, "a/x.bin", 7 },
	{ "zero", MF_FILE, 0444, "", 0 },
};
#define NSAMPLE (sizeof(sample) / sizeof(sample[0]))

/* Creates the sample tree in dirfd/name, plus a socket that the manifest
 * must skip. Parents first; otherwise in an order unlike the sorted one. */
static void make_sample(int dirfd, const char *name)
{
	static const int order[] = { 9, 8, 7, 6, 5, 0, 4, 2, 3, 1 };
	int fd;

	put_dir(dirfd, name, 0755);
	fd = open_dir(dirfd, name);
	for (size_t k = 0; k < NSAMPLE; k++) {
		const struct want *w = &sample[order[k]];
		if (w->type == MF_DIR)
			put_dir(fd, w->path, w->mode);
		else if (w->type == MF_FILE)
			put_file(fd, w->path, w->data, w->len, w->mode);
		else if (w->type == MF_FIFO)
			assert_int_equal(mkfifoat(fd, w->path, 0600) || fchmodat(fd, w->path, w->mode, 0), 0);
		else
			assert_int_equal(symlinkat(w->data, fd, w->path), 0);
	}
	assert_int_equal(mknodat(fd, "sock", S_IFSOCK | 0600, 0), 0);
	close(fd);
}

/* Builds the manifest of dirfd/name. */
static struct manifest *build_as(int dirfd, const char *name, bool owners)
{
	struct manifest *m = NULL;
	int fd = open_dir(dirfd, name);
	int rc = owners ? mf_build(fd, &m) : mf_build_ownerless(fd, &m);

	close(fd);
	if (rc != 0) {
		print_error("mf_build(%s) = %d\n", name, rc);
		fail();
	}
	assert_non_null(m);
	assert_int_equal(m->owners, owners);
	return m;
}

static struct manifest *build(int dirfd, const char *name)
{
	return build_as(dirfd, name, true);
}

/* A manifest as an mtcfs before owners built it (version 1). */
static struct manifest *build_v1(int dirfd, const char *name)
{
	return build_as(dirfd, name, false);
}

static void check_sample(const struct manifest *m)
{
	uint64_t total = 0;
	uint32_t nfiles = 0;

	assert_int_equal(m->n, NSAMPLE);
	for (size_t i = 0; i < NSAMPLE; i++) {
		const struct want *w = &sample[i];
		const struct mf_entry *e = &m->e[i];

		assert_string_equal(e->path, w->path);
		assert_int_equal(e->type, w->type);
		assert_int_equal(e->mode, w->mode);
		if (w->type == MF_FILE) {
			assert_int_equal(e->size, w->len);
			assert_int_equal(e->crc32c, mf_crc32c(0, w->data, w->len));
			assert_null(e->target);
			total += w->len;
			nfiles++;
		} else if (w->type == MF_SYMLINK) {
			assert_int_equal(e->size, 0);
			assert_int_equal(e->crc32c, 0);
			assert_non_null(e->target);
			assert_string_equal(e->target, w->data);
		} else {
			assert_int_equal(e->size, 0);
			assert_int_equal(e->crc32c, 0);
			assert_null(e->target);
		}
	}
	assert_int_equal(m->total, total);
	assert_int_equal(m->nfiles, nfiles);
}

static void assert_same_manifest(const struct manifest *a, const struct manifest *b)
{
	assert_int_equal(a->n, b->n);
	assert_int_equal(a->total, b->total);
	assert_int_equal(a->nfiles, b->nfiles);
	assert_memory_equal(a->hash, b->hash, 32);
	assert_int_equal(a->owners, b->owners);
	assert_int_equal(a->root_mode, b->root_mode);
	assert_int_equal(a->root_uid, b->root_uid);
	assert_int_equal(a->root_gid, b->root_gid);
	for (size_t i = 0; i < a->n; i++) {
		assert_string_equal(a->e[i].path, b->e[i].path);
		assert_int_equal(a->e[i].type, b->e[i].type);
		assert_int_equal(a->e[i].mode, b->e[i].mode);
		assert_int_equal(a->e[i].uid, b->e[i].uid);
		assert_int_equal(a->e[i].gid, b->e[i].gid);
		assert_int_equal(a->e[i].size, b->e[i].size);
		assert_int_equal(a->e[i].crc32c, b->e[i].crc32c);
		if (a->e[i].target || b->e[i].target) {
			assert_non_null(a->e[i].target);
			assert_non_null(b->e[i].target);
			assert_string_equal(a->e[i].target, b->e[i].target);
		}
	}
}

/* ---- a hand-written encoder for crafted (possibly malformed) input ---- */

struct centry {
	uint8_t type;
	uint32_t mode;
	uint64_t size;
	uint32_t crc;
	const char *path;
	size_t pl;           /* 0: strlen(path) unless path is "" */
	const char *target;  /* NULL: none */
	size_t tl;           /* 0: strlen(target) */
};

struct cbuf {
	uint8_t *p;
	size_t n, cap;
};

static void cput(struct cbuf *b, const void *src, size_t len)
{
	if (b->n + len > b->cap) {
		size_t ncap = b->cap ? b->cap : 256;
		while (ncap < b->n + len)
			ncap *= 2;
		b->p = realloc(b->p, ncap);
		assert_non_null(b->p);
		b->cap = ncap;
	}
	if (len)
		memcpy(b->p + b->n, src, len);
	b->n += len;
}

static void cu8(struct cbuf *b, uint8_t v) { cput(b, &v, 1); }
static void cu16(struct cbuf *b, uint16_t v)
{
	uint8_t x[2] = { (uint8_t)v, (uint8_t)(v >> 8) };
	cput(b, x, 2);
}
static void cu32(struct cbuf *b, uint32_t v)
{
	uint8_t x[4] = { (uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24) };
	cput(b, x, 4);
}
static void cu64(struct cbuf *b, uint64_t v)
{
	cu32(b, (uint32_t)v);
	cu32(b, (uint32_t)(v >> 32));
}

static void sha256(const void *p, size_t len, uint8_t out[32])
{
	unsigned int hl = 0;

	assert_int_equal(EVP_Digest(p, len, out, &hl, EVP_sha256(), NULL), 1);
	assert_int_equal(hl, 32);
}

/* Encodes n entries under a count field of count, with a correct hash over
 * exactly those bytes; the result is malloc'd. */
static uint8_t *craft_count(const struct centry *e, size_t n, uint32_t count, size_t *len)
{
	struct cbuf body = { 0 }, out = { 0 };
	uint8_t hash[32];

	cu32(&body, count);
	for (size_t i = 0; i < n; i++) {
		size_t pl = e[i].pl ? e[i].pl : strlen(e[i].path);
		size_t tl = e[i].target ? (e[i].tl ? e[i].tl : strlen(e[i].target)) : 0;

		cu8(&body, e[i].type);
		cu32(&body, e[i].mode);
		cu64(&body, e[i].size);
		cu32(&body, e[i].crc);
		cu16(&body, (uint16_t)pl);
		cput(&body, e[i].path, pl);
		cu16(&body, (uint16_t)tl);
		cput(&body, e[i].target, tl);
	}
	sha256(body.p, body.n, hash);
	cu32(&out, MAGIC);
	cu32(&out, VERSION);
	cput(&out, hash, 32);
	cput(&out, body.p, body.n);
	free(body.p);
	*len = out.n;
	return out.p;
}

static uint8_t *craft(const struct centry *e, size_t n, size_t *len)
{
	return craft_count(e, n, (uint32_t)n, len);
}

struct cown {
	uint32_t uid, gid;
};

/* Version 2: the root's mode and owner, each entry's owner. */
static uint8_t *craft_owners(const struct centry *e, size_t n, uint32_t rmode, uint32_t ruid,
			     uint32_t rgid, const struct cown *own, size_t *len)
{
	struct cbuf body = { 0 }, out = { 0 };
	uint8_t hash[32];

	cu32(&body, rmode);
	cu32(&body, ruid);
	cu32(&body, rgid);
	cu32(&body, (uint32_t)n);
	for (size_t i = 0; i < n; i++) {
		size_t pl = e[i].pl ? e[i].pl : strlen(e[i].path);
		size_t tl = e[i].target ? (e[i].tl ? e[i].tl : strlen(e[i].target)) : 0;

		cu8(&body, e[i].type);
		cu32(&body, e[i].mode);
		cu32(&body, own[i].uid);
		cu32(&body, own[i].gid);
		cu64(&body, e[i].size);
		cu32(&body, e[i].crc);
		cu16(&body, (uint16_t)pl);
		cput(&body, e[i].path, pl);
		cu16(&body, (uint16_t)tl);
		cput(&body, e[i].target, tl);
	}
	sha256(body.p, body.n, hash);
	cu32(&out, MAGIC);
	cu32(&out, VERSION_OWNERS);
	cput(&out, hash, 32);
	cput(&out, body.p, body.n);
	free(body.p);
	*len = out.n;
	return out.p;
}

/* buf must be refused with -EBADMSG and *out left alone. */
static void decode_bad(const uint8_t *buf, size_t len, const char *what)
{
	struct manifest *sentinel = (struct manifest *)&sentinel;
	struct manifest *m = sentinel;
	int rc = mf_decode(buf, len, &m);

	if (rc != -EBADMSG || m != sentinel) {
		print_error("mf_decode(%s, %zu bytes) = %d, want -EBADMSG\n", what, len, rc);
		if (rc == 0 && m != sentinel)
			mf_free(m);
		fail();
	}
}

static void decode_good(const uint8_t *buf, size_t len, const char *what)
{
	struct manifest *m = NULL;
	int rc = mf_decode(buf, len, &m);

	if (rc != 0) {
		print_error("mf_decode(%s, %zu bytes) = %d, want 0\n", what, len, rc);
		fail();
	}
	mf_free(m);
}

static void crafted_good(const struct centry *e, size_t n, const char *what)
{
	size_t len;
	uint8_t *buf = craft(e, n, &len);

	decode_good(buf, len, what);
	free(buf);
}

static void crafted_bad(const struct centry *e, size_t n, const char *what)
{
	size_t len;
	uint8_t *buf = craft(e, n, &len);

	decode_bad(buf, len, what);
	free(buf);
}

/* A valid manifest with every kind of entry; paths of two bytes or more. */
#define CRC_HELLO 0x9a71bb4cu   /* CRC32C("hello") */
static const struct centry base[] = {
	{ MF_DIR, 0755, 0, 0, "dir", 0, NULL, 0 },
	{ MF_FILE, 0644, 5, CRC_HELLO, "dir/file", 0, NULL, 0 },
	{ MF_SYMLINK, 0777, 0, 0, "link", 0, "dir/file", 0 },
	{ MF_FILE, 0600, 0, 0, "zz", 0, NULL, 0 },
};
#define NBASE (sizeof(base) / sizeof(base[0]))

/* ---- CRC32C ---- */

static void test_crc32c_check_values(void **state)
{
	uint8_t v[32];
	const char *s = "123456789";
	(void)state;

	assert_int_equal(mf_crc32c(0, s, 9), 0xE3069283u);
	assert_int_equal(mf_crc32c(0, "hello", 5), CRC_HELLO);
	assert_int_equal(mf_crc32c(0, "", 0), 0);
	assert_int_equal(mf_crc32c(0xE3069283u, "", 0), 0xE3069283u);
	/* RFC 3720 B.4 */
	memset(v, 0, sizeof(v));
	assert_int_equal(mf_crc32c(0, v, 32), 0x8A9136AAu);
	memset(v, 0xff, sizeof(v));
	assert_int_equal(mf_crc32c(0, v, 32), 0x62A8AB43u);
	for (int i = 0; i < 32; i++)
		v[i] = (uint8_t)i;
	assert_int_equal(mf_crc32c(0, v, 32), 0x46DD794Eu);
	for (int i = 0; i < 32; i++)
		v[i] = (uint8_t)(31 - i);
	assert_int_equal(mf_crc32c(0, v, 32), 0x113FDB5Cu);
	/* incremental == one-shot at every split point */
	for (size_t i = 0; i <= 9; i++)
		assert_int_equal(mf_crc32c(mf_crc32c(0, s, i), s + i, 9 - i), 0xE3069283u);
	for (size_t i = 0; i <= 9; i++)
		for (size_t j = i; j <= 9; j++)
			assert_int_equal(mf_crc32c(mf_crc32c(mf_crc32c(0, s, i), s + i, j - i),
						   s + j, 9 - j),
					 0xE3069283u);
}

static void test_crc32c_incremental_large(void **state)
{
	size_t len = (3u << 20) + 12345;
	uint8_t *buf = malloc(len);
	uint32_t one, inc, x = 2463534242u;
	size_t off = 0;
	(void)state;

	assert_non_null(buf);
	for (size_t i = 0; i < len; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		buf[i] = (uint8_t)x;
	}
	one = mf_crc32c(0, buf, len);
	inc = 0;
	while (off < len) {
		size_t chunk = 1 + (x % 70001);
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		if (chunk > len - off)
			chunk = len - off;
		inc = mf_crc32c(inc, buf + off, chunk);
		off += chunk;
	}
	assert_int_equal(inc, one);
	buf[len / 2] ^= 1;
	assert_int_not_equal(mf_crc32c(0, buf, len), one);
	free(buf);
}

static void test_crc32c_fd_small(void **state)
{
	struct tmp *t = *state;
	uint32_t crc = 1;
	uint64_t size = 1;
	int fd;

	put_file(t->fd, "nine", "123456789", 9, 0644);
	fd = openat(t->fd, "nine", O_RDONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(mf_crc32c_fd(fd, &crc, &size), 0);
	assert_int_equal(crc, 0xE3069283u);
	assert_int_equal(size, 9);
	close(fd);

	put_file(t->fd, "empty", "", 0, 0644);
	fd = openat(t->fd, "empty", O_RDONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	crc = 1;
	size = 1;
	assert_int_equal(mf_crc32c_fd(fd, &crc, &size), 0);
	assert_int_equal(crc, 0);
	assert_int_equal(size, 0);
	close(fd);

	assert_int_equal(mf_crc32c_fd(-1, &crc, &size), -EBADF);
}

/* A file larger than the 64 MiB mmap window: mostly holes, with data at the
 * start, on both sides of the window edge and in the unaligned tail. */
static void test_crc32c_fd_crosses_window(void **state)
{
	struct tmp *t = *state;
	const size_t win = 64u << 20;
	const size_t len = win + 3 * 4096 + 5;
	static const struct { size_t off, len; } spans[] = {
		{ 0, 1u << 20 },
		{ (64u << 20) - 4096 - 3, 8192 + 6 },
		{ (32u << 20) + 17, 100 },
		{ (64u << 20) + 3 * 4096 - 10, 15 },
	};
	uint8_t *buf = calloc(1, len);
	uint32_t crc = 0, want, chunked = 0;
	uint64_t size = 0;
	int fd;

	assert_non_null(buf);
	fd = openat(t->fd, "big", O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)len), 0);
	for (size_t s = 0; s < sizeof(spans) / sizeof(spans[0]); s++) {
		for (size_t i = 0; i < spans[s].len; i++)
			buf[spans[s].off + i] = (uint8_t)(i * 7 + s + 1);
		assert_true(spans[s].off + spans[s].len <= len);
		assert_int_equal(pwrite(fd, buf + spans[s].off, spans[s].len, (off_t)spans[s].off),
				 (ssize_t)spans[s].len);
	}
	assert_int_not_equal(buf[win - 1], 0);
	assert_int_not_equal(buf[win], 0);
	assert_int_not_equal(buf[len - 1], 0);

	want = mf_crc32c(0, buf, len);
	for (size_t off = 0; off < len; off += 1u << 20)
		chunked = mf_crc32c(chunked, buf + off, len - off < (1u << 20) ? len - off : 1u << 20);
	assert_int_equal(chunked, want);

	assert_int_equal(mf_crc32c_fd(fd, &crc, &size), 0);
	assert_int_equal(size, len);
	assert_int_equal(crc, want);

	/* the first byte past the window edge is covered */
	buf[win] ^= 0x40;
	assert_int_equal(pwrite(fd, buf + win, 1, (off_t)win), 1);
	assert_int_equal(mf_crc32c_fd(fd, &crc, &size), 0);
	assert_int_equal(crc, mf_crc32c(0, buf, len));
	assert_int_not_equal(crc, want);
	close(fd);
	free(buf);
}

/* ---- mf_build ---- */

static void test_build_tree(void **state)
{
	struct tmp *t = *state;
	struct manifest *m, *m2;
	uint8_t zero[32] = { 0 };

	make_sample(t->fd, "tree");
	m = build(t->fd, "tree");
	check_sample(m);
	assert_memory_not_equal(m->hash, zero, 32);
	/* deterministic */
	m2 = build(t->fd, "tree");
	assert_same_manifest(m, m2);
	mf_free(m2);
	mf_free(m);
	mf_free(NULL);
}

static void test_build_empty(void **state)
{
	struct tmp *t = *state;
	struct manifest *m, *d = NULL;
	uint8_t *buf;
	size_t len;
	uint8_t h[32];
	static const uint8_t zero4[4] = { 0 };

	put_dir(t->fd, "empty", 0755);
	m = build_v1(t->fd, "empty");
	assert_int_equal(m->n, 0);
	assert_int_equal(m->total, 0);
	assert_int_equal(m->nfiles, 0);
	sha256(zero4, 4, h);           /* the hash of "count 0" */
	assert_memory_equal(m->hash, h, 32);
	assert_int_equal(mf_encode(m, &buf, &len), 0);
	assert_int_equal(len, HDR_LEN);
	assert_int_equal(mf_decode(buf, len, &d), 0);
	assert_same_manifest(m, d);
	mf_free(d);
	free(buf);
	mf_free(m);

	/* with owners: the directory's own mode and owner, then "count 0" */
	{
		uint8_t body[16] = { 0 };
		struct stat st;
		assert_int_equal(fstatat(t->fd, "empty", &st, 0), 0);
		m = build(t->fd, "empty");
		assert_int_equal(m->root_mode, 0755);
		assert_int_equal(m->root_uid, st.st_uid);
		assert_int_equal(m->root_gid, st.st_gid);
		for (int i = 0; i < 4; i++) {
			body[i] = (uint8_t)(0755 >> (8 * i));
			body[4 + i] = (uint8_t)(st.st_uid >> (8 * i));
			body[8 + i] = (uint8_t)(st.st_gid >> (8 * i));
		}
		sha256(body, sizeof(body), h);
		assert_memory_equal(m->hash, h, 32);
		assert_int_equal(mf_encode(m, &buf, &len), 0);
		assert_int_equal(len, HDR_LEN_OWNERS);
		assert_int_equal(buf[4], VERSION_OWNERS);
		assert_int_equal(mf_decode(buf, len, &d), 0);
		assert_same_manifest(m, d);
		mf_free(d);
		free(buf);
		mf_free(m);
	}
}

/* Rewrites one byte of dirfd/path at off. */
static void poke(int dirfd, const char *path, off_t off, uint8_t v)
{
	int fd = openat(dirfd, path, O_WRONLY | O_CLOEXEC);

	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, &v, 1, off), 1);
	close(fd);
}

static void test_build_hash(void **state)
{
	struct tmp *t = *state;
	struct manifest *a, *b;
	uint8_t *ea, *eb;
	size_t la, lb;

	make_sample(t->fd, "one");
	put_dir(t->fd, "elsewhere", 0700);
	make_sample(t->fd, "elsewhere/two");
	a = build(t->fd, "one");
	b = build(t->fd, "elsewhere/two");
	/* identical trees in different places: same manifest, same bytes */
	assert_same_manifest(a, b);
	assert_int_equal(mf_encode(a, &ea, &la), 0);
	assert_int_equal(mf_encode(b, &eb, &lb), 0);
	assert_int_equal(la, lb);
	assert_memory_equal(ea, eb, la);
	free(ea);
	free(eb);
	mf_free(b);

	/* one byte changes: the hash changes; back again: equal again */
	poke(t->fd, "elsewhere/two/a/sub/deep.txt", 5, 'X');
	b = build(t->fd, "elsewhere/two");
	assert_memory_not_equal(a->hash, b->hash, 32);
	assert_int_equal(b->total, a->total);
	mf_free(b);
	poke(t->fd, "elsewhere/two/a/sub/deep.txt", 5, 'c');
	b = build(t->fd, "elsewhere/two");
	assert_memory_equal(a->hash, b->hash, 32);
	mf_free(b);

	/* mode is covered */
	assert_int_equal(fchmodat(t->fd, "elsewhere/two/b.txt", 0600, 0), 0);
	b = build(t->fd, "elsewhere/two");
	assert_memory_not_equal(a->hash, b->hash, 32);
	mf_free(b);
	assert_int_equal(fchmodat(t->fd, "elsewhere/two/b.txt", 0640, 0), 0);

	/* symlink target is covered */
	assert_int_equal(unlinkat(t->fd, "elsewhere/two/link", 0), 0);
	assert_int_equal(symlinkat("a/x.bim", t->fd, "elsewhere/two/link"), 0);
	b = build(t->fd, "elsewhere/two");
	assert_memory_not_equal(a->hash, b->hash, 32);
	mf_free(b);
	assert_int_equal(unlinkat(t->fd, "elsewhere/two/link", 0), 0);
	assert_int_equal(symlinkat("a/x.bin", t->fd, "elsewhere/two/link"), 0);

	/* an added empty directory is covered */
	put_dir(t->fd, "elsewhere/two/a/sub/new", 0755);
	b = build(t->fd, "elsewhere/two");
	assert_memory_not_equal(a->hash, b->hash, 32);
	assert_int_equal(b->n, a->n + 1);
	mf_free(b);
	assert_int_equal(unlinkat(t->fd, "elsewhere/two/a/sub/new", AT_REMOVEDIR), 0);
	b = build(t->fd, "elsewhere/two");
	assert_memory_equal(a->hash, b->hash, 32);
	mf_free(b);
	mf_free(a);
}

/* ---- mf_verify ---- */

static void verify_ok(int dirfd, const char *name, const struct manifest *m)
{
	char err[256] = "";
	int fd = open_dir(dirfd, name);
	int rc = mf_verify(fd, m, err, sizeof(err));

	close(fd);
	if (rc != 0) {
		print_error("mf_verify(%s) = %d (%s), want 0\n", name, rc, err);
		fail();
	}
}

/* mf_verify must fail with -EBADMSG and a message naming path and sub. */
static void verify_bad(int dirfd, const char *name, const struct manifest *m,
		       const char *path, const char *sub)
{
	char err[256] = "";
	int fd = open_dir(dirfd, name);
	int rc = mf_verify(fd, m, err, sizeof(err));

	close(fd);
	if (rc != -EBADMSG || strncmp(err, path, strlen(path)) || err[strlen(path)] != ':' ||
	    !strstr(err, sub)) {
		print_error("mf_verify(%s) = %d \"%s\"; want -EBADMSG \"%s: ...%s...\"\n", name,
			    rc, err, path, sub);
		fail();
	}
}

/* Fresh copy of the sample in dirfd/name and its manifest. */
static struct manifest *fresh(int dirfd, const char *name)
{
	struct manifest *m;

	make_sample(dirfd, name);
	m = build(dirfd, name);
	verify_ok(dirfd, name, m);
	return m;
}

static void test_verify_detects(void **state)
{
	struct tmp *t = *state;
	struct manifest *m;
	int fd;

	/* flipped byte, same size */
	m = fresh(t->fd, "c1");
	poke(t->fd, "c1/a/x.bin", 1, 0x81);
	verify_bad(t->fd, "c1", m, "a/x.bin", "crc32c");
	poke(t->fd, "c1/a/x.bin", 1, 0x01);
	verify_ok(t->fd, "c1", m);
	mf_free(m);

	/* truncated */
	m = fresh(t->fd, "c2");
	fd = openat(t->fd, "c2/b.txt", O_WRONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, 4), 0);
	close(fd);
	verify_bad(t->fd, "c2", m, "b.txt", "size 4");
	mf_free(m);

	/* grown (extra bytes at the end) */
	m = fresh(t->fd, "c3");
	fd = openat(t->fd, "c3/a/sub/deep.txt", O_WRONLY | O_APPEND | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "+", 1), 1);
	close(fd);
	verify_bad(t->fd, "c3", m, "a/sub/deep.txt", "size 14");
	mf_free(m);

	/* an empty file that gained a byte */
	m = fresh(t->fd, "c4");
	assert_int_equal(unlinkat(t->fd, "c4/zero", 0), 0);
	put_file(t->fd, "c4/zero", "z", 1, 0444);
	verify_bad(t->fd, "c4", m, "zero", "size 1");
	mf_free(m);

	/* missing file, missing directory */
	m = fresh(t->fd, "c5");
	assert_int_equal(unlinkat(t->fd, "c5/zero", 0), 0);
	verify_bad(t->fd, "c5", m, "zero", "missing");
	assert_int_equal(unlinkat(t->fd, "c5/empty_dir", AT_REMOVEDIR), 0);
	verify_bad(t->fd, "c5", m, "empty_dir", "missing");
	mf_free(m);

	/* a directory replaced by a file */
	m = fresh(t->fd, "c6");
	assert_int_equal(unlinkat(t->fd, "c6/empty_dir", AT_REMOVEDIR), 0);
	put_file(t->fd, "c6/empty_dir", "", 0, 0644);
	verify_bad(t->fd, "c6", m, "empty_dir", "not a directory");
	mf_free(m);

	/* a symlink replaced by a file */
	m = fresh(t->fd, "c7");
	assert_int_equal(unlinkat(t->fd, "c7/link", 0), 0);
	put_file(t->fd, "c7/link", "\0\1\2", 3, 0644);
	verify_bad(t->fd, "c7", m, "link", "not a symlink");
	mf_free(m);

	/* a file replaced by a symlink to identical content */
	m = fresh(t->fd, "c8");
	put_file(t->fd, "c8/copy", "hello", 5, 0640);
	assert_int_equal(unlinkat(t->fd, "c8/b.txt", 0), 0);
	assert_int_equal(symlinkat("copy", t->fd, "c8/b.txt"), 0);
	verify_bad(t->fd, "c8", m, "b.txt", "manifest says");
	mf_free(m);

	/* a directory on the path replaced by a symlink to an identical copy */
	m = fresh(t->fd, "c9");
	make_sample(t->fd, "c9copy");
	assert_int_equal(renameat(t->fd, "c9/a", t->fd, "c9gone"), 0);
	assert_int_equal(symlinkat("../c9copy/a", t->fd, "c9/a"), 0);
	verify_bad(t->fd, "c9", m, "a", "not a directory");
	mf_free(m);

	/* a FIFO replaced by an empty file */
	m = fresh(t->fd, "c10");
	assert_int_equal(unlinkat(t->fd, "c10/fifo", 0), 0);
	put_file(t->fd, "c10/fifo", "", 0, 0640);
	verify_bad(t->fd, "c10", m, "fifo", "not a FIFO");
	mf_free(m);
}

static void test_verify_small_err_buffer(void **state)
{
	struct tmp *t = *state;
	struct manifest *m;
	char err[8 + 8];
	int fd;

	m = fresh(t->fd, "s");
	poke(t->fd, "s/a/sub/deep.txt", 0, 'D');
	fd = open_dir(t->fd, "s");
	memset(err, '#', sizeof(err));
	assert_int_equal(mf_verify(fd, m, err, 8), -EBADMSG);
	assert_int_equal(err[7], '\0');
	assert_string_equal(err, "a/sub/d");
	for (size_t i = 8; i < sizeof(err); i++)
		assert_int_equal(err[i], '#');
	close(fd);
	mf_free(m);
}

/* The manifest records each symlink's target, but mf_verify only checks
 * that a symlink is there: a link re-pointed elsewhere still verifies. */
static void test_verify_symlink_target(void **state)
{
	struct tmp *t = *state;
	struct manifest *m;

	char err[256] = "";
	int fd, rc;

	m = fresh(t->fd, "l");
	assert_int_equal(unlinkat(t->fd, "l/link", 0), 0);
	assert_int_equal(symlinkat("/etc/passwd", t->fd, "l/link"), 0);
	fd = open_dir(t->fd, "l");
	rc = mf_verify(fd, m, err, sizeof(err));
	close(fd);
	mf_free(m);
	if (rc != -EBADMSG || strncmp(err, "link:", 5)) {
		print_error("mf_verify with link -> /etc/passwd (manifest: a/x.bin) = %d \"%s\"; "
			    "want -EBADMSG \"link: ...\"\n", rc, err);
		fail();
	}
}

/* ---- encoding ---- */

static void test_encode_decode_roundtrip(void **state)
{
	struct tmp *t = *state;
	struct manifest *m, *d = NULL;
	uint8_t *buf, *buf2;
	size_t len, len2;

	make_sample(t->fd, "tree");
	m = build(t->fd, "tree");
	assert_int_equal(mf_encode(m, &buf, &len), 0);
	assert_int_equal(mf_decode(buf, len, &d), 0);
	assert_non_null(d);
	assert_same_manifest(m, d);
	check_sample(d);
	assert_int_equal(mf_encode(d, &buf2, &len2), 0);
	assert_int_equal(len2, len);
	assert_memory_equal(buf2, buf, len);
	free(buf2);
	free(buf);
	mf_free(d);
	mf_free(m);
}

/* mf_encode's bytes are exactly the documented layout (see the top). */
static void test_encode_layout(void **state)
{
	struct tmp *t = *state;
	struct manifest *m;
	uint8_t *buf, *want;
	size_t len, wlen;

	put_dir(t->fd, "t", 0755);
	put_dir(t->fd, "t/dir", 0755);
	put_file(t->fd, "t/dir/file", "hello", 5, 0644);
	assert_int_equal(symlinkat("dir/file", t->fd, "t/link"), 0);
	put_file(t->fd, "t/zz", "", 0, 0600);
	m = build_v1(t->fd, "t");
	assert_int_equal(mf_encode(m, &buf, &len), 0);
	want = craft(base, NBASE, &wlen);
	assert_int_equal(len, wlen);
	assert_memory_equal(buf, want, len);
	assert_memory_equal(m->hash, want + 8, 32);
	free(want);
	free(buf);
	mf_free(m);

	/* version 2: the same entries with their owners (this process's,
	 * or the set-gid directory's group) and the shard directory's */
	{
		struct stat st;
		struct cown own[NBASE];
		assert_int_equal(fstatat(t->fd, "t", &st, 0), 0);
		for (size_t i = 0; i < NBASE; i++) {
			struct stat es;
			char p[64];
			snprintf(p, sizeof(p), "t/%s", base[i].path);
			assert_int_equal(fstatat(t->fd, p, &es, AT_SYMLINK_NOFOLLOW), 0);
			own[i].uid = es.st_uid;
			own[i].gid = es.st_gid;
		}
		m = build(t->fd, "t");
		assert_int_equal(mf_encode(m, &buf, &len), 0);
		want = craft_owners(base, NBASE, st.st_mode & 07777, st.st_uid, st.st_gid, own, &wlen);
		assert_int_equal(len, wlen);
		assert_memory_equal(buf, want, len);
		assert_memory_equal(m->hash, want + 8, 32);
		free(want);
		free(buf);
		mf_free(m);
	}
}

/* The smallest entry is 1+4+8+4+2+1+2 = 22 bytes (a one-byte path, no
 * target): a manifest made only of such entries (files "0", "1" ...) must
 * decode. Regression test: the count check once assumed 23 bytes. */
static void test_decode_one_byte_names(void **state)
{
	struct tmp *t = *state;
	static const struct centry one[] = {
		{ MF_FILE, 0644, 5, CRC_HELLO, "0", 0, NULL, 0 },
	};
	static const struct centry two[] = {
		{ MF_FILE, 0644, 0, 0, "a", 0, NULL, 0 },
		{ MF_DIR, 0755, 0, 0, "b", 0, NULL, 0 },
	};
	struct manifest *m, *d = NULL;
	uint8_t *buf;
	size_t len;
	int rc;

	put_dir(t->fd, "t", 0755);
	put_file(t->fd, "t/0", "hello", 5, 0644);
	m = build_v1(t->fd, "t");
	assert_int_equal(mf_encode(m, &buf, &len), 0);
	assert_int_equal(len, HDR_LEN + 22);
	rc = mf_decode(buf, len, &d);
	if (rc != 0) {
		print_error("mf_decode of mf_encode(tree with the single file \"0\") = %d\n", rc);
		fail();
	}
	assert_same_manifest(m, d);
	mf_free(d);
	free(buf);
	mf_free(m);
	crafted_good(one, 1, "one file \"0\"");
	crafted_good(two, 2, "\"a\" and \"b\"");
}

/* ---- decoding untrusted bytes ---- */

static void test_decode_truncated(void **state)
{
	struct tmp *t = *state;
	struct manifest *m;
	uint8_t *buf, *cut;
	size_t len;

	make_sample(t->fd, "tree");
	m = build(t->fd, "tree");
	assert_int_equal(mf_encode(m, &buf, &len), 0);
	/* each prefix in its own exact-size allocation, so ASan sees overreads */
	for (size_t l = 0; l < len; l++) {
		cut = malloc(l ? l : 1);
		assert_non_null(cut);
		memcpy(cut, buf, l);
		decode_bad(cut, l, "truncated");
		free(cut);
	}
	decode_good(buf, len, "whole");
	free(buf);
	mf_free(m);

	buf = craft(NULL, 0, &len);
	assert_int_equal(len, HDR_LEN);
	for (size_t l = 0; l < len; l++)
		decode_bad(buf, l, "truncated empty manifest");
	decode_good(buf, len, "empty manifest");
	free(buf);
}

static void put_le32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static void test_decode_header(void **state)
{
	uint8_t *buf, *big;
	size_t len;
	(void)state;

	buf = craft(base, NBASE, &len);
	decode_good(buf, len, "base");

	put_le32(buf, MAGIC ^ 1);
	decode_bad(buf, len, "bad magic");
	put_le32(buf, 0x4d54434du);     /* byte-swapped */
	decode_bad(buf, len, "swapped magic");
	put_le32(buf, MAGIC);
	put_le32(buf + 4, 0);
	decode_bad(buf, len, "version 0");
	put_le32(buf + 4, 2);
	decode_bad(buf, len, "version 2");
	put_le32(buf + 4, 0x01000000u);
	decode_bad(buf, len, "version big-endian 1");
	put_le32(buf + 4, VERSION);
	decode_good(buf, len, "restored");

	/* counts the buffer cannot hold */
	put_le32(buf + 40, NBASE + 1);
	decode_bad(buf, len, "count + 1");
	put_le32(buf + 40, 1000);
	decode_bad(buf, len, "count 1000");
	put_le32(buf + 40, MF_MAX_ENTRIES);
	decode_bad(buf, len, "count MF_MAX_ENTRIES");
	put_le32(buf + 40, MF_MAX_ENTRIES + 1);
	decode_bad(buf, len, "count MF_MAX_ENTRIES + 1");
	put_le32(buf + 40, UINT32_MAX);
	decode_bad(buf, len, "count UINT32_MAX");
	put_le32(buf + 40, 0x80000000u);
	decode_bad(buf, len, "count 2^31");
	/* fewer than there are: the rest is trailing garbage */
	put_le32(buf + 40, NBASE - 1);
	decode_bad(buf, len, "count - 1");
	put_le32(buf + 40, 0);
	decode_bad(buf, len, "count 0");
	free(buf);

	/* a count at the limit over enough zero bytes: fails on the first entry */
	len = HDR_LEN + (size_t)MF_MAX_ENTRIES * 23;
	big = calloc(1, len);
	assert_non_null(big);
	put_le32(big, MAGIC);
	put_le32(big + 4, VERSION);
	put_le32(big + 40, MF_MAX_ENTRIES);
	decode_bad(big, len, "huge count over zeros");
	put_le32(big + 40, MF_MAX_ENTRIES + 1);
	decode_bad(big, len, "count over the limit");
	free(big);
}

/* The manifest is the base with entry 0 replaced by e, or with e put in
 * front (at index 0 nothing constrains the order, so only the field under
 * test can fail). */
static void with_front(const struct centry *e, struct centry *out)
{
	out[0] = *e;
	memcpy(out + 1, base, sizeof(base));
}

static void test_decode_unsafe_paths(void **state)
{
	static const struct {
		const char *path;
		size_t pl;
	} bad[] = {
		{ "../x", 0 }, { "/x", 0 }, { "a//b", 0 }, { "a/./b", 0 }, { "a/../b", 0 },
		{ "a/", 0 }, { ".", 0 }, { "..", 0 }, { "./a", 0 }, { "a/.", 0 }, { "a/..", 0 },
		{ "/", 0 }, { "a\0b", 3 }, { "a\0", 2 },
	};
	struct centry e[NBASE + 1];
	struct centry probe = { MF_DIR, 0755, 0, 0, "a/b", 0, NULL, 0 };
	char *longp;
	(void)state;

	/* "a/b" is a safe path, but its parent "a" is not an entry: nothing
	 * may be written below something the manifest does not make a directory */
	with_front(&probe, e);
	crafted_bad(e, NBASE + 1, "front \"a/b\" without \"a\"");
	{
		struct centry two[NBASE + 2] = { { MF_DIR, 0755, 0, 0, "a", 0, NULL, 0 },
						 { MF_DIR, 0755, 0, 0, "a/b", 0, NULL, 0 } };
		memcpy(two + 2, base, sizeof(base));
		crafted_good(two, NBASE + 2, "front \"a\", \"a/b\"");
		two[0].type = MF_FILE;
		crafted_bad(two, NBASE + 2, "\"a/b\" below the file \"a\"");
		two[0] = (struct centry){ MF_SYMLINK, 0777, 0, 0, "a", 0, "dir", 0 };
		crafted_bad(two, NBASE + 2, "\"a/b\" below the symlink \"a\"");
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		probe.path = bad[i].path;
		probe.pl = bad[i].pl;
		with_front(&probe, e);
		crafted_bad(e, NBASE + 1, bad[i].path);
	}

	/* empty path: an explicit zero length */
	probe.path = "";
	probe.pl = 0;
	with_front(&probe, e);
	crafted_bad(e, NBASE + 1, "empty path");

	/* component of NAME_MAX bytes, then NAME_MAX + 1 */
	longp = malloc(PATH_MAX + 1);
	assert_non_null(longp);
	memset(longp, 'a', PATH_MAX + 1);
	probe.path = longp;
	probe.pl = NAME_MAX;
	with_front(&probe, e);
	crafted_good(e, NBASE + 1, "NAME_MAX component");
	probe.pl = NAME_MAX + 1;
	with_front(&probe, e);
	crafted_bad(e, NBASE + 1, "NAME_MAX + 1 component");
	/* whole path of PATH_MAX - 1 bytes, then PATH_MAX, each with all its
	 * parent directories ahead of it (41 levels, under MF_MAX_DEPTH) */
	for (size_t i = 0; i < PATH_MAX + 1; i++)
		longp[i] = (i % 100 == 99) ? '/' : 'a';
	{
		struct centry chain[64];
		size_t nc = 0;
		for (size_t i = 99; i < PATH_MAX - 1; i += 100)
			chain[nc++] = (struct centry){ MF_DIR, 0755, 0, 0, longp, i, NULL, 0 };
		chain[nc] = (struct centry){ MF_FILE, 0644, 0, 0, longp, PATH_MAX - 1, NULL, 0 };
		crafted_good(chain, nc + 1, "PATH_MAX - 1 path");
		chain[nc].pl = PATH_MAX;
		crafted_bad(chain, nc + 1, "PATH_MAX path");
	}
	free(longp);
}

static void test_decode_order(void **state)
{
	struct centry e[NBASE + 1];
	(void)state;

	crafted_good(base, NBASE, "base");
	/* unsorted: "dir/file" before "dir" */
	memcpy(e, base, sizeof(base));
	e[0] = base[1];
	e[1] = base[0];
	crafted_bad(e, NBASE, "unsorted");
	/* unsorted at the end */
	memcpy(e, base, sizeof(base));
	e[NBASE - 2] = base[NBASE - 1];
	e[NBASE - 1] = base[NBASE - 2];
	crafted_bad(e, NBASE, "unsorted tail");
	/* duplicates */
	memcpy(e, base, sizeof(base));
	e[NBASE] = base[NBASE - 1];
	crafted_bad(e, NBASE + 1, "duplicate last");
	with_front(&base[0], e);
	crafted_bad(e, NBASE + 1, "duplicate first");
	/* bytewise: "dir.x" < "dir/file" ('.' < '/') is sorted... */
	{
		struct centry s[3] = { base[0], { MF_DIR, 0755, 0, 0, "dir.x", 0, NULL, 0 },
				       base[1] };
		crafted_good(s, 3, "dir, dir.x, dir/file");
		s[1] = base[1];
		s[2] = (struct centry){ MF_DIR, 0755, 0, 0, "dir.x", 0, NULL, 0 };
		crafted_bad(s, 3, "dir, dir/file, dir.x");
	}
	/* ...and bytes >= 0x80 sort after ASCII */
	{
		struct centry s[2] = { { MF_DIR, 0755, 0, 0, "zz", 0, NULL, 0 },
				       { MF_DIR, 0755, 0, 0, "\xc3\xa9t\xc3\xa9", 0, NULL, 0 } };
		crafted_good(s, 2, "zz, utf-8");
		s[0] = s[1];
		s[1] = (struct centry){ MF_DIR, 0755, 0, 0, "zz", 0, NULL, 0 };
		crafted_bad(s, 2, "utf-8, zz");
	}
}

static void test_decode_fields(void **state)
{
	struct centry e[NBASE];
	(void)state;

#define MUTATE(idx, field, value, good)                                   \
	do {                                                              \
		memcpy(e, base, sizeof(base));                            \
		e[idx].field = value;                                     \
		if (good)                                                 \
			crafted_good(e, NBASE, #field " = " #value);      \
		else                                                      \
			crafted_bad(e, NBASE, #field " = " #value);       \
	} while (0)

	/* type */
	MUTATE(0, type, 0, false);
	MUTATE(0, type, 5, false);
	MUTATE(3, type, MF_FIFO, true);       /* an empty file may be a FIFO */
	MUTATE(1, type, MF_FIFO, false);      /* a FIFO has no bytes */
	MUTATE(0, type, 255, false);
	MUTATE(3, type, MF_DIR, true);        /* an empty file may as well be a dir */
	/* mode: permission bits only */
	MUTATE(1, mode, 07777, true);
	MUTATE(1, mode, 0, true);
	MUTATE(1, mode, 010000, false);
	MUTATE(1, mode, 0100644, false);      /* S_IFREG | 0644 */
	MUTATE(0, mode, 040755, false);       /* S_IFDIR | 0755 */
	MUTATE(1, mode, 0x80000000u, false);
	/* size bound */
	MUTATE(1, size, MF_MAX_FILE_SIZE, true);
	MUTATE(1, size, MF_MAX_FILE_SIZE + 1, false);
	MUTATE(1, size, UINT64_MAX, false);
	/* size and crc only on files */
	MUTATE(0, size, 1, false);
	MUTATE(0, crc, 1, false);
	MUTATE(2, size, 8, false);
	MUTATE(2, crc, 1, false);
	MUTATE(3, crc, 0xffffffffu, true);
	/* symlink without target, file or dir with one */
	MUTATE(2, target, NULL, false);
	MUTATE(1, target, "x", false);
	MUTATE(0, target, "x", false);
	/* targets must stay inside the shard (mf_validate; more in test_symlink_rule) */
	MUTATE(2, target, "/absolute/elsewhere", false);
	MUTATE(2, target, "../elsewhere", false);
	MUTATE(2, target, "dir/../zz", false);
	MUTATE(2, target, "./dir//file", true);
	/* target with an embedded NUL */
	memcpy(e, base, sizeof(base));
	e[2].target = "a\0b";
	e[2].tl = 3;
	crafted_bad(e, NBASE, "target with NUL");
#undef MUTATE
}

static void test_decode_trailing_and_hash(void **state)
{
	uint8_t *buf, *longer;
	size_t len;
	(void)state;

	buf = craft(base, NBASE, &len);
	longer = malloc(len + 100);
	assert_non_null(longer);
	memcpy(longer, buf, len);
	memset(longer + len, 0, 100);
	decode_bad(longer, len + 1, "one trailing byte");
	decode_bad(longer, len + 100, "100 trailing bytes");
	free(longer);

	/* every bit of the hash matters */
	for (size_t i = 8; i < 40; i++) {
		for (int bit = 0; bit < 8; bit++) {
			buf[i] ^= (uint8_t)(1u << bit);
			decode_bad(buf, len, "flipped hash bit");
			buf[i] ^= (uint8_t)(1u << bit);
		}
	}
	decode_good(buf, len, "restored");
	free(buf);
}

/* Any change to any byte of a valid encoding is refused. */
static void test_decode_every_byte_flipped(void **state)
{
	struct tmp *t = *state;
	static const uint8_t xors[] = { 0x01, 0x02, 0x10, 0x80, 0xff };
	struct manifest *m;
	uint8_t *buf, *copy;
	size_t len;

	make_sample(t->fd, "tree");
	m = build(t->fd, "tree");
	assert_int_equal(mf_encode(m, &buf, &len), 0);
	copy = malloc(len);
	assert_non_null(copy);
	for (size_t i = 0; i < len; i++) {
		for (size_t x = 0; x < sizeof(xors); x++) {
			memcpy(copy, buf, len);
			copy[i] ^= xors[x];
			decode_bad(copy, len, "flipped byte");
		}
	}
	free(copy);
	free(buf);
	mf_free(m);
}

/* Random damage (bytes changed, cut, grown) with a fixed seed. */
static void test_decode_random_damage(void **state)
{
	struct tmp *t = *state;
	struct manifest *m;
	uint8_t *buf, *copy;
	size_t len;
	uint64_t x = 0x9e3779b97f4a7c15ULL;

	make_sample(t->fd, "tree");
	m = build(t->fd, "tree");
	assert_int_equal(mf_encode(m, &buf, &len), 0);
	for (int iter = 0; iter < 20000; iter++) {
		size_t clen = len, nchg;
		int rc;
		struct manifest *d = NULL;

		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		if ((x & 3) == 0)
			clen = (size_t)(x >> 8) % len;
		else if ((x & 3) == 1)
			clen = len + 1 + (size_t)(x >> 8) % 64;
		copy = malloc(clen ? clen : 1);
		assert_non_null(copy);
		for (size_t i = 0; i < clen; i++)
			copy[i] = i < len ? buf[i] : (uint8_t)(x >> (i % 56));
		nchg = clen ? 1 + (size_t)(x >> 20) % 4 : 0;
		for (size_t k = 0; k < nchg; k++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			copy[(size_t)(x >> 11) % clen] = (uint8_t)(x >> 3);
		}
		rc = mf_decode(copy, clen, &d);
		if (clen == len && memcmp(copy, buf, len) == 0) {
			assert_int_equal(rc, 0);
			mf_free(d);
		} else if (rc != -EBADMSG) {
			print_error("iteration %d: mf_decode = %d on damaged input\n", iter, rc);
			if (rc == 0)
				mf_free(d);
			fail();
		}
		free(copy);
	}
	free(buf);
	mf_free(m);
}

/* ---- hash hex ---- */

static void test_hash_hex(void **state)
{
	uint8_t h[32], back[32];
	char hex[65], bad[80];
	(void)state;

	for (int i = 0; i < 32; i++)
		h[i] = (uint8_t)(i * 0x11 + 0x0f);
	memset(hex, '#', sizeof(hex));
	mf_hash_hex(h, hex);
	assert_int_equal(strlen(hex), 64);
	assert_memory_equal(hex, "0f203142", 8);
	assert_string_equal(hex + 56, "ebfc0d1e");
	memset(back, 0, sizeof(back));
	assert_int_equal(mf_hash_parse(hex, back), 0);
	assert_memory_equal(back, h, 32);

	memset(h, 0xff, sizeof(h));
	mf_hash_hex(h, hex);
	assert_string_equal(hex, "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff");
	assert_int_equal(mf_hash_parse(hex, back), 0);
	assert_memory_equal(back, h, 32);
	memset(h, 0, sizeof(h));
	mf_hash_hex(h, hex);
	assert_string_equal(hex, "0000000000000000000000000000000000000000000000000000000000000000");
	assert_int_equal(mf_hash_parse(hex, back), 0);
	assert_memory_equal(back, h, 32);

	/* rejects */
	assert_int_equal(mf_hash_parse("", back), -EINVAL);
	assert_int_equal(mf_hash_parse("00", back), -EINVAL);
	snprintf(bad, sizeof(bad), "%.63s", hex);                 /* 63 digits */
	assert_int_equal(mf_hash_parse(bad, back), -EINVAL);
	snprintf(bad, sizeof(bad), "%s0", hex);                   /* 65 digits */
	assert_int_equal(mf_hash_parse(bad, back), -EINVAL);
	snprintf(bad, sizeof(bad), "%s\n", hex);
	assert_int_equal(mf_hash_parse(bad, back), -EINVAL);
	snprintf(bad, sizeof(bad), "%s", hex);
	bad[10] = 'A';                                            /* upper case */
	assert_int_equal(mf_hash_parse(bad, back), -EINVAL);
	bad[10] = 'g';
	assert_int_equal(mf_hash_parse(bad, back), -EINVAL);
	bad[10] = ' ';
	assert_int_equal(mf_hash_parse(bad, back), -EINVAL);
	bad[10] = '0';
	bad[63] = 'x';
	assert_int_equal(mf_hash_parse(bad, back), -EINVAL);
	bad[0] = '-';
	bad[63] = '0';
	assert_int_equal(mf_hash_parse(bad, back), -EINVAL);
}

/* ---- what a shard may hold (issue 13 items 3 and 7) ---- */

/* A chain of `depth` directories "d/d/..." under dirfd/top with a file at
 * the bottom, made one level at a time. */
static void make_chain(int dirfd, const char *top, int depth)
{
	int fd;

	put_dir(dirfd, top, 0755);
	fd = open_dir(dirfd, top);
	for (int i = 1; i < depth; i++) {
		int sub;
		put_dir(fd, "d", 0755);
		sub = open_dir(fd, "d");
		close(fd);
		fd = sub;
	}
	put_file(fd, "leaf", "x", 1, 0644);
	close(fd);
}

/* A 5000-level tree used to overflow the sealing thread's stack (8 KiB a
 * level); now it is refused, with the reason, and a tree of exactly
 * MF_MAX_DEPTH levels is a shard. */
static void test_build_depth_bound(void **state)
{
	struct tmp *t = *state;
	struct manifest *m = NULL;
	char err[256] = "";
	int fd;

	make_chain(t->fd, "deep", 5000);
	fd = open_dir(t->fd, "deep");
	assert_int_equal(mf_build_err(fd, &m, err, sizeof(err)), -EBADMSG);
	assert_null(m);
	assert_non_null(strstr(err, "more than 48 levels deep"));
	close(fd);
	/* the teardown's nftw cannot name paths this long */
	assert_int_equal(util_rmtree_at(t->fd, "deep", NULL), 0);
	/* entries down to depth 48 (47 directories below the root and the leaf) */
	make_chain(t->fd, "ok", MF_MAX_DEPTH);
	fd = open_dir(t->fd, "ok");
	assert_int_equal(mf_build_err(fd, &m, err, sizeof(err)), 0);
	assert_int_equal(m->n, MF_MAX_DEPTH);
	assert_int_equal(m->nfiles, 1);
	close(fd);
	mf_free(m);
	m = NULL;
	make_chain(t->fd, "over", MF_MAX_DEPTH + 1);
	fd = open_dir(t->fd, "over");
	assert_int_equal(mf_build_err(fd, &m, err, sizeof(err)), -EBADMSG);
	close(fd);
}

/* Build a one-link tree dir/sub/<link> -> target and return mf_build_err. */
static int build_with_link(int dirfd, const char *name, const char *target, char *err,
			   size_t errlen)
{
	struct manifest *m = NULL;
	int fd, sub, rc;

	put_dir(dirfd, name, 0755);
	fd = open_dir(dirfd, name);
	put_dir(fd, "sub", 0755);
	put_file(fd, "top", "t", 1, 0644);
	sub = open_dir(fd, "sub");
	put_dir(sub, "in", 0755);
	assert_int_equal(symlinkat(target, sub, "link"), 0);
	close(sub);
	err[0] = '\0';
	rc = mf_build_err(fd, &m, err, errlen);
	close(fd);
	mf_free(m);
	return rc;
}

/* One rule for symlinks, at seal time and on decode: relative, only
 * leading "..", no higher than the shard's root. */
static void test_symlink_rule(void **state)
{
	static const struct {
		const char *target;
		const char *why;   /* NULL: accepted */
	} cases[] = {
		{ "../top", NULL },          /* sub/link -> top */
		{ "in", NULL },
		{ "./in/", NULL },
		{ "..", NULL },              /* the shard's root */
		{ "../sub/in", NULL },
		{ "dangling", NULL },        /* inside, even if nothing is there */
		{ "/etc/passwd", "absolute" },
		{ "../../x", "leaves the shard" },
		{ "../..", "leaves the shard" },
		{ "in/../../..", "after a name" },
		{ "in/..", "after a name" },   /* kernel resolves "in" first */
	};
	struct tmp *t = *state;
	char err[512], name[32];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int rc;
		snprintf(name, sizeof(name), "t%zu", i);
		rc = build_with_link(t->fd, name, cases[i].target, err, sizeof(err));
		if (cases[i].why ? (rc != -EBADMSG || !strstr(err, cases[i].why) ||
				    !strstr(err, "symlink sub/link -> "))
				 : rc != 0) {
			print_error("target \"%s\": rc %d err \"%s\", want %s\n", cases[i].target,
				    rc, err, cases[i].why ? cases[i].why : "accepted");
			fail();
		}
	}
}

/* mf_decode applies the same rule as mf_build: what a peer or the bucket
 * hands over is refused exactly when this node would refuse to seal it. */
static void test_decode_same_rule(void **state)
{
	struct mf_entry ent[3] = {
		{ .path = "a", .type = MF_DIR, .mode = 0755 },
		{ .path = "a/l", .target = "../../etc", .type = MF_SYMLINK, .mode = 0777 },
		{ .path = "b", .target = "a/l", .type = MF_SYMLINK, .mode = 0777 },
	};
	struct manifest m = { .e = ent, .n = 3 }, *got = NULL;
	char err[256] = "";
	uint8_t *enc = NULL;
	size_t len = 0;
	unsigned int hl = 0;
	(void)state;

	assert_int_equal(mf_validate(&m, err, sizeof(err)), -EBADMSG);
	assert_non_null(strstr(err, "leaves the shard"));
	assert_int_equal(mf_encode(&m, &enc, &len), 0);
	assert_int_equal(EVP_Digest(enc + 40, len - 40, enc + 8, &hl, EVP_sha256(), NULL), 1);
	assert_int_equal(mf_decode_err(enc, len, &got, err, sizeof(err)), -EBADMSG);
	assert_null(got);
	assert_non_null(strstr(err, "symlink a/l -> ../../etc: the target leaves the shard"));
	free(enc);
	ent[1].target = "..";
	assert_int_equal(mf_validate(&m, err, sizeof(err)), 0);
	assert_int_equal(mf_validate(&m, NULL, 0), 0);
}

/* ---- owners (version 2) ---- */

/* A version-1 manifest (an mtcfs before owners, the catalogs and buckets
 * it left) decodes, has no owners and encodes back byte for byte: its hash,
 * which names its backup's data and decides de-duplication, stays. */
static void test_owners_v1_still_read(void **state)
{
	struct manifest *m = NULL;
	uint8_t *buf, *again;
	size_t len, alen;

	(void)state;
	buf = craft(base, NBASE, &len);
	assert_int_equal(mf_decode(buf, len, &m), 0);
	assert_false(m->owners);
	assert_int_equal(m->root_mode, 0);
	assert_int_equal(m->root_uid, 0);
	for (size_t i = 0; i < m->n; i++) {
		assert_int_equal(m->e[i].uid, 0);
		assert_int_equal(m->e[i].gid, 0);
	}
	assert_int_equal(mf_encode(m, &again, &alen), 0);
	assert_int_equal(alen, len);
	assert_memory_equal(again, buf, len);
	free(again);
	free(buf);
	mf_free(m);
}

/* Owners decode as written and are covered by the hash; a version-2
 * header with a root mode beyond 07777, or entries too short to hold
 * owners, is refused. */
static void test_owners_decode(void **state)
{
	struct cown own[NBASE], other[NBASE];
	struct manifest *a = NULL, *b = NULL;
	uint8_t *ba, *bb;
	size_t la, lb;

	(void)state;
	for (size_t i = 0; i < NBASE; i++) {
		own[i] = (struct cown){ 1000, 2000 };
		other[i] = own[i];
	}
	other[1].gid = 1000;   /* dir/file's group only */
	ba = craft_owners(base, NBASE, 02775, 1000, 2000, own, &la);
	bb = craft_owners(base, NBASE, 02775, 1000, 2000, other, &lb);
	assert_int_equal(mf_decode(ba, la, &a), 0);
	assert_int_equal(mf_decode(bb, lb, &b), 0);
	assert_true(a->owners);
	assert_int_equal(a->root_mode, 02775);
	assert_int_equal(a->root_uid, 1000);
	assert_int_equal(a->root_gid, 2000);
	assert_int_equal(a->e[1].uid, 1000);
	assert_int_equal(a->e[1].gid, 2000);
	assert_int_equal(b->e[1].gid, 1000);
	assert_memory_not_equal(a->hash, b->hash, 32);
	mf_free(a);
	mf_free(b);
	free(bb);
	/* the root uid is covered too */
	bb = craft_owners(base, NBASE, 02775, 1001, 2000, own, &lb);
	assert_int_equal(mf_decode(bb, lb, &b), 0);
	assert_memory_not_equal(ba + 8, bb + 8, 32);
	mf_free(b);
	free(bb);
	free(ba);
	ba = craft_owners(base, NBASE, 010000, 1000, 2000, own, &la);
	decode_bad(ba, la, "version 2, root mode 010000");
	free(ba);
	/* version-1 entries under a version-2 header */
	ba = craft(base, NBASE, &la);
	ba[4] = VERSION_OWNERS;
	decode_bad(ba, la, "version 2 header, version 1 body");
	free(ba);
	ba = craft(base, NBASE, &la);
	ba[4] = 3;
	decode_bad(ba, la, "version 3");
	free(ba);
}

static void assert_owned(int dirfd, const char *path, uid_t u, gid_t g, mode_t mode)
{
	struct stat st;

	assert_int_equal(fstatat(dirfd, path, &st, path[0] ? AT_SYMLINK_NOFOLLOW : AT_EMPTY_PATH), 0);
	if (st.st_uid != u || st.st_gid != g || (!S_ISLNK(st.st_mode) && (st.st_mode & 07777) != mode)) {
		print_error("%s: %u:%u %04o, want %u:%u %04o\n", path, (unsigned)st.st_uid,
			    (unsigned)st.st_gid, (unsigned)(st.st_mode & 07777), (unsigned)u,
			    (unsigned)g, (unsigned)mode);
		fail();
	}
}

/* The tree a peer or the bucket hands over, made by the daemon (root,
 * its own modes), gets the writer's owners and modes from the manifest,
 * set-id bits dropped; without owners in the manifest, the given ones. */
static void test_apply_owners(void **state)
{
	struct tmp *t = *state;
	struct manifest *m;
	int fd;

	if (geteuid() != 0) {
		print_message("skipped: needs root (chown)\n");
		skip();
	}
	/* as the trainer wrote it: uid 1000, fsGroup 2000 */
	put_dir(t->fd, "w", 0750);
	put_dir(t->fd, "w/d", 02770);
	put_file(t->fd, "w/d/secret", "hello", 5, 0600);
	put_file(t->fd, "w/suid", "x", 1, 04755);
	assert_int_equal(symlinkat("d/secret", t->fd, "w/ln"), 0);
	assert_int_equal(fchownat(t->fd, "w/ln", 1000, 2000, AT_SYMLINK_NOFOLLOW), 0);
	assert_int_equal(fchownat(t->fd, "w/d/secret", 1000, 2000, 0), 0);
	assert_int_equal(fchownat(t->fd, "w/suid", 1000, 1000, 0), 0);
	assert_int_equal(fchmodat(t->fd, "w/suid", 04755, 0), 0);
	assert_int_equal(fchownat(t->fd, "w/d", 1000, 2000, 0), 0);
	assert_int_equal(fchmodat(t->fd, "w/d", 02770, 0), 0);
	assert_int_equal(fchownat(t->fd, "w", 1000, 2000, 0), 0);
	m = build(t->fd, "w");
	assert_int_equal(m->root_uid, 1000);
	assert_int_equal(m->root_gid, 2000);
	assert_int_equal(m->root_mode, 0750);

	/* as the daemon received it */
	put_dir(t->fd, "r", 0755);
	put_dir(t->fd, "r/d", 0700);
	put_file(t->fd, "r/d/secret", "hello", 5, 0644);
	put_file(t->fd, "r/suid", "x", 1, 0600);
	assert_int_equal(symlinkat("d/secret", t->fd, "r/ln"), 0);
	fd = open_dir(t->fd, "r");
	assert_int_equal(mf_apply_owners(fd, m, &(struct mf_owner){ 7, 7, 077 }, 0, NULL, 0), 0);
	assert_owned(fd, "", 1000, 2000, 0750);
	assert_owned(fd, "d", 1000, 2000, 0770);
	assert_owned(fd, "d/secret", 1000, 2000, 0600);
	assert_owned(fd, "suid", 1000, 1000, 0755);
	assert_owned(fd, "ln", 1000, 2000, 0);
	close(fd);
	mf_free(m);

	/* no owners recorded (GKE's layout, an older mtcfs): the given ones,
	 * the recorded modes less the given umask (the directory's own too) */
	m = build_v1(t->fd, "w");
	put_dir(t->fd, "g", 0755);
	put_dir(t->fd, "g/d", 0700);
	put_file(t->fd, "g/d/secret", "hello", 5, 0644);
	put_file(t->fd, "g/suid", "x", 1, 0600);
	assert_int_equal(symlinkat("d/secret", t->fd, "g/ln"), 0);
	fd = open_dir(t->fd, "g");
	assert_int_equal(mf_apply_owners(fd, m, &(struct mf_owner){ 1234, 5678, 027 }, 0, NULL, 0), 0);
	assert_owned(fd, "", 1234, 5678, 0750);
	assert_owned(fd, "d", 1234, 5678, 0750);
	assert_owned(fd, "d/secret", 1234, 5678, 0600);
	assert_owned(fd, "suid", 1234, 5678, 0750);
	assert_owned(fd, "ln", 1234, 5678, 0);
	close(fd);
	mf_free(m);
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, tmp_setup, tmp_teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_crc32c_check_values),
		cmocka_unit_test(test_crc32c_incremental_large),
		T(test_crc32c_fd_small),
		T(test_crc32c_fd_crosses_window),
		T(test_build_tree),
		T(test_build_empty),
		T(test_build_hash),
		T(test_verify_detects),
		T(test_verify_small_err_buffer),
		T(test_verify_symlink_target),
		T(test_build_depth_bound),
		T(test_symlink_rule),
		cmocka_unit_test(test_decode_same_rule),
		T(test_encode_decode_roundtrip),
		T(test_encode_layout),
		T(test_decode_one_byte_names),
		T(test_decode_truncated),
		cmocka_unit_test(test_decode_header),
		cmocka_unit_test(test_decode_unsafe_paths),
		cmocka_unit_test(test_decode_order),
		cmocka_unit_test(test_decode_fields),
		cmocka_unit_test(test_decode_trailing_and_hash),
		T(test_decode_every_byte_flipped),
		T(test_decode_random_damage),
		cmocka_unit_test(test_hash_hex),
		cmocka_unit_test(test_owners_v1_still_read),
		cmocka_unit_test(test_owners_decode),
		T(test_apply_owners),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
