/* bucket_gcs: Cloud Storage and curl errors as -errno, the retry policy
 * (capped exponential backoff with jitter) around attempts, and the log
 * lines of a failed request (see bucket_gcs_i.h). Threads: any. */
#include "tiers/bucket.h"
#include "tiers/bucket_gcs_i.h"
#include "tiers/gcs_auth.h"
#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

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

uint64_t gcs_rng_next(void)
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
unsigned gcs_backoff_ms(const struct gcs *g, unsigned attempt, const char *retry_after)
{
	uint64_t d = g->base_ms;
	uint64_t ra = 0;

	for (unsigned i = 1; i < attempt && d < g->cap_ms; i++)
		d *= 2;
	if (d > g->cap_ms)
		d = g->cap_ms;
	if (d > 1)
		d = d / 2 + gcs_rng_next() % (d / 2 + 1);
	if (retry_after && *retry_after && util_parse_u64(retry_after, 3600, &ra) == 0 &&
	    ra * 1000 > d)
		d = ra * 1000 < g->cap_ms ? ra * 1000 : g->cap_ms;
	return (unsigned)d;
}

void gcs_sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* The request with retries. 0 when a final answer arrived (r->status; the
 * caller judges it), or -errno (words set) when none did. */
int gcs_run(struct req *r)
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
		rc = gcs_attempt(r, tok, &cc);
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
			unsigned d = gcs_backoff_ms(g, n, cc == CURLE_OK ? r->retry_after : NULL);
			log_info(MOD, "%s %s: %s; retry %u of %u in %u ms", r->method, r->what, why, n,
				 max - 1, d);
			gcs_sleep_ms(d);
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
int gcs_http_fail(struct req *r)
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
