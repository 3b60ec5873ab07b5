/* bucket_gcs_i: what the pieces of the gs:// backend (bucket_gcs.c,
 * bucket_gcs_http.c, bucket_gcs_retry.c, bucket_gcs_put.c, bucket_gcs_get.c)
 * share and nothing else may use: the backend's state, one request, and the
 * helpers each piece documents at its definition. Threads: any (the handle
 * pool is under gcs.mu). */
#ifndef MTCFS_TIERS_BUCKET_GCS_I_H
#define MTCFS_TIERS_BUCKET_GCS_I_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <curl/curl.h>
#include <jansson.h>

#include "tiers/bucket.h"

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

static inline struct gcs *G(struct bkt *b) { return bkt_priv(b); }

/* A growing NUL-terminated string (bucket_gcs.c); err: the first failure,
 * after which adds do nothing. */
struct sb { char *p; size_t n, cap; int err; };

/* One request and its outcome, over all its attempts (bucket_gcs_http.c,
 * bucket_gcs_retry.c). */
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

/* Shared by the pieces; each is documented where it is defined. */
void gcs_sb_add(struct sb *s, const char *src);
void gcs_sb_addf(struct sb *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void gcs_crc_b64(uint32_t crc, char out[16]);
bool gcs_b64_crc(const char *s, size_t len, uint32_t *crc);
bool gcs_take_lit(const char **s, const char *lit);
bool gcs_take_num(const char **s, uint64_t *v);
bool gcs_parse_i64(const char *s, int64_t *v);
void gcs_req_init(struct req *r, struct gcs *g, const char *method, const char *url,
		  const char *what, const char *perm);
void gcs_req_free(struct req *r);
int gcs_attempt(struct req *r, char *tok, CURLcode *cc);
uint64_t gcs_rng_next(void);
unsigned gcs_backoff_ms(const struct gcs *g, unsigned attempt, const char *retry_after);
void gcs_sleep_ms(unsigned ms);
int gcs_run(struct req *r);
int gcs_http_fail(struct req *r);
char *gcs_full_name(const struct gcs *g, const char *name);
char *gcs_what_of(const struct gcs *g, const char *full);
char *gcs_obj_url(const struct gcs *g, const char *full, const char *query);
char *gcs_upload_url(const struct gcs *g, const char *type, const char *name);
int gcs_obj_fields(json_t *o, uint64_t *size, bool *has_crc, uint32_t *crc, int64_t *gen);
json_t *gcs_parse_json(struct req *r);
int gcs_put(struct bkt *b, const char *name, const struct bkt_src *src);
int gcs_stat_full(struct gcs *g, const char *full, const char *what, uint64_t *size,
		  bool *has_crc, uint32_t *crc, int64_t gen);

int gcs_put(struct bkt *b, const char *name, const struct bkt_src *src);
int gcs_get_file(struct bkt *b, const char *name, int fd, unsigned ranges,
		 uint64_t *size, uint32_t *crcp);
int gcs_get_buf(struct bkt *b, const char *name, size_t max, void **bufp, size_t *lenp);

#endif
