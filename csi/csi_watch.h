/* csi_watch: polls the node's configuration object in the cluster (the
 * CheckpointConfiguration, or the ConfigMap of its spec) on its own thread
 * with libcurl, in-cluster (service-account token and CA), and tells
 * csi_node when it is deleted (404 on `grace` polls in a row) or there
 * with which inMemoryVolumeSize. Any other answer (5xx, 403, a timeout, a
 * refused connection) changes nothing: an API blip must not free a
 * node's checkpoints. The gRPC threads never wait for it. */
#ifndef MTCFS_CSI_WATCH_H
#define MTCFS_CSI_WATCH_H

#include "csi/csi_node.h"

#include <stddef.h>

struct csi_watch_opts {
	const char *what;           /* checkpointconfiguration/NAME or configmap/NAMESPACE/NAME */
	const char *api_url;        /* NULL: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT */
	const char *token_file;     /* NULL: the service account's token */
	const char *ca_file;        /* NULL: the service account's ca.crt */
	unsigned interval_s;        /* between polls, >= 1 */
	unsigned grace;             /* 404s in a row that mean deleted, >= 1 */
};

struct csi_watch;

/* Check o (-EINVAL with a reason in err: a bad `what`, no API address)
 * and start the thread. n must outlive the watch. */
int csi_watch_start(const struct csi_watch_opts *o, struct csi_node *n, struct csi_watch **out,
		    char *err, size_t errcap);

/* Stop and join the thread (a poll under way ends at its timeout); NULL is fine. */
void csi_watch_stop(struct csi_watch *w);

#endif
