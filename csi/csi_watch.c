/* csi_watch.c: see csi_watch.h. One thread: GET the object, judge the
 * answer, sleep interval_s on a condition variable (stop wakes it). The
 * token file is read at every poll: bound service-account tokens are
 * rotated by kubelet. */
#include "csi/csi_watch.h"
#include "csi/csi_cfg.h"
#include "csi/csi_kube.h"
#include "common/log.h"
#include "common/util.h"

#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MOD "csi"
#define SA_DIR "/var/run/secrets/kubernetes.io/serviceaccount"
#define BODY_MAX (1u << 20)
#define TOKEN_MAX 16384
#define URL_MAX 1024
#define ERR_MAX 512

struct csi_watch {
	struct csi_node *node;
	struct csi_watch_opts o;
	char url[URL_MAX];
	bool configmap;             /* the spec is the ConfigMap's data["config.yaml"] */
	pthread_t th;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool stop;                  /* (mu) */
	unsigned misses;            /* 404s in a row (thread only) */
	int last;                   /* last answer logged: HTTP status, -1 no answer, 0 none yet */
};

/* A name the API would accept in a path (DNS-1123 subdomain characters):
 * nothing in it can change the URL. */
static bool k8s_name(const char *s, size_t len)
{
	if (!len || len > 253)
		return false;
	for (size_t i = 0; i < len; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') ||
		      s[i] == '-' || s[i] == '.'))
			return false;
	return true;
}

static int build_url(struct csi_watch *w, char *err, size_t cap)
{
	const char *what = w->o.what, *base = w->o.api_url, *slash;
	char defbase[300];
	int n;

	if (!base) {
		const char *h = getenv("KUBERNETES_SERVICE_HOST"), *p = getenv("KUBERNETES_SERVICE_PORT");
		if (!h || !*h)
			return csi_fail(err, cap, "--watch-config: KUBERNETES_SERVICE_HOST is not set "
				    "(not in a pod? give --kube-api URL)");
		n = snprintf(defbase, sizeof(defbase), strchr(h, ':') ? "https://[%s]:%s" : "https://%s:%s",
			     h, p && *p ? p : "443");
		if (n < 0 || (size_t)n >= sizeof(defbase))
			return csi_fail(err, cap, "KUBERNETES_SERVICE_HOST too long");
		base = defbase;
	}
	if (!strncmp(what, "checkpointconfiguration/", 24)) {
		what += 24;
		if (!k8s_name(what, strlen(what)))
			return csi_fail(err, cap, "--watch-config %s: bad name", w->o.what);
		n = snprintf(w->url, sizeof(w->url),
			     "%s/apis/checkpointing.mtcfs.dev/v1/checkpointconfigurations/%s", base, what);
	} else if (!strncmp(what, "configmap/", 10)) {
		what += 10;
		slash = strchr(what, '/');
		if (!slash || !k8s_name(what, (size_t)(slash - what)) ||
		    !k8s_name(slash + 1, strlen(slash + 1)))
			return csi_fail(err, cap, "--watch-config %s: expected configmap/NAMESPACE/NAME",
				    w->o.what);
		w->configmap = true;
		n = snprintf(w->url, sizeof(w->url), "%s/api/v1/namespaces/%.*s/configmaps/%s", base,
			     (int)(slash - what), what, slash + 1);
	} else {
		return csi_fail(err, cap, "--watch-config %s: expected checkpointconfiguration/NAME or "
			    "configmap/NAMESPACE/NAME", w->o.what);
	}
	if (n < 0 || (size_t)n >= sizeof(w->url))
		return csi_fail(err, cap, "--watch-config: URL too long");
	return 0;
}


/* One GET: the HTTP status (with the body in b), or -1 when there was no
 * answer (curl's reason in err). */
static long get(struct csi_watch *w, struct csi_body *b, char *err, size_t cap)
{
	static char token[TOKEN_MAX];   /* the watch thread's only */
	char auth[TOKEN_MAX + 32];
	struct curl_slist *hdr = NULL;
	long code = -1, tmo;
	CURLcode cc;
	CURL *c;
	int rc;

	rc = csi_read_token(w->o.token_file, token, sizeof(token));
	if (rc < 0) {
		snprintf(err, cap, "token %s: %s", w->o.token_file, strerror(-rc));
		return -1;
	}
	c = curl_easy_init();
	if (!c) {
		snprintf(err, cap, "curl_easy_init failed");
		return -1;
	}
	snprintf(auth, sizeof(auth), "Authorization: Bearer %s", token);
	hdr = curl_slist_append(hdr, auth);
	hdr = hdr ? curl_slist_append(hdr, "Accept: application/json") : NULL;
	/* a poll never outlasts the interval by much: the next one retries */
	tmo = w->o.interval_s < 10 ? (w->o.interval_s < 3 ? 3 : (long)w->o.interval_s) : 10;
	curl_easy_setopt(c, CURLOPT_URL, w->url);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
	curl_easy_setopt(c, CURLOPT_CAINFO, w->o.ca_file);
	curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "https");
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_TIMEOUT, tmo);
	curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, tmo);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, csi_body_write);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, b);
	cc = hdr ? curl_easy_perform(c) : CURLE_OUT_OF_MEMORY;
	if (cc == CURLE_OK)
		curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
	else
		snprintf(err, cap, "%s", curl_easy_strerror(cc));
	curl_slist_free_all(hdr);
	curl_easy_cleanup(c);
	explicit_bzero(auth, sizeof(auth));
	return code;
}

/* The inMemoryVolumeSize of a 200 answer's object; -EINVAL when its spec
 * does not parse (reason in err). */
static int object_size(struct csi_watch *w, const struct csi_body *b, uint64_t *bytes,
		       char *err, size_t cap)
{
	struct csi_cfg cfg;
	const char *spec = b->p;
	size_t len = b->len;
	json_t *root = NULL;
	int rc;

	if (!b->p)
		return csi_fail(err, cap, "empty answer");
	if (w->configmap) {
		json_error_t je;
		json_t *v;

		root = json_loadb(b->p, b->len, 0, &je);
		v = json_object_get(json_object_get(root, "data"), "config.yaml");
		if (!json_is_string(v)) {
			json_decref(root);
			return csi_fail(err, cap, "the ConfigMap has no data key config.yaml");
		}
		spec = json_string_value(v);
		len = json_string_length(v);
	}
	csi_cfg_init(&cfg);
	rc = csi_cfg_parse(&cfg, spec, len, err, cap);
	*bytes = cfg.ram_bytes;
	csi_cfg_free(&cfg);
	json_decref(root);
	return rc;
}

static void poll_once(struct csi_watch *w)
{
	char err[ERR_MAX] = "";
	struct csi_body b = { NULL, 0, BODY_MAX };   /* too big for a config object: fails */
	uint64_t bytes = 0;
	long code = get(w, &b, err, sizeof(err));

	if (code == 404) {
		w->misses++;
		if (w->last != 404)
			log_info(MOD, "watch %s: not found (%u of %u polls in a row before it counts as "
				 "deleted)", w->o.what, w->misses, w->o.grace);
		if (w->misses >= w->o.grace)
			csi_node_config_gone(w->node);
	} else if (code == 200) {
		w->misses = 0;
		if (object_size(w, &b, &bytes, err, sizeof(err)) < 0) {
			if (w->last != 200)
				log_warn(MOD, "watch %s: %s (kept as it is)", w->o.what, err);
			csi_node_config_present(w->node, 0);
		} else {
			if (w->last != 200 && w->last != 0)
				log_info(MOD, "watch %s: found", w->o.what);
			csi_node_config_present(w->node, bytes);
		}
	} else {
		/* not an answer about the object: nothing changes, and a 404
		 * after it starts counting anew */
		w->misses = 0;
		if (w->last != (code < 0 ? -1 : (int)code)) {
			if (code < 0)
				log_warn(MOD, "watch %s: %s: %s (nothing changed; retrying)", w->o.what,
					 w->url, err);
			else
				log_warn(MOD, "watch %s: %s: HTTP %ld (nothing changed; retrying)",
					 w->o.what, w->url, code);
		}
	}
	w->last = code < 0 ? -1 : (int)code;
	free(b.p);
}

static void *watch_run(void *arg)
{
	struct csi_watch *w = arg;
	struct timespec ts;

	for (;;) {
		poll_once(w);
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_sec += (time_t)w->o.interval_s;
		pthread_mutex_lock(&w->mu);
		while (!w->stop && pthread_cond_timedwait(&w->cv, &w->mu, &ts) != ETIMEDOUT)
			;
		if (w->stop) {
			pthread_mutex_unlock(&w->mu);
			break;
		}
		pthread_mutex_unlock(&w->mu);
	}
	return NULL;
}

int csi_watch_start(const struct csi_watch_opts *o, struct csi_node *n, struct csi_watch **out,
		    char *err, size_t errcap)
{
	struct csi_watch *w;
	int rc;

	*out = NULL;
	if (!o->interval_s || !o->grace)
		return csi_fail(err, errcap, "--watch-interval and --watch-grace must be >= 1");
	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->node = n;
	w->o = *o;
	if (!w->o.token_file)
		w->o.token_file = SA_DIR "/token";
	if (!w->o.ca_file)
		w->o.ca_file = SA_DIR "/ca.crt";
	rc = build_url(w, err, errcap);
	if (rc < 0) {
		free(w);
		return rc;
	}
	if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
		free(w);
		return csi_fail(err, errcap, "curl_global_init failed");
	}
	pthread_mutex_init(&w->mu, NULL);
	util_cond_init_monotonic(&w->cv);
	rc = pthread_create(&w->th, NULL, watch_run, w);
	if (rc != 0) {
		pthread_cond_destroy(&w->cv);
		pthread_mutex_destroy(&w->mu);
		free(w);
		return csi_fail(err, errcap, "watch thread: %s", strerror(rc));
	}
	log_info(MOD, "watching %s at %s every %u s (deleted after %u not-found polls in a row)",
		 o->what, w->url, o->interval_s, o->grace);
	*out = w;
	return 0;
}

void csi_watch_stop(struct csi_watch *w)
{
	if (!w)
		return;
	pthread_mutex_lock(&w->mu);
	w->stop = true;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
	pthread_join(w->th, NULL);
	pthread_cond_destroy(&w->cv);
	pthread_mutex_destroy(&w->mu);
	free(w);
	curl_global_cleanup();
}
