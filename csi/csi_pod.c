/* csi_pod.c: the JobSet pod's place in its job, from its name and the
 * volume attributes (csi.md "Volume attributes"). */
#include "csi/csi_pod.h"
#include "csi/csi_cfg.h"
#include "common/util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define POD_PREFIX "csi.storage.k8s.io/"

/* A name that is safe as one directory component and in a mount option:
 * letters, digits, '-', '_', '.', not starting with '.' (no "..", no
 * hidden files), no ',' or '/'. */
static bool safe_name(const char *s, size_t max)
{
	size_t n = strlen(s);

	if (!n || n > max || s[0] == '.')
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '-' || c == '_' || c == '.'))
			return false;
	}
	return true;
}

/* A coordinator endpoint: HOST:PORT, [IPv6]:PORT or a DNS name, and
 * nothing that means something in a mount option (',' separates them,
 * '\\' escapes the next character: "h:1\\" would swallow the ",rank_hint="
 * after it). */
static bool endpoint_ok(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++) {
		char c = *s;
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '-' || c == '_' || c == '.' || c == ':' || c == '[' || c == ']' || c == '%'))
			return false;
	}
	return true;
}

/* Printable, so that a value (or a key) echoed in a reason cannot start a
 * forged log line. */
static bool printable(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			return false;
	return true;
}

static int copy(char *dst, size_t cap, const char *s, size_t n)
{
	if (n >= cap)
		return -ENAMETOOLONG;
	memcpy(dst, s, n);
	dst[n] = 0;
	return 0;
}

static bool all_digits(const char *s, size_t n)
{
	if (!n || n > 9)
		return false;
	for (size_t i = 0; i < n; i++)
		if (s[i] < '0' || s[i] > '9')
			return false;
	return true;
}

static unsigned digits_val(const char *s, size_t n)
{
	unsigned v = 0;

	for (size_t i = 0; i < n; i++)
		v = v * 10 + (unsigned)(s[i] - '0');
	return v;
}

/* <jobset>-<rjob>-<jobIndex>-<podIndex>-<suffix>, parsed from the right:
 * the indices are the only all-digit parts we can be sure of. The
 * jobset/rjob split is the last '-' unless an attribute names one side. */
static int parse_pod_name(struct csi_pod *p, const char *attr_jobset, const char *attr_rjob)
{
	const char *name = p->pod;
	const char *dash[3];
	size_t end = strlen(name), head;

	for (int i = 0; i < 3; i++) {
		const char *d = NULL;
		for (size_t j = end; j > 0; j--)
			if (name[j - 1] == '-') {
				d = name + j - 1;
				break;
			}
		if (!d)
			return -EINVAL;
		dash[i] = d;
		end = (size_t)(d - name);
	}
	/* dash[0]: before the suffix; dash[1]: before podIndex; dash[2]: before jobIndex */
	{
		const char *pi = dash[1] + 1, *ji = dash[2] + 1;
		size_t pn = (size_t)(dash[0] - pi), jn = (size_t)(dash[1] - ji);
		if (!all_digits(pi, pn) || !all_digits(ji, jn))
			return -EINVAL;
		p->pod_index = digits_val(pi, pn);
		p->job_index = digits_val(ji, jn);
	}
	head = (size_t)(dash[2] - name);        /* "<jobset>-<rjob>" */
	if (attr_jobset) {
		size_t n = strlen(attr_jobset);
		if (n + 1 >= head || strncmp(name, attr_jobset, n) || name[n] != '-')
			return -EINVAL;
		if (copy(p->jobset, sizeof(p->jobset), name, n) < 0 ||
		    copy(p->rjob, sizeof(p->rjob), name + n + 1, head - n - 1) < 0)
			return -EINVAL;
		return 0;
	}
	if (attr_rjob) {
		size_t n = strlen(attr_rjob);
		if (n + 1 >= head || strncmp(name + head - n, attr_rjob, n) || name[head - n - 1] != '-')
			return -EINVAL;
		if (copy(p->jobset, sizeof(p->jobset), name, head - n - 1) < 0 ||
		    copy(p->rjob, sizeof(p->rjob), attr_rjob, n) < 0)
			return -EINVAL;
		return 0;
	}
	for (size_t j = head; j > 0; j--)
		if (name[j - 1] == '-') {
			if (j - 1 == 0)
				return -EINVAL;
			if (copy(p->jobset, sizeof(p->jobset), name, j - 1) < 0 ||
			    copy(p->rjob, sizeof(p->rjob), name + j, head - j) < 0)
				return -EINVAL;
			return 0;
		}
	return -EINVAL;
}

static int parse_uint(const char *k, const char *v, uint64_t max, unsigned *out,
		      char *err, size_t cap)
{
	uint64_t u;

	if (util_parse_u64(v, max, &u) < 0)
		return csi_fail(err, cap, "volume attribute %s=%s: expected an integer 0..%llu", k, v,
			    (unsigned long long)max);
	*out = (unsigned)u;
	return 0;
}

/* rank = jobIndex x podsPerJob + podIndex. Without podsPerJob (and no
 * parallelism learnt) only job index 0 is sure (rank = podIndex) and one
 * pod per Job is assumed when podIndex is 0; a podIndex >= 1 of a later
 * Job has no rank until the application's replicator.yaml says
 * (CSI_RANK_NONE: no rank_hint). */
static int pod_rank(struct csi_pod *p, char *err, size_t errcap)
{
	uint64_t r;

	if (!p->pods_per_job_given && p->pod_index >= p->pods_per_job) {
		p->rank = p->job_index == 0 ? p->pod_index : CSI_RANK_NONE;
		return 0;
	}
	if (p->pod_index >= p->pods_per_job)
		return csi_fail(err, errcap, "pod index %u >= podsPerJob %u", p->pod_index,
				p->pods_per_job);
	r = (uint64_t)p->job_index * p->pods_per_job + p->pod_index;
	if (r > (1u << 20))
		return csi_fail(err, errcap, "rank %llu out of range", (unsigned long long)r);
	p->rank = (unsigned)r;
	return 0;
}

int csi_pod_set_pods_per_job(struct csi_pod *p, unsigned ppj, char *err, size_t errcap)
{
	if (p->pods_per_job_given || !ppj)
		return 0;
	p->pods_per_job = ppj;
	p->pods_per_job_given = true;  /* from here on a fact, like the attribute */
	return p->rank_given ? 0 : pod_rank(p, err, errcap);
}

int csi_pod_parse(struct csi_pod *p, const struct csi_kv *kv, size_t n, char *err, size_t errcap)
{
	const char *a_job = NULL, *a_jobset = NULL, *a_rjob = NULL, *a_ns = NULL;
	bool have_rank = false;
	unsigned rank = 0;
	int rc;

	memset(p, 0, sizeof(*p));
	p->pods_per_job = 1;
	for (size_t i = 0; i < n; i++)
		if (!printable(kv[i].key) || (kv[i].value && !printable(kv[i].value)))
			return csi_fail(err, errcap, "volume context: a control character in an "
					"attribute%s%s", printable(kv[i].key) ? " " : "",
					printable(kv[i].key) ? kv[i].key : "");
	for (size_t i = 0; i < n; i++) {
		const char *k = kv[i].key, *v = kv[i].value ? kv[i].value : "";

		if (!strncmp(k, POD_PREFIX, sizeof(POD_PREFIX) - 1)) {
			const char *s = k + sizeof(POD_PREFIX) - 1;
			if (!strcmp(s, "pod.name")) {
				if (copy(p->pod, sizeof(p->pod), v, strlen(v)) < 0)
					return csi_fail(err, errcap, "pod name too long");
			} else if (!strcmp(s, "pod.namespace")) {
				a_ns = v;
			}
			/* pod.uid, serviceAccount.name, ephemeral, serviceAccount.tokens:
			 * kubelet's; nothing of ours */
			continue;
		}
		if (!strcmp(k, "jobName"))
			a_job = v;
		else if (!strcmp(k, "jobSetName"))
			a_jobset = v;
		else if (!strcmp(k, "replicatedJobName"))
			a_rjob = v;
		else if (!strcmp(k, "podsPerJob")) {
			rc = parse_uint(k, v, 1u << 20, &p->pods_per_job, err, errcap);
			if (rc < 0)
				return rc;
			if (!p->pods_per_job)
				return csi_fail(err, errcap, "volume attribute podsPerJob=0: must be >= 1");
			p->pods_per_job_given = true;
		} else if (!strcmp(k, "rank")) {
			rc = parse_uint(k, v, 1u << 20, &rank, err, errcap);
			if (rc < 0)
				return rc;
			have_rank = true;
		} else if (!strcmp(k, "peerPort")) {
			rc = parse_uint(k, v, 65535, &p->peer_port, err, errcap);
			if (rc < 0)
				return rc;
			if (!p->peer_port)
				return csi_fail(err, errcap, "volume attribute peerPort=0 is not a port");
		} else if (!strcmp(k, "coordinator")) {
			if (!endpoint_ok(v) ||
			    copy(p->coordinator, sizeof(p->coordinator), v, strlen(v)) < 0)
				return csi_fail(err, errcap, "volume attribute coordinator=%s: expected HOST:PORT", v);
		} else if (!strcmp(k, "subdomain")) {
			if (!safe_name(v, 63))
				return csi_fail(err, errcap, "volume attribute subdomain=%s: not a Service name", v);
			copy(p->subdomain, sizeof(p->subdomain), v, strlen(v));
		} else if (!strcmp(k, "ramSize")) {
			uint64_t b;
			if (util_parse_size(v, &b) < 0 || !b ||
			    copy(p->ram_size, sizeof(p->ram_size), v, strlen(v)) < 0)
				return csi_fail(err, errcap, "volume attribute ramSize=%s: not a size (512M, 4Gi)", v);
		} else {
			return csi_fail(err, errcap, "unknown volume attribute %s", k);
		}
	}
	if (a_ns && *a_ns) {
		/* a Kubernetes namespace is a DNS label: no '.', which is what
		 * keeps the job key <namespace>.<job> unambiguous */
		if (!safe_name(a_ns, 63) || strchr(a_ns, '.'))
			return csi_fail(err, errcap, "namespace %s cannot name a directory", a_ns);
		copy(p->namespace_, sizeof(p->namespace_), a_ns, strlen(a_ns));
	} else {
		copy(p->namespace_, sizeof(p->namespace_), "default", 7);
	}
	if (p->pod[0]) {
		if (parse_pod_name(p, a_jobset, a_rjob) < 0) {
			if (!a_job || !have_rank)
				return csi_fail(err, errcap,
					    "pod %s is not named <jobset>-<rjob>-<jobIndex>-<podIndex>-<suffix>%s: "
					    "set the jobName and rank volume attributes",
					    p->pod, a_jobset || a_rjob ? " with the given jobSetName/replicatedJobName" : "");
		}
	} else if (!a_job || !have_rank) {
		return csi_fail(err, errcap, "no pod name (podInfoOnMount): the jobName and rank volume attributes are required");
	}
	if (a_job) {
		if (!safe_name(a_job, 63))
			return csi_fail(err, errcap, "jobName %s: 1-63 of [A-Za-z0-9._-], not starting with '.'", a_job);
		copy(p->job, sizeof(p->job), a_job, strlen(a_job));
	} else {
		if (!safe_name(p->jobset, 63))
			return csi_fail(err, errcap, "JobSet name %s cannot name a directory", p->jobset);
		copy(p->job, sizeof(p->job), p->jobset, strlen(p->jobset));
	}
	if (have_rank) {
		p->rank = rank;
		p->rank_given = true;
	} else if ((rc = pod_rank(p, err, errcap)) < 0) {
		return rc;
	}
	if (!p->subdomain[0] && p->jobset[0])
		copy(p->subdomain, sizeof(p->subdomain), p->jobset, strlen(p->jobset));
	if (!p->coordinator[0] && !p->jobset[0])
		return csi_fail(err, errcap, "no JobSet pod name to find rank 0 by: set the coordinator volume attribute");
	return 0;
}

int csi_pod_coordinator(const struct csi_pod *p, unsigned port, char *out, size_t cap)
{
	int n;

	if (p->coordinator[0])
		n = snprintf(out, cap, "%s", p->coordinator);
	else
		n = snprintf(out, cap, "%s-%s-0-0.%s.%s.svc:%u", p->jobset, p->rjob, p->subdomain,
			     p->namespace_, port);
	return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}
