/* bucket_gcs: one HTTP request attempt over libcurl: the handle pool, the
 * request body (read/seek callbacks), the response (media into a file or
 * buffer, headers) (see bucket_gcs_i.h). Threads: any. */
#include "tiers/bucket.h"
#include "tiers/bucket_gcs_i.h"
#include "tiers/gcs_auth.h"
#include "common/sigpipe.h"
#include "tiers/manifest.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

/* ---- one request ---- */

void gcs_req_init(struct req *r, struct gcs *g, const char *method, const char *url,
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

void gcs_req_free(struct req *r)
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
		r->status = sp && (sp++, gcs_take_num(&sp, &code)) && code < 1000 ? (long)code : 0;
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
		if (!gcs_parse_i64(tmp, &r->generation))
			r->generation = 0;
	} else if (hdr_is(p, len, "content-range", &v, &vl)) {
		/* "bytes S-E/T" */
		const char *c = tmp;
		uint64_t s, e, t;
		copy_hdr(tmp, sizeof(tmp), v, vl);
		if (gcs_take_lit(&c, "bytes ") && gcs_take_num(&c, &s) && gcs_take_lit(&c, "-") &&
		    gcs_take_num(&c, &e) && gcs_take_lit(&c, "/") && gcs_take_num(&c, &t) && !*c &&
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
				if (gcs_b64_crc(v + s, e - s, &r->hash_crc))
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
int gcs_attempt(struct req *r, char *tok, CURLcode *cc)
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
	gcs_sb_add(&url, r->url);
	if (r->pin_gen > 0)
		gcs_sb_addf(&url, "%cgeneration=%" PRId64, strchr(r->url, '?') ? '&' : '?', r->pin_gen);
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
		gcs_sb_add(&hv, "Authorization: Bearer ");
		gcs_sb_add(&hv, tok);
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
