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
 * pool (protected by mu) so connections are reused. */
#include "tiers/bucket.h"
#include "tiers/gcs_auth.h"
#include "common/log.h"
#include "common/sigpipe.h"
#include "common/util.h"
#include "tiers/manifest.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>
#include <openssl/evp.h>

#define MOD "gcs"
#define DEF_ENDPOINT    "https://storage.googleapis.com"
#define USER_AGENT      "mtcfs/0.1"
#define IDLE_MAX        64
#define JSON_MAX        (32u << 20)     /* a listing page or object resource */
#define DEF_BASE_MS     100
#define DEF_CAP_MS      5000
#define DEF_ATTEMPTS    10
#define DEF_CONNECT_MS  10000
#define DEF_STALL_S     60
#define MAX_RESTARTS    2               /* resumable sessions lost (404/410) */
#define ROLE_HINT       "roles/storage.objectUser"
#define AUTH_LOG_EVERY_NS (60ull * 1000000000ull)   /* 401/403 at ERROR once a minute */

struct gcs {
	struct bkt *b;
	char *bucket;
	char *prefix;              /* "" or "dir/sub/" */
	char *endpoint;            /* no trailing '/' */
	char *ca_file, *ca_dir;    /* the CA bundle and hashed dir in use, for messages */
	bool ca_file_env, ca_dir_env;  /* from SSL_CERT_FILE / SSL_CERT_DIR */
	bool set_cainfo;           /* CURLOPT_CAINFO = ca_file (NULL: none) per handle */
	struct gcs_auth *auth;
	unsigned base_ms, cap_ms, attempts;
	long connect_ms, stall_s;
	uint64_t simple_max, chunk, part;
	unsigned list_page;
	_Atomic uint64_t refusal_logged_ns[2];   /* last 401, 403 logged at ERROR */
	pthread_mutex_t mu;        /* protects idle[], nidle */
	CURL *idle[IDLE_MAX];
	unsigned nidle;
};

static struct gcs *G(struct bkt *b) { return bkt_priv(b); }

/* ---- small strings ---- */

struct sb { char *p; size_t n, cap; int err; };

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

static void sb_add(struct sb *s, const char *src) { sb_addn(s, src, strlen(src)); }

static void sb_addf(struct sb *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_addf(struct sb *s, const char *fmt, ...)
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

static void crc_b64(uint32_t crc, char out[16])
{
	unsigned char be[4] = { crc >> 24, crc >> 16, crc >> 8, crc };

	EVP_EncodeBlock((unsigned char *)out, be, 4);
}

static bool b64_crc(const char *s, size_t len, uint32_t *crc)
{
	unsigned char raw[8];

	if (len != 8 || EVP_DecodeBlock(raw, (const unsigned char *)s, 8) != 6)
		return false;
	*crc = (uint32_t)raw[0] << 24 | (uint32_t)raw[1] << 16 | (uint32_t)raw[2] << 8 | raw[3];
	return true;
}

/* Checked scanning of header values: a literal, then digits. */
static bool take_lit(const char **s, const char *lit)
{
	size_t n = strlen(lit);

	if (strncmp(*s, lit, n))
		return false;
	*s += n;
	return true;
}

static bool take_num(const char **s, uint64_t *v)
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

static bool parse_i64(const char *s, int64_t *v)
{
	uint64_t u;

	if (util_parse_u64(s, INT64_MAX, &u) < 0)
		return false;
	*v = (int64_t)u;
	return true;
}

/* ---- the error space ---- */

static int gcs_errno(CURLcode cc, long status)
{
	switch (cc) {
	case CURLE_OK:
		break;
	case CURLE_COULDNT_RESOLVE_HOST:
	case CURLE_COULDNT_RESOLVE_PROXY:
		return -EHOSTUNREACH;
	case CURLE_COULDNT_CONNECT:
		return -ECONNREFUSED;
	case CURLE_OPERATION_TIMEDOUT:
		return -ETIMEDOUT;
	case CURLE_SEND_ERROR:
	case CURLE_RECV_ERROR:
	case CURLE_GOT_NOTHING:
	case CURLE_PARTIAL_FILE:
	case CURLE_SEND_FAIL_REWIND:
		return -ECONNRESET;
	case CURLE_SSL_CONNECT_ERROR:
	case CURLE_PEER_FAILED_VERIFICATION:
	case CURLE_SSL_CACERT_BADFILE:
	case CURLE_WEIRD_SERVER_REPLY:
		return -EPROTO;
	case CURLE_OUT_OF_MEMORY:
		return -ENOMEM;
	case CURLE_URL_MALFORMAT:
	case CURLE_UNSUPPORTED_PROTOCOL:
		return -EINVAL;
	default:
		return -EIO;
	}
	if (status >= 200 && status < 300)
		return 0;
	switch (status) {
	case 400: return -EINVAL;
	case 401:
	case 403: return -EACCES;
	case 404:
	case 410: return -ENOENT;
	case 408: return -ETIMEDOUT;
	case 409:
	case 412: return -EEXIST;
	case 413: return -EFBIG;
	case 416: return -ERANGE;
	case 429: return -EAGAIN;
	default:  return status >= 500 ? -EIO : -EPROTO;
	}
}

static bool curl_retryable(CURLcode cc)
{
	switch (cc) {
	case CURLE_COULDNT_RESOLVE_HOST:
	case CURLE_COULDNT_CONNECT:
	case CURLE_OPERATION_TIMEDOUT:
	case CURLE_SEND_ERROR:
	case CURLE_RECV_ERROR:
	case CURLE_GOT_NOTHING:
	case CURLE_PARTIAL_FILE:
	case CURLE_SSL_CONNECT_ERROR:
	case CURLE_WEIRD_SERVER_REPLY:
	case CURLE_HTTP2:
	case CURLE_HTTP2_STREAM:
	case CURLE_SEND_FAIL_REWIND:    /* a chunk that curl may not re-send itself */
		return true;
	default:
		return false;
	}
}

static bool status_retryable(long s)
{
	return s == 408 || s == 429 || s >= 500;
}

static const char *reason(long s)
{
	switch (s) {
	case 400: return "Bad Request";
	case 401: return "Unauthorized";
	case 403: return "Forbidden";
	case 404: return "Not Found";
	case 408: return "Request Timeout";
	case 410: return "Gone";
	case 412: return "Precondition Failed";
	case 413: return "Payload Too Large";
	case 416: return "Range Not Satisfiable";
	case 429: return "Too Many Requests";
	case 500: return "Internal Server Error";
	case 502: return "Bad Gateway";
	case 503: return "Service Unavailable";
	case 504: return "Gateway Timeout";
	default:  return "HTTP error";
	}
}

/* ---- one request ---- */

struct req {
	struct gcs *g;
	const char *method;         /* GET, POST, PUT, DELETE */
	const char *url;            /* without the generation pin */
	const char *what;           /* "gs://b/p/name" for messages */
	const char *perm;           /* the permission it needs, for 401/403 */
	const char *const *hdrs;    /* extra "Name: value", NULL-terminated, or NULL */
	bool no_auth;               /* token and metadata requests */
	bool no_rewind;             /* resumable chunks: never re-sent by curl itself */
	bool rewound;               /* curl re-sent the body on a fresh connection */
	unsigned max_attempts;      /* 0: the handle's */
	/* body: pre + src[src_off, src_off + src_len) + post */
	bool has_body;
	const char *pre, *post;
	size_t pre_len, post_len;
	const struct bkt_src *src;
	uint64_t src_off, src_len;
	uint64_t body_pos;
	/* media response: into sink_fd, else into mbuf (at most mmax bytes) */
	bool media;
	int64_t rstart, rend;       /* wanted range; rstart < 0: none; rend < 0: to the end */
	int64_t pin_gen;            /* > 0: &generation= */
	int sink_fd;
	bool sink_seek;
	uint64_t got;               /* media bytes taken, over all attempts */
	uint32_t crc;               /* their CRC32C */
	char *mbuf;
	size_t mmax;
	/* per attempt */
	uint64_t att_start;         /* absolute offset this attempt asked for */
	uint64_t wpos;              /* next offset to pwrite in the sink */
	bool first_write;
	long status;
	char *rbuf;                 /* non-media and error bodies */
	size_t rlen, rcap, rmax;
	char location[2048], range[128], retry_after[32];
	bool has_hash;
	uint32_t hash_crc;
	int64_t generation;
	int64_t cr_start, cr_total;
	int cb_err;
	char cb_msg[256];
	char errbuf[CURL_ERROR_SIZE];
	/* outcome */
	bool retried;               /* an earlier attempt may have reached the server */
	bool retryable_fail;        /* the final failure was of a retryable kind */
};

static void req_init(struct req *r, struct gcs *g, const char *method, const char *url,
		     const char *what, const char *perm)
{
	memset(r, 0, sizeof(*r));
	r->g = g;
	r->method = method;
	r->url = url;
	r->what = what;
	r->perm = perm;
	r->sink_fd = -1;
	r->rstart = -1;
	r->rend = -1;
	r->rmax = JSON_MAX;
}

static void req_free(struct req *r)
{
	free(r->rbuf);
	free(r->mbuf);
	r->rbuf = r->mbuf = NULL;
}

static CURL *handle_get(struct gcs *g)
{
	CURL *h = NULL;

	pthread_mutex_lock(&g->mu);
	if (g->nidle)
		h = g->idle[--g->nidle];
	pthread_mutex_unlock(&g->mu);
	if (h)
		curl_easy_reset(h);
	else
		h = curl_easy_init();
	return h;
}

static void handle_put(struct gcs *g, CURL *h)
{
	pthread_mutex_lock(&g->mu);
	if (g->nidle < IDLE_MAX) {
		g->idle[g->nidle++] = h;
		h = NULL;
	}
	pthread_mutex_unlock(&g->mu);
	if (h)
		curl_easy_cleanup(h);
}

static size_t read_cb(char *buf, size_t size, size_t nmemb, void *arg)
{
	struct req *r = arg;
	size_t want = size * nmemb, n = 0;

	while (n < want) {
		uint64_t pos = r->body_pos;
		size_t take;

		if (pos < r->pre_len) {
			take = r->pre_len - (size_t)pos < want - n ? r->pre_len - (size_t)pos : want - n;
			memcpy(buf + n, r->pre + pos, take);
		} else if (pos - r->pre_len < r->src_len) {
			uint64_t so = pos - r->pre_len;
			take = r->src_len - so < want - n ? (size_t)(r->src_len - so) : want - n;
			if (r->src->fd >= 0) {
				ssize_t got = pread(r->src->fd, buf + n, take, (off_t)(r->src_off + so));
				if (got < 0 && errno == EINTR)
					continue;
				if (got <= 0) {
					r->cb_err = got < 0 ? -errno : -EIO;
					snprintf(r->cb_msg, sizeof(r->cb_msg), "reading the local data at %" PRIu64
						 ": %s", r->src_off + so,
						 got < 0 ? strerror(errno) : "file is shorter than its size");
					return CURL_READFUNC_ABORT;
				}
				take = (size_t)got;
			} else {
				memcpy(buf + n, (const char *)r->src->buf + r->src_off + so, take);
			}
		} else if (pos - r->pre_len - r->src_len < r->post_len) {
			size_t po = (size_t)(pos - r->pre_len - r->src_len);
			take = r->post_len - po < want - n ? r->post_len - po : want - n;
			memcpy(buf + n, r->post + po, take);
		} else {
			break;
		}
		n += take;
		r->body_pos += take;
	}
	return n;
}

/* curl rewinds the body to re-send it on a fresh connection when a reused
 * one died before answering: that attempt may have reached the server. A
 * resumable chunk refuses, so that its retry goes through the status query. */
static int seek_cb(void *arg, curl_off_t off, int origin)
{
	struct req *r = arg;

	if (origin != SEEK_SET || off < 0 || r->no_rewind)
		return CURL_SEEKFUNC_CANTSEEK;
	r->body_pos = (uint64_t)off;
	r->rewound = true;
	return CURL_SEEKFUNC_OK;
}

static int sink_write(struct req *r, const char *p, size_t len)
{
	if (r->sink_seek) {
		/* the file was truncated before the download: zeros stay holes */
		int rc = bkt_pwrite_sparse(r->sink_fd, p, len, r->wpos);
		if (rc == 0)
			r->wpos += len;
		return rc;
	}
	while (len > 0) {
		ssize_t w = write(r->sink_fd, p, len);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		p += w;
		len -= (size_t)w;
		r->wpos += (uint64_t)w;
	}
	return 0;
}

static size_t write_cb(char *p, size_t size, size_t nmemb, void *arg)
{
	struct req *r = arg;
	size_t len = size * nmemb;

	if (r->media && (r->status == 200 || r->status == 206)) {
		if (r->first_write) {
			r->first_write = false;
			if (r->status == 200 && r->att_start == 0)
				r->rend = -1;   /* the whole object comes, whatever was asked */
			/* a 200 to a ranged request that does not start at 0 would
			 * put the object's first bytes at the wrong offset */
			if ((r->status == 200 && r->att_start > 0) ||
			    (r->status == 206 && r->cr_start != (int64_t)r->att_start)) {
				r->cb_err = -EPROTO;
				snprintf(r->cb_msg, sizeof(r->cb_msg), "asked for bytes from %" PRIu64
					 ", got a %ld answer from %" PRId64, r->att_start, r->status,
					 r->status == 206 ? r->cr_start : 0);
				return 0;
			}
		}
		if (r->rend >= 0 && r->rstart + (int64_t)r->got + (int64_t)len > r->rend + 1) {
			r->cb_err = -EPROTO;
			snprintf(r->cb_msg, sizeof(r->cb_msg), "more bytes than the range asked for");
			return 0;
		}
		if (r->sink_fd >= 0) {
			int rc = sink_write(r, p, len);
			if (rc < 0) {
				r->cb_err = rc;
				snprintf(r->cb_msg, sizeof(r->cb_msg), "writing the local file: %s",
					 strerror(-rc));
				return 0;
			}
		} else {
			if (r->got + len > r->mmax) {
				r->cb_err = -EFBIG;
				snprintf(r->cb_msg, sizeof(r->cb_msg), "larger than the %zu bytes allowed",
					 r->mmax);
				return 0;
			}
			if (!r->mbuf) {
				r->mbuf = malloc(r->mmax + 1);
				if (!r->mbuf) {
					r->cb_err = -ENOMEM;
					return 0;
				}
			}
			memcpy(r->mbuf + r->got, p, len);
		}
		r->crc = mf_crc32c(r->crc, p, len);
		r->got += len;
		return len;
	}
	/* JSON and error bodies: keep what fits (errors are only quoted) */
	if (r->rlen + len > r->rmax) {
		if (r->status >= 200 && r->status < 300) {
			r->cb_err = -EFBIG;
			snprintf(r->cb_msg, sizeof(r->cb_msg), "response larger than %zu bytes", r->rmax);
			return 0;
		}
		len = r->rlen < r->rmax ? r->rmax - r->rlen : 0;
		if (!len)
			return size * nmemb;
	}
	if (r->rlen + len + 1 > r->rcap) {
		size_t nc = r->rcap ? r->rcap : 4096;
		while (nc < r->rlen + len + 1)
			nc *= 2;
		char *np = realloc(r->rbuf, nc);
		if (!np) {
			r->cb_err = -ENOMEM;
			return 0;
		}
		r->rbuf = np;
		r->rcap = nc;
	}
	memcpy(r->rbuf + r->rlen, p, len);
	r->rlen += len;
	r->rbuf[r->rlen] = '\0';
	return size * nmemb;
}

static bool hdr_is(const char *line, size_t len, const char *name, const char **val, size_t *vlen)
{
	size_t nl = strlen(name);

	if (len <= nl || strncasecmp(line, name, nl) || line[nl] != ':')
		return false;
	line += nl + 1;
	len -= nl + 1;
	while (len && (*line == ' ' || *line == '\t')) {
		line++;
		len--;
	}
	while (len && (line[len - 1] == '\r' || line[len - 1] == '\n' || line[len - 1] == ' '))
		len--;
	*val = line;
	*vlen = len;
	return true;
}

static void copy_hdr(char *dst, size_t dlen, const char *v, size_t vl)
{
	if (vl >= dlen)
		vl = dlen - 1;
	memcpy(dst, v, vl);
	dst[vl] = '\0';
}

static size_t header_cb(char *p, size_t size, size_t nmemb, void *arg)
{
	struct req *r = arg;
	size_t len = size * nmemb, vl;
	const char *v;
	char tmp[160];

	if (len > 5 && !strncmp(p, "HTTP/", 5)) {
		/* a new response (after 100 Continue too): forget the last one's headers */
		const char *sp;
		uint64_t code = 0;
		copy_hdr(tmp, sizeof(tmp), p, len);
		sp = strchr(tmp, ' ');
		r->status = sp && (sp++, take_num(&sp, &code)) && code < 1000 ? (long)code : 0;
		r->location[0] = r->range[0] = r->retry_after[0] = '\0';
		r->has_hash = false;
		r->cr_start = -1;
		r->cr_total = -1;
		return len;
	}
	if (hdr_is(p, len, "location", &v, &vl)) {
		copy_hdr(r->location, sizeof(r->location), v, vl);
	} else if (hdr_is(p, len, "range", &v, &vl)) {
		copy_hdr(r->range, sizeof(r->range), v, vl);
	} else if (hdr_is(p, len, "retry-after", &v, &vl)) {
		copy_hdr(r->retry_after, sizeof(r->retry_after), v, vl);
	} else if (hdr_is(p, len, "x-goog-generation", &v, &vl)) {
		copy_hdr(tmp, sizeof(tmp), v, vl);
		if (!parse_i64(tmp, &r->generation))
			r->generation = 0;
	} else if (hdr_is(p, len, "content-range", &v, &vl)) {
		/* "bytes S-E/T" */
		const char *c = tmp;
		uint64_t s, e, t;
		copy_hdr(tmp, sizeof(tmp), v, vl);
		if (take_lit(&c, "bytes ") && take_num(&c, &s) && take_lit(&c, "-") &&
		    take_num(&c, &e) && take_lit(&c, "/") && take_num(&c, &t) && !*c &&
		    s <= e && e < t && t <= INT64_MAX) {
			r->cr_start = (int64_t)s;
			r->cr_total = (int64_t)t;
		}
	} else if (hdr_is(p, len, "x-goog-hash", &v, &vl)) {
		/* "crc32c=XXXXXX==,md5=..." (possibly several headers) */
		for (size_t i = 0; i + 7 <= vl; i++) {
			if (!strncmp(v + i, "crc32c=", 7) && (i == 0 || v[i - 1] == ',' || v[i - 1] == ' ')) {
				size_t s = i + 7, e = s;
				while (e < vl && v[e] != ',')
					e++;
				if (b64_crc(v + s, e - s, &r->hash_crc))
					r->has_hash = true;
				break;
			}
		}
	}
	return len;
}


/* One attempt. 0 with *cc (and r->status when *cc is CURLE_OK), or -errno
 * when it could not start (no token: words already set). tok receives the
 * access token used ("" if none). */
static int attempt(struct req *r, char *tok, CURLcode *cc)
{
	struct gcs *g = r->g;
	struct curl_slist *hl = NULL, *t;
	struct sb url = { 0 }, hv = { 0 };
	CURL *h = NULL;
	uint64_t total = r->pre_len + r->src_len + r->post_len;
	int rc = 0;

	tok[0] = '\0';
	if (!r->no_auth && g->auth) {
		char err[768];
		rc = gcs_auth_token(g->auth, tok, GCS_TOKEN_MAX, err, sizeof(err));
		if (rc < 0) {
			bkt_set_error("%s: no access token for gs://%s: %s", r->what, g->bucket, err);
			return rc;
		}
	}
	sb_add(&url, r->url);
	if (r->pin_gen > 0)
		sb_addf(&url, "%cgeneration=%" PRId64, strchr(r->url, '?') ? '&' : '?', r->pin_gen);
	for (size_t i = 0; r->hdrs && r->hdrs[i]; i++) {
		t = curl_slist_append(hl, r->hdrs[i]);
		if (!t)
			goto nomem;
		hl = t;
	}
	if (!(t = curl_slist_append(hl, "Expect:")))
		goto nomem;
	hl = t;
	if (tok[0]) {
		sb_add(&hv, "Authorization: Bearer ");
		sb_add(&hv, tok);
		if (hv.err || !(t = curl_slist_append(hl, hv.p)))
			goto nomem;
		hl = t;
		OPENSSL_cleanse(hv.p, hv.n);
	}
	r->att_start = 0;
	if (r->media && (r->rstart >= 0 || r->got > 0)) {
		char rh[96];
		r->att_start = (uint64_t)(r->rstart > 0 ? r->rstart : 0) + r->got;
		if (r->rend >= 0)
			snprintf(rh, sizeof(rh), "Range: bytes=%" PRIu64 "-%" PRId64, r->att_start, r->rend);
		else
			snprintf(rh, sizeof(rh), "Range: bytes=%" PRIu64 "-", r->att_start);
		if (!(t = curl_slist_append(hl, rh)))
			goto nomem;
		hl = t;
	}
	r->wpos = r->att_start;
	if (url.err)
		goto nomem;
	h = handle_get(g);
	if (!h)
		goto nomem;
	r->status = 0;
	r->rlen = 0;
	r->cb_err = 0;
	r->cb_msg[0] = r->errbuf[0] = '\0';
	r->first_write = true;
	r->body_pos = 0;
	r->cr_start = r->cr_total = -1;
	r->has_hash = false;
	curl_easy_setopt(h, CURLOPT_URL, url.p);
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
	if (g->set_cainfo)
		curl_easy_setopt(h, CURLOPT_CAINFO, g->ca_file);
	if (g->ca_dir_env)
		curl_easy_setopt(h, CURLOPT_CAPATH, g->ca_dir);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_USERAGENT, USER_AGENT);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, g->connect_ms);
	curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
	curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, g->stall_s);
	curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
	curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 512L * 1024);
	curl_easy_setopt(h, CURLOPT_UPLOAD_BUFFERSIZE, 1024L * 1024);
	curl_easy_setopt(h, CURLOPT_ERRORBUFFER, r->errbuf);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, write_cb);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
	curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, header_cb);
	curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
	if (!strcmp(r->method, "POST")) {
		curl_easy_setopt(h, CURLOPT_POST, 1L);
		curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)total);
	} else if (!strcmp(r->method, "PUT")) {
		curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
		curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)total);
	} else if (strcmp(r->method, "GET")) {
		curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, r->method);
	}
	if (r->has_body) {
		curl_easy_setopt(h, CURLOPT_READFUNCTION, read_cb);
		curl_easy_setopt(h, CURLOPT_READDATA, r);
		curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, seek_cb);
		curl_easy_setopt(h, CURLOPT_SEEKDATA, r);
	}
	{
		struct sigpipe_guard sg;
		sigpipe_block(&sg);
		*cc = curl_easy_perform(h);
		sigpipe_restore(&sg);
	}
	if (*cc == CURLE_OK) {
		long code = 0;
		curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
		r->status = code;
	}
	handle_put(g, h);
	goto out;
nomem:
	rc = -ENOMEM;
out:
	curl_slist_free_all(hl);
	free(url.p);
	if (hv.p)
		OPENSSL_cleanse(hv.p, hv.n);
	free(hv.p);
	return rc;
}

/* What to do about a certificate failure: libcurl's own words say what
 * failed, not with which CA certificates nor how to supply them. */
static void tls_hint(const struct gcs *g, CURLcode cc, char *buf, size_t n)
{
	buf[0] = '\0';
	if (cc == CURLE_SSL_CACERT_BADFILE)
		snprintf(buf, n, " (no CA certificates to verify %s with: install ca-certificates, "
			 "or name a PEM bundle in SSL_CERT_FILE)", g->endpoint);
	else if (cc == CURLE_PEER_FAILED_VERIFICATION)
		snprintf(buf, n, " (verified with CA file %s, CA path %s)",
			 g->ca_file ? g->ca_file : "none", g->ca_dir ? g->ca_dir : "none");
}

static uint64_t rng_next(void)
{
	static __thread uint64_t s;

	if (!s)
		s = util_now_ns() ^ ((uint64_t)(uintptr_t)&s << 17) ^ 0x9e3779b97f4a7c15ull;
	s ^= s << 13;
	s ^= s >> 7;
	s ^= s << 17;
	return s;
}

/* Capped exponential backoff with "equal jitter": [d/2, d]. */
static unsigned backoff_ms(const struct gcs *g, unsigned attempt, const char *retry_after)
{
	uint64_t d = g->base_ms;
	uint64_t ra = 0;

	for (unsigned i = 1; i < attempt && d < g->cap_ms; i++)
		d *= 2;
	if (d > g->cap_ms)
		d = g->cap_ms;
	if (d > 1)
		d = d / 2 + rng_next() % (d / 2 + 1);
	if (retry_after && *retry_after && util_parse_u64(retry_after, 3600, &ra) == 0 &&
	    ra * 1000 > d)
		d = ra * 1000 < g->cap_ms ? ra * 1000 : g->cap_ms;
	return (unsigned)d;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* The request with retries. 0 when a final answer arrived (r->status; the
 * caller judges it), or -errno (words set) when none did. */
static int run(struct req *r)
{
	struct gcs *g = r->g;
	unsigned max = r->max_attempts ? r->max_attempts : g->attempts;
	unsigned n = 0;
	bool reauthed = false;
	char tok[GCS_TOKEN_MAX];
	char why[CURL_ERROR_SIZE + 64];
	int rc = 0;

	r->retryable_fail = false;
	for (;;) {
		CURLcode cc = CURLE_OK;
		uint64_t got0 = r->got;

		r->rewound = false;
		rc = attempt(r, tok, &cc);
		if (rc < 0)
			break;
		if (r->rewound && strcmp(r->method, "GET"))
			r->retried = true;
		n++;
		if (cc == CURLE_OK && r->status == 401 && tok[0] && !reauthed) {
			/* the cached token may have been revoked or expired early */
			gcs_auth_invalidate(g->auth, tok);
			reauthed = true;
			n--;
			continue;
		}
		if (cc == CURLE_OK && !status_retryable(r->status)) {
			rc = 0;
			break;
		}
		if (cc != CURLE_OK && r->cb_err) {
			rc = r->cb_err;
			bkt_set_error("%s: %s", r->what, r->cb_msg[0] ? r->cb_msg : strerror(-rc));
			break;
		}
		if (cc != CURLE_OK && !curl_retryable(cc)) {
			char hint[1024];
			rc = gcs_errno(cc, 0);
			tls_hint(g, cc, hint, sizeof(hint));
			bkt_set_error("%s: %s %s: %s%s", r->what, r->method, g->endpoint,
				      r->errbuf[0] ? r->errbuf : curl_easy_strerror(cc), hint);
			break;
		}
		if (cc == CURLE_OK)
			snprintf(why, sizeof(why), "%ld %s", r->status, reason(r->status));
		else
			snprintf(why, sizeof(why), "%s", r->errbuf[0] ? r->errbuf : curl_easy_strerror(cc));
		if (strcmp(r->method, "GET"))
			r->retried = true;
		if (r->media && r->generation > 0 && !r->pin_gen)
			r->pin_gen = r->generation;     /* resume the same bytes */
		if (r->got > got0)
			n = 1;                          /* progress: a fresh budget */
		if (n >= max) {
			rc = cc != CURLE_OK ? gcs_errno(cc, 0) : gcs_errno(CURLE_OK, r->status);
			r->retryable_fail = true;
			if (max > 1)
				bkt_set_error("%s: %s: %s (gave up after %u attempts)", r->what, r->method,
					      why, n);
			else
				bkt_set_error("%s: %s: %s", r->what, r->method, why);
			if (max > 1)
				log_warn(MOD, "%s", bkt_last_error());
			break;
		}
		{
			unsigned d = backoff_ms(g, n, cc == CURLE_OK ? r->retry_after : NULL);
			log_info(MOD, "%s %s: %s; retry %u of %u in %u ms", r->method, r->what, why, n,
				 max - 1, d);
			sleep_ms(d);
		}
	}
	return rc;
}

/* A refusal is logged at WARN, then at DEBUG for a minute: a parallel
 * upload of a thousand files must not log a thousand times. A WARN, not an
 * ERROR: the text is bkt_last_error(), which the caller reports as the one
 * ERROR of the failed backup or restore. */
static void log_refusal(struct gcs *g, long status)
{
	_Atomic uint64_t *t = &g->refusal_logged_ns[status == 403];
	uint64_t now = util_now_ns(), last = atomic_load(t);

	if ((!last || now - last >= AUTH_LOG_EVERY_NS) && atomic_compare_exchange_strong(t, &last, now))
		log_warn(MOD, "%s", bkt_last_error());
	else
		log_dbg(MOD, "%s", bkt_last_error());
}

/* Words for a final non-2xx answer; returns its errno. */
static int http_fail(struct req *r)
{
	struct gcs *g = r->g;
	long s = r->status;
	char msg[400] = "", perm[96];
	const char *m = NULL;
	json_t *j = NULL;

	if (r->rbuf && r->rlen) {
		j = json_loadb(r->rbuf, r->rlen, 0, NULL);
		m = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
		if (!m)
			m = json_string_value(json_object_get(j, "error_description"));
		snprintf(msg, sizeof(msg), "%s", m ? m : r->rbuf);
		for (char *c = msg; *c; c++)
			if ((unsigned char)*c < 0x20)
				*c = ' ';
	}
	json_decref(j);
	snprintf(perm, sizeof(perm), "%s", r->perm ? r->perm : "storage.objects.get");
	{
		/* the server names the permission: "Permission 'storage.objects.create' denied" */
		const char *p = strstr(msg, "Permission '");
		if (p) {
			const char *e = strchr(p + 12, '\'');
			if (e && (size_t)(e - p - 12) < sizeof(perm)) {
				memcpy(perm, p + 12, (size_t)(e - p - 12));
				perm[e - p - 12] = '\0';
			}
		}
	}
	if (s == 403) {
		bkt_set_error("%s: 403 Forbidden: the caller lacks %s (grant %s on gs://%s) "
			      "[credentials: %s; server: %s]", r->what, perm, ROLE_HINT, g->bucket,
			      gcs_auth_describe(g->auth), msg);
		log_refusal(g, s);
	} else if (s == 401) {
		bkt_set_error("%s: 401 Unauthorized: the credentials were not accepted, so the "
			      "caller lacks %s (needs valid credentials with %s on gs://%s) "
			      "[credentials: %s; server: %s]", r->what, perm, ROLE_HINT, g->bucket,
			      gcs_auth_describe(g->auth), msg);
		log_refusal(g, s);
	} else if (s == 404) {
		bkt_set_error("%s: 404 Not Found%s%s", r->what, msg[0] ? ": " : "", msg);
	} else {
		bkt_set_error("%s: %ld %s%s%s", r->what, s, reason(s), msg[0] ? ": " : "", msg);
	}
	/* a 2xx that the caller did not expect (202, 204, 206 ...) is no
	 * success either: the resource it needs is not in the answer */
	if (s >= 200 && s < 300)
		return -EPROTO;
	return gcs_errno(CURLE_OK, s);
}

/* ---- names and URLs ---- */

static char *full_name(const struct gcs *g, const char *name)
{
	struct sb s = { 0 };

	sb_add(&s, g->prefix);
	sb_add(&s, name);
	return sb_take(&s);
}

static char *what_of(const struct gcs *g, const char *full)
{
	struct sb s = { 0 };

	sb_addf(&s, "gs://%s/", g->bucket);
	sb_add(&s, full);
	if (s.n && s.p[s.n - 1] == '/')
		s.p[--s.n] = '\0';
	return sb_take(&s);
}

static char *obj_url(const struct gcs *g, const char *full, const char *query)
{
	struct sb s = { 0 };

	sb_add(&s, g->endpoint);
	sb_add(&s, "/storage/v1/b/");
	sb_esc(&s, g->bucket);
	sb_add(&s, "/o/");
	sb_esc(&s, full);
	if (query) {
		sb_add(&s, "?");
		sb_add(&s, query);
	}
	return sb_take(&s);
}

static char *upload_url(const struct gcs *g, const char *type, const char *name)
{
	struct sb s = { 0 };

	sb_add(&s, g->endpoint);
	sb_add(&s, "/upload/storage/v1/b/");
	sb_esc(&s, g->bucket);
	sb_addf(&s, "/o?uploadType=%s", type);
	if (name) {
		sb_add(&s, "&name=");
		sb_esc(&s, name);
	}
	sb_add(&s, "&ifGenerationMatch=0");
	return sb_take(&s);
}

/* {"size": "N", "crc32c": "..."} of an object resource */
static int obj_fields(json_t *o, uint64_t *size, bool *has_crc, uint32_t *crc, int64_t *gen)
{
	const char *s = json_string_value(json_object_get(o, "size"));
	const char *c = json_string_value(json_object_get(o, "crc32c"));
	const char *gs = json_string_value(json_object_get(o, "generation"));
	int64_t v;

	if (!s || !parse_i64(s, &v))
		return -EPROTO;
	*size = (uint64_t)v;
	*has_crc = c && b64_crc(c, strlen(c), crc);
	if (gen)
		*gen = gs && parse_i64(gs, &v) ? v : 0;
	return 0;
}

static json_t *parse_json(struct req *r)
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

/* ---- uploads ---- */

static int upload_fail(struct req *r)
{
	if (r->status == 412)
		return -EEXIST;
	if (r->status == 400 && r->rbuf &&
	    (strstr(r->rbuf, "CRC32C") || strstr(r->rbuf, "crc32c") || strstr(r->rbuf, "MD5"))) {
		http_fail(r);
		return -EBADMSG;     /* the data sent does not match its CRC32C */
	}
	return http_fail(r);
}

static int take_obj(struct req *r, json_t **obj)
{
	if (r->status != 200 && r->status != 201)
		return upload_fail(r);
	*obj = parse_json(r);
	return *obj ? 0 : -EPROTO;
}

static int put_media(struct gcs *g, const char *full, const char *what,
		     const struct bkt_src *src, bool *retried, json_t **obj)
{
	char b64[16], hash[48];
	const char *hdrs[] = { "Content-Type: application/octet-stream", hash, NULL };
	char *url = upload_url(g, "media", full);
	struct req r;
	int rc;

	if (!url)
		return -ENOMEM;
	crc_b64(src->crc32c, b64);
	snprintf(hash, sizeof(hash), "X-Goog-Hash: crc32c=%s", b64);
	req_init(&r, g, "POST", url, what, "storage.objects.create");
	r.hdrs = hdrs;
	r.has_body = true;
	r.src = src;
	r.src_len = src->size;
	rc = run(&r);
	if (rc == 0)
		rc = take_obj(&r, obj);
	*retried = r.retried;
	req_free(&r);
	free(url);
	return rc;
}

static char *meta_json(const char *full, uint32_t crc)
{
	char b64[16];
	json_t *j;
	char *s;

	crc_b64(crc, b64);
	j = json_pack("{s:s, s:s, s:s}", "name", full, "crc32c", b64,
		      "contentType", "application/octet-stream");
	s = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	return s;
}

static int put_multipart(struct gcs *g, const char *full, const char *what,
			 const struct bkt_src *src, bool *retried, json_t **obj)
{
	char bnd[48], ctype[96];
	const char *hdrs[] = { ctype, NULL };
	char *url = upload_url(g, "multipart", NULL), *meta = meta_json(full, src->crc32c);
	struct sb pre = { 0 }, post = { 0 };
	struct req r;
	int rc = -ENOMEM;

	if (!url || !meta)
		goto out;
	do {
		snprintf(bnd, sizeof(bnd), "mtcfs_%016" PRIx64 "%016" PRIx64, rng_next(), rng_next());
	} while (src->size >= strlen(bnd) && memmem(src->buf, src->size, bnd, strlen(bnd)));
	snprintf(ctype, sizeof(ctype), "Content-Type: multipart/related; boundary=%s", bnd);
	sb_addf(&pre, "--%s\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n", bnd);
	sb_add(&pre, meta);
	sb_addf(&pre, "\r\n--%s\r\nContent-Type: application/octet-stream\r\n\r\n", bnd);
	sb_addf(&post, "\r\n--%s--\r\n", bnd);
	if (pre.err || post.err)
		goto out;
	req_init(&r, g, "POST", url, what, "storage.objects.create");
	r.hdrs = hdrs;
	r.has_body = true;
	r.pre = pre.p;
	r.pre_len = pre.n;
	r.src = src;
	r.src_len = src->size;
	r.post = post.p;
	r.post_len = post.n;
	rc = run(&r);
	if (rc == 0)
		rc = take_obj(&r, obj);
	*retried = r.retried;
	req_free(&r);
out:
	free(pre.p);
	free(post.p);
	free(meta);
	free(url);
	return rc;
}

/* Start a resumable session: its URL into *session (malloc'd). */
static int resumable_start(struct gcs *g, const char *full, const char *what,
			   const struct bkt_src *src, bool *retried, char **session)
{
	char len[64];
	const char *hdrs[] = { "Content-Type: application/json; charset=UTF-8",
			       "X-Upload-Content-Type: application/octet-stream", len, NULL };
	char *url = upload_url(g, "resumable", full), *meta = meta_json(full, src->crc32c);
	struct bkt_src body;
	struct req r;
	int rc = -ENOMEM;

	if (!url || !meta)
		goto out;
	snprintf(len, sizeof(len), "X-Upload-Content-Length: %" PRIu64, src->size);
	body = (struct bkt_src){ .fd = -1, .buf = meta, .size = strlen(meta) };
	req_init(&r, g, "POST", url, what, "storage.objects.create");
	r.hdrs = hdrs;
	r.has_body = true;
	r.src = &body;
	r.src_len = body.size;
	rc = run(&r);
	*retried |= r.retried;
	if (rc == 0 && r.status != 200 && r.status != 201)
		rc = upload_fail(&r);
	else if (rc == 0 && !r.location[0]) {
		bkt_set_error("%s: the resumable upload answer has no Location", what);
		rc = -EPROTO;
	} else if (rc == 0) {
		*session = strdup(r.location);
		rc = *session ? 0 : -ENOMEM;
	}
	req_free(&r);
out:
	free(meta);
	free(url);
	return rc;
}

/* "bytes=0-E" -> E+1 persisted bytes; no header -> 0 */
static int persisted(const char *range, uint64_t *off)
{
	const char *c = range;
	uint64_t a, e;

	if (!range[0]) {
		*off = 0;
		return 0;
	}
	if (!take_lit(&c, "bytes=") || !take_num(&c, &a) || !take_lit(&c, "-") ||
	    !take_num(&c, &e) || *c || a != 0 || e == UINT64_MAX)
		return -EPROTO;
	*off = e + 1;
	return 0;
}

static int put_resumable(struct gcs *g, const char *full, const char *what,
			 const struct bkt_src *src, bool *retried, json_t **obj)
{
	char *session = NULL;
	uint64_t off = 0, last_fail_off = UINT64_MAX;
	unsigned fails = 0, restarts = 0;
	bool query = false;
	int stalls = 0;
	char cr[96], hash[48], b64[16];
	int rc;

	crc_b64(src->crc32c, b64);
	snprintf(hash, sizeof(hash), "X-Goog-Hash: crc32c=%s", b64);
restart:
	rc = resumable_start(g, full, what, src, retried, &session);
	if (rc < 0)
		goto out;
	off = 0;
	query = false;
	for (;;) {
		const char *hdrs[] = { cr, NULL, NULL };
		struct req r;

		req_init(&r, g, "PUT", session, what, "storage.objects.create");
		r.hdrs = hdrs;
		r.has_body = true;
		if (query) {
			/* where did the broken chunk leave the server? */
			snprintf(cr, sizeof(cr), "Content-Range: bytes */%" PRIu64, src->size);
		} else {
			uint64_t len = src->size - off < g->chunk ? src->size - off : g->chunk;
			snprintf(cr, sizeof(cr), "Content-Range: bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64,
				 off, off + len - 1, src->size);
			if (off + len == src->size)
				hdrs[1] = hash;
			r.src = src;
			r.src_off = off;
			r.src_len = len;
			r.max_attempts = 1;     /* a broken chunk resumes via the query */
			r.no_rewind = true;
		}
		rc = run(&r);
		*retried |= r.retried || query;
		if (rc == 0 && r.status == 308) {
			uint64_t p;
			rc = persisted(r.range, &p);
			if (rc < 0 || p > src->size || (p < off && !query)) {
				bkt_set_error("%s: resumable upload: bad Range \"%s\" after offset %" PRIu64,
					      what, r.range, off);
				rc = -EPROTO;
				req_free(&r);
				goto out;
			}
			if (query)
				log_info(MOD, "%s: resumable upload continues at %" PRIu64 " of %" PRIu64,
					 what, p, src->size);
			/* a server that keeps persisting nothing is not making progress */
			if (p <= off && !query && ++stalls > 5) {
				bkt_set_error("%s: resumable upload: the server persisted nothing of %d chunks at offset %" PRIu64,
					      what, stalls, off);
				rc = -EPROTO;
				req_free(&r);
				goto out;
			}
			if (p > off)
				stalls = 0;
			off = p;
			query = false;
			req_free(&r);
			continue;
		}
		if (rc == 0 && (r.status == 200 || r.status == 201)) {
			rc = take_obj(&r, obj);
			req_free(&r);
			goto out;
		}
		if (rc == 0 && (r.status == 404 || r.status == 410) && restarts < MAX_RESTARTS) {
			log_warn(MOD, "%s: the resumable session is gone (%ld): starting over", what,
				 r.status);
			restarts++;
			req_free(&r);
			free(session);
			session = NULL;
			goto restart;
		}
		if (rc == 0) {
			rc = upload_fail(&r);
			req_free(&r);
			goto out;
		}
		if (!r.retryable_fail) {
			req_free(&r);
			goto out;
		}
		req_free(&r);
		if (off != last_fail_off) {
			fails = 0;              /* progress since the last failure */
			last_fail_off = off;
		}
		if (++fails >= g->attempts) {
			log_warn(MOD, "%s: resumable upload gave up at %" PRIu64 " of %" PRIu64
				 " after %u attempts: %s", what, off, src->size, fails, bkt_last_error());
			goto out;
		}
		{
			unsigned d = backoff_ms(g, fails, NULL);
			log_info(MOD, "%s: resumable chunk at %" PRIu64 " failed (%s); asking the "
				 "server where to go on in %u ms", what, off, bkt_last_error(), d);
			sleep_ms(d);
		}
		query = true;
	}
out:
	free(session);
	return rc;
}

static int gcs_stat_full(struct gcs *g, const char *full, const char *what, uint64_t *size,
			 bool *has_crc, uint32_t *crc, int64_t gen);

static int gcs_put(struct bkt *b, const char *name, const struct bkt_src *src)
{
	struct gcs *g = G(b);
	char *full = full_name(g, name), *what = full ? what_of(g, full) : NULL;
	json_t *obj = NULL;
	bool retried = false, has_crc = false;
	uint64_t size = 0;
	uint32_t crc = 0;
	int rc;

	if (!full || !what) {
		rc = -ENOMEM;
		goto out;
	}
	if (src->size > g->simple_max)
		rc = put_resumable(g, full, what, src, &retried, &obj);
	else if (src->fd < 0)
		rc = put_multipart(g, full, what, src, &retried, &obj);
	else
		rc = put_media(g, full, what, src, &retried, &obj);
	if (rc == -EEXIST && retried) {
		/* an earlier attempt may have created it: ours if size and CRC match */
		if (gcs_stat_full(g, full, what, &size, &has_crc, &crc, 0) == 0 &&
		    size == src->size && has_crc && crc == src->crc32c) {
			log_info(MOD, "%s: a retried upload found the object in place with our size "
				 "and crc32c: done", what);
			rc = 0;
			goto out;
		}
		rc = -EEXIST;
	}
	if (rc == -EEXIST) {
		bkt_set_error("%s: already exists (objects are write-once)", what);
		goto out;
	}
	if (rc == 0 && obj) {
		if (obj_fields(obj, &size, &has_crc, &crc, NULL) == 0 &&
		    (size != src->size || (has_crc && crc != src->crc32c))) {
			bkt_set_error("%s: the server stored %" PRIu64 " bytes with crc32c %08x; we sent "
				      "%" PRIu64 " with %08x", what, size, crc, src->size, src->crc32c);
			rc = -EBADMSG;
		}
	}
out:
	json_decref(obj);
	free(what);
	free(full);
	return rc;
}

/* ---- metadata ---- */

static int gcs_stat_full(struct gcs *g, const char *full, const char *what, uint64_t *size,
			 bool *has_crc, uint32_t *crc, int64_t gen)
{
	char q[64];
	char *url;
	struct req r;
	json_t *j = NULL;
	int rc;

	snprintf(q, sizeof(q), "generation=%" PRId64, gen);
	url = obj_url(g, full, gen > 0 ? q : NULL);
	if (!url)
		return -ENOMEM;
	req_init(&r, g, "GET", url, what, "storage.objects.get");
	rc = run(&r);
	if (rc == 0 && r.status != 200)
		rc = http_fail(&r);
	if (rc == 0 && !(j = parse_json(&r)))
		rc = -EPROTO;
	if (rc == 0 && obj_fields(j, size, has_crc, crc, NULL) < 0) {
		bkt_set_error("%s: the object resource has no size", what);
		rc = -EPROTO;
	}
	json_decref(j);
	req_free(&r);
	free(url);
	return rc;
}

static int gcs_stat(struct bkt *b, const char *name, uint64_t *size, uint32_t *crcp)
{
	struct gcs *g = G(b);
	char *full = full_name(g, name), *what = full ? what_of(g, full) : NULL;
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

/* ---- downloads ---- */

struct part {
	uint64_t start, end;        /* inclusive */
	uint32_t crc;
	int rc;
};

struct dl {
	struct gcs *g;
	const char *url, *what;
	int fd;
	bool seek;
	int64_t gen;
	struct part *parts;
	size_t nparts;
	atomic_size_t next;
	atomic_bool stop;
	pthread_mutex_t mu;         /* protects first, first_err */
	size_t first;
	char first_err[512];
};

static int fetch_part(struct dl *d, struct part *p)
{
	struct req r;
	int rc;

	req_init(&r, d->g, "GET", d->url, d->what, "storage.objects.get");
	r.media = true;
	r.sink_fd = d->fd;
	r.sink_seek = d->seek;
	r.rstart = (int64_t)p->start;
	r.rend = (int64_t)p->end;
	r.pin_gen = d->gen;
	rc = run(&r);
	if (rc == 0 && r.status != 206 && r.status != 200)
		rc = http_fail(&r);
	if (rc == 0 && r.got != p->end - p->start + 1) {
		bkt_set_error("%s: range %" PRIu64 "-%" PRIu64 " came with %" PRIu64 " bytes",
			      d->what, p->start, p->end, r.got);
		rc = -EPROTO;
	}
	p->crc = r.crc;
	req_free(&r);
	return rc;
}

static void *dl_worker(void *arg)
{
	struct dl *d = arg;
	size_t i;

	while ((i = atomic_fetch_add(&d->next, 1)) < d->nparts) {
		struct part *p = &d->parts[i];
		if (atomic_load(&d->stop)) {
			p->rc = -ECANCELED;
			continue;
		}
		p->rc = fetch_part(d, p);
		if (p->rc < 0) {
			atomic_store(&d->stop, true);
			pthread_mutex_lock(&d->mu);
			if (i < d->first) {
				d->first = i;
				snprintf(d->first_err, sizeof(d->first_err), "%s", bkt_last_error());
			}
			pthread_mutex_unlock(&d->mu);
		}
	}
	return NULL;
}

/* Fetch [start, total) in parts, up to ranges at once; *crc extended. */
static int fetch_rest(struct dl *d, uint64_t start, uint64_t total, uint64_t part,
		      unsigned ranges, uint32_t *crc)
{
	size_t n = (size_t)((total - start + part - 1) / part), nt;
	pthread_t *th = NULL;
	size_t started = 0;
	int rc = 0;

	d->parts = calloc(n, sizeof(*d->parts));
	if (!d->parts)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		d->parts[i].start = start + i * part;
		d->parts[i].end = (i + 1 == n ? total : start + (i + 1) * part) - 1;
	}
	d->nparts = n;
	d->first = n;
	atomic_init(&d->next, 0);
	atomic_init(&d->stop, false);
	pthread_mutex_init(&d->mu, NULL);
	nt = d->seek ? (ranges < n ? ranges : n) : 1;   /* a pipe takes bytes in order */
	if (nt > 1)
		th = calloc(nt - 1, sizeof(*th));
	for (size_t i = 0; th && i < nt - 1; i++) {
		if (pthread_create(&th[i], NULL, dl_worker, d) != 0)
			break;
		started++;
	}
	dl_worker(d);
	for (size_t i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	free(th);
	pthread_mutex_destroy(&d->mu);
	if (d->first < n) {
		rc = d->parts[d->first].rc;
		bkt_set_error("%s", d->first_err);
	} else {
		for (size_t i = 0; i < n; i++)
			*crc = bkt_crc32c_combine(*crc, d->parts[i].crc,
						  d->parts[i].end - d->parts[i].start + 1);
	}
	free(d->parts);
	d->parts = NULL;
	return rc;
}

static int check_crc(struct gcs *g, const char *full, const char *what, bool has_hash,
		     uint32_t server, int64_t gen, uint64_t total, uint32_t crc)
{
	if (!has_hash) {
		/* no x-goog-hash on this answer: ask the object resource */
		uint64_t sz;
		bool has = false;
		int rc = gcs_stat_full(g, full, what, &sz, &has, &server, gen);
		if (rc < 0)
			return rc;
		if (!has) {
			bkt_set_error("%s: the server gives no crc32c for the object", what);
			return -EPROTO;
		}
	}
	if (server != crc) {
		bkt_set_error("%s: the %" PRIu64 " bytes received have crc32c %08x, the server's is "
			      "%08x", what, total, crc, server);
		log_warn(MOD, "%s", bkt_last_error());
		return -EBADMSG;
	}
	return 0;
}

static int gcs_get_file_once(struct bkt *b, const char *name, int fd, unsigned ranges,
			     uint64_t *size, uint32_t *crcp);

/* A CRC32C mismatch may be one damaged transfer of an intact object: a
 * regular file as the sink is truncated and the object fetched once more
 * before the mismatch counts. */
static int gcs_get_file(struct bkt *b, const char *name, int fd, unsigned ranges,
			uint64_t *size, uint32_t *crcp)
{
	struct stat st;
	int rc;

	/* zeros are skipped, not written (holes stay holes): what was there must go */
	if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ftruncate(fd, 0) < 0) {
		rc = -errno;
		bkt_set_error("%s: truncating the local file: %s", name, strerror(-rc));
		return rc;
	}
	rc = gcs_get_file_once(b, name, fd, ranges, size, crcp);

	if (rc == -EBADMSG && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ftruncate(fd, 0) == 0) {
		log_warn(MOD, "%s: %s; fetching it once more", name, bkt_last_error());
		rc = gcs_get_file_once(b, name, fd, ranges, size, crcp);
	}
	return rc;
}

static int gcs_get_file_once(struct bkt *b, const char *name, int fd, unsigned ranges,
			     uint64_t *size, uint32_t *crcp)
{
	struct gcs *g = G(b);
	char *full = full_name(g, name), *what = full ? what_of(g, full) : NULL;
	char *url = full ? obj_url(g, full, "alt=media") : NULL;
	struct stat st;
	struct req r;
	uint64_t total;
	uint32_t crc;
	int rc;

	if (!full || !what || !url) {
		free(full);
		free(what);
		free(url);
		return -ENOMEM;
	}
	req_init(&r, g, "GET", url, what, "storage.objects.get");
	r.media = true;
	r.sink_fd = fd;
	r.sink_seek = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
	r.rstart = 0;
	r.rend = (int64_t)g->part - 1;
	rc = run(&r);
	if (rc == 0 && r.status == 416) {
		/* an empty object has no byte 0 */
		r.rstart = r.rend = -1;
		rc = run(&r);
	}
	if (rc == 0 && r.status != 200 && r.status != 206)
		rc = http_fail(&r);
	if (rc < 0)
		goto out;
	total = r.status == 206 && r.cr_total >= 0 ? (uint64_t)r.cr_total : r.got;
	if (total > MF_MAX_FILE_SIZE) {
		/* a Content-Range total sizes the part array: never trust it past
		 * the largest file a manifest may hold */
		bkt_set_error("%s: the server announced %llu bytes, more than any shard file may hold",
			      what, (unsigned long long)total);
		rc = -EPROTO;
		goto out;
	}
	crc = r.crc;
	if (r.got < total) {
		struct dl d = { .g = g, .url = url, .what = what, .fd = fd, .seek = r.sink_seek,
				.gen = r.generation };
		rc = fetch_rest(&d, r.got, total, g->part, ranges, &crc);
		if (rc < 0)
			goto out;
	}
	rc = check_crc(g, full, what, r.has_hash, r.hash_crc, r.generation, total, crc);
	if (rc < 0)
		goto out;
	if (r.sink_seek && ftruncate(fd, (off_t)total) < 0) {
		rc = -errno;
		bkt_set_error("%s: truncating the local file: %s", what, strerror(-rc));
		goto out;
	}
	*size = total;
	*crcp = crc;
out:
	req_free(&r);
	free(url);
	free(what);
	free(full);
	return rc;
}

static int gcs_get_buf(struct bkt *b, const char *name, size_t max, void **bufp, size_t *lenp)
{
	struct gcs *g = G(b);
	char *full = full_name(g, name), *what = full ? what_of(g, full) : NULL;
	char *url = full ? obj_url(g, full, "alt=media") : NULL;
	struct req r;
	int rc = -ENOMEM;

	if (!full || !what || !url)
		goto out0;
	req_init(&r, g, "GET", url, what, "storage.objects.get");
	r.media = true;
	r.mmax = max;
	rc = run(&r);
	if (rc == 0 && r.status != 200 && r.status != 206)
		rc = http_fail(&r);
	if (rc == 0)
		rc = check_crc(g, full, what, r.has_hash, r.hash_crc, r.generation, r.got, r.crc);
	if (rc == 0) {
		if (!r.mbuf && !(r.mbuf = malloc(1)))
			rc = -ENOMEM;
		else {
			r.mbuf[r.got] = '\0';
			*bufp = r.mbuf;
			*lenp = (size_t)r.got;
			r.mbuf = NULL;
		}
	}
	req_free(&r);
out0:
	free(url);
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
	char *full = full_name(g, prefix), *what = full ? what_of(g, full) : NULL;
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

		sb_add(&u, g->endpoint);
		sb_add(&u, "/storage/v1/b/");
		sb_esc(&u, g->bucket);
		sb_add(&u, "/o?prefix=");
		sb_esc(&u, full);
		if (delim) {
			sb_add(&u, "&delimiter=");
			sb_esc(&u, delim);
		}
		sb_addf(&u, "&maxResults=%u", g->list_page);
		if (token) {
			sb_add(&u, "&pageToken=");
			sb_esc(&u, token);
		}
		sb_add(&u, "&fields=");
		sb_esc(&u, "items(name,size,crc32c),prefixes,nextPageToken");
		if (u.err) {
			free(u.p);
			rc = -ENOMEM;
			break;
		}
		req_init(&r, g, "GET", u.p, what, "storage.objects.list");
		rc = run(&r);
		if (rc == 0 && r.status != 200)
			rc = http_fail(&r);
		if (rc == 0 && !(j = parse_json(&r)))
			rc = -EPROTO;
		req_free(&r);
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
			if (!parse_i64(json_string_value(json_object_get(v, "size")) ?
				       json_string_value(json_object_get(v, "size")) : "", &sz))
				sz = 0;
			ents[n].size = (uint64_t)sz;
			{
				const char *c = json_string_value(json_object_get(v, "crc32c"));
				ents[n].has_crc = c && b64_crc(c, strlen(c), &ents[n].crc);
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
	char *full = full_name(g, name), *what = full ? what_of(g, full) : NULL;
	char *url = full ? obj_url(g, full, NULL) : NULL;
	struct req r;
	int rc = -ENOMEM;

	if (!full || !what || !url)
		goto out;
	req_init(&r, g, "DELETE", url, what, "storage.objects.delete");
	rc = run(&r);
	if (rc == 0 && r.status == 404 && r.retried)
		rc = 0;                 /* an attempt that timed out did delete it */
	else if (rc == 0 && r.status != 204 && r.status != 200)
		rc = http_fail(&r);
	req_free(&r);
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

	req_init(&r, g, body ? "POST" : "GET", url, url, NULL);
	r.hdrs = hdrs;
	r.no_auth = true;
	r.rmax = 1u << 20;
	if (body) {
		r.has_body = true;
		r.src = &src;
		r.src_len = src.size;
	}
	rc = run(&r);
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
	req_free(&r);
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
			sb_add(&s, "/");
		}
	}
	g->prefix = sb_take(&s);
	ep = o->gcs_endpoint ? o->gcs_endpoint : (emu && *emu ? emu : DEF_ENDPOINT);
	memset(&s, 0, sizeof(s));
	if (!strstr(ep, "://"))
		sb_add(&s, "http://");        /* STORAGE_EMULATOR_HOST=host:port */
	sb_add(&s, ep);
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
