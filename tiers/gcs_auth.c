/* gcs_auth: access tokens for Cloud Storage (see gcs_auth.h). */
#include "tiers/gcs_auth.h"
#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#define MOD "gcs"
#define DEF_TOKEN_URI "https://oauth2.googleapis.com/token"
#define DEF_METADATA_HOST "metadata.google.internal"
#define METADATA_PATH "/computeMetadata/v1/instance/service-accounts/default/token"
#define REFRESH_MARGIN_S 300
#define JWT_LIFETIME_S 3600
#define KEY_FILE_MAX (64u << 10)

struct gcs_auth {
	enum gcs_auth_kind kind;
	gcs_http_fn http;
	void *http_arg;
	char *email, *key_id, *token_uri, *key_file;
	EVP_PKEY *pkey;
	char *meta_url;
	char describe[512];
	pthread_mutex_t mu;        /* protects token, refresh_at; held across a fetch */
	char token[GCS_TOKEN_MAX];
	uint64_t refresh_at_ns;    /* monotonic; 0 = no token */
};

static void set_err(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || !errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

static char *json_strdup(json_t *o, const char *key)
{
	const char *s = json_string_value(json_object_get(o, key));

	return s ? strdup(s) : NULL;
}

static int load_key(struct gcs_auth *a, const char *path, char *err, size_t errlen)
{
	char *txt = NULL, *pem = NULL;
	size_t len = 0;
	json_t *j = NULL;
	json_error_t je;
	const char *type;
	BIO *bio = NULL;
	int rc;

	rc = util_read_file_at(AT_FDCWD, path, KEY_FILE_MAX, &txt, &len);
	if (rc < 0) {
		set_err(err, errlen, "key file %s: %s", path, strerror(-rc));
		goto out;
	}
	rc = -EINVAL;
	j = json_loadb(txt, len, 0, &je);
	if (!j || !json_is_object(j)) {
		set_err(err, errlen, "key file %s: not JSON (%s, line %d)", path,
			j ? "not an object" : je.text, je.line);
		goto out;
	}
	type = json_string_value(json_object_get(j, "type"));
	if (!type || strcmp(type, "service_account")) {
		set_err(err, errlen, "key file %s: type is \"%s\", want \"service_account\"", path,
			type ? type : "(missing)");
		goto out;
	}
	a->email = json_strdup(j, "client_email");
	pem = json_strdup(j, "private_key");
	a->key_id = json_strdup(j, "private_key_id");
	a->token_uri = json_strdup(j, "token_uri");
	if (!a->token_uri)
		a->token_uri = strdup(DEF_TOKEN_URI);
	if (!a->email || !pem || !a->token_uri) {
		set_err(err, errlen, "key file %s: client_email or private_key missing", path);
		goto out;
	}
	bio = BIO_new_mem_buf(pem, -1);
	a->pkey = bio ? PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL) : NULL;
	if (!a->pkey || EVP_PKEY_get_base_id(a->pkey) != EVP_PKEY_RSA) {
		set_err(err, errlen, "key file %s: private_key is not an RSA key in PEM", path);
		goto out;
	}
	snprintf(a->describe, sizeof(a->describe), "service account %s (key file %s)", a->email, path);
	rc = 0;
out:
	BIO_free(bio);
	if (pem) {
		OPENSSL_cleanse(pem, strlen(pem));
		free(pem);
	}
	if (txt) {
		OPENSSL_cleanse(txt, len);
		free(txt);
	}
	json_decref(j);
	return rc;
}

int gcs_auth_new(const struct gcs_auth_cfg *cfg, struct gcs_auth **out, char *err, size_t errlen)
{
	struct gcs_auth *a = calloc(1, sizeof(*a));
	int rc = 0;

	if (!a)
		return -ENOMEM;
	a->kind = cfg->kind;
	a->http = cfg->http;
	a->http_arg = cfg->http_arg;
	pthread_mutex_init(&a->mu, NULL);
	switch (cfg->kind) {
	case GCS_AUTH_NONE:
		snprintf(a->describe, sizeof(a->describe), "no credentials (STORAGE_EMULATOR_HOST)");
		break;
	case GCS_AUTH_KEY:
		a->key_file = strdup(cfg->key_file);
		rc = a->key_file ? load_key(a, cfg->key_file, err, errlen) : -ENOMEM;
		break;
	case GCS_AUTH_METADATA: {
		const char *h = cfg->metadata_host ? cfg->metadata_host : DEF_METADATA_HOST;
		size_t n = strlen(h) + sizeof(METADATA_PATH) + 16;
		a->meta_url = malloc(n);
		if (!a->meta_url) {
			rc = -ENOMEM;
			break;
		}
		snprintf(a->meta_url, n, "%s%s%s", strstr(h, "://") ? "" : "http://", h, METADATA_PATH);
		snprintf(a->describe, sizeof(a->describe), "the metadata server's default service "
			 "account (%s)", h);
		break;
	}
	}
	if (rc < 0) {
		gcs_auth_free(a);
		return rc;
	}
	*out = a;
	return 0;
}

void gcs_auth_free(struct gcs_auth *a)
{
	if (!a)
		return;
	OPENSSL_cleanse(a->token, sizeof(a->token));
	EVP_PKEY_free(a->pkey);
	free(a->email);
	free(a->key_id);
	free(a->token_uri);
	free(a->key_file);
	free(a->meta_url);
	pthread_mutex_destroy(&a->mu);
	free(a);
}

const char *gcs_auth_describe(const struct gcs_auth *a) { return a->describe; }
enum gcs_auth_kind gcs_auth_kind(const struct gcs_auth *a) { return a->kind; }

/* ---- JWT ---- */

/* base64url without padding; *out malloc'd */
static int b64url(const unsigned char *in, size_t len, char **out)
{
	size_t cap = 4 * ((len + 2) / 3) + 1, n;
	char *s = malloc(cap);

	if (!s)
		return -ENOMEM;
	n = (size_t)EVP_EncodeBlock((unsigned char *)s, in, (int)len);
	while (n > 0 && s[n - 1] == '=')
		n--;
	s[n] = '\0';
	for (size_t i = 0; i < n; i++) {
		if (s[i] == '+')
			s[i] = '-';
		else if (s[i] == '/')
			s[i] = '_';
	}
	*out = s;
	return 0;
}

static int b64url_json(json_t *j, char **out)
{
	char *txt = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
	int rc;

	if (!txt)
		return -ENOMEM;
	rc = b64url((const unsigned char *)txt, strlen(txt), out);
	free(txt);
	return rc;
}

int gcs_auth_jwt(struct gcs_auth *a, int64_t now, char **jwt)
{
	json_t *hdr = NULL, *claims = NULL;
	char *h64 = NULL, *c64 = NULL, *s64 = NULL, *signing = NULL;
	unsigned char *sig = NULL;
	size_t siglen = 0, n;
	EVP_MD_CTX *ctx = NULL;
	int rc = -ENOMEM;

	if (a->kind != GCS_AUTH_KEY)
		return -EINVAL;
	hdr = json_pack("{s:s, s:s}", "alg", "RS256", "typ", "JWT");
	claims = json_pack("{s:s, s:s, s:s, s:I, s:I}", "iss", a->email, "scope", GCS_SCOPE,
			   "aud", a->token_uri, "iat", (json_int_t)now,
			   "exp", (json_int_t)(now + JWT_LIFETIME_S));
	if (!hdr || !claims)
		goto out;
	if (a->key_id && json_object_set_new(hdr, "kid", json_string(a->key_id)) < 0)
		goto out;
	if ((rc = b64url_json(hdr, &h64)) < 0 || (rc = b64url_json(claims, &c64)) < 0)
		goto out;
	rc = -ENOMEM;
	n = strlen(h64) + strlen(c64) + 2;
	signing = malloc(n);
	if (!signing)
		goto out;
	snprintf(signing, n, "%s.%s", h64, c64);
	rc = -EIO;
	ctx = EVP_MD_CTX_new();
	if (!ctx || EVP_DigestSignInit(ctx, NULL, EVP_sha256(), NULL, a->pkey) != 1 ||
	    EVP_DigestSign(ctx, NULL, &siglen, (const unsigned char *)signing, strlen(signing)) != 1)
		goto out;
	sig = malloc(siglen);
	if (!sig || EVP_DigestSign(ctx, sig, &siglen, (const unsigned char *)signing,
				   strlen(signing)) != 1)
		goto out;
	if ((rc = b64url(sig, siglen, &s64)) < 0)
		goto out;
	rc = -ENOMEM;
	n = strlen(signing) + strlen(s64) + 2;
	*jwt = malloc(n);
	if (!*jwt)
		goto out;
	snprintf(*jwt, n, "%s.%s", signing, s64);
	rc = 0;
out:
	EVP_MD_CTX_free(ctx);
	json_decref(hdr);
	json_decref(claims);
	free(h64);
	free(c64);
	free(s64);
	free(signing);
	free(sig);
	return rc;
}

/* ---- fetching ---- */

/* Parse {"access_token", "expires_in"} into the cache. Called with mu held. */
static int take_token(struct gcs_auth *a, const char *resp, size_t len, char *err, size_t errlen)
{
	json_error_t je;
	json_t *j = json_loadb(resp, len, 0, &je);
	const char *tok = json_string_value(json_object_get(j, "access_token"));
	json_int_t ttl = json_integer_value(json_object_get(j, "expires_in"));
	int64_t margin;
	int rc = 0;

	if (!tok || !*tok || strlen(tok) >= sizeof(a->token) || ttl <= 0) {
		set_err(err, errlen, "the token response has no usable access_token/expires_in");
		rc = -EPROTO;
		goto out;
	}
	snprintf(a->token, sizeof(a->token), "%s", tok);
	margin = ttl / 2 < REFRESH_MARGIN_S ? ttl / 2 : REFRESH_MARGIN_S;
	a->refresh_at_ns = util_now_ns() + (uint64_t)(ttl - margin) * 1000000000ull;
	log_dbg(MOD, "new access token from %s, expires in %llds", a->describe, (long long)ttl);
out:
	json_decref(j);
	return rc;
}

static void describe_refusal(struct gcs_auth *a, long status, const char *resp, char *err,
			     size_t errlen)
{
	json_t *j = json_loads(resp ? resp : "", 0, NULL);
	const char *e = json_string_value(json_object_get(j, "error"));
	const char *d = json_string_value(json_object_get(j, "error_description"));

	if (e)
		set_err(err, errlen, "%s: token request refused: %ld %s%s%s", a->describe, status, e,
			d ? ": " : "", d ? d : "");
	else
		set_err(err, errlen, "%s: token request refused: HTTP %ld %.200s", a->describe,
			status, resp ? resp : "");
	json_decref(j);
	/* server text goes into one log line: no control characters */
	for (char *c = err; *c; c++)
		if ((unsigned char)*c < 0x20)
			*c = ' ';
}

static int fetch(struct gcs_auth *a, char *err, size_t errlen)
{
	char *resp = NULL, *jwt = NULL, *body = NULL;
	size_t rlen = 0, n;
	long status = 0;
	int rc;

	if (a->kind == GCS_AUTH_KEY) {
		const char *hdrs[] = { "Content-Type: application/x-www-form-urlencoded", NULL };
		static const char pre[] = "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=";

		rc = gcs_auth_jwt(a, (int64_t)time(NULL), &jwt);
		if (rc < 0) {
			set_err(err, errlen, "%s: cannot sign the JWT: %s", a->describe, strerror(-rc));
			goto out;
		}
		n = sizeof(pre) + strlen(jwt);
		body = malloc(n);
		if (!body) {
			rc = -ENOMEM;
			goto out;
		}
		/* base64url needs no escaping in a form body */
		snprintf(body, n, "%s%s", pre, jwt);
		rc = a->http(a->http_arg, a->token_uri, hdrs, body, &status, &resp, &rlen, err, errlen);
	} else {
		const char *hdrs[] = { "Metadata-Flavor: Google", NULL };
		rc = a->http(a->http_arg, a->meta_url, hdrs, NULL, &status, &resp, &rlen, err, errlen);
	}
	if (rc < 0) {
		char tmp[512];
		snprintf(tmp, sizeof(tmp), "%s", err);
		set_err(err, errlen, "%s unreachable: %s", a->describe, tmp);
		goto out;
	}
	if (status != 200) {
		describe_refusal(a, status, resp, err, errlen);
		rc = -EACCES;
		goto out;
	}
	rc = take_token(a, resp, rlen, err, errlen);
out:
	free(jwt);
	free(body);
	free(resp);
	return rc;
}

int gcs_auth_token(struct gcs_auth *a, char *out, size_t len, char *err, size_t errlen)
{
	int rc = 0;

	if (a->kind == GCS_AUTH_NONE) {
		if (len)
			out[0] = '\0';
		return 0;
	}
	pthread_mutex_lock(&a->mu);
	if (!a->refresh_at_ns || util_now_ns() >= a->refresh_at_ns)
		rc = fetch(a, err, errlen);
	if (rc == 0) {
		if (strlen(a->token) >= len)
			rc = -ENAMETOOLONG;
		else
			snprintf(out, len, "%s", a->token);
	}
	pthread_mutex_unlock(&a->mu);
	if (rc < 0)
		log_err(MOD, "no access token: %s", err);
	return rc;
}

void gcs_auth_invalidate(struct gcs_auth *a, const char *token)
{
	pthread_mutex_lock(&a->mu);
	if (!strcmp(a->token, token))
		a->refresh_at_ns = 0;
	pthread_mutex_unlock(&a->mu);
}
