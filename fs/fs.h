/* fs: the FUSE front of mtcfs: the namespace a trainer sees over the RAM
 * tier, commit detection, the control files and the control thread. It owns
 * the FUSE session, the inode table and its work queues; the RAM tier and
 * the engine are the caller's (tools/mtcfs_main.c, the daemon's composition
 * root), lent to the front until fs_free(). The caller drives it from one
 * thread, in this order (each step only after the ones before succeeded):
 *
 *   fs_new        the session on the FUSE arguments, signal handlers
 *   fs_mount      mount (before the caller forks: errors reach its stderr)
 *   fs_after_fork once the process is final (fuse_daemonize())
 *   fs_attach     the RAM tier, opened by the caller
 *   fs_start      the engine (or NULL), catalog recovery, the control thread
 *   fs_run        the FUSE loop, until unmount or SIGTERM/SIGINT
 *   fs_stop       the control thread stopped, work queues closed
 *   fs_free       unmount, free; accepts NULL and a front stopped anywhere
 */
#ifndef MTCFS_FS_FS_H
#define MTCFS_FS_FS_H

#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>
#include <stddef.h>
#include <stdint.h>

/* Kernel FUSE passthrough (fuse_passthrough_open, FUSE_CAP_PASSTHROUGH)
 * needs libfuse >= 3.17 (3.16 had it, 3.17 is what we build and test);
 * with 3.14 every read goes through the daemon. */
#if FUSE_MAKE_VERSION(FUSE_MAJOR_VERSION, FUSE_MINOR_VERSION) >= FUSE_MAKE_VERSION(3, 17) && \
	defined(FUSE_CAP_PASSTHROUGH)
#define MTCFS_PASSTHROUGH 1
#else
#define MTCFS_PASSTHROUGH 0
#endif

struct fs;
struct jobid;
struct ram_tier;
struct eng;
struct eng_cb;

/* What the front needs of the mount options. The strings are borrowed:
 * they must outlive the front. */
struct fs_opts {
	const char *mountpoint;       /* absolute */
	const char *listen, *peers, *coordinator;   /* the peer tier's, or NULL */
	int jax_init_info;            /* >= 0: write jax-init-info.txt; -1: not */
	int jax_port;                 /* the JAX coordinator's port written there */
	int rank;                     /* -1: from peers/listen, else 0 */
	int rank_hint;                /* -1; else the rank until a yaml gives one (it wins) */
	/* Called on a FUSE thread once the kernel's INIT is handled, i.e. the
	 * mount answers; NULL: nothing. */
	void (*on_init)(void *arg);
	void *arg;
	/* the job identity shared with the engine (tiers/jobid.h; borrowed:
	 * it must outlive the front); NULL: the front makes one of its own */
	struct jobid *jobid;
};

/* A front on a new FUSE session (args: the FUSE options, -f and the
 * mountpoint already taken out by fuse_parse_cmdline()), with libfuse's
 * signal handlers installed. *out is freed with fs_free(). 0 or -errno. */
int  fs_new(const struct fs_opts *o, struct fuse_args *args, struct fs **out);
/* Mounts at o->mountpoint. 0 or -EIO (libfuse says why on stderr). */
int  fs_mount(struct fs *fs);
/* After fuse_daemonize(): opens what names this process (/proc/self/fd,
 * which named the parent before the fork). 0 or -errno (logged). */
int  fs_after_fork(struct fs *fs);
/* Serves the RAM tier ram (its namespace, and its reclaim callback); starts
 * the front's work queues. 0 or -errno. */
int  fs_attach(struct fs *fs, struct ram_tier *ram);
/* The callbacks the engine is to be started with (LKG events, errors for
 * replicator.errors), their argument this front. */
void fs_eng_callbacks(struct fs *fs, struct eng_cb *cb);
/* Uses eng (NULL: a single node without network); recovers the catalog
 * (a failure is logged, not fatal) and starts the control thread; checks
 * whether splice can be asked for in INIT. 0 or -errno. */
int  fs_start(struct fs *fs, struct eng *eng);
/* The multi-threaded FUSE loop; returns when unmounted or on a signal
 * (SIGTERM, SIGINT). 0, or < 0 when the loop failed. */
int  fs_run(struct fs *fs);
/* Stops the control thread and closes the work queues, not freeing them:
 * the engine may still call back (an LKG's GC goes to the seal queue)
 * until it is stopped. Stop the engine after this, then fs_free(). Accepts
 * NULL and a front not started: stops what runs. */
void fs_stop(struct fs *fs);
/* Frees the work queues, unmounts if mounted, removes the signal handlers,
 * destroys the session and frees the front. Accepts NULL. */
void fs_free(struct fs *fs);
/* The job and rank shards are written under now (for metrics; any thread).
 * job has room for len bytes. */
void fs_job(struct fs *fs, char *job, size_t len, uint32_t *rank);

#endif
