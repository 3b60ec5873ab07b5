/* bucket_gcs: uploads: media, multipart and resumable (see the top of
 * bucket_gcs.c and bucket_gcs_i.h). Threads: any. */
#include "tiers/bucket.h"
#include "tiers/bucket_gcs_i.h"
#include "common/log.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* ---- uploads ---- */

static int upload_fail(struct req *r)
{
	if (r->status == 412)
		return -EEXIST;
	if (r->status == 400 && r->rbuf &&
	    (strstr(r->rbuf, "CRC32C") || strstr(r->rbuf, "crc32c") || strstr(r->rbuf, "MD5"))) {
		gcs_http_fail(r);
		return -EBADMSG;     /* the data sent does not match its CRC32C */
	}
	return gcs_http_fail(r);
}

static int take_obj(struct req *r, json_t **obj)
{
	if (r->status != 200 && r->status != 201)
		return upload_fail(r);
	*obj = gcs_parse_json(r);
	return *obj ? 0 : -EPROTO;
}

static int put_media(struct gcs *g, const char *full, const char *what,
		     const struct bkt_src *src, bool *retried, json_t **obj)
{
	char b64[16], hash[48];
	const char *hdrs[] = { "Content-Type: application/octet-stream", hash, NULL };
	char *url = gcs_upload_url(g, "media", full);
	struct req r;
	int rc;

	if (!url)
		return -ENOMEM;
	gcs_crc_b64(src->crc32c, b64);
	snprintf(hash, sizeof(hash), "X-Goog-Hash: crc32c=%s", b64);
	gcs_req_init(&r, g, "POST", url, what, "storage.objects.create");
	r.hdrs = hdrs;
	r.has_body = true;
	r.src = src;
	r.src_len = src->size;
	rc = gcs_run(&r);
	if (rc == 0)
		rc = take_obj(&r, obj);
	*retried = r.retried;
	gcs_req_free(&r);
	free(url);
	return rc;
}

static char *meta_json(const char *full, uint32_t crc)
{
	char b64[16];
	json_t *j;
	char *s;

	gcs_crc_b64(crc, b64);
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
	char *url = gcs_upload_url(g, "multipart", NULL), *meta = meta_json(full, src->crc32c);
	struct sb pre = { 0 }, post = { 0 };
	struct req r;
	int rc = -ENOMEM;

	if (!url || !meta)
		goto out;
	do {
		snprintf(bnd, sizeof(bnd), "mtcfs_%016" PRIx64 "%016" PRIx64, gcs_rng_next(), gcs_rng_next());
	} while (src->size >= strlen(bnd) && memmem(src->buf, src->size, bnd, strlen(bnd)));
	snprintf(ctype, sizeof(ctype), "Content-Type: multipart/related; boundary=%s", bnd);
	gcs_sb_addf(&pre, "--%s\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n", bnd);
	gcs_sb_add(&pre, meta);
	gcs_sb_addf(&pre, "\r\n--%s\r\nContent-Type: application/octet-stream\r\n\r\n", bnd);
	gcs_sb_addf(&post, "\r\n--%s--\r\n", bnd);
	if (pre.err || post.err)
		goto out;
	gcs_req_init(&r, g, "POST", url, what, "storage.objects.create");
	r.hdrs = hdrs;
	r.has_body = true;
	r.pre = pre.p;
	r.pre_len = pre.n;
	r.src = src;
	r.src_len = src->size;
	r.post = post.p;
	r.post_len = post.n;
	rc = gcs_run(&r);
	if (rc == 0)
		rc = take_obj(&r, obj);
	*retried = r.retried;
	gcs_req_free(&r);
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
	char *url = gcs_upload_url(g, "resumable", full), *meta = meta_json(full, src->crc32c);
	struct bkt_src body;
	struct req r;
	int rc = -ENOMEM;

	if (!url || !meta)
		goto out;
	snprintf(len, sizeof(len), "X-Upload-Content-Length: %" PRIu64, src->size);
	body = (struct bkt_src){ .fd = -1, .buf = meta, .size = strlen(meta) };
	gcs_req_init(&r, g, "POST", url, what, "storage.objects.create");
	r.hdrs = hdrs;
	r.has_body = true;
	r.src = &body;
	r.src_len = body.size;
	rc = gcs_run(&r);
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
	gcs_req_free(&r);
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
	if (!gcs_take_lit(&c, "bytes=") || !gcs_take_num(&c, &a) || !gcs_take_lit(&c, "-") ||
	    !gcs_take_num(&c, &e) || *c || a != 0 || e == UINT64_MAX)
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

	gcs_crc_b64(src->crc32c, b64);
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

		gcs_req_init(&r, g, "PUT", session, what, "storage.objects.create");
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
		rc = gcs_run(&r);
		*retried |= r.retried || query;
		if (rc == 0 && r.status == 308) {
			uint64_t p;
			rc = persisted(r.range, &p);
			if (rc < 0 || p > src->size || (p < off && !query)) {
				bkt_set_error("%s: resumable upload: bad Range \"%s\" after offset %" PRIu64,
					      what, r.range, off);
				rc = -EPROTO;
				gcs_req_free(&r);
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
				gcs_req_free(&r);
				goto out;
			}
			if (p > off)
				stalls = 0;
			off = p;
			query = false;
			gcs_req_free(&r);
			continue;
		}
		if (rc == 0 && (r.status == 200 || r.status == 201)) {
			rc = take_obj(&r, obj);
			gcs_req_free(&r);
			goto out;
		}
		if (rc == 0 && (r.status == 404 || r.status == 410) && restarts < MAX_RESTARTS) {
			log_warn(MOD, "%s: the resumable session is gone (%ld): starting over", what,
				 r.status);
			restarts++;
			gcs_req_free(&r);
			free(session);
			session = NULL;
			goto restart;
		}
		if (rc == 0) {
			rc = upload_fail(&r);
			gcs_req_free(&r);
			goto out;
		}
		if (!r.retryable_fail) {
			gcs_req_free(&r);
			goto out;
		}
		gcs_req_free(&r);
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
			unsigned d = gcs_backoff_ms(g, fails, NULL);
			log_info(MOD, "%s: resumable chunk at %" PRIu64 " failed (%s); asking the "
				 "server where to go on in %u ms", what, off, bkt_last_error(), d);
			gcs_sleep_ms(d);
		}
		query = true;
	}
out:
	free(session);
	return rc;
}

int gcs_stat_full(struct gcs *g, const char *full, const char *what, uint64_t *size,
		  bool *has_crc, uint32_t *crc, int64_t gen);

int gcs_put(struct bkt *b, const char *name, const struct bkt_src *src)
{
	struct gcs *g = G(b);
	char *full = gcs_full_name(g, name), *what = full ? gcs_what_of(g, full) : NULL;
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
		if (gcs_obj_fields(obj, &size, &has_crc, &crc, NULL) == 0 &&
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
