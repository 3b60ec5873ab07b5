/* fs_i.h: state shared inside fs/ only.
 * Threads: FUSE request threads (fs_ll.c), the seal worker (commit.c), the
 * control thread (ctl.c). Lock order: fs->mu (inode table, step table) before
 * node->amu. Never hold fs->mu across blocking I/O other than O(1) syscalls. */
#ifndef MTCFS_FS_FS_I_H
#define MTCFS_FS_FS_I_H

#include "fs/fs.h"
#include "common/jobname.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "common/workq.h"
#include "cluster/engine.h"
#include "tiers/jobid.h"
#include "tiers/ramtier.h"

#define FN_FROZEN  0x1u   /* inside a committed step: read-only */
#define FN_STEPDIR 0x2u   /* a digits-named directory at the top */
#define FN_STORE   0x4u   /* inside the read-only store view (.mtcfs) */
#define FN_YAML    0x8u   /* the top-level replicator.yaml */

struct fnode {
	struct fnode *hnext;        /* protected by fs->mu */
	uint64_t nlookup;           /* protected by fs->mu */
	ino_t ino;
	dev_t dev;
	/* The O_PATH descriptor, or -1 while evicted (fs_ll_fd.c): used only
	 * between fs_nfd() and fs_nfd_put(). Protected by fs->fdmu. */
	int fd;
	int fd_users;               /* operations using fd now: not evicted */
	bool fd_pinned;             /* never evicted (root, unlinked, no handle) */
	struct fnode *lru_prev, *lru_next;   /* fs->lru_*: evictable, newest first */
	struct file_handle *fh;     /* to reopen it; made at its first eviction */
	_Atomic uint32_t flags;     /* FN_* */
	_Atomic int inflight;       /* writes/truncates in progress */
	_Atomic int writers;        /* open handles with write access */
	uint64_t step;              /* valid when FN_FROZEN: the step it belongs to */
	uint8_t sdepth;             /* FN_STORE: 1 = .mtcfs, 2 job, 3 step, 4 shard dir, deeper inside */
	uint64_t marker_step;       /* commit_success.txt in top-level digits dir: step+1, else 0 */
	ino_t marker_dir_ino;
	struct fnode *parent;       /* protected by fs->mu; holds a reference (NULL for root) */
	pthread_mutex_t amu;        /* accounting */
	uint64_t blocks, size;      /* protected by amu: last measured */
	/* Open handles by kind (protected by amu). The kernel refuses (EIO)
	 * a passthrough open of an inode that has cached opens and the
	 * reverse, and wants one backing file per inode: pt_id is the
	 * backing id while pt_open > 0. */
	int pt_open, np_open, pt_id;
};

/* A committed step of this node as the namespace shows it. */
struct fs_step {
	char job[JOB_NAME_MAX + 1];     /* the job it was committed under */
	char name[65];     /* the step as the app spelled it ("05"), UTIL_STEP_NAME_MAX */
	uint32_t rank;
	uint32_t worker;   /* framework pytorch: the worker whose .save file this is */
	uint64_t step;
	ino_t dir_ino;     /* the step directory in ns/; 0 for .save files */
	ino_t *files;      /* framework pytorch: the .save file of each worker, owned */
	uint32_t nfiles;
	bool visible;      /* still in the app's view (top-level name present) */
	bool sealed;       /* hard links and manifest done */
	bool failed;       /* sealing failed */
};

/* What the parts under the FUSE operations (commit.c, ctl.c, retain.c)
 * need of the kernel's view: the namespace operations (fs_ll*.c) give it
 * as fs_ll_front, and those parts call down through fs->front, never into
 * fs_ll*.c by name (no call circle in fs/). */
struct fs_front_ops {
	/* a top-level name went behind the kernel's back: its cached subtree
	 * goes, so the daemon's handles on dropped files close. Any thread. */
	void (*forget_name)(struct fs *fs, const char *name);
	/* the same, done before returning: only from threads that serve no
	 * FUSE request (the control thread) */
	void (*forget_name_now)(struct fs *fs, const char *name);
	/* open handles with write access on the inode, 0 if none */
	int (*node_writers)(struct fs *fs, ino_t ino, dev_t dev);
	/* the node of (ino, dev), if known, is read-only from now on (step) */
	void (*node_set_frozen)(struct fs *fs, ino_t ino, dev_t dev, uint64_t step);
	/* every entry under dirfd read-only (step is being sealed), by node and
	 * by backing inode; FIFOs, sockets and devices reported. Seal worker. */
	void (*freeze_subtree)(struct fs *fs, int dirfd, uint64_t step);
};

struct fs {
	struct fs_opts o;
	const struct fs_front_ops *front;   /* fs_ll_front */
	struct ram_tier *ram;       /* the caller's (fs_attach) */
	struct fuse_session *se;
	bool handlers, mounted;     /* fuse_set_signal_handlers, fuse_session_mount done */
	_Atomic bool served;        /* a request after INIT arrived (INIT's reply is in) */
	bool splice_ok;             /* pipes hold a 1 MiB request: set before the loop (fs_start) */
	bool passthrough;           /* the kernel granted FUSE passthrough in INIT */
	bool dio_mmap;              /* FUSE_CAP_DIRECT_IO_ALLOW_MMAP granted in INIT */
	struct workq *sealq;        /* commit sealing, in order */
	struct workq *notifyq;      /* kernel cache invalidations, off request paths */
	struct eng *eng;            /* peer tier; NULL for a single node without network */
	int proc_self_fd;

	pthread_mutex_t mu;
	/* inode descriptors (fs_ll_fd.c); a leaf lock, taken under mu or not */
	pthread_mutex_t fdmu;
	struct fnode *lru_head, *lru_tail;
	size_t lru_n, fd_cap;
	bool fd_evict;              /* file handles work: descriptors beyond fd_cap close */
	int fd_mount;               /* decodes handles: RAMDIR/ns (not owned) */
	/* every open file handle (fs_ll.c), so that a daemon stopped with files
	 * still open frees them: the kernel sends no RELEASE after unmount */
	pthread_mutex_t hmu;
	struct fhandle *handles;
	/* A create or an open for writing (shared) against the pytorch .save
	 * scan (exclusive, commit_top_file_done): from the open of the file
	 * in RAMDIR until its handle counts as a writer, the scan must not see
	 * it, or another worker's close commits a file that is being created
	 * (empty) or truncated. Taken before mu and hmu. */
	pthread_rwlock_t open_lk;
	pthread_cond_t sealed_cv;   /* a step finished sealing */
	struct fnode root;
	struct fnode **htab;        /* protected by mu */
	size_t hsize;
	_Atomic int sealing;        /* commits not yet frozen node by node */
	struct fs_step *steps;      /* protected by mu */
	size_t nsteps, capsteps;
	/* Inodes of RAMDIR (same dev as root) that a committed shard holds
	 * and that may have names outside their step: read-only under every
	 * name. Rebuilt at INIT from RAMDIR/shards (each non-directory with
	 * more than one link: bounded by what the RAM tier holds); the seal
	 * adds the step's files that have other names. Never shrunk while
	 * running: a dropped shard's entry only keeps such a name read-only.
	 * Open addressing, 0 = empty slot. Protected by mu. */
	ino_t *frozen_ino;
	size_t frozen_n, frozen_cap;

	/* The job shards are written under now: the record shared with the
	 * engine (fs_opts.jobid, or the front's own: jid_own), read through
	 * fs_identity(). Its lock is a leaf: it may be taken under mu. */
	struct jobid *jid;
	bool jid_own;

	/* protected by mu */
	uint64_t restored_step;     /* step restored by the last restore, 0 = none */
	bool have_restored;
	bool eager_gc;              /* a job is configured: keep only what policy needs */

	/* control thread (ctl.c) */
	pthread_t ctl_thr;
	bool ctl_running;
	pthread_mutex_t ctl_mu;
	pthread_cond_t ctl_cv;
	bool ctl_pending, ctl_stop;  /* protected by ctl_mu */
	char phase[32];              /* protected by mu: waiting-for-config/restoring/ready/failed */
};

extern struct fs *g_fs;

/* The job shards are committed under now, into *out: the shared record,
 * except that before a replicator.yaml sets it the front commits as job
 * FS_JOB_DEFAULT, rank 0 (whatever rank the engine knows from its
 * options). Any thread, any lock held (the record's lock is a leaf).
 * Inline: commit.c, ctl.c, retain.c and front.c all read it, and front.c
 * calls the first two (check-calls: no circle). */
#define FS_JOB_DEFAULT "default"
static inline void fs_identity(struct fs *fs, struct job_now *out)
{
	jobid_get(fs->jid, out);
	if (!out->set) {
		snprintf(out->job, sizeof(out->job), "%s", FS_JOB_DEFAULT);
		out->rank = 0;
	}
}

/* fs_ll.c */
extern const struct fuse_lowlevel_ops fs_ll_ops;
extern const struct fs_front_ops fs_ll_front;
void fs_nodes_free(struct fs *fs);
/* fs_ll_fd.c: the budget of inode descriptors (after the root is open) */
void fs_fd_init(struct fs *fs);

/* ctl.c */
int  ctl_start(struct fs *fs);
void ctl_stop(struct fs *fs);
void ctl_notify(struct fs *fs);      /* replicator.yaml may be complete */

/* report.c */
void fs_report_error(void *fs, const char *line);   /* append to replicator.errors */

/* commit.c */
int  commit_init(struct fs *fs);           /* catalog recovery at start-up */
/* A step directory (ino) became committed at top-level name `name` (the
 * digits as written; `step` is their value). Called on a FUSE thread:
 * records SEALING. -EEXIST when another spelling of the same step ("5"
 * for "05") is committed and still in the app's view. */
int  commit_begin(struct fs *fs, uint64_t step, const char *name, ino_t dir_ino);
/* commit_success.txt in the top-level step directory dir_ino is complete
 * (closed after writing, or renamed into place): commit the directory. */
void commit_marker_done(struct fs *fs, ino_t dir_ino);
/* A regular file at the top was closed after writing or renamed there:
 * with framework: pytorch, commit each step whose .save files are all
 * complete. FUSE threads (and the control thread at start-up); no-op
 * otherwise. */
void commit_top_file_done(struct fs *fs);
/* A top-level regular file that is a committed .save file: its step.
 * fs->mu held. */
bool commit_file_frozen_locked(struct fs *fs, ino_t ino, uint64_t *step);
/* The .restore marker of worker w for plan p (p->found false: the empty
 * s0 marker): its name, and the relative symlink target (empty when the
 * marker is an empty file). 0 or -errno. Control thread. */
struct restore_plan;
int  commit_marker(struct fs *fs, const char *job, int rank, const struct restore_plan *p,
		   int w, char *name, size_t nlen, char *target, size_t tlen);
void commit_abort(struct fs *fs, uint64_t step);
int  commit_queue(struct fs *fs, uint64_t step);
bool commit_is_step_dir(struct fs *fs, uint64_t step, ino_t ino); /* takes mu */
void commit_wait_sealed(struct fs *fs, uint64_t step);
void commit_hide(struct fs *fs, uint64_t step);

/* steps.c: the step table (fs->mu held) */
struct fs_step *fs_step_find(struct fs *fs, uint64_t step);   /* any worker's entry */
struct fs_step *fs_step_find_w(struct fs *fs, uint64_t step, uint32_t w);
struct fs_step *fs_step_add(struct fs *fs, uint64_t step, uint32_t w);   /* or the existing */
void fs_step_remove(struct fs *fs, uint64_t step, uint32_t w);
void fs_step_key(const struct fs_step *s, struct shard_key *k);
void fs_steps_free(struct fs *fs);         /* at exit, no lock */

/* retain.c: the retention's value and callbacks (tiers/retention runs it) */
void retain_gc(struct fs *fs);             /* routine GC: what the job no longer needs */
void retain_drop_newer(struct fs *fs, const char *job, uint64_t step);   /* after a restore */
void retain_on_lkg(void *fs, const char *job, uint64_t step);   /* engine callback */
uint64_t retain_reclaim(void *fs, uint64_t want);                /* ram_reserve's reclaim */

#endif
