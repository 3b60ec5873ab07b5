/* csi_pod: who the publishing pod is in its job. Pure functions over the
 * volume context of one NodePublishVolume (pod info kubelet adds with
 * podInfoOnMount, and the volume attributes documented in csi.md): the
 * job key, the node rank and the coordinator address, the way GKE's rank
 * server derives them from the JobSet pod. Called from any RPC thread;
 * no state. */
#ifndef MTCFS_CSI_POD_H
#define MTCFS_CSI_POD_H

#include <stdbool.h>
#include <stddef.h>

#define CSI_NAME_MAX 253        /* a DNS subdomain: the longest pod name */
#define CSI_RANK_NONE 0xffffffffu /* rank not known from the pod (the yaml gives it) */

struct csi_kv {
	const char *key;
	const char *value;
};

struct csi_pod {
	char namespace_[64];
	char pod[CSI_NAME_MAX + 1];
	char job[64];               /* the mtcfs job: jobName or the JobSet name */
	char jobset[64];
	char rjob[64];
	unsigned job_index, pod_index, pods_per_job;
	unsigned rank;              /* CSI_RANK_NONE: no podsPerJob to compute it with */
	bool pods_per_job_given;    /* podsPerJob attribute (else 1, or the Job's parallelism) */
	bool rank_given;            /* rank attribute */
	unsigned peer_port;         /* 0: the configuration's */
	char coordinator[CSI_NAME_MAX + 64];   /* "" : derive when the port is known */
	char subdomain[64];
	char ram_size[32];          /* "" : none */
};

/* Fill p from the volume context (n pairs; pointers only read). Returns 0,
 * or -EINVAL with a one-line reason in err: an unknown attribute, a pod
 * name that is not a JobSet pod's when no rank/jobName attribute stands in,
 * a name that cannot be a directory name, a bad number. */
int csi_pod_parse(struct csi_pod *p, const struct csi_kv *kv, size_t n, char *err, size_t errcap);

/* The Job's parallelism learnt (the API) when no podsPerJob attribute is
 * given: the rank is recomputed with it unless a rank attribute is.
 * 0 or -EINVAL (the pod index is not below it; reason in err). */
int csi_pod_set_pods_per_job(struct csi_pod *p, unsigned ppj, char *err, size_t errcap);

/* The coordinator endpoint: the attribute if given, else the rank-0 pod's
 * name under the job's headless Service:
 *   <jobset>-<rjob>-0-0.<subdomain>.<namespace>.svc:<port>
 * Returns 0 or -ENAMETOOLONG. */
int csi_pod_coordinator(const struct csi_pod *p, unsigned port, char *out, size_t cap);

#endif
