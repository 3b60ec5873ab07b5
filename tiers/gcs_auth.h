/* gcs_auth: OAuth2 access tokens for the gs:// backend. Sources, in order:
 * none (STORAGE_EMULATOR_HOST), a service-account JSON key (a JWT signed
 * RS256 with OpenSSL, exchanged at the key's token_uri), the metadata server
 * (GKE Workload Identity / GCE). The token is cached and refreshed 5 minutes
 * (at most half its lifetime) before it expires; one thread fetches while
 * the others wait for it. HTTP goes through a function the caller supplies
 * (bucket_gcs.c: its retries and timeouts), so this module owns no sockets.
 * Thread-safe; the handle is owned by the caller (gcs_auth_free). */
#ifndef MTCFS_TIERS_GCS_AUTH_H
#define MTCFS_TIERS_GCS_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GCS_SCOPE "https://www.googleapis.com/auth/devstorage.read_write"
#define GCS_TOKEN_MAX 4096

/* One HTTP exchange: POST when body is not NULL, else GET; hdrs is a
 * NULL-terminated list of "Name: value". 0 with *status and the response
 * body (*resp malloc'd, NUL-terminated, owned by the caller), or -errno
 * when no response came (words in err). */
typedef int (*gcs_http_fn)(void *arg, const char *url, const char *const *hdrs,
			   const char *body, long *status, char **resp, size_t *resp_len,
			   char *err, size_t errlen);

enum gcs_auth_kind { GCS_AUTH_NONE = 0, GCS_AUTH_KEY, GCS_AUTH_METADATA };

struct gcs_auth_cfg {
	enum gcs_auth_kind kind;
	const char *key_file;        /* GCS_AUTH_KEY */
	const char *metadata_host;   /* GCS_AUTH_METADATA: host[:port] */
	gcs_http_fn http;
	void *http_arg;
};

struct gcs_auth;

/* Reads and checks the key file now (type service_account, client_email,
 * private_key, token_uri): -EINVAL with the reason in err. */
int  gcs_auth_new(const struct gcs_auth_cfg *cfg, struct gcs_auth **out, char *err, size_t errlen);
void gcs_auth_free(struct gcs_auth *a);          /* accepts NULL */

/* A valid access token into out ("" for GCS_AUTH_NONE). 0, or -EACCES when
 * the token source refused (bad key, no service account), -EHOSTUNREACH &c.
 * when it could not be reached; words in err. */
int  gcs_auth_token(struct gcs_auth *a, char *out, size_t len, char *err, size_t errlen);
/* The server rejected token (401): forget it if it is still the cached one. */
void gcs_auth_invalidate(struct gcs_auth *a, const char *token);
/* Words for messages: "service account X (key file P)", "the metadata
 * server at H", "no credentials (STORAGE_EMULATOR_HOST)". Valid until free. */
const char *gcs_auth_describe(const struct gcs_auth *a);
enum gcs_auth_kind gcs_auth_kind(const struct gcs_auth *a);

/* The signed JWT assertion for the key at time now (exposed for tests):
 * *jwt malloc'd, owned by the caller. */
int  gcs_auth_jwt(struct gcs_auth *a, int64_t now, char **jwt);

#endif
