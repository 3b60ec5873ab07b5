/* metrics: process-wide counters and histograms for the Prometheus
 * endpoint. Any thread updates them (relaxed atomics, no locks); the HTTP
 * thread renders them. Gauges that belong to a module (RAM tier use, peer
 * reachability) are read through a callback at render time. */
#ifndef MTCFS_COMMON_METRICS_H
#define MTCFS_COMMON_METRICS_H

#include <stddef.h>
#include <stdint.h>

enum metric_counter {
	MC_BYTES_WRITTEN,       /* bytes the app wrote through the mount */
	MC_COMMITS,             /* steps committed (sealed) */
	MC_COMMIT_FAILURES,
	MC_REPL_BYTES,          /* bytes pushed to peers */
	MC_REPL_SHARDS,         /* replicas pushed (or linked) */
	MC_REPL_FAILURES,
	MC_REPLICAS_RECEIVED,
	MC_RESTORES_LOCAL,      /* restores by source: mtcfs_restores_total{source=...} */
	MC_RESTORES_PEER,
	MC_RESTORES_BUCKET,
	MC_RESTORES_NONE,
	MC_RESTORE_FAILURES,
	MC_RESTORE_BYTES,       /* bytes fetched for restores */
	MC_BACKUP_BYTES,
	MC_BACKUPS,             /* also stamps mtcfs_last_backup_success_timestamp_seconds */
	MC_BACKUP_FAILURES,
	MC_GC_DROPPED,          /* shards dropped by policy */
	MC__COUNT
};

enum metric_hist {
	MH_SEAL_SECONDS,
	MH_REPL_SECONDS,
	MH_RESTORE_SECONDS,
	MH_BACKUP_SECONDS,
	MH__COUNT
};

void metrics_add(enum metric_counter c, uint64_t v);
void metrics_observe(enum metric_hist h, double seconds);

struct metrics_gauges {
	uint64_t ram_used, ram_size;
	int peers_total, peers_reachable;   /* -1 when there is no peer tier */
	int64_t lkg_step;                   /* -1 when unknown */
	int64_t replicated_lkg_step;        /* -1 when unknown or no peer tier */
	int64_t last_commit_step;           /* -1 when none */
};

/* Prometheus text format (version 0.0.4) into a malloc'd buffer. */
int metrics_render(const struct metrics_gauges *g, char **buf, size_t *len);

#endif
