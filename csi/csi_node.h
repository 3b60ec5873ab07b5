/* csi_node: the node's RAM tier and its job mounts, the state behind the
 * CSI Node service. Owns the tmpfs at ram_root, one long-lived mtcfs
 * process per (namespace, job) mounted under state_dir, and the bind
 * mounts onto kubelet's target paths. RPC threads call publish/unpublish
 * concurrently; one mutex (mu) serializes them, which is what makes
 * repeated and concurrent publishes of one job idempotent. Created and
 * destroyed by the main thread; destroy stops the job mounts (SIGTERM,
 * they unmount themselves) and leaves the tmpfs and its RAMDIRs: the next
 * driver restarts the jobs on the same data. */
#ifndef MTCFS_CSI_NODE_H
#define MTCFS_CSI_NODE_H

#include "csi/csi_cfg.h"
#include "csi/csi_kube.h"
#include "csi/csi_pod.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

struct csi_node_opts {
	const char *node_id;
	const char *ram_root;       /* the tmpfs mount point */
	const char *state_dir;      /* per job <key>/mnt and <key>/mtcfs.log */
	const char *node_address;   /* listen address of the job mounts */
	const char *mtcfs_bin;      /* path or name (PATH lookup) of mtcfs */
	bool no_tmpfs;              /* use ram_root as it is */
	bool log_json;              /* pass log_format=json to the job mounts */
	bool debug;                 /* pass -d to the job mounts */
	const struct csi_cfg *cfg;  /* borrowed; outlives the node */
	const char *watch;          /* --watch-config's KIND/NAME, named in refusals; or NULL */
	const char *kubelet_dir;    /* kubelet's root: targets must be under its pods/ */
	unsigned idle_s;            /* a job mount no pod uses stops after this (its RAM stays) */
	unsigned free_pct;          /* RAM of stopped jobs is freed above this % use (0: never) */
	const struct csi_kube *kube; /* the API, for podsPerJob and rank 0's node; NULL: none */
};

struct csi_node;

/* Create the directories and mount the RAM tier. The strings in o are
 * borrowed for the node's life. 0, or -errno with a reason in err. */
int csi_node_create(const struct csi_node_opts *o, struct csi_node **out, char *err, size_t errcap);

/* Stop every job mount this driver started; NULL is fine. */
void csi_node_destroy(struct csi_node *n);

struct csi_publish {
	const char *volume_id;
	const char *target;
	bool readonly;
	const struct csi_kv *ctx;   /* volume context: pod info + attributes */
	size_t n_ctx;
};

/* Bind the job's mount (started on first use) onto rq->target, which must
 * be <kubelet_dir>/pods/<uid>/volumes/... (no "..", no symlink on the way).
 * The publish is recorded in <state_dir>/<key>/published, so that a later
 * driver knows it too. 0;
 * -EINVAL bad request (reason in err); -EEXIST target holds another mount;
 * -EBUSY the job runs with another rank and is still published; -EIO the
 * job mount did not come up (err names its log); other -errno. */
int csi_node_publish(struct csi_node *n, const struct csi_publish *rq, char *err, size_t errcap);

/* Unmount the bind at target (lazily when busy) and remove the directory;
 * only an mtcfs bind (what this driver publishes), never another mount
 * (-EPERM). The job mount stays; when its last pod is gone it stops after
 * o->idle_s (its RAMDIR stays for the job's next pods), at once when
 * another job needs its peer port. A target that is not mounted is fine
 * (0). */
int csi_node_unpublish(struct csi_node *n, const char *volume_id, const char *target,
		       char *err, size_t errcap);

/* Free the node's RAM: unmount every job mount under o->state_dir and
 * the tmpfs at o->ram_root (lazily when busy), with the committed data in
 * it. For when the configuration is deleted, with no driver running
 * (mtcfs-csi --release). 0, or the first -errno (reason in err). */
int csi_node_release(const struct csi_node_opts *o, char *err, size_t errcap);

/* What each job holds on the node, one line a job (mtcfs-csi --status):
 * its key, published (a pod binds it) / idle (no pod, its mtcfs runs) /
 * stopped (only its RAMDIR), the bytes of its RAMDIR, its pods, since when
 * it has had none; first the RAM tier's use. Reads the files a driver
 * keeps, so it works beside a running driver. 0 or -errno. */
int csi_node_status(const struct csi_node_opts *o, FILE *out, char *err, size_t errcap);

/* The watched configuration is deleted (csi_watch): refuse new publishes
 * (-EBUSY), stop the job mounts nobody publishes, and unmount the RAM tier
 * once none is left (the rest go at their last unpublish). Logs once. */
void csi_node_config_gone(struct csi_node *n);

/* The watched configuration exists with inMemoryVolumeSize ram_bytes (0:
 * none given). Publishes work again (a freed RAM tier is mounted anew at
 * the next one, with this size); a mounted tmpfs is resized to it unless
 * that is below what it holds (WARN). */
void csi_node_config_present(struct csi_node *n, uint64_t ram_bytes);

#endif
