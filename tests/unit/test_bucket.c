/* Unit tests for tiers/bucket (+ bucket_file, bucket_gcs, gcs_auth): what is
 * particular to one backend. The contract every backend keeps (round trips,
 * write-once also under concurrent writers, -ENOENT, listing order and "/",
 * CRC checks on read, refused names, parallel transfers) is
 * test_bucket_conformance.c, run once per backend.
 * file://: refused puts leave no temporaries, empty directories and
 * temporaries are not listed, deleted objects take emptied directories with
 * them, objects on disk keep holes; URL checks.
 * gs://: against tests/gcs_server/gcs_server.py started here, each request
 * the client sends is asserted from the server's log: multipart, media and
 * resumable uploads; a reset in the middle of a chunk resumed from the
 * persisted offset after a "bytes * / N" query; 503/429 retried; 412 ->
 * -EEXIST, and a retried create meeting 412 resolved by size+CRC; corrupted
 * and truncated downloads; ranged parallel downloads pinned to a generation;
 * paged listings; emulator (no auth), key-file JWT (one token, reused,
 * refreshed; the server checks the RS256 signature), metadata server,
 * 401/403 words. Retries run with MTCFS_GCS_RETRY=1,20,5 (milliseconds). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include "common/util.h"
#include "tests/unit/bucket_fixture.h"
#include "tests/unit/bucket_listing.h"
#include "tiers/bucket.h"
#include "tiers/gcs_auth.h"
#include "tiers/manifest.h"

/* ---- helpers ---- */

static uint8_t *read_all(int dirfd, const char *name, size_t *len)
{
	char *buf = NULL;
	assert_int_equal(util_read_file_at(dirfd, name, 64 * MIB, &buf, len), 0);
	return (uint8_t *)buf;
}

static int group_setup(void **state)
{
	(void)state;
	if (tmproot_make("bucket") < 0)
		return -1;
	tmpfd = open(tmproot, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	gs_client_env();
	return tmpfd < 0 ? -1 : 0;
}

static int group_teardown(void **state)
{
	(void)state;
	gs_srv_stop();
	close(tmpfd);
	return tmproot_remove();
}

static struct bkt *open_file_bkt(const char *sub)
{
	char url[PATH_MAX + 16];
	struct bkt *b = NULL;

	snprintf(url, sizeof(url), "file://%s/%s", tmproot, sub);
	assert_int_equal(bkt_open(url, NULL, &b), 0);
	return b;
}

/* ---- pure functions ---- */

static void test_crc_combine(void **state)
{
	uint8_t buf[10000];

	(void)state;
	fill(buf, sizeof(buf), 7);
	for (size_t cut = 0; cut <= sizeof(buf); cut += 1237) {
		uint32_t a = mf_crc32c(0, buf, cut), b = mf_crc32c(0, buf + cut, sizeof(buf) - cut);
		assert_int_equal(bkt_crc32c_combine(a, b, sizeof(buf) - cut), mf_crc32c(0, buf, sizeof(buf)));
	}
	assert_int_equal(bkt_crc32c_combine(0, 0, 0), 0);
}

/* Object names and listing prefixes refused: test_bucket_conformance.c, for every backend. */
static void test_bad_urls(void **state)
{
	struct bkt *b = NULL;
	static const char *const bad_urls[] = {
		"s3://x", "gs://", "gs://A_Bad!", "gs://ab", "file://relative/path", "/abs/no/scheme",
		"gs://bucket/../x",
	};

	(void)state;
	for (size_t i = 0; i < sizeof(bad_urls) / sizeof(bad_urls[0]); i++) {
		assert_int_equal(bkt_open(bad_urls[i], NULL, &b), -EINVAL);
		assert_null(b);
		assert_true(bkt_last_error()[0] != '\0');
	}
	bkt_close(NULL);
}

/* ---- file:// ---- */

static int count_tmp(const char *dir)
{
	char cmd[PATH_MAX + 64];
	FILE *p;
	int n = 0;
	char line[PATH_MAX];

	snprintf(cmd, sizeof(cmd), "find '%s' -name '.bkt-tmp-*'", dir);
	p = popen(cmd, "r");
	while (p && fgets(line, sizeof(line), p))
		n++;
	if (p)
		pclose(p);
	return n;
}

static void test_file_write_once(void **state)
{
	struct bkt *b = open_file_bkt("wo");
	char dir[PATH_MAX + 8];
	void *buf = NULL;
	size_t len;
	int fd;
	uint32_t crc;

	(void)state;
	assert_int_equal(bkt_put_buf(b, "x/obj", "first", 5), 0);
	assert_int_equal(bkt_put_buf(b, "x/obj", "second", 6), -EEXIST);
	assert_contains(bkt_last_error(), "already exists");
	/* "x" is a directory here; "x/obj/y" would need "x/obj" to be one */
	assert_int_equal(bkt_put_buf(b, "x", "third", 5), -EISDIR);
	assert_int_equal(bkt_put_buf(b, "x/obj/y", "fourth", 6), -ENOTDIR);
	assert_int_equal(bkt_get_buf(b, "x/obj", 100, &buf, &len), 0);
	assert_memory_equal(buf, "first", 5);
	free(buf);
	/* data that does not match the CRC given: refused, nothing published */
	fd = make_file("wo.src", 1000, 3, &crc);
	assert_int_equal(bkt_put_file(b, "x/bad", fd, 1000, crc ^ 1), -EBADMSG);
	assert_int_equal(bkt_stat(b, "x/bad", NULL, NULL), -ENOENT);
	/* a file shorter than the size claimed */
	assert_int_equal(bkt_put_file(b, "x/short", fd, 2000, crc), -EIO);
	assert_int_equal(bkt_stat(b, "x/short", NULL, NULL), -ENOENT);
	close(fd);
	snprintf(dir, sizeof(dir), "%s/wo", tmproot);
	assert_int_equal(count_tmp(dir), 0);
	bkt_close(b);
}

static void test_file_list(void **state)
{
	struct bkt *b = open_file_bkt("list");
	char path[PATH_MAX + 32];

	(void)state;
	populate_listing(b);
	/* an empty directory is no object and no prefix; a temporary is hidden */
	snprintf(path, sizeof(path), "%s/list/emptydir", tmproot);
	assert_int_equal(mkdir(path, 0755), 0);
	snprintf(path, sizeof(path), "%s/list/a/.bkt-tmp-99", tmproot);
	close(open(path, O_CREAT | O_WRONLY, 0644));
	check_listings(b);
	bkt_close(b);
}

static void test_file_corrupt_missing_delete(void **state)
{
	struct bkt *b = open_file_bkt("bad");
	char path[PATH_MAX + 32];
	uint32_t crc;
	uint64_t size;
	int fd, out;

	(void)state;
	fd = make_file("bad.src", 100 * KIB, 9, &crc);
	assert_int_equal(bkt_put_file(b, "s/f.bin", fd, 100 * KIB, crc), 0);
	close(fd);
	out = new_fd("bad.dst");
	assert_int_equal(bkt_get_file(b, "s/f.bin", out, &size, true, crc), 0);
	assert_int_equal(bkt_get_file(b, "s/f.bin", out, &size, true, crc + 1), -EBADMSG);
	assert_contains(bkt_last_error(), "s/f.bin");
	/* damage on disk */
	snprintf(path, sizeof(path), "%s/bad/s/f.bin", tmproot);
	fd = open(path, O_WRONLY);
	assert_int_equal(pwrite(fd, "X", 1, 5000), 1);
	close(fd);
	assert_int_equal(bkt_get_file(b, "s/f.bin", out, &size, true, crc), -EBADMSG);
	assert_contains(bkt_last_error(), "crc32c");
	/* missing */
	assert_int_equal(bkt_get_file(b, "s/none", out, &size, false, 0), -ENOENT);
	assert_true(bkt_last_error()[0]);
	assert_int_equal(bkt_stat(b, "s/none", &size, NULL), -ENOENT);
	assert_int_equal(bkt_stat(b, "s", &size, NULL), -ENOENT);     /* a "directory" */
	assert_int_equal(bkt_delete(b, "s/none"), -ENOENT);
	close(out);
	/* delete: gone, emptied directories too */
	assert_int_equal(bkt_delete(b, "s/f.bin"), 0);
	assert_int_equal(bkt_stat(b, "s/f.bin", NULL, NULL), -ENOENT);
	snprintf(path, sizeof(path), "%s/bad/s", tmproot);
	assert_int_equal(access(path, F_OK), -1);
	assert_int_equal(bkt_put_buf(b, "s/f.bin", "again", 5), 0);     /* recreated */
	bkt_close(b);
}

static void xfer_roundtrip(struct bkt *b, const char *tag, int nfiles)
{
	char src[64], dst[64], path[64], name[128];
	struct bkt_xfer *x = calloc((size_t)nfiles, sizeof(*x));
	char (*names)[128] = calloc((size_t)nfiles, sizeof(*names));
	char (*paths)[64] = calloc((size_t)nfiles, sizeof(*paths));
	int sfd, dfd;

	snprintf(src, sizeof(src), "%s.src", tag);
	snprintf(dst, sizeof(dst), "%s.dst", tag);
	assert_int_equal(mkdirat(tmpfd, src, 0755), 0);
	assert_int_equal(mkdirat(tmpfd, dst, 0755), 0);
	sfd = openat(tmpfd, src, O_RDONLY | O_DIRECTORY);
	dfd = openat(tmpfd, dst, O_RDONLY | O_DIRECTORY);
	assert_int_equal(mkdirat(sfd, "sub", 0755), 0);
	for (int i = 0; i < nfiles; i++) {
		size_t len = (size_t)(i * 7919) % (300 * KIB);
		uint8_t *buf = malloc(len + 1);
		int fd;

		fill(buf, len, (uint32_t)i);
		snprintf(path, sizeof(path), "%sf%03d", i % 3 ? "sub/" : "", i);
		fd = openat(sfd, path, O_WRONLY | O_CREAT, 0644);
		assert_int_equal(write(fd, buf, len), (ssize_t)len);
		close(fd);
		snprintf(paths[i], sizeof(paths[i]), "%s", path);
		snprintf(names[i], sizeof(names[i]), "%s/%s", tag, path);
		x[i] = (struct bkt_xfer){ .name = names[i], .fd = -1, .dirfd = sfd, .path = paths[i],
					  .size = len, .crc32c = mf_crc32c(0, buf, len) };
		free(buf);
	}
	assert_int_equal(bkt_put_files(b, x, (size_t)nfiles), 0);
	for (int i = 0; i < nfiles; i++) {
		assert_int_equal(x[i].rc, 0);
		x[i].dirfd = dfd;
		x[i].has_crc = true;
		x[i].mode = 0640;
		x[i].size = 0;
	}
	assert_int_equal(bkt_get_files(b, x, (size_t)nfiles), 0);
	for (int i = 0; i < nfiles; i++) {
		size_t la, lb;
		uint8_t *a = read_all(sfd, paths[i], &la), *c = read_all(dfd, paths[i], &lb);
		struct stat st;
		assert_int_equal(la, lb);
		assert_int_equal(x[i].size, la);
		assert_memory_equal(a, c, la);
		assert_int_equal(fstatat(dfd, paths[i], &st, 0), 0);
		assert_int_equal(st.st_mode & 0777, 0640);
		free(a);
		free(c);
	}
	/* a second put of the same names: every one -EEXIST, the first reported */
	assert_int_equal(bkt_put_files(b, x, (size_t)nfiles), -EEXIST);
	for (int i = 0; i < nfiles; i++)
		assert_int_equal(x[i].rc, -EEXIST);
	snprintf(name, sizeof(name), "%s", names[0]);
	assert_contains(bkt_last_error(), name);
	close(sfd);
	close(dfd);
	free(x);
	free(names);
	free(paths);
}

/* ---- gs:// ---- */

/* ---- sparse files: zeros stay holes in restores and file:// objects ---- */

static void test_file_sparse(void **state)
{
	struct bkt *b = open_file_bkt("sparse");
	const uint64_t size = 256ull * MIB;
	char objpath[PATH_MAX];
	uint64_t got = 0;
	uint32_t crc;
	int fd, out;

	(void)state;
	fd = make_sparse("sp.src", size, &crc);
	assert_int_equal(bkt_put_file(b, "s/sparse.bin", fd, size, crc), 0);
	close(fd);
	/* the object keeps the holes: 3 runs touch at most 5 blocks */
	snprintf(objpath, sizeof(objpath), "sparse/s/sparse.bin");
	assert_true(allocated(tmpfd, objpath) <= 64 * KIB);
	out = new_fd("sp.dst");
	/* stale data where the object has a hole must not survive */
	assert_int_equal(pwrite(out, "stale", 5, 30 * MIB), 5);
	assert_int_equal(bkt_get_file(b, "s/sparse.bin", out, &got, true, crc), 0);
	close(out);
	assert_int_equal(got, size);
	assert_true(allocated(tmpfd, "sp.dst") <= 64 * KIB);
	assert_same_file("sp.src", "sp.dst", size);
	/* a wrong CRC is still caught: the check covers the logical bytes */
	out = new_fd("sp.dst2");
	assert_int_equal(bkt_get_file(b, "s/sparse.bin", out, &got, true, crc ^ 1), -EBADMSG);
	close(out);
	bkt_close(b);
}

static struct bkt *gb;           /* opened by gs_setup */
static struct bkt_opts gopts;

static int gs_group_setup(void **state)
{
	if (group_setup(state) < 0)
		return -1;
	return gs_srv_start();
}

static int gs_setup(void **state)
{
	(void)state;
	if (!tsrv_reset(&srv, true))
		return -1;
	gopts = (struct bkt_opts){ .parallelism = 4, .simple_max = 256 * KIB,
				   .chunk = 256 * KIB, .part = 256 * KIB, .list_page = 1000 };
	return bkt_open("gs://bkt/pfx", &gopts, &gb) == 0 ? 0 : -1;
}

static int gs_teardown(void **state)
{
	(void)state;
	bkt_close(gb);
	gb = NULL;
	return 0;
}

static json_t *only(json_t *arr, size_t want)
{
	if (json_array_size(arr) != want) {
		char *s = json_dumps(arr, JSON_INDENT(1));
		print_error("want %zu log entries, got: %s\n", want, s);
		free(s);
		fail();
	}
	return arr;
}

static void crc_b64(uint32_t crc, char out[16])
{
	unsigned char be[4] = { crc >> 24, crc >> 16, crc >> 8, crc };
	EVP_EncodeBlock((unsigned char *)out, be, 4);
}

static void test_gs_multipart(void **state)
{
	json_t *log, *e, *meta;
	char b64[16];
	void *buf = NULL;
	size_t len;

	(void)state;
	assert_int_equal(bkt_put_buf(gb, "x/meta", "hello", 5), 0);
	log = only(tsrv_log_class(&srv, "upload"), 1);
	e = json_array_get(log, 0);
	assert_string_equal(json_string_value(json_object_get(e, "method")), "POST");
	assert_string_equal(json_string_value(json_object_get(e, "path")), "/upload/storage/v1/b/bkt/o");
	assert_string_equal(tsrv_q(e, "uploadType"), "multipart");
	assert_string_equal(tsrv_q(e, "ifGenerationMatch"), "0");
	assert_null(tsrv_q(e, "name"));
	assert_contains(tsrv_h(e, "content-type"), "multipart/related; boundary=");
	assert_null(tsrv_h(e, "authorization"));              /* emulator: no credentials */
	meta = json_object_get(e, "metadata");
	assert_string_equal(json_string_value(json_object_get(meta, "name")), "pfx/x/meta");
	crc_b64(mf_crc32c(0, "hello", 5), b64);
	assert_string_equal(json_string_value(json_object_get(meta, "crc32c")), b64);
	assert_int_equal(json_integer_value(json_object_get(e, "body_len")), 5);
	assert_int_equal(tsrv_status(e), 200);
	json_decref(log);

	assert_true(tsrv_reset(&srv, false));
	assert_int_equal(bkt_get_buf(gb, "x/meta", 100, &buf, &len), 0);
	assert_int_equal(len, 5);
	assert_memory_equal(buf, "hello", 5);
	free(buf);
	log = only(tsrv_log(&srv), 1);
	e = json_array_get(log, 0);
	assert_string_equal(json_string_value(json_object_get(e, "path")),
			    "/storage/v1/b/bkt/o/pfx%2Fx%2Fmeta");
	assert_string_equal(tsrv_q(e, "alt"), "media");
	assert_null(tsrv_h(e, "range"));
	json_decref(log);
	assert_int_equal(bkt_get_buf(gb, "x/meta", 4, &buf, &len), -EFBIG);
}

static void test_gs_media(void **state)
{
	uint32_t crc, scrc;
	uint64_t size;
	char b64[16], hdr[32];
	json_t *log, *e;
	int fd = make_file("media.src", 100 * KIB, 11, &crc);

	(void)state;
	assert_int_equal(bkt_put_file(gb, "dir/f.bin", fd, 100 * KIB, crc), 0);
	close(fd);
	log = only(tsrv_log_class(&srv, "upload"), 1);
	e = json_array_get(log, 0);
	assert_string_equal(tsrv_q(e, "uploadType"), "media");
	assert_string_equal(tsrv_q(e, "name"), "pfx/dir/f.bin");
	assert_string_equal(tsrv_q(e, "ifGenerationMatch"), "0");
	crc_b64(crc, b64);
	snprintf(hdr, sizeof(hdr), "crc32c=%s", b64);
	assert_string_equal(tsrv_h(e, "x-goog-hash"), hdr);
	assert_string_equal(tsrv_h(e, "content-length"), "102400");
	assert_string_equal(tsrv_h(e, "content-type"), "application/octet-stream");
	assert_null(tsrv_h(e, "expect"));
	json_decref(log);
	assert_int_equal(bkt_stat(gb, "dir/f.bin", &size, &scrc), 0);
	assert_int_equal(size, 100 * KIB);
	assert_int_equal(scrc, crc);
	/* the server refuses data whose CRC32C is not the one sent */
	fd = make_file("media2.src", 1000, 12, &crc);
	assert_int_equal(bkt_put_file(gb, "dir/bad.bin", fd, 1000, crc ^ 0x10), -EBADMSG);
	assert_contains(bkt_last_error(), "CRC32C");
	close(fd);
	assert_int_equal(bkt_stat(gb, "dir/bad.bin", NULL, NULL), -ENOENT);
}

/* A gs:// restore of a sparse object leaves holes for zeros (ranged parts,
 * curl's unaligned pieces) and still checks the CRC32C of the logical bytes. */
static void test_gs_sparse_download(void **state)
{
	const uint64_t size = 32ull * MIB;
	uint64_t got = 0;
	uint32_t crc;
	int fd, out;

	(void)state;
	fd = make_sparse("gsp.src", size, &crc);
	assert_int_equal(bkt_put_file(gb, "sp/obj", fd, size, crc), 0);
	close(fd);
	out = new_fd("gsp.dst");
	assert_int_equal(pwrite(out, "stale", 5, 30 * MIB), 5);
	assert_int_equal(bkt_get_file(gb, "sp/obj", out, &got, true, crc), 0);
	close(out);
	assert_int_equal(got, size);
	assert_true(allocated(tmpfd, "gsp.dst") <= 64 * KIB);
	assert_same_file("gsp.src", "gsp.dst", size);
}

static void check_download(const char *obj, const char *src, uint32_t crc)
{
	size_t la, lb;
	uint64_t size = 0;
	uint8_t *a, *c;
	int out = new_fd("dl.dst");

	assert_int_equal(bkt_get_file(gb, obj, out, &size, true, crc), 0);
	close(out);
	a = read_all(tmpfd, src, &la);
	c = read_all(tmpfd, "dl.dst", &lb);
	assert_int_equal(la, lb);
	assert_int_equal(size, la);
	assert_memory_equal(a, c, la);
	free(a);
	free(c);
}

static void test_gs_resumable(void **state)
{
	const uint64_t n = MIB + 123;
	uint32_t crc;
	char range[96], b64[16], hdr[32];
	json_t *log, *e;
	int fd = make_file("res.src", n, 21, &crc);

	(void)state;
	assert_int_equal(bkt_put_file(gb, "big", fd, n, crc), 0);
	close(fd);
	log = only(tsrv_log_class(&srv, "upload"), 6);     /* start + 5 chunks of 256 KiB */
	e = json_array_get(log, 0);
	assert_string_equal(json_string_value(json_object_get(e, "method")), "POST");
	assert_string_equal(tsrv_q(e, "uploadType"), "resumable");
	assert_string_equal(tsrv_q(e, "name"), "pfx/big");
	assert_string_equal(tsrv_q(e, "ifGenerationMatch"), "0");
	assert_string_equal(tsrv_h(e, "x-upload-content-length"), "1048699");
	crc_b64(crc, b64);
	assert_string_equal(json_string_value(json_object_get(json_object_get(e, "metadata"), "crc32c")),
			    b64);
	for (size_t i = 1; i < 6; i++) {
		uint64_t s = (i - 1) * 256 * KIB, end = i == 5 ? n - 1 : s + 256 * KIB - 1;
		e = json_array_get(log, i);
		assert_string_equal(json_string_value(json_object_get(e, "method")), "PUT");
		snprintf(range, sizeof(range), "bytes %llu-%llu/%llu", (unsigned long long)s,
			 (unsigned long long)end, (unsigned long long)n);
		assert_string_equal(tsrv_h(e, "content-range"), range);
		assert_int_equal(tsrv_status(e), i == 5 ? 200 : 308);
		if (i == 5) {
			snprintf(hdr, sizeof(hdr), "crc32c=%s", b64);
			assert_string_equal(tsrv_h(e, "x-goog-hash"), hdr);
		} else {
			assert_null(tsrv_h(e, "x-goog-hash"));
		}
	}
	json_decref(log);
	check_download("big", "res.src", crc);
}

static void test_gs_resume_after_reset(void **state)
{
	const uint64_t n = 3 * MIB + 5;
	uint32_t crc;
	json_t *log, *e;
	struct bkt *b = NULL;
	struct bkt_opts o = gopts;
	int fd = make_file("rst.src", n, 22, &crc);

	(void)state;
	o.chunk = MIB;
	assert_int_equal(bkt_open("gs://bkt/pfx", &o, &b), 0);
	/* the first chunk is cut after 300000 bytes, which the server keeps */
	assert_true(tsrv_fault(&srv, "{\"match\": \"upload\", \"method\": \"PUT\", \"kind\": \"reset\", "
				     "\"after_bytes\": 300000, \"count\": 1}"));
	assert_int_equal(bkt_put_file(b, "resumed", fd, n, crc), 0);
	close(fd);
	bkt_close(b);
	log = tsrv_log_class(&srv, "upload");
	assert_true(json_array_size(log) >= 4);
	e = json_array_get(log, 1);
	assert_string_equal(tsrv_h(e, "content-range"), "bytes 0-1048575/3145733");
	assert_string_equal(tsrv_status_str(e), "reset");
	e = json_array_get(log, 2);                        /* where are we? */
	assert_string_equal(tsrv_h(e, "content-range"), "bytes */3145733");
	assert_string_equal(tsrv_h(e, "content-length"), "0");
	assert_int_equal(tsrv_status(e), 308);
	e = json_array_get(log, 3);                        /* on from the persisted offset */
	assert_string_equal(tsrv_h(e, "content-range"), "bytes 300000-1348575/3145733");
	assert_int_equal(tsrv_status(e), 308);
	e = json_array_get(log, json_array_size(log) - 1);
	assert_int_equal(tsrv_status(e), 200);
	json_decref(log);
	check_download("resumed", "rst.src", crc);
}

static void test_gs_retries(void **state)
{
	json_t *log;
	void *buf = NULL;
	size_t len;

	(void)state;
	assert_true(tsrv_fault(&srv, "{\"match\": \"upload\", \"kind\": \"503\", \"count\": 2}"));
	assert_int_equal(bkt_put_buf(gb, "r/obj", "data", 4), 0);
	log = only(tsrv_log_class(&srv, "upload"), 3);
	assert_int_equal(tsrv_status(json_array_get(log, 0)), 503);
	assert_int_equal(tsrv_status(json_array_get(log, 1)), 503);
	assert_int_equal(tsrv_status(json_array_get(log, 2)), 200);
	json_decref(log);
	assert_true(tsrv_reset(&srv, false));
	assert_true(tsrv_fault(&srv, "{\"match\": \"download\", \"kind\": \"429\", \"count\": 1}"));
	assert_int_equal(bkt_get_buf(gb, "r/obj", 10, &buf, &len), 0);
	assert_memory_equal(buf, "data", 4);
	free(buf);
	log = only(tsrv_log_class(&srv, "download"), 2);
	assert_int_equal(tsrv_status(json_array_get(log, 0)), 429);
	json_decref(log);
	/* connection resets and 408 on a listing */
	assert_true(tsrv_fault(&srv, "[{\"match\": \"list\", \"kind\": \"reset\", \"count\": 1},"
				     " {\"match\": \"list\", \"kind\": \"408\", \"count\": 1}]"));
	assert_int_equal(bkt_list(gb, "", NULL, collect, &(struct seen){ 0 }), 0);
	/* beyond the attempts (5): the error, with its words */
	assert_true(tsrv_fault(&srv, "{\"match\": \"meta\", \"kind\": \"500\", \"count\": 5}"));
	assert_int_equal(bkt_stat(gb, "r/obj", NULL, NULL), -EIO);
	assert_contains(bkt_last_error(), "gave up after 5 attempts");
	assert_contains(bkt_last_error(), "gs://bkt/pfx/r/obj");
	/* 4xx are not retried */
	assert_true(tsrv_reset(&srv, false));
	assert_int_equal(bkt_stat(gb, "r/none", NULL, NULL), -ENOENT);
	log = only(tsrv_log(&srv), 1);
	json_decref(log);
}

static void test_gs_exists(void **state)
{
	json_t *log;

	(void)state;
	assert_int_equal(bkt_put_buf(gb, "once", "v1", 2), 0);
	assert_int_equal(bkt_put_buf(gb, "once", "v2", 2), -EEXIST);
	assert_contains(bkt_last_error(), "already exists");
	log = only(tsrv_log_class(&srv, "upload"), 2);
	assert_int_equal(tsrv_status(json_array_get(log, 1)), 412);
	json_decref(log);
	assert_true(tsrv_reset(&srv, false));
	/* the first attempt commits but its answer is lost: the retry meets
	 * 412, and the object found has our size and CRC: success */
	assert_true(tsrv_fault(&srv, "{\"match\": \"upload\", \"kind\": \"drop\", \"count\": 1}"));
	assert_int_equal(bkt_put_buf(gb, "lost-answer", "payload", 7), 0);
	log = only(tsrv_log(&srv), 3);
	assert_string_equal(tsrv_status_str(json_array_get(log, 0)), "reset");
	assert_int_equal(tsrv_status(json_array_get(log, 1)), 412);
	assert_string_equal(json_string_value(json_object_get(json_array_get(log, 2), "class")), "meta");
	json_decref(log);
	/* same after a 503, but the object there is someone else's: -EEXIST */
	assert_true(tsrv_fault(&srv, "{\"match\": \"upload\", \"kind\": \"503\", \"count\": 1}"));
	assert_int_equal(bkt_put_buf(gb, "once", "v3", 2), -EEXIST);
	/* a resumable upload whose last answer is lost: the status query finds it done */
	{
		uint32_t crc;
		int fd = make_file("drop.src", 600 * KIB, 23, &crc);
		assert_true(tsrv_reset(&srv, false));
		/* chunks 0-256K, 256K-512K pass; the final one commits, its
		 * answer is lost; the status query then answers 200 */
		assert_true(tsrv_fault(&srv, "{\"match\": \"upload\", \"method\": \"PUT\", \"kind\": "
					     "\"drop\", \"count\": 1, \"skip\": 2}"));
		assert_int_equal(bkt_put_file(gb, "res-drop", fd, 600 * KIB, crc), 0);
		close(fd);
		{
			json_t *l = tsrv_log_class(&srv, "upload");
			json_t *q = json_array_get(l, json_array_size(l) - 1);
			assert_string_equal(tsrv_h(q, "content-range"), "bytes */614400");
			assert_int_equal(tsrv_status(q), 200);
			json_decref(l);
		}
		check_download("res-drop", "drop.src", crc);
	}
}

static void test_gs_download_damage(void **state)
{
	uint32_t crc;
	uint64_t size;
	int fd = make_file("dmg.src", 700 * KIB, 31, &crc), out;

	(void)state;
	assert_int_equal(bkt_put_file(gb, "dmg", fd, 700 * KIB, crc), 0);
	close(fd);
	out = new_fd("dmg.dst");
	/* one flipped byte in flight: the object is fetched once more */
	assert_true(tsrv_fault(&srv, "{\"match\": \"download\", \"kind\": \"corrupt\", \"count\": 1, "
				     "\"after_bytes\": 1000}"));
	assert_int_equal(bkt_get_file(gb, "dmg", out, &size, true, crc), 0);
	assert_int_equal(size, 700 * KIB);
	/* damaged on every transfer: the mismatch counts */
	assert_true(tsrv_fault(&srv, "{\"match\": \"download\", \"kind\": \"corrupt\", \"count\": 100, "
				     "\"after_bytes\": 1000}"));
	assert_int_equal(bkt_get_file(gb, "dmg", out, &size, true, crc), -EBADMSG);
	assert_contains(bkt_last_error(), "gs://bkt/pfx/dmg");
	assert_contains(bkt_last_error(), "crc32c");
	assert_true(tsrv_reset(&srv, false));   /* the faults left over */
	/* the stored bytes truncated behind the metadata's back */
	assert_true(tsrv_post(&srv, "/_corrupt", "{\"bucket\": \"bkt\", \"name\": \"pfx/dmg\", "
					       "\"kind\": \"truncate\", \"offset\": 500000}"));
	assert_int_equal(bkt_get_file(gb, "dmg", out, &size, false, 0), -EBADMSG);
	/* and a wrong expected CRC on a good object */
	assert_int_equal(bkt_put_buf(gb, "good", "abc", 3), 0);
	assert_int_equal(bkt_get_file(gb, "good", out, &size, true, 1234), -EBADMSG);
	assert_int_equal(bkt_get_file(gb, "good", out, &size, true, mf_crc32c(0, "abc", 3)), 0);
	assert_int_equal(bkt_get_file(gb, "missing", out, &size, false, 0), -ENOENT);
	close(out);
}

static void test_gs_download_resume_and_ranges(void **state)
{
	const uint64_t n = 2 * MIB + 7;
	uint32_t crc;
	json_t *log, *e;
	size_t i;
	int fd = make_file("rng.src", n, 41, &crc);
	char gen[32] = "";

	(void)state;
	assert_int_equal(bkt_put_file(gb, "ranged", fd, n, crc), 0);
	close(fd);
	assert_true(tsrv_reset(&srv, false));
	/* part 3 is cut after 100000 bytes: it resumes from there */
	assert_true(tsrv_fault(&srv, "{\"match\": \"download\", \"kind\": \"truncate\", \"count\": 1, "
				     "\"after_bytes\": 100000, \"query\": \"generation\"}"));
	check_download("ranged", "rng.src", crc);
	log = tsrv_log_class(&srv, "download");
	/* 9 parts of 256 KiB + the resumed one */
	assert_int_equal(json_array_size(log), 10);
	e = json_array_get(log, 0);
	assert_string_equal(tsrv_h(e, "range"), "bytes=0-262143");
	assert_null(tsrv_q(e, "generation"));
	json_array_foreach(log, i, e) {
		const char *r = tsrv_h(e, "range");
		if (i == 0)
			continue;
		/* the later parts are pinned to the first answer's generation */
		assert_non_null(tsrv_q(e, "generation"));
		if (!gen[0])
			snprintf(gen, sizeof(gen), "%s", tsrv_q(e, "generation"));
		assert_string_equal(tsrv_q(e, "generation"), gen);
		assert_non_null(r);
		if (tsrv_status_str(e)) {
			unsigned long long s, en, s2, en2;
			json_t *nx;
			size_t k;
			assert_string_equal(tsrv_status_str(e), "truncated");
			assert_int_equal(sscanf(r, "bytes=%llu-%llu", &s, &en), 2);
			/* some later request asks for the rest of this part */
			bool found = false;
			json_array_foreach(log, k, nx) {
				const char *r2 = tsrv_h(nx, "range");
				if (k > i && r2 && sscanf(r2, "bytes=%llu-%llu", &s2, &en2) == 2 &&
				    s2 == s + 100000 && en2 == en)
					found = true;
			}
			assert_true(found);
		}
	}
	json_decref(log);
	/* into a pipe: parts in order */
	{
		struct piper pr = { 0 };
		pthread_t th;
		uint8_t *want;
		size_t wl;
		uint64_t size;
		int p[2];

		assert_int_equal(pipe(p), 0);
		pr.fd = p[0];
		pr.cap = n;
		pr.buf = malloc(n);
		pthread_create(&th, NULL, pipe_reader, &pr);
		assert_int_equal(bkt_get_file(gb, "ranged", p[1], &size, true, crc), 0);
		close(p[1]);
		pthread_join(th, NULL);
		close(p[0]);
		want = read_all(tmpfd, "rng.src", &wl);
		assert_int_equal(pr.got, wl);
		assert_int_equal(size, wl);
		assert_memory_equal(pr.buf, want, wl);
		free(want);
		free(pr.buf);
	}
	/* an empty object */
	{
		uint64_t size = 1;
		int out = new_fd("empty.dst");
		assert_int_equal(bkt_put_buf(gb, "empty", "", 0), 0);
		assert_int_equal(bkt_get_file(gb, "empty", out, &size, true, 0), 0);
		assert_int_equal(size, 0);
		close(out);
	}
}

/* collect_ex(), and gs:// lists a CRC32C with every object (file:// may not) */
static int collect_ex_crc(void *arg, const struct bkt_entry *e)
{
	assert_int_equal(e->has_crc, !e->is_prefix);
	return collect_ex(arg, e);
}

static void test_gs_list_paging(void **state)
{
	struct bkt *b = NULL;
	struct bkt_opts o = gopts;
	struct seen s = { 0 };
	json_t *log, *e;
	size_t i, tokens = 0;

	(void)state;
	o.list_page = 2;
	assert_int_equal(bkt_open("gs://bkt/pfx/", &o, &b), 0);
	assert_string_equal(bkt_url(b), "gs://bkt/pfx");
	populate_listing(b);
	assert_int_equal(bkt_put_buf(gb, "../outside-not-allowed", "x", 1), -EINVAL);
	assert_true(tsrv_reset(&srv, false));
	check_listings(b);
	log = tsrv_log_class(&srv, "list");
	json_array_foreach(log, i, e) {
		assert_string_equal(tsrv_q(e, "maxResults"), "2");
		assert_non_null(tsrv_q(e, "prefix"));
		assert_int_equal(strncmp(tsrv_q(e, "prefix"), "pfx/", 4), 0);
		tokens += tsrv_q(e, "pageToken") != NULL;
	}
	assert_true(tokens >= 4);
	json_decref(log);
	/* sizes and CRCs come with the listing */
	assert_int_equal(bkt_list_ex(b, "", NULL, collect_ex_crc, &s), 0);
	assert_int_equal(s.n, 7);
	for (int k = 0; k < 7; k++)
		assert_int_equal(s.size[k], strlen(all_sorted[k]));
	/* delete */
	assert_int_equal(bkt_delete(b, "z"), 0);
	assert_int_equal(bkt_delete(b, "z"), -ENOENT);
	assert_int_equal(bkt_stat(b, "z", NULL, NULL), -ENOENT);
	bkt_close(b);
}

static void test_gs_xfers(void **state)
{
	json_t *log;

	(void)state;
	xfer_roundtrip(gb, "gx", 40);
	log = tsrv_log_class(&srv, "upload");
	assert_true(json_array_size(log) >= 40);
	json_decref(log);
}

static void test_gs_stall_timeout(void **state)
{
	struct bkt *b = NULL;
	void *buf = NULL;
	size_t len;
	json_t *log;

	(void)state;
	setenv("MTCFS_GCS_TIMEOUTS", "2000,1", 1);
	assert_int_equal(bkt_open("gs://bkt/pfx", &gopts, &b), 0);
	unsetenv("MTCFS_GCS_TIMEOUTS");
	assert_int_equal(bkt_put_buf(b, "slow", "answer", 6), 0);
	assert_true(tsrv_fault(&srv, "{\"match\": \"download\", \"kind\": \"slow\", \"delay_ms\": 2500, "
				     "\"count\": 1}"));
	assert_int_equal(bkt_get_buf(b, "slow", 100, &buf, &len), 0);
	assert_memory_equal(buf, "answer", 6);
	free(buf);
	log = tsrv_log_class(&srv, "download");
	assert_int_equal(json_array_size(log), 2);
	json_decref(log);
	bkt_close(b);
}

/* ---- credentials ---- */

static char keyfile[PATH_MAX + 16];
static char pubpem[4096];

static void make_key(const char *email, const char *token_uri)
{
	EVP_PKEY *k = EVP_RSA_gen(2048);
	BIO *priv = BIO_new(BIO_s_mem()), *pub = BIO_new(BIO_s_mem());
	char *pp = NULL, *s;
	long pl;
	json_t *j;
	FILE *f;

	assert_non_null(k);
	assert_int_equal(PEM_write_bio_PrivateKey(priv, k, NULL, NULL, 0, NULL, NULL), 1);
	assert_int_equal(PEM_write_bio_PUBKEY(pub, k), 1);
	pl = BIO_get_mem_data(priv, &pp);
	s = strndup(pp, (size_t)pl);
	pl = BIO_get_mem_data(pub, &pp);
	snprintf(pubpem, sizeof(pubpem), "%.*s", (int)pl, pp);
	j = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "type", "service_account", "project_id", "p",
		      "private_key_id", "kid-1", "private_key", s, "client_email", email,
		      "token_uri", token_uri);
	snprintf(keyfile, sizeof(keyfile), "%s/sa.json", tmproot);
	f = fopen(keyfile, "w");
	assert_non_null(f);
	assert_int_equal(json_dumpf(j, f, 0), 0);
	fclose(f);
	json_decref(j);
	free(s);
	BIO_free(priv);
	BIO_free(pub);
	EVP_PKEY_free(k);
}

static void config_bearer(const char *extra)
{
	json_t *j = json_pack("{s:s, s:s, s:s}", "auth", "bearer", "jwt_key", pubpem,
			      "client_email", "mtcfs-test@proj.iam.gserviceaccount.com");
	json_t *x = extra ? json_loads(extra, 0, NULL) : NULL;
	char *s;

	if (x)
		json_object_update(j, x);
	s = json_dumps(j, 0);
	assert_true(tsrv_config(&srv, s));
	free(s);
	json_decref(j);
	json_decref(x);
}

static struct bkt *open_auth(const char *key, const char *meta_host)
{
	struct bkt_opts o = gopts;
	struct bkt *b = NULL;

	o.gcs_endpoint = srv.base;
	o.gcs_key_file = key;
	o.metadata_host = meta_host;
	unsetenv("STORAGE_EMULATOR_HOST");
	assert_int_equal(bkt_open("gs://bkt/auth", &o, &b), 0);
	return b;
}

static void restore_emulator(void)
{
	char emu[64];
	snprintf(emu, sizeof(emu), "127.0.0.1:%d", srv.port);
	setenv("STORAGE_EMULATOR_HOST", emu, 1);
}

static void test_auth_keyfile(void **state)
{
	char uri[128];
	struct bkt *b;
	json_t *log, *e, *claims;
	const char *tok = NULL;
	size_t i, ntok = 0;
	void *buf = NULL;
	size_t len;

	(void)state;
	snprintf(uri, sizeof(uri), "%s/token", srv.base);
	make_key("mtcfs-test@proj.iam.gserviceaccount.com", uri);
	config_bearer(NULL);
	b = open_auth(keyfile, NULL);
	assert_int_equal(bkt_put_buf(b, "a", "1", 1), 0);
	assert_int_equal(bkt_put_buf(b, "b", "2", 1), 0);
	assert_int_equal(bkt_get_buf(b, "a", 10, &buf, &len), 0);
	free(buf);
	assert_int_equal(bkt_stat(b, "b", NULL, NULL), 0);
	assert_int_equal(bkt_list(b, "", NULL, collect, &(struct seen){ 0 }), 0);
	log = tsrv_log(&srv);
	json_array_foreach(log, i, e) {
		const char *cls = json_string_value(json_object_get(e, "class"));
		if (!strcmp(cls, "token")) {
			ntok++;
			assert_true(json_is_true(json_object_get(e, "jwt_ok")));
			claims = json_object_get(e, "jwt_claims");
			assert_string_equal(json_string_value(json_object_get(claims, "iss")),
					    "mtcfs-test@proj.iam.gserviceaccount.com");
			assert_string_equal(json_string_value(json_object_get(claims, "scope")), GCS_SCOPE);
			assert_string_equal(json_string_value(json_object_get(claims, "aud")), uri);
			assert_string_equal(json_string_value(json_object_get(json_object_get(e, "jwt_header"),
									      "kid")), "kid-1");
			assert_string_equal(json_string_value(json_object_get(json_object_get(e, "form"),
									      "grant_type")),
					    "urn:ietf:params:oauth:grant-type:jwt-bearer");
			assert_int_equal(tsrv_status(e), 200);
			continue;
		}
		assert_non_null(tsrv_h(e, "authorization"));
		if (!tok)
			tok = tsrv_h(e, "authorization");
		assert_string_equal(tsrv_h(e, "authorization"), tok);   /* one token, reused */
		assert_int_equal(strncmp(tok, "Bearer ya29.test-", 17), 0);
		assert_true(tsrv_status(e) == 200);
	}
	assert_int_equal(ntok, 1);
	assert_int_equal(json_array_size(log), 6);
	json_decref(log);
	/* a revoked token: 401, a fresh token, the request again */
	assert_true(tsrv_reset(&srv, false));
	assert_true(tsrv_config(&srv, "{\"revoke\": true}"));
	assert_int_equal(bkt_stat(b, "a", NULL, NULL), 0);
	log = only(tsrv_log(&srv), 3);
	assert_int_equal(tsrv_status(json_array_get(log, 0)), 401);
	assert_string_equal(json_string_value(json_object_get(json_array_get(log, 1), "class")), "token");
	assert_int_equal(tsrv_status(json_array_get(log, 2)), 200);
	json_decref(log);
	bkt_close(b);

	/* short-lived tokens are refreshed before they expire */
	assert_true(tsrv_config(&srv, "{\"token_ttl\": 2}"));
	b = open_auth(keyfile, NULL);
	assert_true(tsrv_reset(&srv, false));
	assert_int_equal(bkt_stat(b, "a", NULL, NULL), 0);
	assert_int_equal(bkt_stat(b, "a", NULL, NULL), 0);
	/* time is the subject: 1.1 s into a 2 s token its refresh is due */
	usleep(1100 * 1000);
	assert_int_equal(bkt_stat(b, "a", NULL, NULL), 0);
	log = tsrv_log_class(&srv, "token");
	assert_int_equal(json_array_size(log), 2);
	json_decref(log);
	bkt_close(b);
	restore_emulator();
}

static void test_auth_metadata(void **state)
{
	char host[64];
	struct bkt *b;
	json_t *log, *e;

	(void)state;
	config_bearer(NULL);
	snprintf(host, sizeof(host), "127.0.0.1:%d", srv.port);
	b = open_auth(NULL, host);
	assert_int_equal(bkt_put_buf(b, "m", "1", 1), 0);
	assert_int_equal(bkt_stat(b, "m", NULL, NULL), 0);
	log = only(tsrv_log(&srv), 3);
	e = json_array_get(log, 0);
	assert_string_equal(json_string_value(json_object_get(e, "path")),
			    "/computeMetadata/v1/instance/service-accounts/default/token");
	assert_string_equal(tsrv_h(e, "metadata-flavor"), "Google");
	assert_int_equal(tsrv_status(e), 200);
	assert_int_equal(strncmp(tsrv_h(json_array_get(log, 1), "authorization"), "Bearer ", 7), 0);
	json_decref(log);
	bkt_close(b);
	/* GCE_METADATA_HOST is honoured */
	setenv("GCE_METADATA_HOST", host, 1);
	b = open_auth(NULL, NULL);
	assert_int_equal(bkt_stat(b, "m", NULL, NULL), 0);
	unsetenv("GCE_METADATA_HOST");
	bkt_close(b);
	restore_emulator();
}

static void test_auth_denied(void **state)
{
	char uri[128];
	struct bkt *b;
	const char *m;
	json_t *log;

	(void)state;
	snprintf(uri, sizeof(uri), "%s/token", srv.base);
	make_key("mtcfs-test@proj.iam.gserviceaccount.com", uri);
	config_bearer("{\"deny\": [\"storage.objects.create\"]}");
	b = open_auth(keyfile, NULL);
	assert_int_equal(bkt_put_buf(b, "x", "1", 1), -EACCES);
	m = bkt_last_error();
	assert_contains(m, "gs://bkt/auth/x: 403 Forbidden: the caller lacks storage.objects.create");
	assert_contains(m, "grant roles/storage.objectUser on gs://bkt");
	assert_contains(m, "mtcfs-test@proj.iam.gserviceaccount.com");
	assert_int_equal(bkt_list(b, "", "/", collect, &(struct seen){ 0 }), 0);  /* list allowed */
	/* every token refused: one refresh, then the 401 in words */
	assert_true(tsrv_reset(&srv, false));
	assert_true(tsrv_config(&srv, "{\"reject_tokens\": true}"));
	assert_int_equal(bkt_stat(b, "x", NULL, NULL), -EACCES);
	m = bkt_last_error();
	assert_contains(m, "401 Unauthorized");
	assert_contains(m, "storage.objects.get");
	assert_contains(m, "gs://bkt");
	log = tsrv_log_class(&srv, "token");
	assert_int_equal(json_array_size(log), 1);
	json_decref(log);
	bkt_close(b);
	/* no credentials at all (the emulator setting) against a server that
	 * wants them: 401 for the anonymous caller, in words */
	restore_emulator();
	{
		struct bkt *anon = NULL;
		assert_int_equal(bkt_open("gs://bkt/auth", &gopts, &anon), 0);
		assert_int_equal(bkt_put_buf(anon, "y", "1", 1), -EACCES);
		assert_contains(bkt_last_error(), "401 Unauthorized");
		assert_contains(bkt_last_error(), "storage.objects.create");
		assert_contains(bkt_last_error(), "no credentials (STORAGE_EMULATOR_HOST)");
		assert_contains(bkt_last_error(), "Anonymous caller");
		bkt_close(anon);
	}
	/* a key the token endpoint does not know: the refusal in words */
	tsrv_reset(&srv, true);
	assert_true(tsrv_config(&srv, "{\"auth\": \"bearer\"}"));
	b = open_auth(keyfile, NULL);
	assert_int_equal(bkt_stat(b, "x", NULL, NULL), -EACCES);
	assert_contains(bkt_last_error(), "Invalid JWT Signature");
	bkt_close(b);
	/* unreadable key files fail at open */
	{
		struct bkt_opts o = gopts;
		struct bkt *bb = NULL;
		o.gcs_endpoint = srv.base;
		o.gcs_key_file = "/nonexistent/key.json";
		unsetenv("STORAGE_EMULATOR_HOST");
		assert_int_equal(bkt_open("gs://bkt/auth", &o, &bb), -ENOENT);
		assert_contains(bkt_last_error(), "/nonexistent/key.json");
	}
	restore_emulator();
}

static void test_jwt_signature(void **state)
{
	struct gcs_auth *a = NULL;
	struct gcs_auth_cfg cfg = { .kind = GCS_AUTH_KEY };
	char err[256], *jwt = NULL, *dot1, *dot2;
	unsigned char sig[512], hdr[512];
	int siglen, hl;
	EVP_PKEY *pub;
	BIO *bio;
	EVP_MD_CTX *ctx;

	(void)state;
	make_key("x@y.iam.gserviceaccount.com", "https://oauth2.example/token");
	cfg.key_file = keyfile;
	assert_int_equal(gcs_auth_new(&cfg, &a, err, sizeof(err)), 0);
	assert_int_equal(gcs_auth_jwt(a, 1700000000, &jwt), 0);
	dot1 = strchr(jwt, '.');
	dot2 = strrchr(jwt, '.');
	assert_true(dot1 && dot2 && dot1 != dot2);
	/* header {"alg":"RS256","kid":"kid-1","typ":"JWT"} in base64url */
	{
		char b64[512];
		size_t l = (size_t)(dot1 - jwt);
		memcpy(b64, jwt, l);
		while (l % 4)
			b64[l++] = '=';
		b64[l] = '\0';
		hl = EVP_DecodeBlock(hdr, (unsigned char *)b64, (int)l);
		assert_true(hl > 0);
		assert_non_null(memmem(hdr, (size_t)hl, "\"alg\":\"RS256\"", 13));
	}
	/* the signature verifies with the public key */
	{
		char b64[1024];
		size_t l = strlen(dot2 + 1);
		for (size_t i = 0; i < l; i++)
			b64[i] = dot2[1 + i] == '-' ? '+' : dot2[1 + i] == '_' ? '/' : dot2[1 + i];
		while (l % 4)
			b64[l++] = '=';
		b64[l] = '\0';
		siglen = EVP_DecodeBlock(sig, (unsigned char *)b64, (int)l);
		while (siglen > 256)
			siglen--;       /* padding bytes decoded as zeros */
	}
	bio = BIO_new_mem_buf(pubpem, -1);
	pub = PEM_read_bio_PUBKEY(bio, NULL, NULL, NULL);
	ctx = EVP_MD_CTX_new();
	assert_int_equal(EVP_DigestVerifyInit(ctx, NULL, EVP_sha256(), NULL, pub), 1);
	assert_int_equal(EVP_DigestVerify(ctx, sig, 256, (unsigned char *)jwt, (size_t)(dot2 - jwt)), 1);
	EVP_MD_CTX_free(ctx);
	EVP_PKEY_free(pub);
	BIO_free(bio);
	free(jwt);
	gcs_auth_free(a);
	/* a key file of the wrong type */
	{
		FILE *f = fopen(keyfile, "w");
		fputs("{\"type\": \"authorized_user\"}", f);
		fclose(f);
		assert_int_equal(gcs_auth_new(&cfg, &a, err, sizeof(err)), -EINVAL);
		assert_contains(err, "service_account");
	}
}


/* ---- regressions found by fuzz_gcs_json (tests/fuzz/regressions/) ---- */

/* a 2xx other than 200/201 answering an upload is no success: -EPROTO */
static void test_gs_resumable_start_unexpected_2xx(void **state)
{
	static const char *const kinds[] = { "206", "202" };
	struct bkt_opts o = { .simple_max = 256 * KIB, .chunk = 256 * KIB };
	const size_t n = 300 * KIB;
	char *data = calloc(1, n), path[] = "/tmp/mtcfs-test-2xx-XXXXXX", f[200];
	struct bkt *b = NULL;
	int fd = mkstemp(path);

	(void)state;
	assert_non_null(data);
	assert_true(fd >= 0);
	unlink(path);
	assert_int_equal(write(fd, data, n), (ssize_t)n);
	assert_int_equal(bkt_open("gs://bkt/pfx", &o, &b), 0);
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
		assert_true(tsrv_reset(&srv, true));
		snprintf(f, sizeof(f), "{\"match\": \"upload\", \"query\": \"uploadType=resumable\", "
			 "\"method\": \"POST\", \"kind\": \"%s\", \"count\": 1}", kinds[i]);
		assert_true(tsrv_fault(&srv, f));
		assert_int_equal(bkt_put_file(b, "big", fd, n, mf_crc32c(0, data, n)), -EPROTO);
		assert_non_null(strstr(bkt_last_error(), kinds[i]));
	}
	assert_true(tsrv_reset(&srv, true));
	assert_true(tsrv_fault(&srv, "{\"match\": \"upload\", \"kind\": \"202\", \"count\": 1}"));
	assert_int_equal(bkt_put_buf(b, "small", "hello", 5), -EPROTO);
	bkt_close(b);
	close(fd);
	free(data);
}

/* A loopback HTTP server with canned answers, for what gcs_server.py cannot
 * send: resp[i] answers request i, the last one the rest, up to cap
 * requests (then 503, so a looping client gives up). "%d" becomes the
 * port; Content-Length is added; request bodies are read and dropped. */
struct canned {
	int lfd, port;
	const char *const *resp;
	size_t nresp;
	unsigned cap, served;
	pthread_t th;
};

static void canned_answer(struct canned *c, int fd)
{
	const char *fmt = c->served < c->cap ? c->resp[c->served < c->nresp ? c->served : c->nresp - 1]
					     : "HTTP/1.1 503 Stop\r\n\r\n";
	char txt[2048], out[4096];
	const char *body;
	int n;

	c->served++;
	{
		/* "%d" in the canned text becomes our port */
		const char *pd = strstr(fmt, "%d");
		if (pd)
			snprintf(txt, sizeof(txt), "%.*s%d%s", (int)(pd - fmt), fmt, c->port, pd + 2);
		else
			snprintf(txt, sizeof(txt), "%s", fmt);
	}
	body = strstr(txt, "\r\n\r\n");
	if (!body)
		return;
	n = snprintf(out, sizeof(out), "%.*sContent-Length: %zu\r\n\r\n%s", (int)(body - txt + 2),
		     txt, strlen(body + 4), body + 4);
	if (n > 0 && (size_t)n < sizeof(out))
		(void)send(fd, out, (size_t)n, MSG_NOSIGNAL);
}

static void *canned_main(void *arg)
{
	struct canned *c = arg;
	int fd;

	while ((fd = accept(c->lfd, NULL, NULL)) >= 0) {
		static char buf[1 << 20];
		size_t have = 0, skip = 0;
		ssize_t r;

		while ((r = recv(fd, buf + have, sizeof(buf) - 1 - have, 0)) > 0) {
			char *e;
			have += (size_t)r;
			buf[have] = '\0';
			for (;;) {
				size_t used;
				const char *cl;
				if (skip) {
					size_t k = skip < have ? skip : have;
					memmove(buf, buf + k, have - k + 1);
					have -= k;
					skip -= k;
					if (skip)
						break;
				}
				e = strstr(buf, "\r\n\r\n");
				if (!e)
					break;
				*e = '\0';
				cl = strcasestr(buf, "\r\ncontent-length:");
				skip = cl ? strtoul(cl + 17, NULL, 10) : 0;
				used = (size_t)(e + 4 - buf);
				memmove(buf, e + 4, have - used + 1);
				have -= used;
				canned_answer(c, fd);
			}
		}
		close(fd);
	}
	return NULL;
}

static void canned_start(struct canned *c, const char *const *resp, size_t nresp, unsigned cap)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t al = sizeof(a);

	memset(c, 0, sizeof(*c));
	c->resp = resp;
	c->nresp = nresp;
	c->cap = cap;
	c->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(c->lfd >= 0);
	assert_int_equal(bind(c->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(c->lfd, 8), 0);
	assert_int_equal(getsockname(c->lfd, (struct sockaddr *)&a, &al), 0);
	c->port = ntohs(a.sin_port);
	assert_int_equal(pthread_create(&c->th, NULL, canned_main, c), 0);
}

static struct bkt *canned_bkt(struct canned *c, const struct bkt_opts *base)
{
	struct bkt_opts o = base ? *base : (struct bkt_opts){ 0 };
	struct bkt *b = NULL;
	char ep[64];

	snprintf(ep, sizeof(ep), "http://127.0.0.1:%d", c->port);
	o.gcs_endpoint = ep;
	assert_int_equal(bkt_open("gs://bkt/pfx", &o, &b), 0);
	return b;
}

static unsigned canned_stop(struct canned *c)
{
	shutdown(c->lfd, SHUT_RDWR);
	close(c->lfd);
	pthread_join(c->th, NULL);
	return c->served;
}

static int count_cb(void *arg, const struct bkt_entry *e)
{
	(void)e;
	(*(unsigned *)arg)++;
	return 0;
}

struct names {
	char v[8][64];
	unsigned n;
};

static int names_cb(void *arg, const struct bkt_entry *e)
{
	struct names *g = arg;

	if (g->n < 8)
		snprintf(g->v[g->n], sizeof(g->v[0]), "%s", e->name);
	g->n++;
	return 0;
}

/* a Content-Range total beyond MF_MAX_FILE_SIZE: -EPROTO, no further GETs */
static void test_gs_content_range_total_bounded(void **state)
{
	static const char *const totals[] = { "9223372036854775807", "1125899906842624" };
	char resp[256], path[] = "/tmp/mtcfs-test-crange-XXXXXX";
	const char *rv[] = { resp };
	int fd = mkstemp(path);

	(void)state;
	assert_true(fd >= 0);
	unlink(path);
	for (size_t i = 0; i < sizeof(totals) / sizeof(totals[0]); i++) {
		struct canned c;
		struct bkt *b;
		uint64_t size = 0;

		snprintf(resp, sizeof(resp), "HTTP/1.1 206 Partial Content\r\n"
			 "Content-Range: bytes 0-10/%s\r\n\r\nhello world", totals[i]);
		canned_start(&c, rv, 1, 10);
		b = canned_bkt(&c, NULL);
		assert_int_equal(bkt_get_file(b, "obj", fd, &size, false, 0), -EPROTO);
		bkt_close(b);
		assert_int_equal(canned_stop(&c), 1);
	}
	close(fd);
}

/* 308s that persist nothing new: the upload gives up instead of looping */
static void test_gs_resumable_308_no_progress(void **state)
{
	const char *rv[] = {
		"HTTP/1.1 200 OK\r\nLocation: http://127.0.0.1:%d/upload/s?upload_id=1\r\n\r\n",
		"HTTP/1.1 308 Resume Incomplete\r\n\r\n",
	};
	struct bkt_opts o = { .simple_max = 256 * KIB, .chunk = 256 * KIB };
	const size_t n = 300 * KIB;
	char *data = calloc(1, n), path[] = "/tmp/mtcfs-test-308-XXXXXX";
	struct canned c;
	struct bkt *b;
	unsigned served;
	int fd = mkstemp(path), rc;

	(void)state;
	assert_true(data && fd >= 0);
	unlink(path);
	assert_int_equal(write(fd, data, n), (ssize_t)n);
	canned_start(&c, rv, 2, 100);
	b = canned_bkt(&c, &o);
	rc = bkt_put_file(b, "big", fd, n, mf_crc32c(0, data, n));
	bkt_close(b);
	served = canned_stop(&c);
	assert_int_equal(rc, -EPROTO);
	assert_true(served <= 12);
	close(fd);
	free(data);
}

/* a nextPageToken equal to the one just sent: -EPROTO, not a loop */
static void test_gs_list_same_page_token(void **state)
{
	const char *rv[] = { "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n"
			     "{\"nextPageToken\": \"t\"}" };
	struct canned c;
	struct bkt *b;
	unsigned cnt = 0;
	int rc;

	(void)state;
	canned_start(&c, rv, 1, 100);
	b = canned_bkt(&c, NULL);
	rc = bkt_list_ex(b, "", NULL, count_cb, &cnt);
	bkt_close(b);
	assert_true(canned_stop(&c) <= 2);
	assert_int_equal(rc, -EPROTO);
}

/* names outside the listed prefix are skipped; a page going back is -EPROTO */
static void test_gs_list_contract(void **state)
{
	const char *outside[] = { "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n"
		"{\"items\": [{\"name\": \"pfx/dir/a\"}, {\"name\": \"pfx/other/x\"}]}" };
	const char *backwards[] = {
		"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n"
		"{\"items\": [{\"name\": \"pfx/b\"}], \"nextPageToken\": \"t1\"}",
		"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n"
		"{\"items\": [{\"name\": \"pfx/a\"}]}",
	};
	struct canned c;
	struct bkt *b;
	struct names got = { 0 };
	unsigned cnt = 0;
	int rc;

	(void)state;
	canned_start(&c, outside, 1, 10);
	b = canned_bkt(&c, NULL);
	assert_int_equal(bkt_list_ex(b, "dir/", NULL, names_cb, &got), 0);
	bkt_close(b);
	canned_stop(&c);
	assert_int_equal(got.n, 1);
	assert_string_equal(got.v[0], "dir/a");
	canned_start(&c, backwards, 2, 10);
	b = canned_bkt(&c, NULL);
	rc = bkt_list_ex(b, "", NULL, count_cb, &cnt);
	bkt_close(b);
	canned_stop(&c);
	assert_int_equal(rc, -EPROTO);
}

/* the token refusal text reaches err (and the log) as one line */
static int refuse_http(void *arg, const char *url, const char *const *hdrs, const char *body,
		       long *status, char **resp, size_t *resp_len, char *err, size_t errlen)
{
	static const char text[] = "Not Found\nno service account on this instance\r\n";

	(void)arg; (void)url; (void)hdrs; (void)body; (void)err; (void)errlen;
	*status = 404;
	*resp = strdup(text);
	*resp_len = sizeof(text) - 1;
	return *resp ? 0 : -ENOMEM;
}

static void test_auth_refusal_one_line(void **state)
{
	struct gcs_auth_cfg cfg = { .kind = GCS_AUTH_METADATA, .metadata_host = "127.0.0.1:1",
				    .http = refuse_http };
	struct gcs_auth *a = NULL;
	char tok[GCS_TOKEN_MAX], err[1024] = "";

	(void)state;
	assert_int_equal(gcs_auth_new(&cfg, &a, err, sizeof(err)), 0);
	assert_int_equal(gcs_auth_token(a, tok, sizeof(tok), err, sizeof(err)), -EACCES);
	assert_non_null(strstr(err, "404"));
	for (const char *p = err; *p; p++)
		assert_true((unsigned char)*p >= 0x20);
	gcs_auth_free(a);
}

int main(void)
{
	const struct CMUnitTest file_tests[] = {
		cmocka_unit_test(test_crc_combine),
		cmocka_unit_test(test_bad_urls),
		cmocka_unit_test(test_file_write_once),
		cmocka_unit_test(test_file_list),
		cmocka_unit_test(test_file_corrupt_missing_delete),
		cmocka_unit_test(test_file_sparse),
		cmocka_unit_test(test_jwt_signature),
	};
	const struct CMUnitTest gs_tests[] = {
		cmocka_unit_test_setup_teardown(test_gs_multipart, gs_setup, gs_teardown),
		cmocka_unit_test_setup_teardown(test_gs_media, gs_setup, gs_teardown),
		cmocka_unit_test_setup_teardown(test_gs_sparse_download, gs_setup, gs_teardown),
		cmocka_unit_test_setup_teardown(test_gs_resumable, gs_setup, gs_teardown),
		cmocka_unit_test_setup_teardown(test_gs_resume_after_reset, gs_setup, gs_teardown),
		cmocka_unit_test_setup_teardown(test_gs_retries, gs_setup, gs_teardown),
		cmocka_unit_test_setup_teardown(test_gs_exists, gs_setup, gs_teardown),
		cmocka_unit_test_setup_teardown(test_gs_download_damage, gs_setup, gs_teardown),
		cmocka_unit_test_setup_teardown(test_gs_download_resume_and_ranges, gs_setup, gs_teardown),
		cmocka_unit_test_setup_teardown(test_gs_list_paging, gs_setup, gs_teardown),
		cmocka_unit_test_setup_teardown(test_gs_xfers, gs_setup, gs_teardown),
		cmocka_unit_test_setup_teardown(test_gs_stall_timeout, gs_setup, gs_teardown),
		cmocka_unit_test_setup_teardown(test_auth_keyfile, gs_setup, gs_teardown),
		cmocka_unit_test_setup_teardown(test_auth_metadata, gs_setup, gs_teardown),
		cmocka_unit_test_setup_teardown(test_auth_denied, gs_setup, gs_teardown),
		cmocka_unit_test_setup_teardown(test_gs_resumable_start_unexpected_2xx, gs_setup, gs_teardown),
		cmocka_unit_test_setup_teardown(test_gs_content_range_total_bounded, gs_setup, gs_teardown),
		cmocka_unit_test_setup_teardown(test_gs_resumable_308_no_progress, gs_setup, gs_teardown),
		cmocka_unit_test_setup_teardown(test_gs_list_same_page_token, gs_setup, gs_teardown),
		cmocka_unit_test_setup_teardown(test_gs_list_contract, gs_setup, gs_teardown),
		cmocka_unit_test(test_auth_refusal_one_line),
	};
	int rc;

	signal(SIGPIPE, SIG_DFL);   /* the code under test must not need SIG_IGN */
	curl_global_init(CURL_GLOBAL_DEFAULT);
	rc = cmocka_run_group_tests_name("bucket.file", file_tests, group_setup, group_teardown);
	rc |= cmocka_run_group_tests_name("bucket.gs", gs_tests, gs_group_setup, group_teardown);
	curl_global_cleanup();
	return rc;
}
