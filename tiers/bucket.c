/* bucket: URL dispatch, name checks, the last-error words, expected-CRC
 * checks and the parallel transfer helpers shared by both backends. */
#include "tiers/bucket.h"
#include "common/io.h"
#include "common/log.h"
#include "common/par_for.h"
#include "common/util.h"
#include "tiers/manifest.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MOD "bucket"

#define BKT_NAME_MAX      1024u          /* Cloud Storage's limit, prefix included */
#define BKT_TMP_PREFIX    ".bkt-tmp-"    /* reserved: file:// temporaries */
#define DEF_PARALLELISM   8
#define DEF_SIMPLE_MAX    (8u << 20)
#define DEF_CHUNK         (16u << 20)
#define DEF_PART          (32u << 20)
#define DEF_LIST_PAGE     1000u
#define CHUNK_ALIGN       (256u << 10)   /* resumable chunks: multiples of 256 KiB */

struct bkt {
	const struct bkt_ops *ops;
	void *priv;                 /* the backend's state */
	char *url;                  /* as given, without a trailing '/' */
	struct bkt_opts o;          /* defaults filled in; strings owned */
	size_t name_max;            /* what BKT_NAME_MAX leaves to a name after the
				     * backend's own prefix (bkt_name_prefix) */
};

static const struct bkt_ops *const backends[] = { &bkt_file_ops, &bkt_gcs_ops };
const struct bkt_ops *bkt_test_backend;

/* ---- last error, per thread ---- */

static __thread char last_err[1024];

void bkt_set_error(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(last_err, sizeof(last_err), fmt, ap);
	va_end(ap);
}

bool bkt_has_error(void) { return last_err[0] != '\0'; }
const char *bkt_last_error(void) { return last_err; }

static void err_clear(void) { last_err[0] = '\0'; }

/* Give every failure words, even when the backend had none to add. */
static int done(const struct bkt *b, const char *op, const char *name, int rc)
{
	if (rc < 0 && !last_err[0])
		bkt_set_error("%s/%s: %s: %s", b->url, name ? name : "", op, strerror(-rc));
	return rc;
}

/* ---- accessors for backends ---- */

void *bkt_priv(const struct bkt *b) { return b->priv; }
const struct bkt_opts *bkt_opts_of(const struct bkt *b) { return &b->o; }
const char *bkt_url(const struct bkt *b) { return b ? b->url : ""; }

/* ---- CRC32C combination (zlib's crc32_combine, Castagnoli polynomial) ---- */

#define CRC32C_POLY 0x82f63b78u

/* a * b modulo the polynomial, reflected; a must not be 0 */
static uint32_t multmodp(uint32_t a, uint32_t b)
{
	uint32_t m = 1u << 31, p = 0;

	for (;;) {
		if (a & m) {
			p ^= b;
			if ((a & (m - 1)) == 0)
				break;
		}
		m >>= 1;
		b = (b & 1) ? (b >> 1) ^ CRC32C_POLY : b >> 1;
	}
	return p;
}

static uint32_t x2n_table[32];
static pthread_once_t x2n_once = PTHREAD_ONCE_INIT;

static void x2n_init(void)
{
	uint32_t p = 1u << 30;      /* x^1 */

	x2n_table[0] = p;
	for (int k = 1; k < 32; k++)
		x2n_table[k] = p = multmodp(p, p);
}

uint32_t bkt_crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b)
{
	uint32_t p = 1u << 31;      /* x^0 */
	unsigned k = 3;             /* len_b counts bytes: x^(8 n) */

	pthread_once(&x2n_once, x2n_init);
	while (len_b) {
		if (len_b & 1)
			p = multmodp(x2n_table[k & 31], p);
		len_b >>= 1;
		k++;
	}
	return multmodp(p, crc_a) ^ crc_b;
}

/* ---- names ---- */

static bool component_ok(const char *s, size_t n)
{
	return !(n >= sizeof(BKT_TMP_PREFIX) - 1 &&
		 !memcmp(s, BKT_TMP_PREFIX, sizeof(BKT_TMP_PREFIX) - 1));
}

static bool chars_ok(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c < 0x20 || c == 0x7f)
			return false;
	}
	return true;
}

static bool name_ok(const struct bkt *b, const char *name)
{
	size_t n, start = 0;

	if (!name)
		return false;
	n = strlen(name);
	if (n == 0 || n > b->name_max || !chars_ok(name, n) || !util_safe_relpath(name, n))
		return false;
	for (size_t i = 0; i <= n; i++) {
		if (i == n || name[i] == '/') {
			if (!component_ok(name + start, i - start))
				return false;
			start = i + 1;
		}
	}
	return true;
}

/* A listing prefix: "" or a name, possibly ending with '/' or in the
 * middle of a component. */
static bool prefix_ok(const char *p)
{
	char buf[BKT_NAME_MAX + 1];
	size_t n;

	if (!p || !*p)
		return true;
	n = strlen(p);
	if (n > BKT_NAME_MAX)
		return false;
	memcpy(buf, p, n + 1);
	if (buf[n - 1] == '/')
		buf[--n] = '\0';
	return n > 0 && chars_ok(buf, n) && util_safe_relpath(buf, n);
}

static int bad_name(const struct bkt *b, const char *op, const char *name)
{
	if (name && strlen(name) > b->name_max && strlen(name) <= BKT_NAME_MAX) {
		bkt_set_error("%s: %s: object name of %zu bytes: with the bucket's prefix it is "
			      "longer than Cloud Storage's %u", b->url, op, strlen(name),
			      BKT_NAME_MAX);
		return -ENAMETOOLONG;
	}
	bkt_set_error("%s: %s: invalid object name \"%s\"", b->url, op, name ? name : "(null)");
	return -EINVAL;
}

void bkt_name_prefix(struct bkt *b, size_t len)
{
	b->name_max = len < BKT_NAME_MAX ? BKT_NAME_MAX - len : 0;
}

/* ---- lifecycle ---- */

static int dup_opt(const char *s, const char **dst)
{
	if (!s) {
		*dst = NULL;
		return 0;
	}
	*dst = strdup(s);
	return *dst ? 0 : -ENOMEM;
}

static void free_opts(struct bkt_opts *o)
{
	free((char *)o->gcs_endpoint);
	free((char *)o->gcs_key_file);
	free((char *)o->metadata_host);
}

int bkt_open(const char *url, const struct bkt_opts *o, struct bkt **out)
{
	const struct bkt_ops *ops = NULL;
	const char *loc = NULL, *sep;
	struct bkt *b = NULL;
	struct bkt_opts def = { 0 };
	size_t n;
	int rc;

	err_clear();
	*out = NULL;
	if (!o)
		o = &def;
	sep = url ? strstr(url, "://") : NULL;
	if (sep) {
		for (size_t i = 0; i < sizeof(backends) / sizeof(backends[0]); i++) {
			if (strlen(backends[i]->scheme) == (size_t)(sep - url) &&
			    !memcmp(url, backends[i]->scheme, (size_t)(sep - url))) {
				ops = backends[i];
				loc = sep + 3;
			}
		}
		if (bkt_test_backend && strlen(bkt_test_backend->scheme) == (size_t)(sep - url) &&
		    !memcmp(url, bkt_test_backend->scheme, (size_t)(sep - url))) {
			ops = bkt_test_backend;
			loc = sep + 3;
		}
	}
	if (!ops) {
		bkt_set_error("bucket URL \"%s\": want gs://BUCKET[/PREFIX] or file:///abs/path",
			      url ? url : "(null)");
		log_err(MOD, "%s", last_err);
		return -EINVAL;
	}
	b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	b->ops = ops;
	b->url = strdup(url);
	if (!b->url) {
		rc = -ENOMEM;
		goto out;
	}
	n = strlen(b->url);
	while (n > 0 && b->url[n - 1] == '/' && b->url + n > b->url + (loc - url) + 1)
		b->url[--n] = '\0';
	b->o = *o;
	b->o.gcs_endpoint = b->o.gcs_key_file = b->o.metadata_host = NULL;
	if ((rc = dup_opt(o->gcs_endpoint, &b->o.gcs_endpoint)) < 0 ||
	    (rc = dup_opt(o->gcs_key_file, &b->o.gcs_key_file)) < 0 ||
	    (rc = dup_opt(o->metadata_host, &b->o.metadata_host)) < 0)
		goto out;
	if (b->o.parallelism <= 0)
		b->o.parallelism = DEF_PARALLELISM;
	if (b->o.parallelism > 256)
		b->o.parallelism = 256;
	if (!b->o.simple_max)
		b->o.simple_max = DEF_SIMPLE_MAX;
	if (!b->o.chunk)
		b->o.chunk = DEF_CHUNK;
	b->o.chunk = b->o.chunk < CHUNK_ALIGN ? CHUNK_ALIGN : b->o.chunk / CHUNK_ALIGN * CHUNK_ALIGN;
	if (!b->o.part)
		b->o.part = DEF_PART;
	if (!b->o.list_page || b->o.list_page > 1000)
		b->o.list_page = DEF_LIST_PAGE;
	b->name_max = BKT_NAME_MAX;
	rc = ops->open(b, loc, &b->priv);
	if (rc < 0) {
		if (!last_err[0])
			bkt_set_error("%s: %s", url, strerror(-rc));
		log_err(MOD, "cannot open bucket: %s", last_err);
		goto out;
	}
	*out = b;
	b = NULL;
	rc = 0;
out:
	if (b) {
		free_opts(&b->o);
		free(b->url);
		free(b);
	}
	return rc;
}

void bkt_close(struct bkt *b)
{
	if (!b)
		return;
	if (b->priv)
		b->ops->close(b->priv);
	free_opts(&b->o);
	free(b->url);
	free(b);
}

static bool all_zero(const char *p, size_t n)
{
	/* p[0] == 0 and every byte equals the next: memcmp runs at memory speed */
	return n == 0 || (p[0] == 0 && memcmp(p, p + 1, n - 1) == 0);
}

int bkt_pwrite_sparse(int fd, const void *buf, size_t len, uint64_t off)
{
	const char *p = buf;

	while (len > 0) {
		size_t n = BKT_HOLE_BLOCK - (size_t)(off % BKT_HOLE_BLOCK);
		if (n > len)
			n = len;
		/* extend n over the following non-zero blocks: one pwrite per data run */
		if (!all_zero(p, n)) {
			while (n < len) {
				size_t m = len - n > BKT_HOLE_BLOCK ? BKT_HOLE_BLOCK : len - n;
				if (all_zero(p + n, m))
					break;
				n += m;
			}
			int rc = io_pwrite_full(fd, p, n, off);
			if (rc < 0)
				return rc;
		}
		p += n;
		off += n;
		len -= n;
	}
	return 0;
}

/* ---- operations: the inline wrappers over the table ---- */

static inline int ops_put(struct bkt *b, const char *name, const struct bkt_src *s)
{
	return b->ops->put(b, name, s);
}

static inline int ops_get_file(struct bkt *b, const char *name, int fd, unsigned ranges,
			       uint64_t *size, uint32_t *crc)
{
	return b->ops->get_file(b, name, fd, ranges, size, crc);
}

int bkt_put_file(struct bkt *b, const char *name, int fd, uint64_t size, uint32_t crc32c)
{
	struct bkt_src s = { .fd = fd, .buf = NULL, .size = size, .crc32c = crc32c };

	err_clear();
	if (!name_ok(b, name))
		return bad_name(b, "put", name);
	if (fd < 0)
		return done(b, "put", name, -EBADF);
	return done(b, "put", name, ops_put(b, name, &s));
}

int bkt_put_buf(struct bkt *b, const char *name, const void *buf, size_t len)
{
	struct bkt_src s = { .fd = -1, .buf = buf ? buf : "", .size = len,
			     .crc32c = mf_crc32c(0, buf, len) };

	err_clear();
	if (!name_ok(b, name))
		return bad_name(b, "put", name);
	return done(b, "put", name, ops_put(b, name, &s));
}

static int get_file(struct bkt *b, const char *name, int fd, unsigned ranges, uint64_t *size,
		    bool has_crc, uint32_t expect_crc)
{
	uint64_t sz = 0;
	uint32_t crc = 0;
	int rc;

	if (!name_ok(b, name))
		return bad_name(b, "get", name);
	rc = ops_get_file(b, name, fd, ranges ? ranges : 1, &sz, &crc);
	if (rc == 0 && has_crc && crc != expect_crc) {
		bkt_set_error("%s/%s: crc32c %08x, expected %08x", b->url, name, crc, expect_crc);
		log_warn(MOD, "%s", last_err);
		rc = -EBADMSG;
	}
	if (rc == 0 && size)
		*size = sz;
	return done(b, "get", name, rc);
}

int bkt_get_file(struct bkt *b, const char *name, int fd, uint64_t *size, bool has_crc,
		 uint32_t expect_crc)
{
	err_clear();
	return get_file(b, name, fd, (unsigned)b->o.parallelism, size, has_crc, expect_crc);
}

int bkt_get_buf(struct bkt *b, const char *name, size_t max, void **buf, size_t *len)
{
	err_clear();
	*buf = NULL;
	*len = 0;
	if (!name_ok(b, name))
		return bad_name(b, "get", name);
	return done(b, "get", name, b->ops->get_buf(b, name, max, buf, len));
}

int bkt_stat(struct bkt *b, const char *name, uint64_t *size, uint32_t *crc32c)
{
	err_clear();
	if (!name_ok(b, name))
		return bad_name(b, "stat", name);
	return done(b, "stat", name, b->ops->stat(b, name, size, crc32c));
}

int bkt_list_ex(struct bkt *b, const char *prefix, const char *delim,
		int (*cb)(void *arg, const struct bkt_entry *e), void *arg)
{
	err_clear();
	if (!prefix)
		prefix = "";
	if (!prefix_ok(prefix))
		return bad_name(b, "list", prefix);
	if (delim && strcmp(delim, "/")) {
		bkt_set_error("%s: list: only \"/\" is supported as a delimiter", b->url);
		return -EINVAL;
	}
	return done(b, "list", prefix, b->ops->list(b, prefix, delim, cb, arg));
}

struct list_adapter {
	int (*cb)(void *arg, const char *name, bool is_prefix, uint64_t size);
	void *arg;
};

static int list_adapt(void *arg, const struct bkt_entry *e)
{
	struct list_adapter *a = arg;

	return a->cb(a->arg, e->name, e->is_prefix, e->size);
}

int bkt_list(struct bkt *b, const char *prefix, const char *delim,
	     int (*cb)(void *arg, const char *name, bool is_prefix, uint64_t size), void *arg)
{
	struct list_adapter a = { cb, arg };

	return bkt_list_ex(b, prefix, delim, list_adapt, &a);
}

int bkt_delete(struct bkt *b, const char *name)
{
	err_clear();
	if (!name_ok(b, name))
		return bad_name(b, "delete", name);
	return done(b, "delete", name, b->ops->del(b, name));
}

/* ---- parallel transfers: a small pool of threads per call ---- */

struct pool {
	struct bkt *b;
	struct bkt_xfer *x;
	bool get;
	unsigned ranges;            /* ranged GETs per download */
	char first_err[sizeof(last_err)];   /* of the lowest failed index (par_for's lock) */
};

static int open_get_target(struct bkt_xfer *x)
{
	int fd, rc;
	unsigned mode = x->mode ? x->mode : 0644;
	const int fl = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW;

	fd = openat(x->dirfd, x->path, fl, mode);
	if (fd < 0 && errno == ENOENT && strchr(x->path, '/')) {
		char dir[PATH_MAX];
		size_t dl = (size_t)(strrchr(x->path, '/') - x->path);
		if (dl >= sizeof(dir))
			return -ENAMETOOLONG;
		memcpy(dir, x->path, dl);
		dir[dl] = '\0';
		rc = util_mkdirs_at(x->dirfd, dir, 0755);
		if (rc < 0)
			return rc;
		fd = openat(x->dirfd, x->path, fl, mode);
	}
	return fd < 0 ? -errno : fd;
}

static int run_one(struct pool *p, struct bkt_xfer *x)
{
	int fd = x->fd, rc;

	if (fd < 0) {
		if (!x->path || !util_safe_relpath(x->path, strlen(x->path))) {
			bkt_set_error("%s/%s: bad local path", p->b->url, x->name ? x->name : "");
			return -EINVAL;
		}
		fd = p->get ? open_get_target(x)
			    : openat(x->dirfd, x->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
		if (fd < 0) {
			rc = p->get ? fd : -errno;
			bkt_set_error("%s/%s: local file %s: %s", p->b->url, x->name ? x->name : "",
				      x->path, strerror(-rc));
			return rc;
		}
	}
	if (p->get) {
		err_clear();
		rc = get_file(p->b, x->name, fd, p->ranges, &x->size, x->has_crc, x->crc32c);
	} else {
		rc = bkt_put_file(p->b, x->name, fd, x->size, x->crc32c);
	}
	if (fd != x->fd && close(fd) < 0 && rc == 0 && p->get) {
		rc = -errno;
		bkt_set_error("%s/%s: close %s: %s", p->b->url, x->name, x->path, strerror(-rc));
	}
	return rc;
}

static int pool_one(void *arg, size_t i)
{
	struct pool *p = arg;

	err_clear();
	p->x[i].rc = run_one(p, &p->x[i]);
	return p->x[i].rc;
}

/* The lowest failed transfer's error text is the one bkt_last_error() shows. */
static void pool_fail(void *arg, size_t i, int rc)
{
	struct pool *p = arg;

	(void)i;
	(void)rc;
	snprintf(p->first_err, sizeof(p->first_err), "%s", last_err);
}

static int run_pool(struct bkt *b, struct bkt_xfer *x, size_t n, bool get)
{
	struct pool p = { .b = b, .x = x, .get = get };
	size_t par = (size_t)b->o.parallelism, nt;
	int rc;

	err_clear();
	if (n == 0)
		return 0;
	nt = par < n ? par : n;
	/* a few large files may use the spare parallelism as ranges */
	p.ranges = (unsigned)(par / nt);
	/* every transfer runs: callers read each one's rc */
	rc = par_for(n, nt, 0, pool_one, pool_fail, &p, NULL);
	if (rc < 0) {
		snprintf(last_err, sizeof(last_err), "%s", p.first_err);
		return rc;
	}
	err_clear();
	return 0;
}

int bkt_put_files(struct bkt *b, struct bkt_xfer *x, size_t n)
{
	return run_pool(b, x, n, false);
}

int bkt_get_files(struct bkt *b, struct bkt_xfer *x, size_t n)
{
	return run_pool(b, x, n, true);
}
