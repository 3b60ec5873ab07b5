/* csi_cfg: the node driver's configuration, the ConfigMap form of GKE's
 * CheckpointConfiguration (its spec fields plus mtcfs extras), read once
 * at start-up by the main thread; read-only afterwards, so every thread
 * may read it without a lock. csi_cfg_free() releases what load filled. */
#ifndef MTCFS_CSI_CFG_H
#define MTCFS_CSI_CFG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A YAML map of strings, in the order written. */
struct csi_cfg_map {
	char **keys;
	char **vals;
	size_t n;
};

struct csi_cfg {
	char *name;             /* metadata.name of the whole object, or NULL (spec only) */
	struct csi_cfg_map node_selector;   /* nodeSelector (mtcfs-csi render) */
	struct csi_cfg_map *tolerations;    /* tolerations: key/operator/value/effect/tolerationSeconds */
	size_t n_tolerations;
	char *bucket;           /* bucket= URL (gs://NAME or as given with ://), or NULL */
	char *ram_size;         /* inMemoryVolumeSize as written ("200Gi"), or NULL */
	uint64_t ram_bytes;     /* the same in bytes; 0 when not given */
	unsigned peer_port;     /* peerPort, default 8765 */
	unsigned metrics_port;  /* metricsPort, 0 = off */
	char *secret_file;      /* secretFile */
	char *gcs_key_file;     /* gcsKeyFile */
	char *gcs_endpoint;     /* gcsEndpoint */
	unsigned restore_timeout; /* restoreTimeout seconds, 0 = mtcfs default */
	char **mount_opts;      /* mountOptions: extra -o words, NULL-terminated */
	size_t n_mount_opts;
	size_t n_gcsfuse_opts;  /* gcsFuseMountOptions seen (none applies to mtcfs) */
	size_t n_gke_ignored;   /* csiEphemeralLimit, replicationOptions given (no effect) */
	bool external_jax_ids;  /* enableExternalJaxProcessIds: true (no effect either) */
};

/* Defaults only (no file). */
void csi_cfg_init(struct csi_cfg *c);
/* Format an error for the caller's err[cap] and return -EINVAL: the one
 * way csi's parsers (config, pod info, watch answers) refuse input. */
int csi_fail(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Parse PATH (YAML or JSON: a whole CheckpointConfiguration object or just
 * its spec map). Returns 0, or -EINVAL with a one-line reason in err (an
 * unknown key, a bad size or port, not a mapping), or -errno of reading. */
int csi_cfg_load(struct csi_cfg *c, const char *path, char *err, size_t errcap);

/* Parse the same from a buffer (tests, and load's body). */
int csi_cfg_parse(struct csi_cfg *c, const char *buf, size_t len, char *err, size_t errcap);

void csi_cfg_free(struct csi_cfg *c);

/* Every document of a YAML stream (documents separated by "---"), each
 * one configuration: *out (n of them) to free with csi_cfg_free_all.
 * An empty document is skipped. 0, or -EINVAL with the document's index
 * in err. */
int csi_cfg_parse_all(const char *buf, size_t len, struct csi_cfg **out, size_t *n,
		      char *err, size_t errcap);
void csi_cfg_free_all(struct csi_cfg *c, size_t n);

#endif
