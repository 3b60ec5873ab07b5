/* csi_kube: the few Kubernetes API reads a publish needs, in-cluster
 * (service-account token and CA) with libcurl: the Job's parallelism
 * (podsPerJob when the volume attributes do not give it) and the node of
 * rank 0's pod (the coordinator when no attribute names it: on the pod
 * network the pod's DNS name is not where its node's mtcfs listens).
 * Read-only after csi_kube_init; any RPC thread may call the lookups (each
 * makes its own connection). */
#ifndef MTCFS_CSI_KUBE_H
#define MTCFS_CSI_KUBE_H

#include <stdbool.h>
#include <stddef.h>

struct csi_kube {
	char base[300];             /* https://HOST:PORT */
	const char *token_file;
	const char *ca_file;
};

/* From --kube-api/--kube-token/--kube-ca (NULL: in-cluster defaults).
 * -ENOENT when there is no API to ask (no URL, KUBERNETES_SERVICE_HOST
 * unset: outside a cluster); -EINVAL with a reason in err. */
int csi_kube_init(struct csi_kube *k, const char *api_url, const char *token_file,
		  const char *ca_file, char *err, size_t errcap);

/* spec.parallelism of Job NS/NAME: 0, -ENOENT (no such Job), -EIO (no
 * answer, another status, no parallelism; reason in err). */
int csi_kube_job_parallelism(const struct csi_kube *k, const char *ns, const char *job,
			     unsigned *out, char *err, size_t errcap);

/* status.hostIP of the JobSet pod of job index 0, completion index 0 of
 * replicated job rjob of JobSet jobset in ns (the labels JobSet sets; a
 * pod being deleted is skipped), its name in pod. 0; -EAGAIN (no such pod
 * yet, or not scheduled; reason in err); -EIO (reason in err). */
int csi_kube_rank0_host(const struct csi_kube *k, const char *ns, const char *jobset,
			const char *rjob, char *host, size_t hcap, char *pod, size_t pcap,
			char *err, size_t errcap);

/* A response body for libcurl's CURLOPT_WRITEFUNCTION (csi_body_write,
 * WRITEDATA the struct): grown with realloc, NUL-terminated, at most max
 * bytes (past that the transfer fails); the caller frees p. */
struct csi_body {
	char *p;
	size_t len;
	size_t max;
};
size_t csi_body_write(char *data, size_t sz, size_t nm, void *arg);

/* A bearer token file's first cap-1 bytes, trailing white space dropped:
 * 0, -errno when unreadable, -ENODATA when empty. */
int csi_read_token(const char *path, char *out, size_t cap);

#endif
