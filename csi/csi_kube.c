/* csi_kube.c: see csi_kube.h. GETs of JSON with a bearer token read at
 * every call (bound tokens are rotated by kubelet). */
#include "csi/csi_kube.h"
#include "csi/csi_cfg.h"

#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SA_DIR "/var/run/secrets/kubernetes.io/serviceaccount"
#define BODY_MAX (8u << 20)
#define TOKEN_MAX 16384
#define KUBE_TIMEOUT_S 10L


/* DNS-1123 characters only: nothing that could change the URL. */
static bool k8s_name(const char *s)
{
	size_t n = strlen(s);

	if (!n || n > 253)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-' ||
		      s[i] == '.'))
			return false;
	return true;
}

int csi_kube_init(struct csi_kube *k, const char *api_url, const char *token_file,
		  const char *ca_file, char *err, size_t errcap)
{
	int n;

	memset(k, 0, sizeof(*k));
	k->token_file = token_file ? token_file : SA_DIR "/token";
	k->ca_file = ca_file ? ca_file : SA_DIR "/ca.crt";
	if (api_url) {
		n = snprintf(k->base, sizeof(k->base), "%s", api_url);
	} else {
		const char *h = getenv("KUBERNETES_SERVICE_HOST"), *p = getenv("KUBERNETES_SERVICE_PORT");
		if (!h || !*h)
			return -ENOENT;
		n = snprintf(k->base, sizeof(k->base), strchr(h, ':') ? "https://[%s]:%s" : "https://%s:%s",
			     h, p && *p ? p : "443");
	}
	if (n < 0 || (size_t)n >= sizeof(k->base))
		return csi_fail(err, errcap, "Kubernetes API URL too long");
	while (n > 0 && k->base[n - 1] == '/')
		k->base[--n] = 0;
	return 0;
}

size_t csi_body_write(char *data, size_t sz, size_t nm, void *arg)
{
	struct csi_body *b = arg;
	size_t n = sz * nm;
	char *p;

	if (b->len + n > b->max)
		return 0;               /* fails the transfer */
	p = realloc(b->p, b->len + n + 1);
	if (!p)
		return 0;
	memcpy(p + b->len, data, n);
	b->p = p;
	b->len += n;
	b->p[b->len] = 0;
	return n;
}

int csi_read_token(const char *path, char *out, size_t cap)
{
	FILE *f = fopen(path, "re");
	size_t n;

	if (!f)
		return -errno;
	n = fread(out, 1, cap - 1, f);
	fclose(f);
	while (n && (out[n - 1] == '\n' || out[n - 1] == '\r' || out[n - 1] == ' '))
		n--;
	out[n] = 0;
	return n ? 0 : -ENODATA;
}

/* GET base+path: the HTTP status with the parsed body in *out (NULL when
 * not JSON), or -1 with the reason in err. */
static long get_json(const struct csi_kube *k, const char *path, json_t **out, char *err,
		     size_t cap)
{
	char *token = malloc(TOKEN_MAX), *auth = malloc(TOKEN_MAX + 32), url[1024];
	struct curl_slist *hdr = NULL;
	struct csi_body b = { NULL, 0, BODY_MAX };
	long code = -1;
	CURLcode cc;
	CURL *c = NULL;
	int rc;

	*out = NULL;
	if (!token || !auth) {
		snprintf(err, cap, "out of memory");
		goto out;
	}
	if (snprintf(url, sizeof(url), "%s%s", k->base, path) >= (int)sizeof(url)) {
		snprintf(err, cap, "URL too long");
		goto out;
	}
	rc = csi_read_token(k->token_file, token, TOKEN_MAX);
	if (rc < 0) {
		snprintf(err, cap, "token %s: %s", k->token_file, strerror(-rc));
		goto out;
	}
	c = curl_easy_init();
	if (!c) {
		snprintf(err, cap, "curl_easy_init failed");
		goto out;
	}
	snprintf(auth, TOKEN_MAX + 32, "Authorization: Bearer %s", token);
	hdr = curl_slist_append(hdr, auth);
	hdr = hdr ? curl_slist_append(hdr, "Accept: application/json") : NULL;
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
	curl_easy_setopt(c, CURLOPT_CAINFO, k->ca_file);
	curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "https");
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_TIMEOUT, KUBE_TIMEOUT_S);
	curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, KUBE_TIMEOUT_S);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, csi_body_write);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
	cc = hdr ? curl_easy_perform(c) : CURLE_OUT_OF_MEMORY;
	if (cc == CURLE_OK) {
		curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
		if (b.p)
			*out = json_loadb(b.p, b.len, 0, NULL);
	} else {
		snprintf(err, cap, "%s: %s", url, curl_easy_strerror(cc));
	}
out:
	curl_slist_free_all(hdr);
	if (c)
		curl_easy_cleanup(c);
	if (auth)
		explicit_bzero(auth, TOKEN_MAX + 32);
	if (token)
		explicit_bzero(token, TOKEN_MAX);
	free(auth);
	free(token);
	free(b.p);
	return code;
}

int csi_kube_job_parallelism(const struct csi_kube *k, const char *ns, const char *job,
			     unsigned *out, char *err, size_t errcap)
{
	char path[600];
	json_t *root, *v;
	long code;
	int rc = -EIO;

	if (!k8s_name(ns) || !k8s_name(job)) {
		snprintf(err, errcap, "Job %s/%s: not a Kubernetes name", ns, job);
		return -EIO;
	}
	snprintf(path, sizeof(path), "/apis/batch/v1/namespaces/%s/jobs/%s", ns, job);
	code = get_json(k, path, &root, err, errcap);
	if (code == 404) {
		rc = -ENOENT;
		snprintf(err, errcap, "Job %s/%s not found", ns, job);
	} else if (code == 200) {
		v = json_object_get(json_object_get(root, "spec"), "parallelism");
		if (json_is_integer(v) && json_integer_value(v) >= 1 &&
		    json_integer_value(v) <= (1 << 20)) {
			*out = (unsigned)json_integer_value(v);
			rc = 0;
		} else {
			snprintf(err, errcap, "Job %s/%s has no spec.parallelism", ns, job);
		}
	} else if (code >= 0) {
		snprintf(err, errcap, "GET %s: HTTP %ld", path, code);
	}
	json_decref(root);
	return rc;
}

int csi_kube_rank0_host(const struct csi_kube *k, const char *ns, const char *jobset,
			const char *rjob, char *host, size_t hcap, char *pod, size_t pcap,
			char *err, size_t errcap)
{
	char path[1024];
	json_t *root, *items, *it;
	size_t i;
	long code;
	int rc;

	if (!k8s_name(ns) || !k8s_name(jobset) || !k8s_name(rjob)) {
		snprintf(err, errcap, "JobSet %s/%s: not a Kubernetes name", ns, jobset);
		return -EIO;
	}
	/* the labels JobSet puts on its pods; '/', '=' and ',' escaped */
	snprintf(path, sizeof(path),
		 "/api/v1/namespaces/%s/pods?labelSelector=jobset.sigs.k8s.io%%2Fjobset-name%%3D%s"
		 "%%2Cjobset.sigs.k8s.io%%2Freplicatedjob-name%%3D%s%%2Cjobset.sigs.k8s.io%%2Fjob-index%%3D0"
		 "%%2Cbatch.kubernetes.io%%2Fjob-completion-index%%3D0", ns, jobset, rjob);
	code = get_json(k, path, &root, err, errcap);
	if (code != 200) {
		if (code >= 0)
			snprintf(err, errcap, "GET /api/v1/namespaces/%s/pods (JobSet %s rank 0): HTTP %ld",
				 ns, jobset, code);
		json_decref(root);
		return -EIO;
	}
	items = json_object_get(root, "items");
	rc = -EAGAIN;
	snprintf(err, errcap, "JobSet %s/%s: no pod of job index 0, completion index 0 of %s yet",
		 ns, jobset, rjob);
	json_array_foreach(items, i, it) {
		json_t *meta = json_object_get(it, "metadata"), *st = json_object_get(it, "status");
		const char *name = json_string_value(json_object_get(meta, "name"));
		const char *ip = json_string_value(json_object_get(st, "hostIP"));

		if (json_object_get(meta, "deletionTimestamp"))
			continue;       /* the previous generation's, going */
		snprintf(pod, pcap, "%s", name ? name : "?");
		if (!ip || !*ip) {
			snprintf(err, errcap, "rank 0's pod %s/%s is not scheduled yet", ns, pod);
			continue;
		}
		if ((size_t)snprintf(host, hcap, "%s", ip) >= hcap)
			continue;
		rc = 0;
		break;
	}
	json_decref(root);
	return rc;
}
