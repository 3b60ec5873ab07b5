/* csi_render: the node DaemonSet of each CheckpointConfiguration
 * (mtcfs-csi render), from the template csi/daemonset.yaml.in built into
 * the binary: its name, the configuration it reads, nodeSelector,
 * tolerations and memory (inMemoryVolumeSize + 6Gi) from the
 * configuration; the rest is the template's. Pure; main thread. */
#ifndef MTCFS_CSI_RENDER_H
#define MTCFS_CSI_RENDER_H

#include "csi/csi_cfg.h"

#include <stdio.h>

#define CSI_RENDER_OVERHEAD (6ull << 30)   /* catalog, daemons, slack beside the tmpfs */

/* Write n DaemonSets (YAML documents) to out. Refused (-EINVAL, reason in
 * err, nothing written): a configuration without inMemoryVolumeSize or a
 * name that cannot name a DaemonSet, two of one name, two whose
 * nodeSelectors can select one node (no key on which both differ: GKE
 * allows several configurations only on disjoint nodes). */
int csi_render(const struct csi_cfg *cfgs, size_t n, FILE *out, char *err, size_t errcap);

#endif
