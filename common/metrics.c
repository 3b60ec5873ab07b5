#include "common/metrics.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef MTCFS_VERSION
#error "MTCFS_VERSION comes from CMakeLists.txt (the project version)"
#endif

static _Atomic uint64_t counters[MC__COUNT];
/* unix seconds of the last shard backed up (MC_BACKUPS), 0 before the first */
static _Atomic int64_t last_backup_s;

/* seconds; +Inf is implicit. Past 300 s because a backup of a large shard
 * or a restore from the bucket takes minutes: without 600..3600 every one of
 * them landed in +Inf and the histogram could not tell 6 min from an hour. */
static const double bounds[] = { 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300,
				 600, 1200, 1800, 3600 };
#define NB (sizeof(bounds) / sizeof(bounds[0]))

struct hist {
	_Atomic uint64_t bucket[NB + 1];
	_Atomic uint64_t count;
	_Atomic uint64_t sum_us;
};
static struct hist hists[MH__COUNT];

static const struct { const char *name, *help; } cnames[MC__COUNT] = {
	[MC_BYTES_WRITTEN] = { "mtcfs_app_written_bytes_total", "Bytes the application wrote through the mount" },
	[MC_COMMITS] = { "mtcfs_commits_total", "Steps committed (sealed with a manifest)" },
	[MC_COMMIT_FAILURES] = { "mtcfs_commit_failures_total", "Commits whose sealing failed" },
	[MC_REPL_BYTES] = { "mtcfs_replication_sent_bytes_total", "Bytes pushed to peers" },
	[MC_REPL_SHARDS] = { "mtcfs_replication_shards_total", "Shards replicated to a peer" },
	[MC_REPL_FAILURES] = { "mtcfs_replication_failures_total", "Failed pushes to a peer" },
	[MC_REPLICAS_RECEIVED] = { "mtcfs_replicas_received_total", "Replicas of other nodes stored here" },
	[MC_RESTORE_FAILURES] = { "mtcfs_restore_failures_total", "Restores that failed" },
	[MC_RESTORE_BYTES] = { "mtcfs_restore_fetched_bytes_total", "Bytes fetched for restores" },
	[MC_BACKUP_BYTES] = { "mtcfs_backup_uploaded_bytes_total", "Bytes uploaded to the bucket" },
	[MC_BACKUPS] = { "mtcfs_backups_total", "Shards backed up" },
	[MC_BACKUP_FAILURES] = { "mtcfs_backup_failures_total", "Failed shard backups" },
	[MC_GC_DROPPED] = { "mtcfs_gc_dropped_shards_total", "Shards dropped by the retention policy" },
};

static const struct { const char *name, *help; } hnames[MH__COUNT] = {
	[MH_SEAL_SECONDS] = { "mtcfs_commit_seal_seconds", "Time from commit to sealed manifest" },
	[MH_REPL_SECONDS] = { "mtcfs_replication_seconds", "Time to push one shard to one peer" },
	[MH_RESTORE_SECONDS] = { "mtcfs_restore_seconds", "Time from replicator.yaml to markers" },
	[MH_BACKUP_SECONDS] = { "mtcfs_backup_seconds", "Time to upload one shard" },
};

/* The restores by source are one family with a source label, so a
 * dashboard sums or splits them with one query. */
static const struct { enum metric_counter c; const char *source; } restore_sources[] = {
	{ MC_RESTORES_LOCAL, "local" },
	{ MC_RESTORES_PEER, "peer" },
	{ MC_RESTORES_BUCKET, "bucket" },
	{ MC_RESTORES_NONE, "none" },
};

static bool is_restore_source(int c)
{
	return c >= MC_RESTORES_LOCAL && c <= MC_RESTORES_NONE;
}

void metrics_add(enum metric_counter c, uint64_t v)
{
	atomic_fetch_add_explicit(&counters[c], v, memory_order_relaxed);
	if (c == MC_BACKUPS && v)
		atomic_store_explicit(&last_backup_s, (int64_t)time(NULL), memory_order_relaxed);
}

void metrics_observe(enum metric_hist h, double seconds)
{
	size_t i = 0;
	while (i < NB && seconds > bounds[i])
		i++;
	atomic_fetch_add_explicit(&hists[h].bucket[i], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&hists[h].count, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&hists[h].sum_us, (uint64_t)(seconds * 1e6), memory_order_relaxed);
}

struct out { char *p; size_t n, cap; bool err; };

static void put(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct out *o, const char *fmt, ...)
{
	va_list ap;
	int n;
	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(o->p + o->n, o->cap - o->n, fmt, ap);
		va_end(ap);
		if (n < 0) {
			o->err = true;
			return;
		}
		if ((size_t)n < o->cap - o->n)
			break;
		size_t nc = o->cap * 2 + (size_t)n;
		char *np = realloc(o->p, nc);
		if (!np) {
			o->err = true;
			return;
		}
		o->p = np;
		o->cap = nc;
	}
	o->n += (size_t)n;
}

int metrics_render(const struct metrics_gauges *g, char **buf, size_t *len)
{
	struct out o = { malloc(8192), 0, 8192, false };

	if (!o.p)
		return -ENOMEM;
	o.p[0] = '\0';
	put(&o, "# HELP mtcfs_build_info The mtcfs version running (always 1)\n# TYPE mtcfs_build_info gauge\n"
	    "mtcfs_build_info{version=\"%s\"} 1\n", MTCFS_VERSION);
	for (int c = 0; c < MC__COUNT; c++) {
		if (is_restore_source(c))
			continue;
		put(&o, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", cnames[c].name, cnames[c].help,
		    cnames[c].name, cnames[c].name,
		    (unsigned long long)atomic_load_explicit(&counters[c], memory_order_relaxed));
	}
	put(&o, "# HELP mtcfs_restores_total Restores by where the step came from (none: nothing to restore)\n"
	    "# TYPE mtcfs_restores_total counter\n");
	for (size_t i = 0; i < sizeof(restore_sources) / sizeof(restore_sources[0]); i++)
		put(&o, "mtcfs_restores_total{source=\"%s\"} %llu\n", restore_sources[i].source,
		    (unsigned long long)atomic_load_explicit(&counters[restore_sources[i].c],
							     memory_order_relaxed));
	put(&o, "# HELP mtcfs_last_backup_success_timestamp_seconds Unix time of the last shard this node backed up (0: none yet)\n"
	    "# TYPE mtcfs_last_backup_success_timestamp_seconds gauge\n"
	    "mtcfs_last_backup_success_timestamp_seconds %lld\n",
	    (long long)atomic_load_explicit(&last_backup_s, memory_order_relaxed));
	for (int h = 0; h < MH__COUNT; h++) {
		uint64_t cum = 0;
		put(&o, "# HELP %s %s\n# TYPE %s histogram\n", hnames[h].name, hnames[h].help, hnames[h].name);
		for (size_t i = 0; i <= NB; i++) {
			cum += atomic_load_explicit(&hists[h].bucket[i], memory_order_relaxed);
			if (i < NB)
				put(&o, "%s_bucket{le=\"%g\"} %llu\n", hnames[h].name, bounds[i], (unsigned long long)cum);
			else
				put(&o, "%s_bucket{le=\"+Inf\"} %llu\n", hnames[h].name, (unsigned long long)cum);
		}
		put(&o, "%s_sum %.6f\n%s_count %llu\n", hnames[h].name,
		    (double)atomic_load_explicit(&hists[h].sum_us, memory_order_relaxed) / 1e6,
		    hnames[h].name, (unsigned long long)atomic_load_explicit(&hists[h].count, memory_order_relaxed));
	}
	put(&o, "# HELP mtcfs_ram_used_bytes Bytes held in the RAM tier\n# TYPE mtcfs_ram_used_bytes gauge\nmtcfs_ram_used_bytes %llu\n",
	    (unsigned long long)g->ram_used);
	put(&o, "# HELP mtcfs_ram_size_bytes Capacity of the RAM tier (ram_size)\n# TYPE mtcfs_ram_size_bytes gauge\nmtcfs_ram_size_bytes %llu\n",
	    (unsigned long long)g->ram_size);
	if (g->peers_total >= 0) {
		put(&o, "# HELP mtcfs_peers Nodes of the job\n# TYPE mtcfs_peers gauge\nmtcfs_peers %d\n", g->peers_total);
		put(&o, "# HELP mtcfs_coordinator_reachable 1 when the control connection to the coordinator is up\n# TYPE mtcfs_coordinator_reachable gauge\nmtcfs_coordinator_reachable %d\n",
		    g->peers_reachable > 0 ? 1 : 0);
	}
	put(&o, "# HELP mtcfs_lkg_step Newest step complete across the job (-1 unknown)\n# TYPE mtcfs_lkg_step gauge\nmtcfs_lkg_step %lld\n",
	    (long long)g->lkg_step);
	/* GKE's coordinator answers "replicated-step": the newest step every
	 * node has committed and copied to its peers, i.e. the step a loss of
	 * any one node still restores from RAM */
	put(&o, "# HELP mtcfs_replicated_lkg_step Newest step every node of the job has committed and replicated to its peers (-1 unknown)\n"
	    "# TYPE mtcfs_replicated_lkg_step gauge\nmtcfs_replicated_lkg_step %lld\n",
	    (long long)g->replicated_lkg_step);
	put(&o, "# HELP mtcfs_last_commit_step Newest step committed on this node (-1 none)\n# TYPE mtcfs_last_commit_step gauge\nmtcfs_last_commit_step %lld\n",
	    (long long)g->last_commit_step);
	if (o.err) {
		free(o.p);
		return -ENOMEM;
	}
	*buf = o.p;
	*len = o.n;
	return 0;
}
