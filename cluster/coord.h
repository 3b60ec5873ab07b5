/* coord: the coordinator of a job (runs on node-rank 0), DESIGN §5. Nodes
 * hold one control connection to it. It keeps the rank -> address table,
 * the commits reported by every node (the steady-state LKG, broadcast as it
 * moves), and runs restore rounds: collect every node's catalog (waiting up
 * to restore_timeout for all), plan with lkg_plan(), answer each node with
 * its source, re-plan on fetch failures, and release the job-wide barrier.
 * Called on the server's loop thread (messages, closes) and on its own tick
 * thread (timeouts); one mutex inside. Messages are borrowed. */
#ifndef MTCFS_NET_COORD_H
#define MTCFS_NET_COORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

struct coord;
struct nsrv;

/* The bucket as the coordinator sees it (rank 0's engine provides it).
 * Every function may block on the network: they run on the coordinator's
 * own worker thread, never on the server loop. */
struct coord_bk_decision {
	bool forced;            /* restore.version exists */
	bool forced_ok;         /* ... and names a complete backup */
	bool have_newest;       /* a complete backup exists (not excluded) */
	char name[64];          /* the backup to restore */
	uint64_t step;
	char notes[1024];       /* for replicator.errors: skipped backups, why */
	/* the backup's node each (rank, worker) restores, [nodes * workers]
	 * (a backup of another job size: GKE's rule, lkg_plan_backup); malloc'ed
	 * by decide, the coordinator's to free; NULL: every rank its own */
	uint32_t *owners;
	uint32_t workers;
};
struct coord_bucket {
	/* need_newest: nothing is complete in the cluster, so look for the
	 * newest backup this job can restore too (else only restore.version
	 * matters); dp: the job's assume-data-parallelism (0: none) */
	int  (*decide)(void *arg, const char *job, uint32_t nodes, uint32_t dp,
		       const char (*exclude)[64], size_t nexclude, bool need_newest,
		       struct coord_bk_decision *d);
	/* a new backup's name into out; on failure the reason in words.
	 * -EAGAIN: the current UTC minute already has a backup; *retry_s is
	 * when the next minute starts */
	int  (*new_name)(void *arg, const char *job, char *out, size_t outlen, unsigned *retry_s);
	/* remove the objects of an attempt that failed and is not resumed; on
	 * failure the reason in words in out */
	int  (*discard)(void *arg, const char *job, const char *name, char *out, size_t outlen);
	void (*clear_restore_version)(void *arg, const char *job);
	void *arg;
};

/* restore_timeout_s: the wait for catalogs, and again at the barrier (<= 0:
 * 120, the engine's ENG_RESTORE_TIMEOUT_S). */
int  coord_start(struct nsrv *srv, int restore_timeout_s, struct coord **out);
/* Give the coordinator a bucket: backups are scheduled and restores may
 * come from it. Call before traffic arrives. */
void coord_set_bucket(struct coord *c, const struct coord_bucket *b);
/* Stop the timer thread (no more sends from it); messages may still be
 * handled. Then stop the server, then coord_stop() frees. */
void coord_quiesce(struct coord *c);
void coord_stop(struct coord *c);     /* accepts NULL */
void coord_on_msg(struct coord *c, uint64_t conn, int rank, uint8_t type, uint32_t req_id,
		  json_t *msg);
void coord_on_close(struct coord *c, uint64_t conn, int rank);

#endif
