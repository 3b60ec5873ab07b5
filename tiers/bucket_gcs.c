/* bucket_gcs: the gs:// backend, Cloud Storage's JSON API over libcurl.
 *
 * Uploads (all with ifGenerationMatch=0, so every retry is safe): multipart
 * for in-memory objects up to simple_max (CRC32C in the metadata part),
 * media for files up to simple_max (X-Goog-Hash header), resumable above
 * (CRC32C in the session's metadata, chunks of a 256 KiB multiple; after a
 * broken chunk the persisted offset is asked for with "bytes *\/SIZE" and
 * the upload goes on from there). Downloads: alt=media with Range; a large
 * object comes as parallel ranged GETs pinned to the generation of the first
 * answer, each part resuming from its last byte after a broken connection;
 * the parts' CRC32Cs are combined and checked against x-goog-hash. Bodies
 * stream from/to fds: memory stays bounded by curl's buffers.
 *
 * Retries: 408, 429, 5xx, resets, timeouts, partial bodies; capped
 * exponential backoff with jitter (MTCFS_GCS_RETRY). 401 with a cached token
 * refreshes it once. Threads: any; curl easy handles are kept in a small
 * pool (protected by mu) so connections are reused.
 *
 * This file: small strings, object names and URLs, stat, list, delete,
 * open/close and the ops table. One HTTP attempt: bucket_gcs_http.c; errors
 * and retries: bucket_gcs_retry.c; uploads: bucket_gcs_put.c; downloads:
 * bucket_gcs_get.c; what they share: bucket_gcs_i.h. */
#include "tiers/bucket.h"
#include "tiers/bucket_gcs_i.h"
#include "tiers/gcs_auth.h"
#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

/* ---- small strings ---- */

static void sb_addn(struct sb *s, const char *src, size_t len)
{
	if (s->err)
		return;
	if (s->n + len + 1 > s->cap) {
		size_t nc = s->cap ? s->cap : 128;
		while (nc < s->n + len + 1)
			nc *= 2;
		char *np = realloc(s->p, nc);
		if (!np) {
			s->err = -ENOMEM;
			return;
		}
		s->p = np;
		s->cap = nc;
	}
	memcpy(s->p + s->n, src, len);
	s->n += len;
	s->p[s->n] = '\0';
}

void gcs_sb_add(struct sb *s, const char *src) { sb_addn(s, src, strlen(src)); }

void gcs_sb_addf(struct sb *s, const char *fmt, ...)
{
	char buf[512];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= sizeof(buf)) {
		s->err = -ENAMETOOLONG;
		return;
	}
	sb_addn(s, buf, (size_t)n);
}

/* Percent-encode everything but RFC 3986's unreserved characters. */
static void sb_esc(struct sb *s, const char *src)
{
	static const char hx[] = "0123456789ABCDEF";

	for (; *src; src++) {
		unsigned char c = (unsigned char)*src;
		if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
		    c == '-' || c == '.' || c == '_' || c == '~') {
			sb_addn(s, (const char *)&c, 1);
		} else {
			char e[3] = { '%', hx[c >> 4], hx[c & 15] };
			sb_addn(s, e, 3);
		}
	}
}

static char *sb_take(struct sb *s)
{
	if (s->err) {
		free(s->p);
		return NULL;
	}
	return s->p ? s->p : strdup("");
}

void gcs_crc_b64(uint32_t crc, char out[16])
{
	unsigned char be[4] = { crc >> 24, crc >> 16, crc >> 8, crc };

	EVP_EncodeBlock((unsigned char *)out, be, 4);
}

bool gcs_b64_crc(const char *s, size_t len, uint32_t *crc)
{
	unsigned char raw[8];

	if (len != 8 || EVP_DecodeBlock(raw, (const unsigned char *)s, 8) != 6)
		return false;
	*crc = (uint32_t)raw[0] << 24 | (uint32_t)raw[1] << 16 | (uint32_t)raw[2] << 8 | raw[3];
	return true;
}

/* Checked scanning of header values: a literal, then digits. */
bool gcs_take_lit(const char **s, const char *lit)
{
	size_t n = strlen(lit);

	if (strncmp(*s, lit, n))
		return false;
	*s += n;
	return true;
}

bool gcs_take_num(const char **s, uint64_t *v)
{
	uint64_t x = 0;
	const char *p = *s;

	if (*p < '0' || *p > '9')
		return false;
	for (; *p >= '0' && *p <= '9'; p++) {
		if (x > (UINT64_MAX - 9) / 10)
			return false;
		x = x * 10 + (uint64_t)(*p - '0');
	}
	*s = p;
	*v = x;
	return true;
}

bool gcs_parse_i64(const char *s, int64_t *v)
{
	uint64_t u;

	if (util_parse_u64(s, INT64_MAX, &u) < 0)
		return false;
	*v = (int64_t)u;
	return true;
}

/* ---- names and URLs ---- */

char *gcs_full_name(const struct gcs *g, const char *name)
{
	struct sb s = { 0 };

	gcs_sb_add(&s, g->prefix);
	gcs_sb_add(&s, name);
	return sb_take(&s);
}

char *gcs_what_of(const struct gcs *g, const char *full)
{
	struct sb s = { 0 };

	gcs_sb_addf(&s, "gs://%s/", g->bucket);
	gcs_sb_add(&s, full);
	if (s.n && s.p[s.n - 1] == '/')
		s.p[--s.n] = '\0';
	return sb_take(&s);
}

char *gcs_obj_url(const struct gcs *g, const char *full, const char *query)
{
	struct sb s = { 0 };

	gcs_sb_add(&s, g->endpoint);
	gcs_sb_add(&s, "/storage/v1/b/");
	sb_esc(&s, g->bucket);
	gcs_sb_add(&s, "/o/");
	sb_esc(&s, full);
	if (query) {
		gcs_sb_add(&s, "?");
		gcs_sb_add(&s, query);
	}
	return sb_take(&s);
}

char *gcs_upload_url(const struct gcs *g, const char *type, const char *name)
{
	struct sb s = { 0 };

	gcs_sb_add(&s, g->endpoint);
	gcs_sb_add(&s, "/upload/storage/v1/b/");
	sb_esc(&s, g->bucket);
	gcs_sb_addf(&s, "/o?uploadType=%s", type);
	if (name) {
		gcs_sb_add(&s, "&name=");
		sb_esc(&s, name);
	}
	gcs_sb_add(&s, "&ifGenerationMatch=0");
	return sb_take(&s);
}

/* {"size": "N", "crc32c": "..."} of an object resource */
int gcs_obj_fields(json_t *o, uint64_t *size, bool *has_crc, uint32_t *crc, int64_t *gen)
{
	const char *s = json_string_value(json_object_get(o, "size"));
	const char *c = json_string_value(json_object_get(o, "crc32c"));
	const char *gs = json_string_value(json_object_get(o, "generation"));
	int64_t v;

	if (!s || !gcs_parse_i64(s, &v))
		return -EPROTO;
	*size = (uint64_t)v;
	*has_crc = c && gcs_b64_crc(c, strlen(c), crc);
	if (gen)
		*gen = gs && gcs_parse_i64(gs, &v) ? v : 0;
	return 0;
}

json_t *gcs_parse_json(struct req *r)
{
	json_error_t je;
	json_t *j = r->rbuf ? json_loadb(r->rbuf, r->rlen, 0, &je) : NULL;

	if (!j || !json_is_object(j)) {
		json_decref(j);
		bkt_set_error("%s: the server's answer is not a JSON object", r->what);
		return NULL;
	}
	return j;
}

/* ---- metadata ---- */

int gcs_stat_full(struct gcs *g, const char *full, const char *what, uint64_t *size,
		  bool *has_crc, uint32_t *crc, int64_t gen)
{
	char q[64];
	char *url;
	struct req r;
	json_t *j = NULL;
	int rc;

	snprintf(q, sizeof(q), "generation=%" PRId64, gen);
	url = gcs_obj_url(g, full, gen > 0 ? q : NULL);
	if (!url)
		return -ENOMEM;
	gcs_req_init(&r, g, "GET", url, what, "storage.objects.get");
	rc = gcs_run(&r);
	if (rc == 0 && r.status != 200)
		rc = gcs_http_fail(&r);
	if (rc == 0 && !(j = gcs_parse_json(&r)))
		rc = -EPROTO;
	if (rc == 0 && gcs_obj_fields(j, size, has_crc, crc, NULL) < 0) {
		bkt_set_error("%s: the object resource has no size", what);
		rc = -EPROTO;
	}
	json_decref(j);
	gcs_req_free(&r);
	free(url);
	return rc;
}

static int gcs_stat(struct bkt *b, const char *name, uint64_t *size, uint32_t *crcp)
{
	struct gcs *g = G(b);
	char *full = gcs_full_name(g, name), *what = full ? gcs_what_of(g, full) : NULL;
	uint64_t sz = 0;
	uint32_t crc = 0;
	bool has = false;
	int rc = -ENOMEM;

	if (full && what)
		rc = gcs_stat_full(g, full, what, &sz, &has, &crc, 0);
	if (rc == 0 && crcp && !has) {
		bkt_set_error("%s: the object has no crc32c", what);
		rc = -EPROTO;
	}
	if (rc == 0) {
		if (size)
			*size = sz;
		if (crcp)
			*crcp = crc;
	}
	free(what);
	free(full);
	return rc;
}

/* ---- listing ---- */

struct lent {
	char *name;
	bool is_prefix;
	uint64_t size;
	bool has_crc;
	uint32_t crc;
};

static int lent_cmp(const void *a, const void *b)
{
	return strcmp(((const struct lent *)a)->name, ((const struct lent *)b)->name);
}

static int gcs_list(struct bkt *b, const char *prefix, const char *delim,
		    int (*cb)(void *arg, const struct bkt_entry *e), void *arg)
{
	struct gcs *g = G(b);
	char *full = gcs_full_name(g, prefix), *what = full ? gcs_what_of(g, full) : NULL;
	char *token = NULL, *last = NULL;
	size_t plen = strlen(g->prefix), flen = full ? strlen(full) : 0;
	int rc = 0;

	if (!full || !what) {
		rc = -ENOMEM;
		goto out;
	}
	do {
		struct sb u = { 0 };
		struct req r;
		json_t *j = NULL, *items, *prefs, *v;
		struct lent *ents = NULL;
		size_t n = 0, i;
		const char *next;

		gcs_sb_add(&u, g->endpoint);
		gcs_sb_add(&u, "/storage/v1/b/");
		sb_esc(&u, g->bucket);
		gcs_sb_add(&u, "/o?prefix=");
		sb_esc(&u, full);
		if (delim) {
			gcs_sb_add(&u, "&delimiter=");
			sb_esc(&u, delim);
		}
		gcs_sb_addf(&u, "&maxResults=%u", g->list_page);
		if (token) {
			gcs_sb_add(&u, "&pageToken=");
			sb_esc(&u, token);
		}
		gcs_sb_add(&u, "&fields=");
		sb_esc(&u, "items(name,size,crc32c),prefixes,nextPageToken");
		if (u.err) {
			free(u.p);
			rc = -ENOMEM;
			break;
		}
		gcs_req_init(&r, g, "GET", u.p, what, "storage.objects.list");
		rc = gcs_run(&r);
		if (rc == 0 && r.status != 200)
			rc = gcs_http_fail(&r);
		if (rc == 0 && !(j = gcs_parse_json(&r)))
			rc = -EPROTO;
		gcs_req_free(&r);
		free(u.p);
		if (rc < 0)
			break;
		items = json_object_get(j, "items");
		prefs = json_object_get(j, "prefixes");
		ents = calloc(json_array_size(items) + json_array_size(prefs) + 1, sizeof(*ents));
		if (!ents) {
			rc = -ENOMEM;
			json_decref(j);
			break;
		}
		json_array_foreach(items, i, v) {
			const char *nm = json_string_value(json_object_get(v, "name"));
			int64_t sz = 0;
			/* "dir/" placeholders (the console's folders) are not objects */
			if (!nm || strncmp(nm, full, flen) || !nm[plen] ||
			    nm[strlen(nm) - 1] == '/')
				continue;   /* outside what was asked for: not ours to report */
			ents[n].name = (char *)nm + plen;
			if (!gcs_parse_i64(json_string_value(json_object_get(v, "size")) ?
				       json_string_value(json_object_get(v, "size")) : "", &sz))
				sz = 0;
			ents[n].size = (uint64_t)sz;
			{
				const char *c = json_string_value(json_object_get(v, "crc32c"));
				ents[n].has_crc = c && gcs_b64_crc(c, strlen(c), &ents[n].crc);
			}
			n++;
		}
		json_array_foreach(prefs, i, v) {
			const char *nm = json_string_value(v);
			if (!nm || strncmp(nm, full, flen) || !nm[plen])
				continue;
			ents[n].name = (char *)nm + plen;
			ents[n].is_prefix = true;
			n++;
		}
		/* a page holds the next names in order; merge its two arrays */
		if (n)
			qsort(ents, n, sizeof(*ents), lent_cmp);
		/* pages continue in name order: a page going back is a broken server */
		if (n && last && strcmp(ents[0].name, last) <= 0) {
			bkt_set_error("%s: listing pages out of order (\"%s\" after \"%s\")", what,
				      ents[0].name, last);
			rc = -EPROTO;
		}
		if (n && rc == 0) {
			free(last);
			last = strdup(ents[n - 1].name);
			if (!last)
				rc = -ENOMEM;
		}
		for (i = 0; i < n && rc == 0; i++) {
			struct bkt_entry e = { .name = ents[i].name, .is_prefix = ents[i].is_prefix,
					       .size = ents[i].size, .has_crc = ents[i].has_crc,
					       .crc32c = ents[i].crc };
			rc = cb(arg, &e);
		}
		free(ents);
		next = json_string_value(json_object_get(j, "nextPageToken"));
		if (rc == 0 && next && token && !strcmp(next, token)) {
			bkt_set_error("%s: the server repeats page token \"%s\"", what, next);
			rc = -EPROTO;
		}
		free(token);
		token = NULL;
		if (rc == 0 && next && *next && !(token = strdup(next)))
			rc = -ENOMEM;
		json_decref(j);
	} while (rc == 0 && token);
out:
	free(token);
	free(last);
	free(what);
	free(full);
	return rc;
}

/* ---- delete ---- */

static int gcs_del(struct bkt *b, const char *name)
{
	struct gcs *g = G(b);
	char *full = gcs_full_name(g, name), *what = full ? gcs_what_of(g, full) : NULL;
	char *url = full ? gcs_obj_url(g, full, NULL) : NULL;
	struct req r;
	int rc = -ENOMEM;

	if (!full || !what || !url)
		goto out;
	gcs_req_init(&r, g, "DELETE", url, what, "storage.objects.delete");
	rc = gcs_run(&r);
	if (rc == 0 && r.status == 404 && r.retried)
		rc = 0;                 /* an attempt that timed out did delete it */
	else if (rc == 0 && r.status != 204 && r.status != 200)
		rc = gcs_http_fail(&r);
	gcs_req_free(&r);
out:
	free(url);
	free(what);
	free(full);
	return rc;
}

/* ---- lifecycle ---- */

/* gcs_auth's transport: our requests, without a token */
static int auth_http(void *arg, const char *url, const char *const *hdrs, const char *body,
		     long *status, char **resp, size_t *resp_len, char *err, size_t errlen)
{
	struct gcs *g = arg;
	struct bkt_src src = { .fd = -1, .buf = body, .size = body ? strlen(body) : 0 };
	struct req r;
	int rc;

	gcs_req_init(&r, g, body ? "POST" : "GET", url, url, NULL);
	r.hdrs = hdrs;
	r.no_auth = true;
	r.rmax = 1u << 20;
	if (body) {
		r.has_body = true;
		r.src = &src;
		r.src_len = src.size;
	}
	rc = gcs_run(&r);
	if (rc < 0) {
		snprintf(err, errlen, "%s", bkt_last_error());
	} else {
		*status = r.status;
		*resp = r.rbuf ? r.rbuf : strdup("");
		*resp_len = r.rbuf ? r.rlen : 0;
		r.rbuf = NULL;
		if (!*resp)
			rc = -ENOMEM;
	}
	gcs_req_free(&r);
	return rc;
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init(void) { curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

static void parse_env_triplet(const char *name, unsigned *a, unsigned *b, unsigned *c)
{
	const char *v = getenv(name);
	char buf[96], *s, *e;
	unsigned *dst[3] = { a, b, c };
	unsigned vals[3];
	int i = 0;

	if (!v || !*v)
		return;
	snprintf(buf, sizeof(buf), "%s", v);
	for (s = buf; i < 3 && s; i++, s = e) {
		uint64_t x;
		e = strchr(s, ',');
		if (e)
			*e++ = '\0';
		if (!dst[i])
			break;
		if (util_parse_u64(s, 3600000, &x) < 0) {
			log_warn(MOD, "%s=\"%s\": not N,N[,N]; ignored", name, v);
			return;
		}
		vals[i] = (unsigned)x;
	}
	for (int k = 0; k < i; k++)
		if (dst[k])
			*dst[k] = vals[k];
}

static bool bucket_name_ok(const char *s, size_t n)
{
	if (n < 3 || n > 222)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
		      c == '.'))
			return false;
	}
	return true;
}

/* libcurl reads only its built-in CA file and path (Debian's:
 * /etc/ssl/certs/ca-certificates.crt and /etc/ssl/certs, which the
 * ca-certificates package fills). SSL_CERT_FILE and SSL_CERT_DIR replace
 * them as they do for OpenSSL's defaults and Go (so gcsfuse): a private
 * endpoint's CA without rebuilding the image. */
static int ca_setup(struct gcs *g)
{
	const char *f = getenv("SSL_CERT_FILE"), *d = getenv("SSL_CERT_DIR");
	char *def_f = NULL, *def_d = NULL;
	CURL *h;

	g->ca_file_env = f && *f;
	g->ca_dir_env = d && *d;
	h = curl_easy_init();
#if LIBCURL_VERSION_NUM >= 0x075400     /* CURLINFO_CAINFO/CAPATH: 7.84 */
	if (h) {
		curl_easy_getinfo(h, CURLINFO_CAINFO, &def_f);
		curl_easy_getinfo(h, CURLINFO_CAPATH, &def_d);
	}
#endif
	f = g->ca_file_env ? f : def_f;
	d = g->ca_dir_env ? d : def_d;
	/* a missing CA file fails the handshake even with a good CA path:
	 * with SSL_CERT_DIR alone, an absent built-in bundle is not used */
	if (g->ca_dir_env && !g->ca_file_env && f && access(f, R_OK) != 0)
		f = NULL;
	g->set_cainfo = g->ca_file_env || (g->ca_dir_env && !f);
	g->ca_file = f ? strdup(f) : NULL;
	g->ca_dir = d ? strdup(d) : NULL;
	if (h)
		curl_easy_cleanup(h);
	if ((f && !g->ca_file) || (d && !g->ca_dir))
		return -ENOMEM;
	return 0;
}

static void gcs_close(void *priv);

static int gcs_open(struct bkt *b, const char *loc, void **priv)
{
	const struct bkt_opts *o = bkt_opts_of(b);
	const char *slash = strchr(loc, '/');
	size_t bl = slash ? (size_t)(slash - loc) : strlen(loc);
	const char *emu = getenv("STORAGE_EMULATOR_HOST");
	const char *ep, *key;
	struct gcs *g;
	struct gcs_auth_cfg ac = { 0 };
	struct sb s = { 0 };
	char err[512] = "";
	unsigned conn_ms = DEF_CONNECT_MS, stall = DEF_STALL_S;
	int rc;

	if (!bucket_name_ok(loc, bl)) {
		bkt_set_error("%s: \"%.*s\" is not a bucket name", bkt_url(b), (int)bl, loc);
		return -EINVAL;
	}
	pthread_once(&curl_once, curl_init);
	if (curl_init_rc != CURLE_OK) {
		bkt_set_error("%s: curl_global_init failed", bkt_url(b));
		return -EIO;
	}
	g = calloc(1, sizeof(*g));
	if (!g)
		return -ENOMEM;
	pthread_mutex_init(&g->mu, NULL);
	g->b = b;
	g->bucket = strndup(loc, bl);
	/* the prefix, without leading/trailing '/', then one '/' appended */
	if (slash) {
		const char *p = slash;
		size_t pl;
		while (*p == '/')
			p++;
		pl = strlen(p);
		while (pl && p[pl - 1] == '/')
			pl--;
		if (pl) {
			if (!util_safe_relpath(p, pl)) {
				bkt_set_error("%s: bad prefix", bkt_url(b));
				rc = -EINVAL;
				goto fail;
			}
			sb_addn(&s, p, pl);
			gcs_sb_add(&s, "/");
		}
	}
	g->prefix = sb_take(&s);
	if (g->prefix)
		bkt_name_prefix(b, strlen(g->prefix));
	ep = o->gcs_endpoint ? o->gcs_endpoint : (emu && *emu ? emu : DEF_ENDPOINT);
	memset(&s, 0, sizeof(s));
	if (!strstr(ep, "://"))
		gcs_sb_add(&s, "http://");        /* STORAGE_EMULATOR_HOST=host:port */
	gcs_sb_add(&s, ep);
	while (s.n && s.p[s.n - 1] == '/')
		s.p[--s.n] = '\0';
	g->endpoint = sb_take(&s);
	if (!g->bucket || !g->prefix || !g->endpoint) {
		rc = -ENOMEM;
		goto fail;
	}
	rc = ca_setup(g);
	if (rc < 0)
		goto fail;
	g->base_ms = DEF_BASE_MS;
	g->cap_ms = DEF_CAP_MS;
	g->attempts = DEF_ATTEMPTS;
	parse_env_triplet("MTCFS_GCS_RETRY", &g->base_ms, &g->cap_ms, &g->attempts);
	if (!g->attempts)
		g->attempts = 1;
	parse_env_triplet("MTCFS_GCS_TIMEOUTS", &conn_ms, &stall, NULL);
	g->connect_ms = conn_ms ? conn_ms : DEF_CONNECT_MS;
	g->stall_s = stall ? stall : DEF_STALL_S;
	g->simple_max = o->simple_max;
	g->chunk = o->chunk;
	g->part = o->part;
	g->list_page = o->list_page;

	key = o->gcs_key_file ? o->gcs_key_file : getenv("GOOGLE_APPLICATION_CREDENTIALS");
	if (emu && *emu)
		ac.kind = GCS_AUTH_NONE;
	else if (key && *key)
		ac.kind = GCS_AUTH_KEY;
	else
		ac.kind = GCS_AUTH_METADATA;
	ac.key_file = key;
	ac.metadata_host = o->metadata_host ? o->metadata_host : getenv("GCE_METADATA_HOST");
	ac.http = auth_http;
	ac.http_arg = g;
	rc = gcs_auth_new(&ac, &g->auth, err, sizeof(err));
	if (rc < 0) {
		bkt_set_error("%s: credentials: %s", bkt_url(b), err[0] ? err : strerror(-rc));
		goto fail;
	}
	if (!strncmp(g->endpoint, "https://", 8))
		snprintf(err, sizeof(err), ", CA file %s%s, CA path %s%s",
			 g->ca_file ? g->ca_file : "none", g->ca_file_env ? " (SSL_CERT_FILE)" : "",
			 g->ca_dir ? g->ca_dir : "none", g->ca_dir_env ? " (SSL_CERT_DIR)" : "");
	else
		err[0] = '\0';
	log_info(MOD, "%s: endpoint %s%s, credentials: %s, retry %u ms..%u ms x%u", bkt_url(b),
		 g->endpoint, err, gcs_auth_describe(g->auth), g->base_ms, g->cap_ms, g->attempts);
	*priv = g;
	return 0;
fail:
	gcs_close(g);
	return rc;
}

static void gcs_close(void *priv)
{
	struct gcs *g = priv;

	for (unsigned i = 0; i < g->nidle; i++)
		curl_easy_cleanup(g->idle[i]);
	gcs_auth_free(g->auth);
	pthread_mutex_destroy(&g->mu);
	free(g->bucket);
	free(g->prefix);
	free(g->endpoint);
	free(g->ca_file);
	free(g->ca_dir);
	free(g);
}

const struct bkt_ops bkt_gcs_ops = {
	.scheme   = "gs",
	.open     = gcs_open,
	.close    = gcs_close,
	.put      = gcs_put,
	.get_file = gcs_get_file,
	.get_buf  = gcs_get_buf,
	.stat     = gcs_stat,
	.list     = gcs_list,
	.del      = gcs_del,
};
